"""Dead code elimination: drop nodes whose outputs nothing reads (effects and random ops that
feed something are kept; a dropped random op changes no observable value)."""
from __future__ import annotations

from ..ir import IRGraph, Value
from . import register


@register("dce")
def dce(g: IRGraph, config=None) -> IRGraph:
    live: set = {o for o in g.outputs if isinstance(o, Value)} | {v for _, v in g.updates}
    kept = []
    for n in reversed(g.nodes):
        if n.effect or any(v in live for v in n.outputs):
            kept.append(n)
            live.update(n.value_inputs())
    kept.reverse()
    used_state = tuple((v, t) for v, t in g.state if v in live)
    return g.with_(nodes=tuple(kept), state=used_state)
