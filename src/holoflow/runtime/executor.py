"""The sequential executor: the reference semantics of a plan, one task after another on the caller's
thread, in topological order, one iteration at a time. The actor runtime must match it bit for bit.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .errors import TaskError
from .plan import SOURCE_STREAM, Plan, PlanError, TaskSpec
from .timeline import Act, Timeline


def call_task(task: TaskSpec, values: tuple | list, iteration: int) -> tuple:
    """Runs ``task.fn(*values)`` and checks it returned one value per produced regst; any failure
    becomes a `TaskError` naming the task, stream, iteration and source line."""
    try:
        out = task.fn(*values)
        if type(out) is not tuple or len(out) != len(task.produces):
            out = as_result(out, task.produces)
    except Exception as e:
        raise TaskError(task.name, task.stream, iteration, task.source, e) from e
    return out


def as_result(out: Any, produces: tuple[str, ...]) -> tuple:
    """``out`` as a tuple of one value per produced regst, or a TypeError saying what fn returned."""
    if isinstance(out, (tuple, list)) and len(out) == len(produces):
        return tuple(out)
    got = f"a {type(out).__name__} of length {len(out)}" if isinstance(out, (tuple, list)) \
        else f"a {type(out).__name__}"
    raise TypeError(f"fn must return a tuple of {len(produces)} value(s) for {list(produces)}, got {got}")


def check_feed(plan: Plan, feed: Mapping[str, Any], iteration: int) -> None:
    """Raises `PlanError` unless ``feed`` holds exactly the plan's inputs."""
    if type(feed) is dict and len(feed) == len(plan.inputs) and all(r in feed for r in plan.inputs):
        return
    if not isinstance(feed, Mapping) or set(feed) != set(plan.inputs):
        keys = sorted(feed) if isinstance(feed, Mapping) else type(feed).__name__
        raise PlanError(f"feed for iteration {iteration} must be a dict with exactly the inputs "
                        f"{list(plan.inputs)}, got {keys}")


class SequentialExecutor:
    """Runs a plan in topological order on the calling thread; carries state across calls.

    >>> ex = SequentialExecutor(plan)
    >>> outs = ex.run([{"x": x0}, {"x": x1}])      # one output dict per feed dict
    >>> ex.state["w"]                              # loop-carried value after the last iteration
    """

    def __init__(self, plan: Plan, *, trace: bool = False) -> None:
        self.plan = plan
        self._order = plan.topo_order()
        self._state: dict[str, Any] = dict(plan.initial)
        self.iteration = 0
        self.timeline: Timeline | None = Timeline() if trace else None
        self._lanes = {s: self.timeline.lane(s) for s in (SOURCE_STREAM, *(t.stream for t in plan.tasks))} \
            if self.timeline else {}

    @property
    def state(self) -> dict[str, Any]:
        """The loop-carried regsts as the next iteration will read them."""
        return dict(self._state)

    def step(self, feed: Mapping[str, Any]) -> dict[str, Any]:
        """Runs one iteration and returns its outputs."""
        i = self.iteration
        check_feed(self.plan, feed, i)
        env: dict[str, Any] = {**self._state, **feed}
        carried: dict[str, Any] = {}
        timeline = self.timeline
        for task in self._order:
            t0 = time.perf_counter() if timeline else 0.0
            out = call_task(task, [env[r] for r in task.consumes], i)
            for r, v in zip(task.produces, out):
                (carried if r in self._state else env)[r] = v
            if timeline:
                self._lanes[task.stream].append(Act(task.name, task.stream, i, t0 - timeline.t0,
                                                    time.perf_counter() - timeline.t0))
        self._state.update(carried)
        self.iteration += 1
        return {r: carried[r] if r in carried else env[r] for r in self.plan.outputs}

    def stream(self, feeds: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
        """Yields the outputs of each iteration, one per feed dict."""
        for feed in feeds:
            yield self.step(feed)

    def run(self, feeds: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The outputs of every iteration, in order."""
        return list(self.stream(feeds))

    __call__ = step

    def write_trace(self, path: str) -> None:
        """Writes the recorded acts as a Chrome/Perfetto trace (needs ``trace=True``)."""
        _need(self.timeline).write(path)

    def trace_table(self) -> str:
        """Per-task count, total, mean and share of wall time (needs ``trace=True``)."""
        return _need(self.timeline).table()

    def close(self) -> None:
        """Nothing to release; here so both executors are interchangeable."""

    def __enter__(self) -> SequentialExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _need(timeline: Timeline | None) -> Timeline:
    if timeline is None:
        raise RuntimeError("no trace recorded: construct the executor with trace=True")
    return timeline
