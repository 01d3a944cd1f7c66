"""A fake accelerator for the runtime's device streams: kernels are queued per stream and run later,
in a random interleaving that honours only the events, as a GPU would.

Task fns wrapped by `FakeDevice.lazy` launch a kernel on the current stream and return `Buffer`s
at once (like CUDA tensors whose values are not computed yet). `FakeDevice.drain` then runs the
queues. A kernel reading a buffer that is not written yet raises `OrderError` (a missing event
wait); reading a buffer made on another stream that was not ``keep``-ed on the reader's stream
raises `OrderError` too (its memory could be reused under the reader: a missing record_stream).
"""
from __future__ import annotations

import random
import threading
from collections import deque
from contextlib import contextmanager


class OrderError(AssertionError):
    """The device ran work in an order the runtime's events should have forbidden."""


class Buffer:
    """A device value: written once by a kernel on stream ``made_on`` (None: before the run)."""

    def __init__(self, made_on=None, value=None, written=False):
        self.made_on, self.value, self.written = made_on, value, written
        self.kept_on: set = set()

    def read(self, stream):
        if not self.written:
            raise OrderError(f"a kernel on {stream.name!r} read a buffer before "
                             f"{getattr(self.made_on, 'name', None)!r} wrote it")
        if self.made_on is not stream and stream.name not in self.kept_on:
            raise OrderError(f"a kernel on {stream.name!r} read a buffer made on "
                             f"{getattr(self.made_on, 'name', None)!r} that was never kept on its stream")
        return self.value


class Event:
    def __init__(self, stream):
        self.stream, self.done = stream, False


class FakeStream:
    """A `DeviceStream`: ``wait``/``record``/kernels are queued, nothing runs until ``drain``."""

    def __init__(self, device, name, ignore_waits=False):
        self.device, self.name, self.ignore_waits = device, name, ignore_waits
        self.queue: deque = deque()

    def _push(self, op):
        with self.device.lock:
            self.queue.append(op)
            detail = op[1].stream.name if op[0] == "wait" else None     # whose event a wait is for
            self.device.log.append((self.name, op[0], detail))

    @contextmanager
    def activate(self):
        local = self.device.current
        old = getattr(local, "stream", None)
        local.stream = self
        try:
            yield
        finally:
            local.stream = old

    def record(self):
        ev = Event(self)
        self._push(("record", ev))
        return ev

    def wait(self, event):
        if not self.ignore_waits:
            self._push(("wait", event))

    def keep(self, value):
        for b in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(b, Buffer):
                b.kept_on.add(self.name)


class FakeDevice:
    def __init__(self):
        self.lock = threading.Lock()
        self.current = threading.local()
        self.streams: dict[str, FakeStream] = {}
        self.log: list = []

    def stream(self, name, **kw) -> FakeStream:
        return self.streams.setdefault(name, FakeStream(self, name, **kw))

    def lazy(self, fn, n_out):
        """``fn`` as a kernel launch: returns ``n_out`` unwritten buffers at once."""
        def launch(*bufs):
            stream = getattr(self.current, "stream", None)
            if stream is None:
                raise OrderError("a task launched a kernel with no device stream current")
            outs = tuple(Buffer(stream) for _ in range(n_out))

            def kernel():
                got = fn(*(b.read(stream) for b in bufs))
                for o, v in zip(outs, got):
                    o.value, o.written = v, True
            stream._push(("kernel", kernel))
            return outs
        return launch

    def drain(self, rng: random.Random) -> None:
        """Runs every queue to the end, picking at random among the streams whose next op may run."""
        while True:
            heads = [s for s in self.streams.values() if s.queue and
                     (s.queue[0][0] != "wait" or s.queue[0][1].done)]
            if not heads:
                left = [s.name for s in self.streams.values() if s.queue]
                if left:
                    raise OrderError(f"device deadlock: streams {left} wait for events never recorded")
                return
            op = rng.choice(heads).queue.popleft()
            if op[0] == "record":
                op[1].done = True
            elif op[0] == "kernel":
                op[1]()
