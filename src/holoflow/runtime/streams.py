"""Workers and device streams: who runs an actor's acts, and how an accelerator orders them.

A *worker* runs the actors of one or more plan streams, one message at a time: a thread of its
own, or, for the worker named `CALLER`, the caller's thread while it waits for outputs (no
hand-off at all). Messages are ``(handler, a, b)`` tuples, run as ``handler(a, b)``; ``None``
is the poison that ends a thread (``low`` messages, yielding acts, run only when nothing else
waits). Messages between actors of one worker skip the queue (a local
deque the worker drains first), so consecutive ready acts of one worker run in one loop without a
wake-up; only messages that cross workers go through the queue.

A *device stream* (`DeviceStream`) orders the work of an accelerator stream (a CUDA stream) by
events instead of by threads: an act enqueues its kernels with the stream current and records an
event; a consumer on another stream waits for that event on the device, the host never blocks.
The runtime knows no device library: the object is handed in (`Runtime(devices=...)`); the graph
lowering builds CUDA ones (docs/architecture.md, "Runtime").
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from queue import SimpleQueue
from typing import Any, Protocol, runtime_checkable

CALLER = "caller"      # the worker name meaning "the caller's thread, while it waits"


class Worker:
    """Runs messages for the actors that live on it, on its own thread or (`CALLER`) on the caller's."""

    def __init__(self, name: str, on_crash: Callable[[str, BaseException], None],
                 on_start: Callable[[], None] | None = None) -> None:
        self.name = name
        self.queue: SimpleQueue = SimpleQueue()    # messages from other workers (and the caller)
        self.local: deque = deque()                # messages from actors of this worker
        self.low: deque = deque()                  # yielding acts: run when nothing else waits
        self._on_crash = on_crash
        self._on_start = on_start
        self.thread: threading.Thread | None = None
        if name != CALLER:
            self.thread = threading.Thread(target=self._loop, name=f"holoflow-stream-{name}", daemon=True)

    def start(self) -> None:
        """Starts the thread (the caller's worker has none)."""
        if self.thread is not None:
            self.thread.start()

    def stop(self) -> None:
        """Posts the poison message; the thread ends after the messages already queued."""
        if self.thread is not None:
            self.queue.put(None)
        else:
            self.local.clear()

    def alive(self) -> bool:
        return self.thread is None or self.thread.is_alive()

    def _loop(self) -> None:
        local, get, low, empty = self.local, self.queue.get, self.low, self.queue.empty
        try:
            if self._on_start is not None:
                self._on_start()
            while True:
                if local:
                    msg = local.popleft()
                elif low and empty():
                    msg = low.popleft()
                else:
                    msg = get()
                if msg is None:
                    return
                msg[0](msg[1], msg[2])
        except BaseException as e:       # a bug in the runtime itself: report, never hang
            self._on_crash(self.name, e)


@runtime_checkable
class DeviceStream(Protocol):
    """One accelerator stream as the runtime uses it (a CUDA stream; a fake one in the tests).

    An act on a device stream: ``wait(e)`` for the event of every input produced on another
    stream, ``keep(v)`` for those inputs, run the task with ``activate()`` entered (kernels go to
    this stream), then ``record()`` an event the consumers wait for. Nothing here blocks the host.
    """

    name: str

    def activate(self) -> AbstractContextManager:
        """A context in which work launched by the host goes to this stream."""

    def record(self) -> Any:
        """An event marking the work enqueued on this stream so far."""

    def wait(self, event: Any) -> None:
        """Work enqueued on this stream from now on starts after ``event`` (device side)."""

    def keep(self, value: Any) -> None:
        """``value`` (made on another stream) is read by work on this stream: its memory must not
        be reused before that work finishes (CUDA: ``Tensor.record_stream``)."""
