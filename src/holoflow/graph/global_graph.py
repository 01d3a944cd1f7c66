"""Graphs of global tensors: tracing on logical shapes, boxing as IR nodes, one plan per rank.

While a graph traces, a global tensor is a lazy tensor of its *logical* shape whose ``_global``
is a :class:`LazyGlobal` (placement, nd-SBP, logical shape, and the tracer that records it). An
op on such inputs chooses its nd-signature with the same cost function eager uses
(``global_dispatch.choose``); an input whose SBP differs from the chosen one is boxed by a
``global_box`` node, so every redistribution is a node of the IR, with its bytes. Gradients are
logical values too: the backward graph is traced from the same grad rules, and a leaf's gradient
is boxed to the parameter's SBP (a data-parallel weight's partial sums become an all-reduce).

:func:`localize` turns the logical graph into rank ``r``'s graph: values get their local shapes,
attrs their local values (the op's ``local_attrs``), boxing nodes the rank and communicator.
Every rank derives its own plan from the same logical graph, with no communication to agree.
See docs/architecture.md, "Global graphs".
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..core import grad_mode
from ..core.dispatch import apply
from ..core.errors import HoloflowError
from ..core.registry import REGISTRY, Meta, defop, meta_attrs
from ..ops.family import like_first_input
from ..core.sbp import B, P
from ..core.tensor import Tensor
from ..core.views import aliases, replay
from ..distributed import comm_track, rng, world
from ..distributed.boxing import cost, plan as box_plan, run_step, sizes_along
from ..distributed.global_dispatch import local_attrs
from ..distributed.global_tensor import ABSENT, GlobalMeta, make_global
from ..distributed.sharding import local_shape, nd_str
from .ir import AliasGroups, IRGraph, Node, Value


def _global_box_kernel(t: torch.Tensor, place, src, dst, shape, rank: int, comm) -> torch.Tensor:
    # runtime threads of a simulated rank say whose turn it is; the plan's collectives were checked
    # as one program (comm_track.planned)
    with world.acting_as(rank, comm), comm_track.planned():
        for step in box_plan(src, dst, place.hierarchy):
            t = run_step(t, step, shape, place, rank, comm)
    return t


# Boxing changes how a logical value is laid out, not the value: its gradient is the gradient
# (whatever its SBP; whoever consumes it boxes it as needed).
def _reduces(attrs: dict) -> bool:
    return P in attrs["src"]


GLOBAL_BOX = defop("global_box", _global_box_kernel, grad=lambda ctx, dy: (dy,), shape=like_first_input,
                   family="boxing", collective=True, reduces=_reduces)


def _bucket_kernel(*ts: torch.Tensor, place, src, dst, shapes: tuple, rank: int, comm) -> tuple:
    """Several values boxed by one collective over their concatenation: all-reduce steps (the
    gradient buckets of passes/bucket_grads.py), one reduce-scatter of even rows (each rank's block
    of every value side by side, `_pack_rows`) or one all-gather of even row shards
    (passes/bucket_gathers.py, unpacked by `_unpack_rows`)."""
    steps = box_plan(src, dst, place.hierarchy)
    if steps[0].kind == "all_gather":
        group = place.axis_group(rank, steps[0].axis)
        flat = torch.cat([t.reshape(-1) for t in ts])
        with world.acting_as(rank, comm), comm_track.planned():
            out = comm.all_gather(flat, group, 0, [flat.numel()] * len(group))
        return _unpack_rows(out, tuple(tuple(t.shape) for t in ts), len(group))
    if steps[0].kind == "reduce_scatter":
        group = place.axis_group(rank, steps[0].axis)
        n = len(group)
        flat = _pack_rows(ts, n)
        with world.acting_as(rank, comm), comm_track.planned():
            out = comm.reduce_scatter(flat, group, 0, [flat.numel() // n] * n)
        return tuple(p.view((t.shape[0] // n,) + tuple(t.shape[1:])) for p, t in zip(
            out.split([t.numel() // n for t in ts]), ts))
    # all-reduces over the concatenation, one collective each; a reshard (each rank slicing its part
    # of a value for the new layout, no communication) of each value on its own
    parts, flat = list(ts), None
    with world.acting_as(rank, comm), comm_track.planned():
        for step in steps:
            if step.kind == "reshard":
                if flat is not None:
                    parts, flat = _unflatten(flat, parts), None
                parts = [run_step(t, step, shape, place, rank, comm) for t, shape in zip(parts, shapes)]
            else:
                if flat is None:
                    flat = torch.cat([t.reshape(-1) for t in parts])
                flat = run_step(flat, step, tuple(flat.shape), place, rank, comm)
    return tuple(_unflatten(flat, parts) if flat is not None else parts)


def _unflatten(flat: torch.Tensor, like: list) -> list:
    return [p.view(t.shape) for p, t in zip(flat.split([t.numel() for t in like]), like)]


def merge_boxes(g: IRGraph, buckets: list[list[int]], at_last: bool) -> IRGraph:
    """``g`` with each run of one-value boxing nodes in ``buckets`` (node indices, same placement
    and SBPs) replaced by one ``global_box_bucket`` standing at its last member's place
    (``at_last``: gradients, once the last exists) or its first's (state, wanted from the first
    reader on); runs of one are left alone."""
    merged: dict[int, Node] = {}
    dropped: set[int] = set()
    for members in buckets:
        if len(members) < 2:
            continue
        nodes = [g.nodes[i] for i in members]
        here = members[-1] if at_last else members[0]
        lead = g.nodes[here]
        a = lead.attrs
        merged[here] = Node(GLOBAL_BOX_BUCKET.name, tuple(n.inputs[0] for n in nodes),
                            {"place": a["place"], "src": a["src"], "dst": a["dst"],
                             "shapes": tuple(tuple(n.attrs["shape"]) for n in nodes)},
                            tuple(n.outputs[0] for n in nodes), lead.source, lead.scope, tags=lead.tags,
                            sbp=(tuple(a["src"] for _ in nodes), tuple(a["dst"] for _ in nodes)))
        dropped.update(i for i in members if i != here)
    if not merged:
        return g
    return g.with_(nodes=tuple(merged.get(i, n) for i, n in enumerate(g.nodes) if i not in dropped))


def _unpack_rows(out: torch.Tensor, shapes: tuple, n: int) -> tuple:
    """The inverse of `_pack_rows` for a gather: from rank-major ``out`` (each rank's shards of
    every value in turn), each value's rows of every rank stacked (a copy)."""
    parts = out.view(n, -1).split([math.prod(s) for s in shapes], dim=1)
    return tuple(p.reshape((n * s[0],) + s[1:]) for p, s in zip(parts, shapes))


def _pack_rows(ts: tuple, n: int) -> torch.Tensor:
    """A new flat tensor of rank-major blocks: block ``r`` is rank ``r``'s rows of every ``t`` in
    turn (rows a multiple of ``n``), so a reduce-scatter of it hands each rank its rows of each."""
    return torch.cat([t.reshape(n, -1) for t in ts], dim=1).view(-1)


# gradients bucketed by passes/bucket_grads.py (DDP's buckets), ZeRO-3 gathers by bucket_gathers.py
GLOBAL_BOX_BUCKET = defop("global_box_bucket", _bucket_kernel, family="boxing", collective=True, reduces=_reduces,
                          grad=lambda ctx, *dys: dys, shape=lambda metas, attrs: list(metas))


# -- collectives issued now, waited for at their first reader ------------------------------------------
#
# A boxing node whose plan is one all-reduce, reduce-scatter or all-gather can run as two nodes on
# the compute stream: ``global_box_issue`` hands a private copy of its inputs to the communicator
# (Gloo works on its own threads, without the GIL) and returns the collective in flight;
# ``global_box_wait``, placed just before the first node that reads the result
# (``issue_collectives``), waits for it. An all-gather of values that exist earlier (a ZeRO-3
# parameter's rows) is issued one all-gather ahead: it runs while the ops before its reader do.
# One thread issues every collective in program order, so every rank issues them alike.

ASYNC_KINDS = ("all_reduce", "reduce_scatter", "all_gather")


class InFlight:
    """A collective in flight: ``wait()`` gives the node's results (views of one flat result for a
    bucket; for a bucket of all-gathers of ``ranks`` ranks, each input's rows gathered from every
    rank's part of the flat result)."""

    def __init__(self, handle: Any, shapes: tuple | None, ranks: int = 0) -> None:
        self.handle, self.shapes, self.ranks = handle, shapes, ranks

    def wait(self) -> Any:
        out = self.handle.wait()
        if self.shapes is None:
            return out
        if self.ranks:   # rank-major: (ranks, this bucket's elements)
            return _unpack_rows(out, self.shapes, self.ranks)
        return tuple(p.view(s) for p, s in zip(out.split([math.prod(s) for s in self.shapes]), self.shapes))


def _issue_kernel(*ts: torch.Tensor, place, src, dst, rank: int, comm, shape=None, read_late: bool = False
                  ) -> InFlight:
    (step,) = box_plan(src, dst, place.hierarchy)
    group = place.axis_group(rank, step.axis)
    with world.acting_as(rank, comm), comm_track.planned():
        if read_late and step.kind == "all_reduce" and len(ts) > 1:
            # no node writes the inputs' memory before the wait: the communicator reads them as
            # they are (through shared memory, straight into the segment), with no concatenation
            h = comm.all_reduce_many_async(list(ts), group)
            return InFlight(h, tuple(tuple(t.shape) for t in ts))
        # a private buffer: the inputs' memory may be reused (memory_plan) while the collective runs
        if step.kind == "reduce_scatter" and len(ts) > 1:   # a bucket of even row shards (bucket_grads)
            n = len(group)
            buf = _pack_rows(ts, n)
            h = comm.reduce_scatter_async(buf, group, 0, [buf.numel() // n] * n)
            return InFlight(h, tuple((t.shape[0] // n,) + tuple(t.shape[1:]) for t in ts))
        buf = torch.cat([t.reshape(-1) for t in ts]) if len(ts) > 1 \
            else ts[0].clone(memory_format=torch.contiguous_format)
        if step.kind == "all_reduce":
            h = comm.all_reduce_async(buf, group)
        elif step.kind == "all_gather" and len(ts) > 1:   # a bucket of even row shards (bucket_gathers)
            h = comm.all_gather_async(buf, group, 0, [buf.numel()] * len(group))
            return InFlight(h, tuple(tuple(t.shape) for t in ts), len(group))
        elif step.kind == "all_gather":
            h = comm.all_gather_async(buf, group, step.dim, sizes_along(shape, step.src, place, rank, step.axis,
                                                                         step.dim))
        else:
            h = comm.reduce_scatter_async(buf, group, step.dim, sizes_along(shape, step.dst, place, rank, step.axis,
                                                                             step.dim))
    return InFlight(h, tuple(tuple(t.shape) for t in ts) if len(ts) > 1 else None)


def _wait_kernel(pending: InFlight) -> Any:
    return pending.wait()


GLOBAL_BOX_ISSUE = defop("global_box_issue", _issue_kernel, family="boxing", collective=True, differentiable=False)
GLOBAL_BOX_WAIT = defop("global_box_wait", _wait_kernel, family="boxing", differentiable=False)


def _split_box(n: Node) -> tuple[Node, Node] | None:
    """``n`` as (issue, wait) when its plan is one all-reduce (several inputs: one over their
    concatenation), reduce-scatter (several: of their rank-major blocks, `_pack_rows`) or
    all-gather; else None (it runs as one node)."""
    a = n.attrs
    steps = box_plan(a["src"], a["dst"], a["place"].hierarchy)
    if len(steps) != 1 or steps[0].kind not in ASYNC_KINDS:
        return None
    pending = Value((0,), torch.uint8, name=f"{n.outputs[0]!r}_inflight")
    attrs = {k: v for k, v in a.items() if k in ("place", "src", "dst", "rank", "comm", "shape")}
    return (n.with_(op=GLOBAL_BOX_ISSUE.name, kernel=None, attrs=attrs, outputs=(pending,)),
            n.with_(op=GLOBAL_BOX_WAIT.name, kernel=None, inputs=(pending,), attrs={}, tags=n.tags | {"comm"}))


#: op -> its collective as an (issue, wait) pair of nodes, or None where it cannot be split
ASYNC_FORMS: dict[str, Any] = {GLOBAL_BOX.name: _split_box, GLOBAL_BOX_BUCKET.name: _split_box}


def issue_collectives(g: IRGraph, gather_ahead: bool = True) -> IRGraph:
    """A localized graph whose splittable collectives (``ASYNC_FORMS``) are issued where they
    stand and waited for just before their first reader (after every other compute node when
    only the update, the outputs or nothing reads them). With ``gather_ahead``
    (``graph.config.gather_ahead``, default on) an all-gather (or bucket of them,
    passes/bucket_gathers.py) of values that exist earlier is issued one all-gather ahead
    (`_prefetches`). The memory plan's frees follow: inputs after the issue (after the wait for
    an issue moved ahead of other readers), the rest after the wait."""
    pairs = {}
    for i, n in enumerate(g.nodes):
        form = ASYNC_FORMS.get(n.op) if n.kernel is None else None
        pair = form(n) if form is not None else None
        if pair is not None:
            pairs[i] = pair
    if not pairs:
        return g
    first_read: dict[Value, int] = {}
    for i, n in enumerate(g.nodes):
        if not n.effect:
            for v in n.value_inputs():
                first_read.setdefault(v, i)
    groups = AliasGroups(g.nodes)
    ahead = _prefetches(g, pairs, groups, first_read) if gather_ahead else {}   # node index -> where its issue goes
    early: dict[int, list[Node]] = {}
    for i, at in ahead.items():
        early.setdefault(at, []).append(pairs[i][0])
    before: dict[int, list[Node]] = {}
    tail: list[Node] = []
    nodes: list[Node] = []
    for i, n in enumerate(g.nodes):
        nodes += before.pop(i, [])
        if i not in pairs:
            nodes.append(n)
            nodes += early.pop(i, [])
            continue
        issue, wait = pairs[i]
        at = min((first_read[v] for v in n.outputs if first_read.get(v, -1) > i), default=None)
        if i not in ahead:
            if unwritten(g.nodes[i + 1:], groups, set(n.value_inputs())):
                issue = issue.with_(attrs={**issue.attrs, "read_late": True})
                pairs[i] = issue, wait
            nodes.append(issue)
        nodes += early.pop(i, [])
        (before.setdefault(at, []) if at is not None else tail).append(wait)
    frees = g.frees
    if frees is not None:
        frees = dict(frees)
        for i, (issue, wait) in pairs.items():
            dead = frees.pop(id(g.nodes[i]), ())
            ins = set() if i in ahead else set(g.nodes[i].value_inputs())
            frees[id(issue)] = [v for v in dead if v in ins]
            frees[id(wait)] = [v for v in dead if v not in ins]
    return g.with_(nodes=tuple(nodes + tail), frees=frees)


def _prefetches(g: IRGraph, pairs: dict, groups: AliasGroups, first_read: dict) -> dict[int, int]:
    """All-gathers issued one all-gather ahead: node index -> the index of the all-gather before
    it, after whose issue its own goes, where everything it reads exists by then and no node in
    between writes that memory or is an effect. A ZeRO-3 block's parameters (one bucket) travel
    while the block before computes, as FSDP's prefetch. The result of another collective issued
    in flight exists from its wait on (before its first reader), not where it stands."""
    gathers = [i for i in sorted(pairs) if _one_step(g.nodes[i]).kind == "all_gather"]
    made: dict[Value, int] = {}
    for i, n in enumerate(g.nodes):
        for v in n.outputs:
            made.setdefault(v, first_read.get(v, len(g.nodes)) if i in pairs else i)
    ahead = {}
    for prev, cur in zip(gathers, gathers[1:]):
        ins = set(g.nodes[cur].value_inputs())
        between = g.nodes[prev + 1:cur]
        if all(made.get(v, -1) < prev for v in ins) and not any(n.effect for n in between) \
                and unwritten(between, groups, ins):
            ahead[cur] = prev
    return ahead


def _one_step(n: Node):
    a = n.attrs
    return box_plan(a["src"], a["dst"], a["place"].hierarchy)[0]


def unwritten(later, groups: AliasGroups, values: set) -> bool:
    """Whether no node of ``later`` (every node after the issue, whichever task runs it) writes in
    place into memory that ``values`` may share (the memory plan chose in-place ops knowing only
    the issue reads them)."""
    roots = {groups.find(v) for v in values}
    return not any("inplace" in n.tags and n.inputs and groups.find(n.inputs[0]) in roots for n in later)


# a local traced value every rank computes identically, taken as a broadcast global value
GLOBAL_TAG = defop("global_tag", lambda x: x, grad=lambda ctx, dy: (dy,), shape=like_first_input, family="boxing")


@dataclass(frozen=True)
class LazyGlobal(GlobalMeta):
    """The global meta of a traced value: conversions record boxing nodes instead of running."""

    tracer: Any = None

    def box_to(self, t: Tensor, nd: tuple, grad_sbp=None) -> Tensor:
        return self.tracer.box(t, nd)

    def box_grad(self, t: Tensor, g: Tensor) -> Tensor:
        return self.tracer.box(g, self.grad_sbp or self.sbp)

    def leaf_grad(self, t: Tensor, g: Tensor) -> Tensor:
        return self.tracer.box(g, self.tracer.leaf_grad_sbp(t))

    def move_to(self, t: Tensor, place, nd: tuple, grad_sbp=None) -> Tensor:
        return self.tracer.move(t, place, nd)   # a pipeline stage boundary (graph/pipeline.py)

    def seed_grad(self, t: Tensor, g: Tensor | None) -> Tensor:
        if g is None:
            g = t.detach().new_ones(tuple(self.shape))
        if g._global is None:   # the same ones on every rank: a broadcast value
            g = self.tracer.make_global(g, self.placement, (B,) * len(self.sbp))
        return g

    def full(self, t: Tensor) -> torch.Tensor:
        raise HoloflowError("holoflow.nn.Graph: a global tensor's value is not known inside build(); "
                            "return it from build() and read it outside")

    def repr(self, t: Tensor) -> str:
        return f"tensor(<traced>, shape={tuple(self.shape)}, placement={self.placement}, sbp={nd_str(self.sbp)})"


# -- per-rank lowering --------------------------------------------------------------------------------

def is_global(g: IRGraph) -> bool:
    return any(v.placement is not None for v in g.feeds) or any(v.placement is not None for v, _ in g.state)


def localize(g: IRGraph, rank: int, comm: Any = None, seed: int = 0) -> IRGraph:
    """Rank ``rank``'s graph: local shapes, local attrs, boxing nodes bound to the communicator,
    and each random node a generator of its own (distributed/rng.py): node ``i`` of a graph whose
    ranks agreed on ``seed`` draws from ``rank_seed(mix(seed, i), ...)``, advanced by every run."""
    comm = comm if comm is not None else world.comm()
    layout = _layouts(g)
    vals: dict[Value, Value] = {}

    def loc(v: Any) -> Any:
        if not isinstance(v, Value):
            return v
        hit = vals.get(v)
        if hit is None:
            place, nd = layout.get(v, (None, None))
            shape = (v.shape if place is None else (0,) if place.coords(rank) is None  # absent: as eager's
                     else tuple(local_shape(v.shape, nd, place, rank)))
            hit = vals[v] = replace(v, shape=shape, placement=place, sbp=nd)
        return hit

    nodes = []
    node_map: dict[int, Node] = {}
    for i, n in enumerate(g.nodes):
        attrs = n.attrs
        op = REGISTRY.get(n.op)
        if _absent_here(n, layout, rank):   # one program on every rank: skip it as eager does
            new = n.with_(op=ABSENT.name, kernel=None, effect=False, inputs=tuple(loc(v) for v in n.inputs),
                          outputs=tuple(loc(v) for v in n.outputs),
                          attrs={"dtypes": tuple(v.dtype for v in n.outputs), "single": len(n.outputs) == 1,
                                 "device": next((v.device for v in (*n.outputs, *n.value_inputs())),
                                                torch.device("cpu"))})
            node_map[id(n)] = new
            nodes.append(new)
            continue
        if op is not None and op.collective:
            attrs = {**attrs, "rank": rank, "comm": comm}
        elif n.sbp is not None:
            place = next(layout[v][0] for v in n.value_inputs() if v in layout)
            metas = [Meta(v.shape, v.dtype, v.device) if isinstance(v, Value) else v for v in n.inputs]
            attrs = local_attrs(op, attrs, metas, n.sbp[0], place, rank)
            if op.random and n.kernel is None and n.value_inputs():
                own = rng.rank_seed(rng.mix(seed, i), place, n.sbp[1][0], rank, op.name)
                attrs = {**attrs, "generator": rng.generator_for(own, n.value_inputs()[0].device)}
        new = n.with_(inputs=tuple(loc(v) for v in n.inputs), outputs=tuple(loc(v) for v in n.outputs),
                      attrs=attrs)
        node_map[id(n)] = new
        nodes.append(new)
    frees = None
    if g.frees is not None:  # the memory plan (values dead after each node), on the new nodes
        frees = {id(node_map[k]): [loc(v) for v in vs] for k, vs in g.frees.items() if k in node_map}
    return g.with_(feeds=tuple(loc(v) for v in g.feeds), state=tuple((loc(v), t) for v, t in g.state),
                   nodes=tuple(nodes), outputs=tuple(loc(v) for v in g.outputs),
                   updates=tuple((t, loc(v)) for t, v in g.updates), frees=frees)


def _absent_here(n: Node, layout: dict, rank: int) -> bool:
    """Whether every global value ``n`` reads or writes lies on placements without ``rank`` (a
    node touching no global value is local and runs everywhere)."""
    places = [layout[v][0] for v in (*n.value_inputs(), *n.outputs) if v in layout]
    return bool(places) and all(p.coords(rank) is None for p in places)


def fingerprint(g: IRGraph) -> str:
    """A digest of what a global graph does (ops, shapes, dtypes, SBPs, simple attrs), equal on
    every rank exactly when the ranks traced the same program."""
    h = hashlib.sha256()
    for n in g.nodes:
        attrs = sorted((k, repr(v)) for k, v in n.attrs.items() if isinstance(v, (int, float, str, bool, tuple)))
        sig = [(v.shape, str(v.dtype), v.sbp) if isinstance(v, Value) else repr(v) for v in (*n.inputs, *n.outputs)]
        h.update(repr((n.op, sig, attrs)).encode())
    return h.hexdigest()[:16]


def check_same_program(g: IRGraph) -> int:
    """Compares the graph's fingerprint across the ranks of its placement before anything runs:
    a rank that traced another program (a data-dependent branch, another model) fails on every
    rank, naming the ranks, instead of issuing mismatched collectives. Returns the graph's random
    seed, the first rank's draw, agreed in the same exchange (``localize``'s ``seed``)."""
    seed = rng.draw()
    place = next((v.placement for v in (*g.feeds, *(v for v, _ in g.state)) if v.placement is not None), None)
    if place is None or len(place.flat_ranks) < 2 or place.coords(world.rank()) is None:
        return seed   # (a rank outside the placement runs the program without data: nothing to compare)
    return agree_program(fingerprint(g), seed, place.flat_ranks, f"the ranks of {place}")


def agree_program(mine: str, seed: int, ranks: tuple, who: str) -> int:
    """All-gathers ``(fingerprint, seed)`` among ``ranks``: fails on every rank, naming them, if
    the fingerprints differ; else the first rank's seed."""
    got = world.comm().all_gather_shapes((mine, seed), ranks)
    if len({f for f, _ in got}) > 1:
        by: dict = {}
        for r, (f, _) in zip(ranks, got):
            by.setdefault(f, []).append(r)
        groups = "; ".join(f"ranks {rs}: {f}" for f, rs in by.items())
        raise HoloflowError(f"holoflow.nn.Graph: {who} traced different programs "
                            f"(graph fingerprints {groups}); every rank must build the same graph — "
                            f"look for branches on rank-dependent values or different models/inputs")
    return got[0][1]


def _layouts(g: IRGraph) -> dict:
    """Placement and nd-SBP of every global value. A node a pass made after tracing (an AMP cast,
    a fused elementwise region, a recomputed copy) carries no signature: its outputs take the
    layout of its first global input, which is right exactly when the op's attrs need no
    mapping to shards (no ``local_attrs``) and it keeps shapes; anything else is an error."""
    out = {v: (v.placement, v.sbp) for v in (*g.feeds, *(v for v, _ in g.state)) if v.placement is not None}
    for n in g.nodes:
        for v in n.outputs:
            if v.placement is not None:
                out[v] = (v.placement, v.sbp)
        ins = [out[v] for v in n.value_inputs() if v in out]
        missing = [v for v in n.outputs if v not in out]
        if not ins or not missing:
            continue
        if n.sbp is not None:   # a traced node whose outputs a pass re-made (AMP's dtypes): its signature
            for i, v in enumerate(n.outputs):
                out.setdefault(v, (ins[0][0], n.sbp[1][i]))
            continue
        op = REGISTRY.get(n.op)
        first = next(v for v in n.value_inputs() if v in out)
        if (op is not None and op.local_attrs is not None) or any(v.shape != first.shape for v in missing):
            raise HoloflowError(f"holoflow.nn.Graph: node {n.op!r} ({n.source or 'made by a pass'}) has global "
                                f"inputs but no SBP signature, and its attrs or shapes depend on the layout; "
                                f"the pass that made it does not support global graphs yet")
        for v in missing:
            out[v] = ins[0]
    return out


def wrap_outputs(g: IRGraph, outs: list, views: dict) -> list:
    """The local results of rank's plan as global tensors of the logical graph's outputs. An
    output standing for a view of state (``return self.w[0:]``) whose shard is not a view of the
    state's shard (the view was boxed: a copy made in forward) is re-derived from the live state:
    eager's view, and a local graph's (which aliases the state's storage), read the parameter after
    the optimizer's step. ``views``: :func:`state_views` of ``g``."""
    res = []
    for i, (v, o) in enumerate(zip(g.outputs, outs)):
        if isinstance(v, Value) and v.placement is not None and isinstance(o, Tensor):
            live = views.get(i)
            if live is not None and not _shares_storage(o._data, live[0]._data):
                with grad_mode.no_grad():
                    o = replay(live[1], live[0], lambda op, x, attrs: apply(op, x, **attrs))
            else:
                o = make_global(o, v.placement, v.sbp, torch.Size(v.shape))
        res.append(o)
    return res


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def state_views(g: IRGraph) -> dict[int, tuple]:
    """The outputs of ``g`` that are a chain of view ops of a state value (boxing between them: a
    layout, not a value): output index -> (the state tensor, the chain as ``views.replay`` takes it)."""
    producers, state = g.producers(), {v: t for v, t in g.state}
    out = {}
    for i, v in enumerate(g.outputs):
        chain = []
        while isinstance(v, Value) and v not in state:
            n = producers.get(v)
            op = REGISTRY.get(n.op) if n is not None else None
            if op is None or not (op.view or op.family == "boxing"):
                break
            if op.view:
                chain.append((op, n.attrs, n.outputs.index(v) if len(n.outputs) > 1 else None))
            v = n.inputs[0]
        else:
            if chain and isinstance(v, Value) and _views_throughout(state[v], chain[::-1]):
                out[i] = (state[v], tuple(reversed(chain)))
    return out


def _views_throughout(t: Tensor, chain: list) -> bool:
    """Whether torch's kernels on state ``t`` (its logical layout) return a view at every op of
    ``chain``: a view op copies where no view can do it (``w.t().reshape(-1)``), and that output
    holds the values read in forward, not the state after the optimizer's step. Where a meta
    kernel refuses the attrs, the chain counts as views (as before)."""
    g = t._global
    strides = g.strides if g is not None and g.strides is not None else None
    x = torch.empty_strided(tuple(t.shape), strides, dtype=t._data.dtype, device="meta") if strides else \
        torch.empty(tuple(t.shape), dtype=t._data.dtype, device="meta")
    for op, attrs, idx in chain:
        try:
            out = op.kernel(x, **meta_attrs(attrs))
        except Exception:   # noqa: BLE001 - (the meta kernel refuses: taken as a view, as before)
            return True
        o = out if idx is None else out[idx]
        if not aliases(o, x):
            return False
        x = o
    return True


# -- explain ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BoxingPoint:
    """One redistribution in a global graph, with what caused it."""

    node: Node
    src: tuple
    dst: tuple
    nbytes: int          # the logical tensor's bytes
    comm_bytes: float    # bytes over links per rank, from the one cost function
    steps: tuple         # the collectives, in order
    share: float = 1.0   # its part of the collectives' latency: 1 / members for a bucket member

    def payload_bytes(self, rank: int) -> int:
        """The bytes rank ``rank`` hands to the collectives (what ``flow.comm.count`` measures)."""
        v, place = self.node.inputs[0], self.node.attrs["place"]
        total = 0
        for step in self.steps:
            if step.collective and rank in place.axis_group(rank, step.axis):
                shape = list(local_shape(v.shape, step.src, place, rank))
                k = place.hierarchy[step.axis]   # uneven shards travel padded to the largest:
                if step.kind == "all_gather":
                    shape[step.dim] = max(sizes_along(v.shape, step.src, place, rank, step.axis, step.dim))
                elif step.kind == "reduce_scatter":
                    shape[step.dim] = k * -(-shape[step.dim] // k)
                total += math.prod(shape) * v.dtype.itemsize
        return total

    def __str__(self) -> str:
        v = self.node.inputs[0]
        where = self.node.source or "?"
        steps = " + ".join(s.kind for s in self.steps) or "local"
        return (f"{where:<28} {nd_str(self.src)} -> {nd_str(self.dst)}  {steps:<28} "
                f"{tuple(v.shape)} {str(v.dtype).replace('torch.', '')}  {self.comm_bytes / 1e6:.3f} MB/rank"
                + ("  [backward]" if "bw" in self.node.tags else "")
                + ("  [update]" if "update" in self.node.tags else "")
                + ("  [in flight]" if self.in_flight else ""))

    @property
    def in_flight(self) -> bool:
        """Whether lowering issues this collective in flight (``ASYNC_FORMS``): compute after it
        runs while it moves, until a node reads its result (``issue_collectives``)."""
        form = ASYNC_FORMS.get(self.node.op) if self.node.kernel is None and "update" not in self.node.tags else None
        return form is not None and form(self.node) is not None


@dataclass(frozen=True)
class LinkModel:
    """Predicted time of a boxing node: ``latency`` per collective plus its bytes over links per
    rank (the one cost function, ``boxing.cost``) at ``bytes_per_s``. ``calibrated`` says whether
    the figures were measured (:func:`calibrate`) or are the default guess."""

    latency_s: float = 100e-6
    bytes_per_s: float = 1e9
    calibrated: bool = False

    def seconds(self, p: BoxingPoint) -> float:
        n = sum(1 for s in p.steps if s.collective)
        return n * self.latency_s * p.share + p.comm_bytes / self.bytes_per_s

    def __str__(self) -> str:
        how = "calibrated" if self.calibrated else "default, not calibrated"
        return f"{self.latency_s * 1e6:.0f} us + {self.bytes_per_s / 1e9:.2f} GB/s per collective ({how})"


_LINKS: dict = {}   # placement -> LinkModel measured by calibrate()


def link_model(place) -> LinkModel:
    """The calibrated link model of ``place`` (or the default guess)."""
    return _LINKS.get(place, LinkModel())


def calibrate(place, nbytes: int = 8 << 20, repeats: int = 5) -> LinkModel:
    """Measures the link model of ``place`` with all-reduces of 4 bytes and of ``nbytes``: the
    small one's time is the latency, the difference the bandwidth (bytes over links per rank, as
    the cost function counts them; large enough that the difference is not noise: gradients of
    data parallelism are megabytes). A collective: every rank of ``place`` calls it, in order."""
    import time
    comm, ranks = world.comm(), tuple(place.flat_ranks)
    if len(ranks) < 2:
        return LinkModel(0.0, float("inf"), True)

    def best(t: torch.Tensor) -> float:
        out = float("inf")
        for _ in range(repeats):
            mine = t.clone()
            comm.all_reduce(torch.zeros(1), ranks)   # the ranks arrive together
            t0 = time.perf_counter()
            comm.all_reduce(mine, ranks)
            out = min(out, time.perf_counter() - t0)
        return out
    small, big = best(torch.zeros(1)), best(torch.zeros(nbytes // 4))
    over_links = cost((P,), (B,), (len(ranks),), nbytes) - cost((P,), (B,), (len(ranks),), 4)
    # every rank uses the same figures (the slowest rank's), so predictions agree across ranks
    got = comm.all_gather_shapes((small, big), ranks)
    small, big = max(g[0] for g in got), max(g[1] for g in got)
    model = LinkModel(small, over_links / max(big - small, 1e-9), True)
    _LINKS[place] = model
    return model


def boxing_points(g: IRGraph) -> list[BoxingPoint]:
    """Every redistribution of a global graph (each member of a bucket too): source line, SBP
    before -> after, bytes."""
    return [p for n in g.nodes for p in node_boxing_points(n)]


def node_boxing_points(n: Node) -> list[BoxingPoint]:
    """The redistributions node ``n`` runs: a boxing node's (one per bucket member), or the
    all-gathers of the parameters an update effect shards (ZeRO 1/2); none for other nodes."""
    out = []
    for place, nd, shape, dtype in getattr(n.kernel, "zero_gathers", ()) if n.effect else ():
        # ZeRO 1/2: an update effect all-gathers each sharded parameter's updated rows
        v = Value(shape, dtype, placement=place, sbp=nd)
        member = Node(GLOBAL_BOX.name, (v,), {"place": place, "src": nd, "dst": (B,) * len(nd)}, (),
                      n.source, n.scope, tags=n.tags | {"update"})
        steps = tuple(s for s in box_plan(nd, (B,) * len(nd), place.hierarchy) if s.kind != "reshard")
        out.append(BoxingPoint(member, nd, (B,) * len(nd), v.nbytes,
                               cost(nd, (B,) * len(nd), place.hierarchy, v.nbytes), steps))
    if n.op not in (GLOBAL_BOX.name, GLOBAL_BOX_BUCKET.name):
        return out
    a = n.attrs
    place = a["place"]
    steps = tuple(s for s in box_plan(a["src"], a["dst"], place.hierarchy) if s.kind != "reshard")
    for v in n.value_inputs():
        member = n if n.op == GLOBAL_BOX.name else n.with_(inputs=(v,))
        # a bucket's members share its collectives: each carries its part of their latency
        out.append(BoxingPoint(member, a["src"], a["dst"], v.nbytes,
                               cost(a["src"], a["dst"], place.hierarchy, v.nbytes), steps,
                               1.0 / len(n.value_inputs())))
    return out


def explain(g: IRGraph, link: LinkModel | None = None) -> str:
    """A table of every boxing node: the user's line that caused it, SBP, collectives, bytes and
    predicted time (``link``: default, the placement's calibrated :class:`LinkModel`)."""
    pts = boxing_points(g)
    if not pts:
        return "no boxing: every op ran in the SBP its inputs already had"
    link = link or link_model(pts[0].node.attrs["place"])
    total = sum(p.comm_bytes for p in pts)
    secs = sum(link.seconds(p) for p in pts)
    return "\n".join([f"{len(pts)} boxing node(s), {total / 1e6:.3f} MB over links per rank per step, predicted "
                      f"{secs * 1e3:.3f} ms (links: {link}):"] +
                     [f"  {p}  ~{link.seconds(p) * 1e3:.3f} ms" for p in pts])
