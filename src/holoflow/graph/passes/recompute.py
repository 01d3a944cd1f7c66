"""Pointwise recomputation: a forward value made by an elementwise node whose inputs the backward
keeps anyway is not kept for the backward; the backward recomputes it from those inputs.

``y = gelu(x)`` in an MLP: ``gelu_backward`` keeps ``x``, and the next linear's weight gradient
reads ``y``; keeping both holds two activations where one suffices. The backward gets a copy of
the node (tags ``bw`` and ``recompute_pointwise``; CSE, which would merge it back, has run)
just before its first backward reader, and memory_plan frees the forward ``y`` after its last forward use. This
is torch.compile's choice for cheap pointwise ops (its min-cut partitioner recomputes them).

Candidates: forward nodes of ops declared ``elementwise`` (one output, not random, no own
kernel) of local graphs whose every tensor input is state, a feed, or read by the backward
(nodes of global graphs carry signatures the boxing plan was priced with: left alone). The
rewrite is kept only when it lowers the planned peak (memory_plan.peak_bytes);
``config.recompute_pointwise = False`` turns it off.
"""
from __future__ import annotations

from ...core.registry import REGISTRY
from ..ir import IRGraph, Node, Value
from . import register
from .memory_plan import last_uses, peak_bytes


TAG = "recompute_pointwise"


def _backward(n: Node) -> bool:
    return "bw" in n.tags


def candidates(g: IRGraph) -> set:
    """Forward values the backward may recompute at the cost of one elementwise kernel."""
    read_bw = {x for n in g.nodes if _backward(n) for x in n.value_inputs()}
    held = {v for v, _ in g.state} | set(g.feeds)
    keep = {o for o in g.outputs if isinstance(o, Value)} | {v for _, v in g.updates}
    out = set()
    for n in g.nodes:
        op = REGISTRY.get(n.op)
        if _backward(n) or n.effect or op is None or not op.elementwise or op.random or n.kernel is not None:
            continue
        if len(n.outputs) != 1 or n.outputs[0] not in read_bw or n.outputs[0] in keep:
            continue
        if n.sbp is not None or n.outputs[0].placement is not None:
            continue   # global graphs: the boxing plan counts each value once; left as traced
        if all(x in read_bw or x in held for x in n.value_inputs()):
            out.add(n.outputs[0])
    return out


def with_copies(g: IRGraph, todo: set) -> IRGraph:
    """``g`` with backward reads of the values in ``todo`` redirected to copies of their nodes,
    each made just before its first backward reader."""
    producer = g.producers()
    copies: dict = {}
    nodes: list[Node] = []
    for n in g.nodes:
        if _backward(n) and any(x in todo for x in n.value_inputs()):
            ins = []
            for x in n.inputs:
                if isinstance(x, Value) and x in todo:
                    if x not in copies:
                        p = producer[x]
                        copies[x] = Value(x.shape, x.dtype, x.device)
                        nodes.append(p.with_(outputs=(copies[x],), tags=p.tags | {"bw", TAG}))
                    x = copies[x]
                ins.append(x)
            n = n.with_(inputs=tuple(ins))
        nodes.append(n)
    return g.with_(nodes=tuple(nodes))


@register("recompute", enabled=lambda cfg: getattr(cfg, "recompute_pointwise", True))
def recompute(g: IRGraph, config=None) -> IRGraph:
    """Recomputes cheap pointwise forward values in the backward (see the module docstring)."""
    todo = candidates(g)
    if not todo:
        return g
    new = with_copies(g, todo)
    return new if peak_bytes(new, last_uses(new)) < peak_bytes(g, last_uses(g)) else g
