"""Add-to-output fusion: ``add(matmul(a, b), r)`` — a residual added to the output of an op that
has an add-to-output kernel, where nothing else reads that output — becomes one node whose kernel
accumulates into the residual.

The ops say how (``Op.add_to_output``, core/registry.py): matmul as ``torch.addmm`` (2-D) or
``torch.baddbmm`` (3-D), linear as ``addmm`` on the flattened batch then its bias. The add is any
op declared ``axpy`` (``inputs[0] + alpha * inputs[1]``): ``alpha`` becomes the kernel's ``beta``
(``o + alpha * r``) or ``alpha`` (``r + alpha * o``). Convolutions declare no such kernel (torch
has no add-to-output convolution on CPU) and stay unfused.
"""
from __future__ import annotations

from ...core.registry import REGISTRY
from ..ir import IRGraph, Node, Value
from . import register


def _op(n: Node):
    return REGISTRY.get(n.op) if n.kernel is None else None


def _match(p: Node, n: Node) -> Node | None:
    """The fused node for producer ``p`` read only by the axpy node ``n``, or None."""
    o = p.outputs[0]
    alpha = n.attrs.get("alpha", 1)
    if n.inputs[0] is o and n.inputs[1] is not o:
        r, beta, alph = n.inputs[1], alpha, 1
    elif n.inputs[1] is o and n.inputs[0] is not o:
        r, beta, alph = n.inputs[0], 1, alpha
    else:
        return None
    if not isinstance(r, Value) or r.shape != o.shape or r.dtype != o.dtype or r.device != o.device:
        return None
    shapes = tuple(x.shape if isinstance(x, Value) else None for x in p.inputs)
    k = _op(p).add_to_output(shapes, beta, alph)
    if k is None:
        return None
    k.__name__ = f"{p.op}_add"
    return Node(f"fused_{p.op}_add", (*p.inputs, r), {}, n.outputs, n.source, n.scope,
                kernel=k, tags=n.tags | {"fresh"})


@register("fuse_add_to_output", enabled=lambda cfg: getattr(cfg, "fuse_add_to_output", False))
def fuse_add_to_output(g: IRGraph, config=None) -> IRGraph:
    """Fuses residual adds into the matmul-like node before them (see the module docstring)."""
    users = g.users()
    keep = {o for o in g.outputs if isinstance(o, Value)} | {v for _, v in g.updates}
    producer = g.producers()
    fused: dict[int, Node] = {}
    dropped: set = set()
    for n in g.nodes:
        op = _op(n)
        if op is None or not op.axpy or n.effect:
            continue
        for x in n.value_inputs():
            p = producer.get(x)
            if p is None or _op(p) is None or _op(p).add_to_output is None or id(p) in dropped:
                continue
            if len(p.outputs) != 1 or x in keep or users.get(x) != [n] or p.tags != n.tags:
                continue
            new = _match(p, n)
            if new is not None:
                fused[id(n)], _ = new, dropped.add(id(p))
                break
    if not fused:
        return g
    return g.with_(nodes=tuple(fused.get(id(n), n) for n in g.nodes if id(n) not in dropped))
