"""Stream threads: one thread and one message queue per stream named in the plan (and 'source').

Messages are ``(handler, a, b)`` tuples, run as ``handler(a, b)`` on the stream's thread; ``None``
is the poison that ends the thread. Messages between actors of the same stream skip the queue
(a local deque the thread drains first), since the sender already runs on that thread.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from queue import SimpleQueue


class Stream:
    """A thread reacting to messages for the actors that live on it."""

    def __init__(self, name: str, on_crash: Callable[[str, BaseException], None]) -> None:
        self.name = name
        self.queue: SimpleQueue = SimpleQueue()
        self.local: deque = deque()
        self._on_crash = on_crash
        self.thread = threading.Thread(target=self._loop, name=f"holoflow-stream-{name}", daemon=True)

    def start(self) -> None:
        """Starts the thread."""
        self.thread.start()

    def stop(self) -> None:
        """Posts the poison message; the thread ends after the messages already queued."""
        self.queue.put(None)

    def _loop(self) -> None:
        local, get = self.local, self.queue.get
        try:
            while True:
                msg = local.popleft() if local else get()
                if msg is None:
                    return
                msg[0](msg[1], msg[2])
        except BaseException as e:       # a bug in the runtime itself: report, never hang
            self._on_crash(self.name, e)
