"""Keys under which two constants are equal only if a kernel cannot tell them apart: ``2``,
``2.0`` and ``True`` are three keys (Python's ``==`` makes them one), floats by their bits.

:func:`const_key` falls back to an object's identity (tensors, callables): right for merging
nodes of one graph that hold the same object, wrong for a cache that outlives the object (a
later object may reuse the id), which :func:`cache_key` refuses instead (None).
"""
from __future__ import annotations

import math
from typing import Any

import torch


class _Unkeyable(Exception):
    pass


def const_key(x: Any, _strict: bool = False) -> Any:
    """A hashable key of ``x`` (identity for objects without a value key)."""
    if x is None or isinstance(x, (str, bytes, torch.dtype, torch.device)):
        return (type(x).__name__, x)
    if isinstance(x, bool):
        return ("bool", x)
    if isinstance(x, int):
        return ("int", x)
    if isinstance(x, float):
        return ("float", "nan" if math.isnan(x) else x.hex())
    if isinstance(x, complex):
        return ("complex", const_key(x.real), const_key(x.imag))
    if isinstance(x, (tuple, list, torch.Size)):
        return (type(x).__name__, tuple(const_key(v, _strict) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple(sorted((repr(k), const_key(v, _strict)) for k, v in x.items())))
    if isinstance(x, slice):
        return ("slice", const_key(x.start), const_key(x.stop), const_key(x.step))
    if x is Ellipsis:
        return ("ellipsis",)
    if _strict:
        raise _Unkeyable
    return ("id", id(x))  # tensors, callables, anything else: identity only


def cache_key(x: Any) -> Any | None:
    """``const_key(x)`` when it is a value key throughout; None when some part is only an
    identity (a tensor, a callable): such keys must not outlive their objects."""
    try:
        return const_key(x, True)
    except _Unkeyable:
        return None
