"""The actor runtime: one actor per task, one thread per stream, no central scheduler.

The caller's thread only posts feeds to the source actor and collects what the sink actor delivers;
every act happens on a stream thread in reaction to a message (see `actor.py`).
"""
from __future__ import annotations

import queue
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .actor import Actor
from .errors import RuntimeStall, TaskError
from .executor import check_feed
from .plan import SINK, SOURCE, SOURCE_STREAM, TICK, Plan
from .regst import Inbox, Regst
from .streams import Stream
from .timeline import Timeline

_POLL_S = 0.2          # how often a waiting caller checks for stalls and dead threads


class Runtime:
    """Runs a plan on actors; carries loop-carried state across `run` calls.

    >>> with Runtime(plan, trace=True) as rt:
    ...     outs = rt.run({"x": x} for x in batches)   # source feeds i+1 while tasks work on i
    ...     print(rt.trace_table()); rt.write_trace("trace.json")

    ``timeout``: seconds without any act, while a run waits, before `RuntimeStall` (None: never).
    """

    def __init__(self, plan: Plan, *, trace: bool = False, timeout: float | None = 300.0) -> None:
        self.plan = plan
        self.timeout = timeout
        self.timeline: Timeline | None = Timeline() if trace else None
        self.results: queue.SimpleQueue = queue.SimpleQueue()   # ("out", i, dict) | ("error", e) | ("done", ...)
        self.failed = False
        self.target = -1              # actors report ("done", name, n) when they reach n acts
        self.iteration = 0            # iterations fed so far
        self._error: BaseException | None = None
        self._closed = False
        self._running = False
        names = dict.fromkeys([SOURCE_STREAM, *(t.stream for t in plan.tasks)])
        self.streams = {s: Stream(s, self._crash) for s in names}
        self.actors = self._build()
        for s in self.streams.values():
            s.start()

    # -- wiring -----------------------------------------------------------------------------
    def _actor(self, name: str, stream: str, fn: Any, source: str | None = None) -> Actor:
        lane = self.timeline.lane(stream) if self.timeline else None
        return Actor(name, self.streams[stream], fn, self, lane, source)

    def _build(self) -> list[Actor]:
        plan = self.plan
        inputs = plan.inputs
        self.source = self._actor(SOURCE, SOURCE_STREAM, lambda feed: (*(feed[r] for r in inputs), None))
        self.source.inboxes.append(Inbox(None, -1, -1, True))          # feeds, posted by the caller
        owner: dict[str, tuple[Actor, Regst]] = {}
        for r in (*inputs, TICK):
            owner[r] = (self.source, self._regst(self.source, r, plan.input_register_num))
        tasks = [self._actor(t.name, t.stream, t.fn, t.source) for t in plan.tasks]
        for t, a in zip(plan.tasks, tasks):
            for r in t.produces:
                owner[r] = (a, self._regst(a, r, t.register_num))
        for t, a in zip(plan.tasks, tasks):
            for r in t.consumes + (TICK,) * plan.needs_tick(t):
                self._connect(owner[r], a, passed=r != TICK, skip_first=False)
        outputs = plan.outputs
        self.sink = self._actor(SINK, SOURCE_STREAM, self._deliver)
        for r in outputs or (TICK,):
            self._connect(owner[r], self.sink, passed=r != TICK, skip_first=r in plan.initial)
        for r, value in plan.initial.items():
            actor, regst = owner[r]
            regst.produced, regst.last = 1, value
            for consumer, k in regst.consumers:
                if consumer is not self.sink:
                    consumer.inboxes[k].pieces.append(value)
        return [self.source, *tasks, self.sink]

    def _regst(self, actor: Actor, name: str, register_num: int) -> Regst:
        regst = Regst(name, register_num, keep=name in self.plan.initial)
        actor.regsts.append(regst)
        return regst

    @staticmethod
    def _connect(owner: tuple[Actor, Regst], consumer: Actor, passed: bool, skip_first: bool) -> None:
        producer, regst = owner
        k = regst.add_consumer(consumer, len(consumer.inboxes), skip_first)
        consumer.inboxes.append(Inbox(producer, producer.regsts.index(regst), k, passed))

    def _deliver(self, *values: Any) -> tuple:
        self.results.put(("out", self.sink.acted, dict(zip(self.plan.outputs, values))))
        return ()

    # -- failure ----------------------------------------------------------------------------
    def fail(self, error: BaseException) -> None:
        """Called on a stream thread when an act fails: stop acting, tell the waiting caller."""
        self.failed = True
        self.results.put(("error", error))

    def _crash(self, stream: str, e: BaseException) -> None:
        err = RuntimeError(f"holoflow runtime: internal error on stream {stream!r}: {type(e).__name__}: {e}")
        err.__cause__ = e
        self.fail(err)

    # -- running ----------------------------------------------------------------------------
    def stream(self, feeds: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
        """Yields each iteration's outputs in order while later iterations are already fed.

        Leaving early (``break``) still finishes the iterations already fed, so the state stays
        consistent. At most `window` feeds are taken from ``feeds`` ahead of the last output.
        """
        self._check_usable()
        self._running = True
        it, start = iter(feeds), self.iteration
        yielded, exhausted, window = start, False, self.window
        try:
            while True:
                while not exhausted and self.iteration - yielded < window:
                    feed = next(it, _END)
                    if feed is _END:
                        exhausted = True
                        break
                    check_feed(self.plan, feed, self.iteration)
                    self.source.stream.queue.put((self.source.on_ready, 0, feed))
                    self.iteration += 1
                if yielded == self.iteration:
                    break
                out = self._next_output(yielded)
                yielded += 1
                yield out
            self._quiesce()
        except (Exception, GeneratorExit):
            if yielded < self.iteration and not self._closed:    # left early: finish what was fed
                while yielded < self.iteration:
                    self._next_output(yielded)
                    yielded += 1
                self._quiesce()
            raise
        except BaseException:                                     # KeyboardInterrupt: stop now
            self.close()
            raise
        finally:
            self._running = False

    def run(self, feeds: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The outputs of every iteration, in order (`stream` collected)."""
        return list(self.stream(feeds))

    def __call__(self, feed: Mapping[str, Any]) -> dict[str, Any]:
        """Runs one iteration."""
        return self.run([feed])[0]

    @property
    def window(self) -> int:
        """How many feeds the caller posts ahead of the outputs it has returned: more than the
        slots can hold, so the source is never starved; the slots do the real bounding."""
        return self.plan.input_register_num + sum(t.register_num for t in self.plan.tasks) + 1

    @property
    def state(self) -> dict[str, Any]:
        """The loop-carried regsts as the next iteration will read them (between runs)."""
        if self._running:
            raise RuntimeError("Runtime.state is only defined between runs")
        return {r: _newest(self.actors, r) for r in self.plan.initial}

    def _next_output(self, i: int) -> dict[str, Any]:
        msg = self._wait(lambda m: m[0] == "out")
        assert msg[1] == i, f"sink delivered iteration {msg[1]}, expected {i}"
        return msg[2]

    def _quiesce(self) -> None:
        """Waits until every actor has acted once per fed iteration (state is then final)."""
        n = self.target = self.iteration
        done = {a.name for a in self.actors if a.acted >= n}
        while len(done) < len(self.actors):
            msg = self._wait(lambda m: m[0] == "done" and m[2] == n)
            done.add(msg[1])

    def _wait(self, wanted: Any) -> tuple:
        """The next wanted message; raises the actors' error, or `RuntimeStall` when nothing acts."""
        last, since = -1, time.monotonic()
        while True:
            try:
                msg = self.results.get(timeout=_POLL_S)
            except queue.Empty:
                acts = sum(a.acted for a in self.actors)
                if acts != last:
                    last, since = acts, time.monotonic()
                elif self.timeout is not None and time.monotonic() - since > self.timeout:
                    self._raise(RuntimeStall(f"no actor acted for {self.timeout}s; waiting:\n  " +
                                             "\n  ".join(a.waiting_for() for a in self.actors)))
                dead = [s.name for s in self.streams.values() if not s.thread.is_alive()]
                if dead:
                    self._raise(RuntimeError(f"holoflow runtime: stream thread(s) {dead} died"))
                continue
            if msg[0] == "error":
                self._raise(msg[1])
            if wanted(msg):
                return msg

    def _raise(self, error: BaseException) -> None:
        self._error = error
        self.close()
        if isinstance(error, TaskError):
            raise error from error.__cause__
        raise error

    def _check_usable(self) -> None:
        if self._running:
            raise RuntimeError("Runtime.run is not reentrant: a run is already in progress")
        if self._closed:
            why = f" after a failure: {self._error}" if self._error else ""
            raise RuntimeError(f"the runtime is closed{why}")

    # -- profiling --------------------------------------------------------------------------
    def write_trace(self, path: str) -> None:
        """Writes every act as a Chrome/Perfetto trace JSON (needs ``trace=True``)."""
        _need(self.timeline).write(path)

    def trace_table(self) -> str:
        """Per-actor count, total, mean and share of wall time (needs ``trace=True``)."""
        return _need(self.timeline).table()

    # -- shutdown ---------------------------------------------------------------------------
    def close(self, join_timeout: float = 10.0) -> None:
        """Stops the stream threads and joins them; idempotent."""
        if self._closed:
            return
        self._closed = self.failed = True
        for s in self.streams.values():
            s.stop()
        for s in self.streams.values():
            s.thread.join(join_timeout)
        alive = [s.name for s in self.streams.values() if s.thread.is_alive()]
        if alive:       # a task fn that never returns; the threads are daemons and die with the process
            warnings.warn(f"holoflow runtime: stream thread(s) {alive} did not stop within {join_timeout}s",
                          RuntimeWarning, stacklevel=2)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_END = object()


def _newest(actors: list[Actor], regst: str) -> Any:
    for a in actors:
        for r in a.regsts:
            if r.name == regst:
                return r.last
    raise KeyError(regst)


def _need(timeline: Timeline | None) -> Timeline:
    if timeline is None:
        raise RuntimeError("no trace recorded: construct the runtime with trace=True")
    return timeline
