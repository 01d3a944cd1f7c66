"""Actors: each task (and the source and sink) is an actor owning its produced regsts.

Act rule (docs/architecture.md, "Runtime"): act while every inbox holds a piece and every produced
regst has a free slot. After acting, announce each new piece to its consumers (a reference, never
a copy) and return each consumed piece to its producer. A piece of a regst bundling several plan
regsts (`regst.Regst`) is the tuple of their values (of one plan regst: the value itself); an act
picks its arguments out of the pieces it popped.
Everything runs on the actor's worker, triggered by messages; a message to an actor of the same
worker is a deque append, not a wake-up.

`DeviceActor` is the same actor on a device stream (`streams.DeviceStream`): its pieces travel
with the event recorded after the act that made them, and a consumer on another stream waits for
that event on the device instead of the host waiting for the kernels.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from .errors import TaskError
from .executor import as_result
from .regst import Inbox, Regst
from .streams import DeviceStream, Worker
from .timeline import Act

if TYPE_CHECKING:
    from .runtime import Runtime

_now = time.perf_counter


class Actor:
    """One actor: ``fn(*args) -> tuple`` produces one value per regst in ``regsts``; ``source`` is
    the user's source line quoted when fn fails. ``stream`` is the plan's stream name, ``worker``
    the worker running it."""

    def __init__(self, name: str, stream: str, worker: Worker, fn: Callable[..., tuple], runtime: Runtime,
                 lane: list | None, source: str | None = None) -> None:
        self.name = name
        self.stream = stream
        self.worker = worker
        self.fn = fn
        self.source = source
        self.rt = runtime
        self.inboxes: list[Inbox] = []
        self.regsts: list[Regst] = []
        self.produces: tuple[str, ...] = ()    # the plan regsts fn returns, in order
        self.acted = 0                    # iterations done: the next act is iteration ``acted``
        self._lane = lane                 # the trace lane of our stream, or None
        self.busy_since: float | None = None   # while an act runs: its start (perf_counter), or not None
        self._args: Callable[[list], list] | None = None   # popped pieces -> fn arguments (None: as popped)
        self._picks: list = []            # per regst: out -> its piece (None: out itself)
        self.low = False                  # yields to every other message of its worker (set_priority)
        self._react = self.try_act        # after a message: act while the act rule holds (or defer)
        self._deferred = False

    def set_priority(self, priority: int) -> None:
        """``priority < 0``: acts only when the worker has nothing else waiting (a worker thread;
        on the caller's worker the priority is ignored)."""
        self.low = priority < 0 and self.worker.thread is not None
        self._react = self._defer if self.low else self.try_act

    def wired(self, consumes: tuple[str, ...] | None) -> None:
        """Called once every inbox and regst is connected: precomputes the hot path. ``consumes``:
        the plan regsts fn reads, in order (None: fn takes the popped pieces as they are)."""
        if consumes is not None:
            bundles = [box.producer.regsts[box.regst].names for box in self.inboxes]
            where = {r: (k, j if len(names) > 1 else None) for k, names in enumerate(bundles)
                     for j, r in enumerate(names)}
            spec = [where[r] for r in consumes]
            if spec != [(k, None) for k in range(len(bundles))]:   # else: the pieces are the arguments
                self._args = _selector(spec)
        self._picks = [_picker([self.produces.index(r) for r in regst.names], len(self.produces))
                       for regst in self.regsts]
        self._n_out = len(self.produces)

    def on_ready(self, inbox: int, value: Any) -> None:
        """Message: a piece of a consumed regst is readable."""
        self.inboxes[inbox].pieces.append(value)
        self._react()

    def on_free(self, regst: int, consumer: int) -> None:
        """Message: a consumer on another worker returned its oldest piece of one of our regsts."""
        self.regsts[regst].give_back(consumer)
        self._react()

    def on_wake(self, _a: Any = None, _b: Any = None) -> None:
        """Message: a consumer on our worker returned a piece and freed a slot we lacked."""
        self._react()

    def ready(self) -> bool:
        """The act rule."""
        for box in self.inboxes:
            if not box.pieces:
                return False
        for r in self.regsts:       # Regst.free() inlined: no free slot when all are still read
            if r.produced - (r.least if r.returned else r.produced) >= r.register_num:
                return False
        return True

    def _defer(self) -> None:
        """A yielding actor (``priority < 0``): one act later, when its worker is otherwise idle."""
        if not self._deferred and not self.rt.failed and self.ready():
            self._deferred = True
            self.worker.low.append((self._act_low, None, None))

    def _act_low(self, _a: Any = None, _b: Any = None) -> None:
        self._deferred = False
        if not self.rt.failed and self.ready():
            self._act()
            self._defer()      # the next one yields again to what arrived meanwhile

    def try_act(self) -> None:
        """Acts as long as the act rule holds (and the run has not failed)."""
        rt = self.rt
        while not rt.failed and self.ready():
            self._act()

    def _call(self, i: int, args: list) -> tuple | None:
        """fn(*args) as a checked tuple, or None after reporting the failure."""
        self.busy_since = _now()
        try:
            out = self.fn(*args)
            if type(out) is not tuple or len(out) != self._n_out:
                out = as_result(out, self.produces)
        except Exception as e:
            self.rt.fail(TaskError(self.name, self.stream, i, self.source, e))
            return None
        finally:
            t0, self.busy_since = self.busy_since, None
        if self._lane is not None:
            base = self.rt.timeline.t0
            self._lane.append(Act(self.name, self.stream, i, t0 - base, _now() - base))
        return out

    def _act(self) -> None:
        i = self.acted
        args = [box.pieces.popleft() for box in self.inboxes]
        if self._args is not None:
            args = self._args(args)
        if self._lane is None:          # the hot path: _call inlined, no timing
            self.busy_since = i
            try:
                out = self.fn(*args)
                if type(out) is not tuple or len(out) != self._n_out:
                    out = as_result(out, self.produces)
            except Exception as e:
                self.rt.fail(TaskError(self.name, self.stream, i, self.source, e))
                return
            finally:
                self.busy_since = None
        else:
            out = self._call(i, args)
            if out is None:
                return
        self._announce(i, [out if pick is None else pick(out) for pick in self._picks])

    def _announce(self, i: int, pieces: list) -> None:
        """Sends the new pieces (one per regst) to their consumers and the consumed ones back to
        their producers."""
        worker = self.worker
        local = worker.local.append
        for regst, piece in zip(self.regsts, pieces):
            regst.produced += 1
            if regst.keep:
                regst.last = piece
            for handler, k, w in regst.targets:
                if w is worker:
                    local((handler, k, piece))
                else:
                    w.queue.put((handler, k, piece))
        for box in self.inboxes:
            w = box.ret_worker
            if w is worker:
                if box.slots.give_back(box.consumer):
                    local(box.wake)
            elif w is not None:
                w.queue.put(box.ret)
        self.acted = i + 1          # last: a caller seeing it may read ``regst.last`` as final state
        if self.acted == self.rt.target:
            self.rt.note(("done", self.name, self.acted), worker)

    def waiting_for(self) -> str:
        """What keeps this actor from acting, for stall reports (read racily from another thread)."""
        head = f"{self.name} (stream {self.stream!r}, acted {self.acted}): "
        since = self.busy_since
        if since is not None:
            return head + f"running iteration {self.acted}" + \
                (f" for {_now() - since:.1f}s" if isinstance(since, float) else "")
        empty = [b.producer.regsts[b.regst].name if b.producer else "feed" for b in self.inboxes if not b.pieces]
        full = [r.name for r in self.regsts if r.free() <= 0]
        why = ([f"waits for {empty}"] if empty else []) + ([f"no free slot in {full}"] if full else [])
        return head + ("; ".join(why) or "ready")


class DeviceActor(Actor):
    """An actor on a device stream: pieces are ``(value, event, stream)``; an act waits (on the
    device) for the events of inputs made on other streams, runs with its stream current, and
    records one event for everything it produced. The caller's feeds arrive as plain values."""

    def __init__(self, *args: Any, device: DeviceStream, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.device = device

    def _act(self) -> None:
        i, dev = self.acted, self.device
        values = []
        for box in self.inboxes:
            piece = box.pieces.popleft()
            if box.producer is None:                  # a feed from the caller: made on its stream
                values.append(piece)
                continue
            values.append(self.unwrap(piece, dev, box.bundled))
        with dev.activate():
            out = self._call(i, values if self._args is None else self._args(values))
            if out is None:
                return
            event = dev.record()
        self._announce(i, [(out if pick is None else pick(out), event, dev) for pick in self._picks])

    @staticmethod
    def unwrap(piece: tuple, on: DeviceStream, bundled: bool) -> Any:
        """A piece's value (a bundle's tuple of values), made safe to use on stream ``on`` from now on."""
        value, event, made_on = piece
        if made_on is not on:
            if event is not None:
                on.wait(event)
            for v in value if bundled else (value,):
                on.keep(v)
        return value


def _selector(spec: list[tuple[int, int | None]]) -> Callable[[list], list]:
    """Popped pieces -> fn's arguments: for each ``(k, j)`` of ``spec``, value ``j`` of the bundle
    popped from inbox ``k`` (``j`` None: the piece is the value)."""
    return lambda pieces: [pieces[k] if j is None else pieces[k][j] for k, j in spec]


def _picker(idx: list[int], n: int) -> Callable[[tuple], Any] | None:
    """fn's output tuple (``n`` values) -> the piece holding values ``idx``: the value itself for one
    index, a tuple for several (None: the output tuple as it is)."""
    if len(idx) == 1:
        return itemgetter(idx[0])
    return None if idx == list(range(n)) else itemgetter(*idx)
