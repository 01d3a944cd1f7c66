"""Flattening nested tuples/lists/dicts of tensors (graph inputs and outputs)."""
from __future__ import annotations

from typing import Any


def flatten(x: Any) -> tuple[list, Any]:
    """Leaves in order and a spec that :func:`unflatten` rebuilds the structure from."""
    leaves: list = []

    def go(v):
        if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
            return (type(v), tuple(go(e) for e in v))
        if isinstance(v, tuple):  # namedtuple
            return (type(v), tuple(go(e) for e in v))
        if isinstance(v, dict):
            return (dict, tuple((k, go(e)) for k, e in v.items()))
        leaves.append(v)
        return None
    return leaves, go(x)


def unflatten(leaves: list, spec: Any) -> Any:
    it = iter(leaves)

    def go(s):
        if s is None:
            return next(it)
        kind, items = s
        if kind is dict:
            return {k: go(e) for k, e in items}
        vals = [go(e) for e in items]
        if hasattr(kind, "_fields"):
            return kind(*vals)
        return kind(vals)
    return go(spec)
