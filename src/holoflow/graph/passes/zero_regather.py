"""zero_regather: ZeRO-3 parameters are gathered again for the backward instead of kept.

A stage-3 parameter (kept S(0), graph/zero.py) is read in forward through an all-gather node
tagged ``zero3``. Grad rules read the op's saved inputs, so backward would read that forward
copy, keeping every gathered parameter alive from its forward use to its backward use — the
whole model, which is what stage 3 exists to avoid. This pass gives backward its own gather:
just before the first backward node that reads a forward copy, a copy of the gather node (new
value, tags ``bw`` and ``recompute`` so CSE keeps it apart) is emitted and every backward read
goes to it. A backward read of a value made from the gathered parameter by one-input elementwise
nodes (mixed precision's cast to bfloat16) gets those nodes replayed on the backward's gather,
so no whole low-precision copy is kept from forward to backward either. memory_plan then frees
the forward copy after its last forward use and the backward copy after its last backward use: a
parameter is whole only around the ops that read it. The last parameters gathered in forward (no
other gather before backward first reads them: a tied output head's) are kept instead, as FSDP
keeps its root unit: gathering them again at once would only cost a collective.
"""
from __future__ import annotations

from ...core.registry import REGISTRY
from ..ir import IRGraph, Node, Value
from ..zero import ZERO3
from . import register
from .checkpointing import RECOMPUTE


@register("zero_regather", enabled=lambda cfg: getattr(getattr(cfg, "zero", None), "stage", 0) >= 3)
def zero_regather(g: IRGraph, config=None) -> IRGraph:
    gathers = {n.outputs[0]: n for n in g.nodes if ZERO3 in n.tags and "bw" not in n.tags}
    if not gathers:
        return g
    # forward values made from a gathered parameter by one-input elementwise nodes (mixed
    # precision's cast): backward replays the chain on its own gather instead of keeping them
    chain: dict[Value, tuple[Node, ...]] = {v: () for v in gathers}
    root: dict[Value, Value] = {v: v for v in gathers}
    for n in g.nodes:
        if "bw" in n.tags or n.effect or len(n.outputs) != 1:
            continue
        op = REGISTRY.get(n.op)
        ins = n.value_inputs()
        if op is not None and op.elementwise and not op.random and n.kernel is None and len(ins) == 1 \
                and ins[0] in chain:
            chain[n.outputs[0]] = chain[ins[0]] + (n,)
            root[n.outputs[0]] = root[ins[0]]
    # the last parameters gathered in forward (a tied output head's): no other gather between
    # their last forward reader and backward's first, so backward reads the forward copy (as
    # FSDP keeps its root unit gathered after forward) instead of gathering it again at once
    where = {id(n): i for i, n in enumerate(g.nodes)}
    gather_at = sorted(where[id(n)] for n in gathers.values())
    last_fwd: dict[Value, int] = {}
    first_bw: dict[Value, int] = {}
    for i, n in enumerate(g.nodes):
        for x in n.value_inputs():
            if x in chain:
                if "bw" in n.tags:
                    first_bw.setdefault(root[x], i)
                else:
                    last_fwd[root[x]] = i
    kept = {r for r in gathers if r in first_bw and not any(
        last_fwd.get(r, where[id(gathers[r])]) < i < first_bw[r] for i in gather_at)}
    chain = {v: c for v, c in chain.items() if root[v] not in kept}
    if not chain:
        return g
    copies: dict[Value, Value] = {}
    nodes: list[Node] = []
    changed = False

    def like(v: Value) -> Value:
        return Value(v.shape, v.dtype, v.device, placement=v.placement, sbp=v.sbp)

    def copy_of(x: Value) -> Value:
        """The backward's copy of forward value ``x``: its gather, then its chain, each made once."""
        r = root[x]
        if r not in copies:
            src = gathers[r]
            copies[r] = like(r)
            nodes.append(src.with_(outputs=(copies[r],), tags=src.tags | {"bw", RECOMPUTE}))
        cur = copies[r]
        for step in chain[x]:
            out = step.outputs[0]
            if out not in copies:
                copies[out] = like(out)
                prev = step.value_inputs()[0]
                nodes.append(step.with_(inputs=tuple(cur if v is prev else v for v in step.inputs),
                                        outputs=(copies[out],), tags=step.tags | {"bw", RECOMPUTE}))
            cur = copies[out]
        return cur
    for n in g.nodes:
        if "bw" in n.tags and any(isinstance(x, Value) and x in chain for x in n.inputs):
            n = n.with_(inputs=tuple(copy_of(x) if isinstance(x, Value) and x in chain else x for x in n.inputs))
            changed = True
        nodes.append(n)
    return g.with_(nodes=tuple(nodes)) if changed else g
