"""zero_regather: ZeRO-3 parameters are gathered again for the backward instead of kept.

A stage-3 parameter (kept S(0), graph/zero.py) is read in forward through an all-gather node
tagged ``zero3``. Grad rules read the op's saved inputs, so backward would read that forward
copy, keeping every gathered parameter alive from its forward use to its backward use — the
whole model, which is what stage 3 exists to avoid. This pass gives backward its own gather:
just before the first backward node that reads a forward copy, a copy of the gather node (new
value, tags ``bw`` and ``recompute`` so CSE keeps it apart) is emitted and every backward read
goes to it. memory_plan then frees the forward copy after its last forward use and the backward
copy after its last backward use: a parameter is whole only around the ops that read it.
"""
from __future__ import annotations

from ..ir import IRGraph, Node, Value
from ..zero import ZERO3
from . import register
from .checkpointing import RECOMPUTE


@register("zero_regather", enabled=lambda cfg: getattr(getattr(cfg, "zero", None), "stage", 0) >= 3)
def zero_regather(g: IRGraph, config=None) -> IRGraph:
    gathers = {n.outputs[0]: n for n in g.nodes if ZERO3 in n.tags and "bw" not in n.tags}
    if not gathers:
        return g
    copies: dict[Value, Value] = {}
    nodes: list[Node] = []
    changed = False
    for n in g.nodes:
        if "bw" in n.tags and any(isinstance(x, Value) and x in gathers for x in n.inputs):
            ins = []
            for x in n.inputs:
                if isinstance(x, Value) and x in gathers:
                    if x not in copies:
                        src = gathers[x]
                        copies[x] = Value(x.shape, x.dtype, x.device, placement=x.placement, sbp=x.sbp)
                        nodes.append(src.with_(outputs=(copies[x],), tags=src.tags | {"bw", RECOMPUTE}))
                    x = copies[x]
                ins.append(x)
            n = n.with_(inputs=tuple(ins))
            changed = True
        nodes.append(n)
    return g.with_(nodes=tuple(nodes)) if changed else g
