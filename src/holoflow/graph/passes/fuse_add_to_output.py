"""Add-to-output fusion: ``add(matmul(a, b), r)`` — a residual added to a matmul-like output that
nothing else reads — becomes one node whose kernel accumulates into the residual:

- 2-D ``matmul``: ``torch.addmm(r, a, b)``; 3-D batched ``matmul``: ``torch.baddbmm(r, a, b)``;
- ``linear(x, w, bias)``: ``torch.addmm(r, x.flatten(0, -2), w.t())`` reshaped back, then the
  bias added (the unfused order is ``(x @ w.T + bias) + r``; results agree to rounding);
- ``add``'s ``alpha`` becomes addmm's ``beta`` (``o + alpha * r``) or ``alpha`` (``r + alpha * o``).

Convolutions stay unfused: torch has no add-to-output convolution kernel on CPU.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..ir import Graph, Node, Value
from . import register

MATMUL_LIKE = frozenset({"matmul", "linear"})


def _kernel(op: str, ndim: int, beta, alpha) -> Callable | None:
    """``(*matmul inputs, r) -> r * beta + alpha * op(...)`` for a supported case, else None."""
    if op == "matmul" and ndim == 2:
        return lambda a, b, r: torch.addmm(r, a, b, beta=beta, alpha=alpha)
    if op == "matmul" and ndim == 3:
        return lambda a, b, r: torch.baddbmm(r, a, b, beta=beta, alpha=alpha)
    if op == "linear":
        def linear_add(x, w, bias, r):
            out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t(),
                              beta=beta, alpha=alpha).reshape(r.shape)
            return out if bias is None else out.add_(bias, alpha=alpha)
        return linear_add
    return None


def _match(p: Node, n: Node) -> Node | None:
    """The fused node for producer ``p`` read only by ``add`` node ``n``, or None."""
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
    ins = p.value_inputs()
    if p.op == "matmul" and (len(ins) != 2 or any(len(v.shape) != len(o.shape) for v in ins)):
        return None  # broadcasting or vector operands: no addmm/baddbmm form
    if p.op == "linear" and (len(o.shape) < 1 or not isinstance(p.inputs[1], Value) or len(p.inputs[1].shape) != 2):
        return None
    k = _kernel(p.op, len(o.shape), beta, alph)
    if k is None:
        return None
    k.__name__ = f"{p.op}_add"
    return Node(f"fused_{p.op}_add", (*p.inputs, r), {}, n.outputs, n.source, n.scope,
                kernel=k, tags=n.tags | {"fresh"})


@register("fuse_add_to_output", enabled=lambda cfg: getattr(cfg, "fuse_add_to_output", False))
def fuse_add_to_output(g: Graph, config=None) -> Graph:
    """Fuses residual adds into the matmul-like node before them (see the module docstring)."""
    users = g.users()
    keep = {o for o in g.outputs if isinstance(o, Value)} | {v for _, v in g.updates}
    producer = g.producers()
    fused: dict[int, Node] = {}
    dropped: set = set()
    for n in g.nodes:
        if n.op != "add" or n.kernel is not None or n.effect:
            continue
        for x in n.value_inputs():
            p = producer.get(x)
            if p is None or p.op not in MATMUL_LIKE or p.kernel is not None or id(p) in dropped:
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
