"""schedule: global graphs issue their collectives as early as their inputs allow and read their
results as late as possible, so that communication overlaps compute.

Lowering cuts a task where a node reads a value another stream's task makes (``ir.split_tasks``),
and a task waits for all its inputs before it starts. In traced order, cross_entropy's global
'mean' denominator (an all-reduce of a value computed from the targets only) sits in the middle
of the forward, so the rest of the forward and all of backward wait for it; a gradient bucket's
all-reduce starts only where the traced order happens to reach it. This pass reorders the nodes
by a list schedule over the data flow; among the nodes whose inputs are ready it takes, in order:

1. a collective (in traced order: every rank issues its collectives in one sequence);
2. a node some *hoisted* collective needs, for the earliest such collective first (its cone),
   a reduction of a computed value to a quarter of it or less before any cone's (its input
   need not wait for a later collective's cone);
3. any other node, except
4. nodes that read a collective's result: they wait until nothing else is ready.

Ties go to the traced order, so the result depends on the graph alone and every rank derives the
same schedule from the same logical graph. A collective reading state directly (a ZeRO-3
parameter all-gather, placed by its pass just before use) is not hoisted: issuing it earlier
would only keep the gathered parameter alive longer; nor is a checkpointed module's
recomputation (it would hold the activations checkpointing frees). Random nodes keep their
relative order (one RNG stream), and so do effect nodes. Reordering equations of a functional IR changes no value:
the scheduled graph's results are bit-equal to the traced order's.
"""
from __future__ import annotations

import heapq

from ...core.registry import REGISTRY
from ..ir import IRGraph, Node, talks
from . import register
from .checkpointing import RECOMPUTE

COLLECTIVE, CONE, OTHER, WAITER = range(4)   # ready-node classes, taken in this order


def _declares(n: Node, prop: str) -> bool:
    """Whether ``n``'s op declares ``prop`` (a collective also runs its registry kernel:
    ``ir.talks``; a fused node naming a random op counts as random)."""
    if prop == "collective":
        return talks(n)
    op = REGISTRY.get(n.op)
    return op is not None and bool(getattr(op, prop, False))


def _deps(nodes: tuple, state: set) -> list[set[int]]:
    """Per node, the indices it must follow: producers of its inputs, the previous node of its
    ordered kind (collectives, random draws, effects) whose relative order is kept, and, for a
    collective that is not hoisted or a recomputation (passes/checkpointing.py puts it just before
    the backward reads it: hoisted, it would hold what checkpointing frees), the node traced just
    before it (it stays where it was put)."""
    made = {v: i for i, n in enumerate(nodes) for v in n.outputs}
    last: dict[str, int] = {}
    deps = []
    for i, n in enumerate(nodes):
        d = {made[v] for v in n.value_inputs() if v in made}
        if i and ((_declares(n, "collective") and not _hoisted(n, state)) or RECOMPUTE in n.tags):
            d.add(i - 1)
        for kind in _ordered_kinds(n):
            if kind in last:
                d.add(last[kind])
            last[kind] = i
        deps.append(d)
    return deps


def _ordered_kinds(n: Node) -> list[str]:
    return [k for k, hit in (("collective", _declares(n, "collective")), ("random", _declares(n, "random")),
                             ("effect", n.effect)) if hit]


def _hoisted(n: Node, state: set) -> bool:
    """A collective worth issuing early: one whose inputs are computed (not read from state)."""
    return _declares(n, "collective") and not any(v in state for v in n.value_inputs())


def _cone_rank(nodes: tuple, deps: list[set[int]], state: set) -> list[int]:
    """Per node, the position (in traced order) of the earliest hoisted collective that needs it
    (``len(nodes)`` when none does)."""
    rank = [len(nodes)] * len(nodes)
    for c, n in enumerate(nodes):
        if not _hoisted(n, state):
            continue
        stack = [c]
        while stack:
            i = stack.pop()
            if rank[i] <= c:
                continue
            rank[i] = c
            stack.extend(deps[i])
    return rank


def _shrinks(n: Node, state: set) -> bool:
    """Whether ``n`` reduces a computed value to a quarter of it or less (a bias gradient's
    ``sum_to_size`` of a layer's output gradient)."""
    ins = [v.nbytes for v in n.value_inputs() if v not in state]
    return bool(ins) and 4 * sum(v.nbytes for v in n.outputs) <= max(ins)


def order(g: IRGraph) -> list[int]:
    """The scheduled order of ``g.nodes``, as indices (see the module docstring)."""
    nodes = g.nodes
    state = {v for v, _ in g.state}
    deps = _deps(nodes, state)
    cone = _cone_rank(nodes, deps, state)
    from_comm = {v for n in nodes if _declares(n, "collective") for v in n.outputs}
    shrinks = [_shrinks(n, state) for n in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    waiting = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)

    def key(i: int) -> tuple:
        n = nodes[i]
        if _declares(n, "collective"):
            return (COLLECTIVE, 0, i)
        if any(v in from_comm for v in n.value_inputs()):
            return (WAITER, cone[i], i)
        if cone[i] < len(nodes):   # (a reduction of a computed value, as soon as it can: its large
            return (CONE, -1 if shrinks[i] else cone[i], i)   # input need not wait for a later cone)
        return (OTHER, 0, i)

    ready = [key(i) for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)[-1]
        out.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, key(u))
    return out


def has_collectives(g: IRGraph) -> bool:
    return any(_declares(n, "collective") for n in g.nodes)


@register("schedule", enabled=lambda cfg: getattr(cfg, "global_graph", False))
def schedule(g: IRGraph, config=None) -> IRGraph:
    """Collectives early, readers of their results late (module docstring); ``g`` itself when
    nothing moves."""
    if not has_collectives(g):
        return g
    idx = order(g)
    if idx == list(range(len(g.nodes))):
        return g
    return g.with_(nodes=tuple(g.nodes[i] for i in idx))


def moved(before: IRGraph, after: IRGraph) -> list[tuple[str, int, int]]:
    """``(op, old position, new position)`` of the collectives, for debugging views and tests."""
    pos = {id(n): i for i, n in enumerate(before.nodes)}
    return [(n.op, pos[id(n)], j) for j, n in enumerate(after.nodes) if _declares(n, "collective")]

