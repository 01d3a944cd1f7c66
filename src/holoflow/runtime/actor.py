"""Actors: each task (and the source and sink) is an actor owning its produced regsts.

Act rule (docs/architecture.md, "Runtime"): act while every inbox holds a piece and every produced
regst has a free slot. After acting, announce each new piece to its consumers (a reference, never
a copy) and return each consumed piece to its producer. Everything runs on the actor's stream
thread, triggered by messages.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import TaskError
from .executor import as_result
from .regst import Inbox, Regst
from .streams import Stream
from .timeline import Act

if TYPE_CHECKING:
    from .runtime import Runtime


class Actor:
    """One actor: ``fn(*args) -> tuple`` produces one value per regst in ``regsts``; ``source`` is
    the user's source line quoted when fn fails."""

    def __init__(self, name: str, stream: Stream, fn: Callable[..., tuple], runtime: Runtime,
                 lane: list | None, source: str | None = None) -> None:
        self.name = name
        self.stream = stream
        self.fn = fn
        self.source = source
        self.rt = runtime
        self.inboxes: list[Inbox] = []
        self.regsts: list[Regst] = []
        self.acted = 0                    # iterations done: the next act is iteration ``acted``
        self._lane = lane                 # the trace lane of our stream, or None
        self.busy_since: float | None = None   # perf_counter when the running act began

    def on_ready(self, inbox: int, value: Any) -> None:
        """Message: a piece of a consumed regst is readable."""
        self.inboxes[inbox].pieces.append(value)
        self.try_act()

    def on_free(self, regst: int, consumer: int) -> None:
        """Message: a consumer returned its oldest piece of one of our regsts."""
        self.regsts[regst].give_back(consumer)
        self.try_act()

    def ready(self) -> bool:
        """The act rule."""
        for box in self.inboxes:
            if not box.pieces:
                return False
        for r in self.regsts:
            if r.free() <= 0:
                return False
        return True

    def try_act(self) -> None:
        """Acts as long as the act rule holds (and the run has not failed)."""
        rt = self.rt
        while not rt.failed and self.ready():
            self._act()

    def _act(self) -> None:
        i = self.acted
        values = [box.pieces.popleft() for box in self.inboxes]
        args = [v for v, box in zip(values, self.inboxes) if box.passed]
        t0 = self.busy_since = time.perf_counter()
        try:
            out = self.fn(*args)
            if type(out) is not tuple or len(out) != len(self.regsts):
                out = as_result(out, tuple(r.name for r in self.regsts))
        except Exception as e:
            self.rt.fail(TaskError(self.name, self.stream.name, i, self.source, e))
            return
        finally:
            self.busy_since = None
        if self._lane is not None:
            t1, base = time.perf_counter(), self.rt.timeline.t0
            self._lane.append(Act(self.name, self.stream.name, i, t0 - base, t1 - base))
        for regst, value in zip(self.regsts, out):
            regst.produced += 1
            if regst.keep:
                regst.last = value
            for consumer, k in regst.consumers:
                self._send(consumer, (consumer.on_ready, k, value))
        for box in self.inboxes:
            if box.producer is not None:
                self._send(box.producer, (box.producer.on_free, box.regst, box.consumer))
        self.acted = i + 1          # last: a caller seeing it may read ``regst.last`` as final state
        if self.acted == self.rt.target:
            self.rt.results.put(("done", self.name, self.acted))

    def _send(self, to: Actor, msg: tuple) -> None:
        if to.stream is self.stream:
            to.stream.local.append(msg)
        else:
            to.stream.queue.put(msg)

    def waiting_for(self) -> str:
        """What keeps this actor from acting, for stall reports (read racily from another thread)."""
        head = f"{self.name} (stream {self.stream.name!r}, acted {self.acted}): "
        since = self.busy_since
        if since is not None:
            return head + f"running iteration {self.acted} for {time.perf_counter() - since:.1f}s"
        empty = [b.producer.regsts[b.regst].name if b.producer else "feed" for b in self.inboxes if not b.pieces]
        full = [r.name for r in self.regsts if r.free() <= 0]
        why = ([f"waits for {empty}"] if empty else []) + ([f"no free slot in {full}"] if full else [])
        return head + ("; ".join(why) or "ready")
