"""shard_elementwise: a one-input elementwise op that is the only reader of an all-gather's
result runs on the shards, before the gather.

An all-gather moves values and sums nothing, so it commutes with any elementwise op of one
input: ``f(gather(x)) == gather(f(x))``, bit for bit. Mixed precision casts a ZeRO-3 parameter
right after its gather (passes/amp.py, zero_regather's replay in backward): run on the rows
instead, the cast touches 1/N of the elements, the gather moves bfloat16 values (half the
bytes) and no whole float32 copy is ever made; FSDP's mixed precision gathers its parameter
dtype the same way. Gather buckets (passes/bucket_gathers.py) move every member's op.

Candidates: a node whose collective only all-gathers (``box_plan`` steps), each of whose outputs
has one reader, a forward or backward node of an ``elementwise`` op (not random, not
writing in place: it would write the shard, no own kernel, one tensor input, one output). The
moved node takes its layout from its input (no signature), the gather's outputs become the ops'
outputs.
"""
from __future__ import annotations

from ...core.registry import REGISTRY
from ...distributed.boxing import plan as box_plan
from ..ir import IRGraph, Node, Value
from . import register


def _only_gathers(n: Node) -> bool:
    op = REGISTRY.get(n.op)
    if op is None or not op.collective or "src" not in n.attrs or not n.inputs:
        return False
    a = n.attrs
    steps = box_plan(a["src"], a["dst"], a["place"].hierarchy)
    return bool(steps) and all(s.kind == "all_gather" for s in steps)


def _unary(n: Node) -> bool:
    op = REGISTRY.get(n.op)
    return (op is not None and op.elementwise and not op.random and n.kernel is None
            and not n.effect and "inplace" not in n.tags and len(n.value_inputs()) == 1 and len(n.outputs) == 1)


@register("shard_elementwise", enabled=lambda cfg: getattr(cfg, "global_graph", False))
def shard_elementwise(g: IRGraph, config=None) -> IRGraph:
    readers: dict[Value, list[Node]] = {}
    for n in g.nodes:
        for x in n.value_inputs():
            readers.setdefault(x, []).append(n)
    outs = {o for o in g.outputs if isinstance(o, Value)} | {v for _, v in g.updates}
    moves: dict[int, list[Node]] = {}   # gather -> its outputs' readers, in output order
    for n in g.nodes:
        if not _only_gathers(n):
            continue
        ops = [readers.get(v, []) for v in n.outputs]
        if all(len(r) == 1 and _unary(r[0]) and v not in outs for r, v in zip(ops, n.outputs)):
            moves[id(n)] = [r[0] for r in ops]
    if not moves:
        return g
    moved = {id(f) for fs in moves.values() for f in fs}
    nodes: list[Node] = []
    for n in g.nodes:
        if id(n) in moved:
            continue
        if id(n) in moves:
            ins = []
            for x, f in zip(n.inputs, moves[id(n)]):
                y = f.outputs[0]
                low = Value(x.shape, y.dtype, x.device)
                nodes.append(f.with_(inputs=tuple(x if v is f.value_inputs()[0] else v for v in f.inputs),
                                     outputs=(low,), sbp=None))
                ins.append(low)
            n = n.with_(inputs=tuple(ins), outputs=tuple(f.outputs[0] for f in moves[id(n)]))
        nodes.append(n)
    return g.with_(nodes=tuple(nodes))
