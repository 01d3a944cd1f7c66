"""Flattening nested tuples/lists/dicts of tensors (graph inputs and outputs).

Plain recursive functions, not closures calling themselves: a nested function that refers to
itself is a reference cycle (function -> its cell -> function) holding whatever else its cells
hold (the leaves), so a compiled call's inputs, outputs and through them their autograd graphs
with every saved tensor would live until Python's cyclic collector ran."""
from __future__ import annotations

from typing import Any, Iterator


def flatten(x: Any) -> tuple[list, Any]:
    """Leaves in order and a spec that :func:`unflatten` rebuilds the structure from."""
    leaves: list = []
    return leaves, _spec(x, leaves)


def _spec(v: Any, leaves: list) -> Any:
    if isinstance(v, (list, tuple)):   # (a namedtuple too: its type rebuilds it)
        return (type(v), tuple(_spec(e, leaves) for e in v))
    if isinstance(v, dict):
        return (dict, tuple((k, _spec(e, leaves)) for k, e in v.items()))
    leaves.append(v)
    return None


def unflatten(leaves: list, spec: Any) -> Any:
    return _build(spec, iter(leaves))


def _build(s: Any, it: Iterator) -> Any:
    if s is None:
        return next(it)
    kind, items = s
    if kind is dict:
        return {k: _build(e, it) for k, e in items}
    vals = [_build(e, it) for e in items]
    if hasattr(kind, "_fields"):
        return kind(*vals)
    return kind(vals)
