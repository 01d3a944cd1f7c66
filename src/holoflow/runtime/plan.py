"""The plan: tasks that produce and consume named regsts, checked once when it is built.

A `Plan` is the contract between the graph compiler (which lowers an IR into tasks) and the
executors (`SequentialExecutor`, the reference, and `Runtime`, the actor runtime). See the package
docstring (`holoflow.runtime`) for the semantics; this module holds the records and the checker.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..core.errors import HoloflowError

SOURCE_STREAM = "source"     # the stream thread of the source (feeds) and sink (outputs) actors
SOURCE = "<source>"          # the source actor's name (in traces and errors)
SINK = "<sink>"              # the sink actor's name
TICK = "<tick>"              # the source's hidden per-iteration regst gating tasks that read no feed


class PlanError(HoloflowError, ValueError):
    """A plan that cannot run: a missing producer, a cycle without an initial value, a deadlock."""


@dataclass(frozen=True, eq=False)
class TaskSpec:
    """One task (one actor): ``fn(*values of consumes) -> tuple of values of produces``.

    ``register_num`` is the number of slots of each regst this task produces: how many pieces
    (iterations) of it may be in flight at once. ``source`` is the user's source line, quoted in
    errors; ``meta`` is free-form information for tools (never read by the executors).
    ``priority`` below 0 makes the task's acts yield: on a worker thread they run only when no
    other message of that worker is waiting (work that may fill idle time, such as deferred
    weight gradients); the sequential executor ignores it.

    >>> TaskSpec("fwd", "compute", lambda x, w: (x @ w,), consumes=("x", "w"), produces=("y",))
    """

    name: str
    stream: str
    fn: Callable[..., tuple]
    consumes: tuple[str, ...] = ()
    produces: tuple[str, ...] = ()
    register_num: int = 1
    source: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 0      # < 0: acts only when its worker has no other message waiting

    def __post_init__(self) -> None:
        object.__setattr__(self, "consumes", tuple(self.consumes))
        object.__setattr__(self, "produces", tuple(self.produces))
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))

    def where(self) -> str:
        """``task 'fwd' (stream 'compute')`` plus the source line when known: for error messages."""
        s = f"task {self.name!r} (stream {self.stream!r})"
        return s + (f" from `{self.source}`" if self.source else "")


@dataclass(frozen=True, eq=False)
class Plan:
    """Tasks plus the regsts the caller feeds (``inputs``), reads (``outputs``) and pre-fills
    for iteration 0 (``initial``, the loop-carried state). Checked on construction.

    ``input_register_num`` is the number of slots of each input regst: how many iterations the
    source may run ahead of the tasks that consume its feeds.
    """

    tasks: tuple[TaskSpec, ...]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    initial: Mapping[str, Any] = field(default_factory=dict)
    input_register_num: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "initial", MappingProxyType(dict(self.initial)))
        check_plan(self)

    @property
    def producers(self) -> dict[str, TaskSpec]:
        """Regst name -> the task producing it (inputs are produced by the source, not listed)."""
        return {r: t for t in self.tasks for r in t.produces}

    def consumers(self, regst: str) -> tuple[TaskSpec, ...]:
        """The tasks consuming ``regst`` (the sink, reading outputs, is not listed)."""
        return tuple(t for t in self.tasks if regst in t.consumes)

    def needs_tick(self, task: TaskSpec) -> bool:
        """Whether ``task`` is gated by the source's hidden per-iteration tick: true when none of
        its consumed regsts is produced within the iteration (it reads only loop-carried state,
        or nothing), so that it never runs an iteration the caller did not feed."""
        return all(r in self.initial for r in task.consumes)

    def topo_order(self) -> tuple[TaskSpec, ...]:
        """Tasks in an order where every within-iteration producer precedes its consumers."""
        return _topo_order(self)

    def __repr__(self) -> str:
        lines = [f"Plan(inputs={list(self.inputs)}, outputs={list(self.outputs)}, "
                 f"initial={list(self.initial)}, input_register_num={self.input_register_num})"]
        for t in self.tasks:
            lines.append(f"  {t.stream:>8} | {', '.join(t.produces) or '-'} = {t.name}"
                         f"({', '.join(t.consumes)})  register_num={t.register_num}")
        return "\n".join(lines)


def check_plan(plan: Plan) -> None:
    """Raises `PlanError` unless ``plan`` is well formed and runs without deadlock.

    Checks: unique task names; each regst produced once (inputs by the source); every consumed
    regst and output has a producer; initial regsts are produced by a task (the next value);
    no cycle through within-iteration regsts; the slot counts let every task act (a task that
    consumes a loop-carried regst it or its upstream produces needs ``register_num >= 2``).
    """
    _check_names(plan)
    _check_producers(plan)
    _topo_order(plan)
    _check_live(plan)


def _check_names(plan: Plan) -> None:
    seen: set[str] = set()
    for t in plan.tasks:
        if not isinstance(t, TaskSpec):
            raise PlanError(f"plan tasks must be TaskSpec, got {type(t).__name__}")
        if t.name in seen or t.name in (SOURCE, SINK):
            raise PlanError(f"task name {t.name!r} is used twice (or reserved); task names must be unique")
        seen.add(t.name)
        if not callable(t.fn):
            raise PlanError(f"{t.where()}: fn is not callable ({type(t.fn).__name__})")
        if not isinstance(t.register_num, int) or t.register_num < 1:
            raise PlanError(f"{t.where()}: register_num must be an int >= 1, got {t.register_num!r}")
        for what, names in (("consumes", t.consumes), ("produces", t.produces)):
            if len(set(names)) != len(names):
                raise PlanError(f"{t.where()}: {what} names a regst twice: {list(names)}")
    for what, names in (("inputs", plan.inputs), ("outputs", plan.outputs)):
        if len(set(names)) != len(names):
            raise PlanError(f"plan {what} name a regst twice: {list(names)}")
    if not isinstance(plan.input_register_num, int) or plan.input_register_num < 1:
        raise PlanError(f"input_register_num must be an int >= 1, got {plan.input_register_num!r}")


def _check_producers(plan: Plan) -> None:
    producer: dict[str, str] = {r: "the source (an input)" for r in plan.inputs}
    for t in plan.tasks:
        for r in t.produces:
            if r in producer:
                raise PlanError(f"regst {r!r} is produced by {producer[r]} and by {t.where()}; "
                                f"each regst has exactly one producer")
            producer[r] = t.where()
    for r in plan.initial:
        if r in plan.inputs:
            raise PlanError(f"regst {r!r} is both an input and initial; an input is fed every iteration")
        if r not in producer:
            raise PlanError(f"initial regst {r!r} has no producer: loop-carried state needs a task that "
                            f"produces its next value (bind constants inside the task fn instead)")
    for t in plan.tasks:
        for r in t.consumes:
            if r not in producer:
                raise PlanError(f"{t.where()} consumes regst {r!r}, which no task produces and which "
                                f"is neither an input nor initial")
    for r in plan.outputs:
        if r not in producer:
            raise PlanError(f"output {r!r} is produced by no task and is not an input")


def _topo_order(plan: Plan) -> tuple[TaskSpec, ...]:
    """Kahn's algorithm over within-iteration edges (regsts without an initial value), stable in
    plan order; a leftover names the cycle."""
    prod = {r: t for t in plan.tasks for r in t.produces if r not in plan.initial}
    deps = {t.name: {prod[r].name for r in t.consumes if r in prod} for t in plan.tasks}
    order: list[TaskSpec] = []
    done: set[str] = set()
    pending = list(plan.tasks)
    while pending:
        ready = [t for t in pending if deps[t.name] <= done]
        if not ready:
            raise PlanError(f"cycle without an initial value through tasks {_cycle(pending, deps)}; "
                            f"give one regst on the cycle an initial value (a loop-carried back-edge)")
        for t in ready:
            order.append(t)
            done.add(t.name)
        pending = [t for t in pending if t.name not in done]
    return tuple(order)


def _cycle(pending: list[TaskSpec], deps: dict[str, set[str]]) -> list[str]:
    left = {t.name for t in pending}
    path, node = [], pending[0].name
    while node not in path:
        path.append(node)
        node = sorted(deps[node] & left)[0]
    return path[path.index(node):] + [node]


def _check_live(plan: Plan) -> None:
    """Plays one iteration of the act rule on slot counters (no fn is called).

    Regsts and slots form a marked graph: if every actor can act once, the counters return to
    their start and the plan runs forever; the act rule is persistent (acting never disables
    another actor), so the order tried does not matter. Otherwise, name who waits for what.
    """
    actors = [(t.name, t.consumes + (TICK,) * plan.needs_tick(t), t.produces, t.register_num) for t in plan.tasks]
    sink_reads = tuple(plan.outputs) or (TICK,)
    consumers: dict[str, list[str]] = {r: [] for r in (*plan.inputs, TICK, *plan.producers)}
    for name, cons, _, _ in actors:
        for r in cons:
            consumers[r].append(name)
    for r in sink_reads:
        consumers[r].append(SINK)
    slots = {r: t.register_num for t in plan.tasks for r in t.produces}
    slots |= {r: plan.input_register_num for r in (*plan.inputs, TICK)}
    # readable[(regst, consumer)] and inflight[regst]: pieces written but not returned by all.
    readable = {(r, c): int(r in plan.initial and c != SINK) for r, cs in consumers.items() for c in cs}
    returned = {(r, c): int(r in plan.initial and c == SINK) for r, cs in consumers.items() for c in cs}
    produced = {r: int(r in plan.initial) for r in consumers}

    def free(r: str) -> int:
        least = min((returned[(r, c)] for c in consumers[r]), default=produced[r])
        return slots[r] - (produced[r] - least)

    def can_act(cons: tuple[str, ...], prods: tuple[str, ...], name: str) -> bool:
        return all(readable[(r, name)] > 0 for r in cons) and all(free(r) > 0 for r in prods)

    todo = [(SOURCE, (), (*plan.inputs, TICK), 0)] + actors + [(SINK, sink_reads, (), 0)]
    progress = True
    while todo and progress:
        progress = False
        for a in list(todo):
            name, cons, prods, _ = a
            if can_act(cons, prods, name):
                for r in cons:
                    readable[(r, name)] -= 1
                    returned[(r, name)] += 1
                for r in prods:
                    produced[r] += 1
                    for c in consumers[r]:
                        readable[(r, c)] += 1
                todo.remove(a)
                progress = True
    if todo:
        raise PlanError("plan deadlocks: " + "; ".join(_why_blocked(a, readable, free, consumers, slots)
                                                       for a in todo))


def _why_blocked(actor: tuple, readable: dict, free: Callable[[str], int], consumers: dict, slots: dict) -> str:
    name, cons, prods, _ = actor
    full = [r for r in prods if free(r) <= 0]
    if full:
        r = full[0]
        return (f"task {name!r} needs a free slot of regst {r!r} (register_num={slots[r]}) still held by "
                f"{sorted(set(consumers[r]))}; raise its register_num")
    empty = [r for r in cons if readable[(r, name)] <= 0]
    return f"task {name!r} waits for regst {empty[0]!r}" if empty else f"task {name!r} is blocked"
