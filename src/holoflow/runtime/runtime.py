"""The actor runtime: one actor per task, workers running the actors of their streams, no central
scheduler.

Every act happens on a worker in reaction to a message (see `actor.py`): a thread per stream by
default; ``threads`` maps streams onto shared workers, and the worker `CALLER` is the caller's own
thread, which runs its actors while it waits for outputs (the graph lowering puts a CPU device's
streams there: one thread runs its kernels, one intra-op pool, no hand-off per act). ``devices``
makes streams device streams ordered by events (`streams.DeviceStream`).
"""
from __future__ import annotations

import atexit
import queue
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .actor import Actor, DeviceActor
from .errors import RuntimeStall, TaskError
from .executor import check_feed
from .plan import SINK, SOURCE, SOURCE_STREAM, TICK, Plan
from .regst import Inbox, Regst
from .streams import CALLER, DeviceStream, Worker
from .timeline import Timeline

_POLL_S = 0.2          # how often a waiting caller checks for stalls and dead threads


class Runtime:
    """Runs a plan on actors; carries loop-carried state across `run` calls.

    >>> with Runtime(plan, trace=True) as rt:
    ...     outs = rt.run({"x": x} for x in batches)   # source feeds i+1 while tasks work on i
    ...     print(rt.trace_table()); rt.write_trace("trace.json")

    ``timeout``: seconds without any act, while a run waits, before `RuntimeStall` (None: never).
    ``threads``: stream name -> worker name (default: a thread per stream, named after it; the
    source and sink run on stream ``'source'``); `CALLER` runs a stream on the caller's thread.
    ``devices``: stream name -> `DeviceStream`, for every stream and ``'source'`` (the caller's
    stream), or None for host streams. ``on_start`` runs first on every worker thread (to size
    its intra-op pool, say).
    """

    def __init__(self, plan: Plan, *, trace: bool = False, timeout: float | None = 300.0,
                 threads: Mapping[str, str] | None = None, devices: Mapping[str, DeviceStream] | None = None,
                 on_start: Callable[[], None] | None = None) -> None:
        self.plan = plan
        self.timeout = timeout
        self.timeline: Timeline | None = Timeline() if trace else None
        self.results: deque = deque()  # ("out", i, dict) | ("error", e) | ("done", name, n), on the caller
        self.failed = False
        self.target = -1              # actors report ("done", name, n) when they reach n acts
        self.iteration = 0            # iterations fed so far
        self._error: BaseException | None = None
        self._closed = False
        self._running = False
        streams = list(dict.fromkeys([SOURCE_STREAM, *(t.stream for t in plan.tasks)]))
        self.threads = _check_threads(streams, threads or {})
        self.devices = _check_devices(streams, devices)
        self.caller = Worker(CALLER, self._crash)
        self.workers = {CALLER: self.caller}
        for s in streams:
            w = self.threads[s]
            if w not in self.workers:
                self.workers[w] = Worker(w, self._crash, on_start)
        self.actors = self._build()
        for w in self.workers.values():
            w.start()
        if any(w.thread is not None for w in self.workers.values()):
            _OPEN.add(self)

    # -- wiring -----------------------------------------------------------------------------
    def _actor(self, name: str, stream: str, fn: Any, source: str | None = None) -> Actor:
        lane = self.timeline.lane(stream) if self.timeline else None
        worker = self.workers[self.threads[stream]]
        if self.devices is not None:
            return DeviceActor(name, stream, worker, fn, self, lane, source, device=self.devices[stream])
        return Actor(name, stream, worker, fn, self, lane, source)

    def _build(self) -> list[Actor]:
        plan = self.plan
        inputs = plan.inputs
        self.source = self._actor(SOURCE, SOURCE_STREAM, lambda feed: (*(feed[r] for r in inputs), None))
        self.source.inboxes.append(Inbox(None, -1, -1))          # feeds, posted by the caller
        tasks = [self._actor(t.name, t.stream, t.fn, t.source) for t in plan.tasks]
        for t, a in zip(plan.tasks, tasks):
            a.set_priority(getattr(t, "priority", 0))
        self.sink = self._actor(SINK, SOURCE_STREAM, self._deliver)
        reads = [(a, t.consumes + (TICK,) * plan.needs_tick(t)) for t, a in zip(plan.tasks, tasks)]
        reads.append((self.sink, plan.outputs or (TICK,)))
        self._owner = self._bundle([(self.source, (*inputs, TICK), plan.input_register_num)] +
                                   [(a, t.produces, t.register_num) for t, a in zip(plan.tasks, tasks)], reads)
        for consumer, names in reads:       # one inbox per regst read, however many of its values
            regsts = {id(regst): (producer, regst) for producer, regst, _ in map(self._owner.get, names)}
            for producer, regst in regsts.values():
                self._connect(producer, regst, consumer, skip_first=consumer is self.sink and regst.keep)
        for producer in (self.source, *tasks):
            for regst in producer.regsts:
                if regst.keep:
                    self._prefill(regst)
        self.source.wired(None)
        for t, a in zip(plan.tasks, tasks):
            a.wired(t.consumes)
        self.sink.wired(plan.outputs)
        return [self.source, *tasks, self.sink]

    def _bundle(self, producers: list[tuple[Actor, tuple[str, ...], int]],
                reads: list[tuple[Actor, tuple[str, ...]]]) -> dict[str, tuple[Actor, Regst, int]]:
        """Makes each producer's regsts: one per set of consumers (loop-carried values apart), in
        order of first value. Returns plan regst -> (producer, its regst, position in the piece).
        Values nobody reads and no state keeps get no regst (the act drops them)."""
        readers: dict[str, list[int]] = {}
        for k, (_, names) in enumerate(reads):
            for r in names:
                readers.setdefault(r, []).append(k)
        owner: dict[str, tuple[Actor, Regst, int]] = {}
        for actor, names, register_num in producers:
            actor.produces = names
            groups: dict[tuple, list[str]] = {}
            for r in names:
                key = (tuple(readers.get(r, ())), r in self.plan.initial)
                if key != ((), False):
                    groups.setdefault(key, []).append(r)
            for (_, keep), members in groups.items():
                regst = Regst(tuple(members), register_num, keep=keep)
                actor.regsts.append(regst)
                owner.update({r: (actor, regst, j) for j, r in enumerate(members)})
        return owner

    def _prefill(self, regst: Regst) -> None:
        """Piece 0 of a loop-carried regst: the initial values, readable by all but the sink."""
        values = tuple(self.plan.initial[r] for r in regst.names)
        value = values if len(values) > 1 else values[0]
        piece = value if self.devices is None else (value, None, None)
        regst.produced, regst.last = 1, piece
        for consumer, k in regst.consumers:
            if consumer is not self.sink:
                consumer.inboxes[k].pieces.append(piece)

    @staticmethod
    def _connect(producer: Actor, regst: Regst, consumer: Actor, skip_first: bool) -> None:
        k = regst.add_consumer(consumer, len(consumer.inboxes), skip_first)
        consumer.inboxes.append(Inbox(producer, producer.regsts.index(regst), k))

    def _deliver(self, *values: Any) -> tuple:
        self.note(("out", self.sink.acted, dict(zip(self.plan.outputs, values))), self.sink.worker)
        return ()

    def note(self, msg: tuple, worker: Worker) -> None:
        """A message for the waiting caller, sent from an actor running on ``worker``."""
        if worker is self.caller:
            self.results.append(msg)
        else:
            self.caller.queue.put((_note, self.results, msg))

    # -- failure ----------------------------------------------------------------------------
    def fail(self, error: BaseException) -> None:
        """Called on a worker when an act fails: stop acting, tell the waiting caller."""
        self.failed = True
        self.caller.queue.put((_note, self.results, ("error", error)))

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
        caller, source_worker, on_feed = self.caller, self.source.worker, self.source.on_ready
        yielded, exhausted, window = start, False, self.window
        try:
            while True:
                while not exhausted and self.iteration - yielded < window:
                    feed = next(it, _END)
                    if feed is _END:
                        exhausted = True
                        break
                    check_feed(self.plan, feed, self.iteration)
                    if source_worker is caller:
                        caller.local.append((on_feed, 0, feed))
                    else:
                        source_worker.queue.put((on_feed, 0, feed))
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
        state = {}
        for r in self.plan.initial:
            _, regst, j = self._owner[r]
            bundled = len(regst.names) > 1
            value = regst.last if self.devices is None else \
                self.sink.unwrap(regst.last, self.devices[SOURCE_STREAM], bundled)
            state[r] = value[j] if bundled else value
        return state

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
        """The next wanted message; raises the actors' error, or `RuntimeStall` when nothing acts.
        Meanwhile the caller runs the messages of its own worker's actors."""
        results, local, get = self.results, self.caller.local, self.caller.queue.get
        last, since = -1, time.monotonic()
        while True:
            while results:
                msg = results.popleft()
                if msg[0] == "error":
                    self._raise(msg[1])
                if wanted(msg):
                    return msg
            if local:
                m = local.popleft()
            else:
                try:
                    m = get(timeout=_POLL_S)
                except queue.Empty:
                    acts = sum(a.acted for a in self.actors)
                    if acts != last:
                        last, since = acts, time.monotonic()
                    elif self.timeout is not None and time.monotonic() - since > self.timeout:
                        self._raise(RuntimeStall(f"no actor acted for {self.timeout}s; waiting:\n  " +
                                                 "\n  ".join(a.waiting_for() for a in self.actors)))
                    dead = [w.name for w in self.workers.values() if not w.alive()]
                    if dead:
                        self._raise(RuntimeError(f"holoflow runtime: stream thread(s) {dead} died"))
                    continue
            try:
                m[0](m[1], m[2])
            except Exception as e:       # a bug in the runtime itself, on the caller's worker
                err = RuntimeError(f"holoflow runtime: internal error on the caller's thread: "
                                   f"{type(e).__name__}: {e}")
                err.__cause__ = e
                self._raise(err)

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
        """Stops the worker threads and joins them; idempotent."""
        if self._closed:
            return
        self._closed = self.failed = True
        for w in self.workers.values():
            w.stop()
        threads = [w.thread for w in self.workers.values() if w.thread is not None]
        for t in threads:
            t.join(join_timeout)
        alive = [t.name for t in threads if t.is_alive()]
        if alive:       # a task fn that never returns; the threads are daemons and die with the process
            warnings.warn(f"holoflow runtime: stream thread(s) {alive} did not stop within {join_timeout}s",
                          RuntimeWarning, stacklevel=2)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_END = object()

# Runtimes with stream threads still running: closed before the interpreter finalizes. A daemon
# thread left parked in a queue while Python shuts down can be torn down inside torch's C++
# frames, which aborts the process ("terminate called without an active exception") after the
# program itself has finished.
_OPEN: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_runtimes() -> None:
    for rt in list(_OPEN):
        rt.close(join_timeout=2.0)


def _note(results: deque, msg: tuple) -> None:
    results.append(msg)


def _check_threads(streams: list[str], threads: Mapping[str, str]) -> dict[str, str]:
    unknown = sorted(set(threads) - set(streams))
    if unknown:
        raise ValueError(f"Runtime(threads=...): {unknown} name no stream of the plan; streams: {streams}")
    bad = {s: w for s, w in threads.items() if not isinstance(w, str) or not w}
    if bad:
        raise ValueError(f"Runtime(threads=...): worker names must be non-empty strings, got {bad}")
    return {s: threads.get(s, s if s != CALLER else f"{s}-stream") for s in streams}


def _check_devices(streams: list[str], devices: Mapping[str, DeviceStream] | None) -> dict | None:
    if devices is None:
        return None
    missing = [s for s in streams if s not in devices]
    if missing:
        raise ValueError(f"Runtime(devices=...): every stream needs a device stream (the source's is "
                         f"the caller's stream); missing {missing}")
    return dict(devices)


def _need(timeline: Timeline | None) -> Timeline:
    if timeline is None:
        raise RuntimeError("no trace recorded: construct the runtime with trace=True")
    return timeline
