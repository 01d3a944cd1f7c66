"""Common subexpression elimination: a node equal to an earlier one (same op, same inputs, equal
attrs, same kernel) is dropped and its outputs are read from the earlier node's everywhere —
later nodes, effect inputs, graph outputs and state updates.

Never merged: effect nodes, nodes without outputs, random ops (each draw is its own) and nodes
whose tags differ beyond ``bw`` (a checkpoint's ``recompute`` copy must stay a separate node, or
the recomputation would be undone). Attrs are compared by a typed key, so ``1``, ``1.0`` and
``True`` differ, ``nan`` equals ``nan``, ``0.0`` differs from ``-0.0``, and tensors or other
unhashable objects are equal only to themselves.
"""
from __future__ import annotations

from typing import Any

import torch

from ...core.keys import const_key as _const_key
from ...core.registry import REGISTRY
from ..ir import IRGraph, Node, Value
from . import register


def const_key(x: Any) -> Any:
    """A hashable key under which two constants are equal only if a kernel can't tell them apart."""
    if isinstance(x, Value):
        return ("V", x.id)
    if isinstance(x, (tuple, list, torch.Size)):   # containers may hold Values
        return (type(x).__name__, tuple(const_key(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple(sorted((repr(k), const_key(v)) for k, v in x.items())))
    return _const_key(x)


def node_key(n: Node) -> tuple | None:
    """The key of a mergeable node, or ``None`` if it must stay (effects, random ops...)."""
    op = REGISTRY.get(n.op)
    if n.effect or not n.outputs or op is None or op.random:
        return None
    return (n.op, id(n.kernel), const_key(n.inputs), const_key(n.attrs), n.tags - {"bw"})


def _sub(x: Any, repl: dict) -> Any:
    return repl.get(x, x) if isinstance(x, Value) else x


@register("cse")
def cse(g: IRGraph, config=None) -> IRGraph:
    """Merges equal nodes; see the module docstring."""
    seen: dict[tuple, Node] = {}
    repl: dict[Value, Value] = {}
    nodes = []
    for n in g.nodes:
        if repl and any(isinstance(x, Value) and x in repl for x in n.inputs):
            n = n.with_(inputs=tuple(_sub(x, repl) for x in n.inputs))
        key = node_key(n)
        first = seen.get(key) if key is not None else None
        if first is not None and _same_metas(first, n):
            repl.update(zip(n.outputs, first.outputs))
            continue
        if key is not None:
            seen.setdefault(key, n)
        nodes.append(n)
    if not repl:
        return g
    return g.with_(nodes=tuple(nodes), outputs=tuple(_sub(o, repl) for o in g.outputs),
                   updates=tuple((t, _sub(v, repl)) for t, v in g.updates))


def _same_metas(a: Node, b: Node) -> bool:
    return len(a.outputs) == len(b.outputs) and all(
        x.shape == y.shape and x.dtype == y.dtype and x.device == y.device for x, y in zip(a.outputs, b.outputs))
