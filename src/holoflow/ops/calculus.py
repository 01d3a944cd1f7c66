"""Finite differences and quadrature: ``diff``, ``trapezoid`` (``trapz``) and
``cumulative_trapezoid`` (``gradient`` is in ops/numeric.py).

All are composites of existing ops (narrow, sub, cumsum, ...) in ATen's order of operations, so
they need no gradient code and take their SBP rules from their parts.
"""
from __future__ import annotations

import torch

from ..core.errors import normalize_dim
from ..core.tensor import Tensor
from .pointwise import _tensor
from .shape import cat, reshape

__all__ = ["diff", "trapezoid", "trapz", "cumulative_trapezoid"]


# -- composites: differences, products, rotations, integration --------------------------------------------

def diff(input: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None,
         append: Tensor | None = None) -> Tensor:
    """The ``n``-th forward difference along ``dim`` (``!=`` for bool), as ``torch.diff``."""
    if _tensor("diff", input).dim() == 0:
        raise RuntimeError("holoflow.diff expects input to be at least one-dimensional")
    if n < 0:
        raise RuntimeError(f"holoflow.diff expects n to be non-negative, got n={n}")
    d = normalize_dim("diff", dim, input.dim())
    parts = [t for t in (prepend, input, append) if t is not None]
    for t in parts:
        if t.dim() != input.dim():
            raise RuntimeError(f"holoflow.diff expects prepend or append to be the same dimension as input, got "
                               f"shapes {tuple(t.shape)} and {tuple(input.shape)}")
    x = cat(parts, d) if len(parts) > 1 else input
    for _ in range(n):
        m = max(x.shape[d] - 1, 0)
        hi, lo = x.narrow(d, 1, m) if m else x.narrow(d, 0, 0), x.narrow(d, 0, m)
        x = (hi != lo) if x._data.dtype is torch.bool else hi - lo
    return x


def trapezoid(y: Tensor, x=None, *, dx=None, dim: int = -1) -> Tensor:
    """The trapezoidal rule along ``dim`` with sample points ``x`` or spacing ``dx`` (default 1),
    as ``torch.trapezoid`` (the same formulas ATen uses)."""
    d = normalize_dim("trapezoid", dim, _tensor("trapezoid", y, "y").dim())
    if isinstance(x, Tensor) and dx is not None:
        raise RuntimeError("holoflow.trapezoid: received both x and dx; pass one of them")
    n = y.shape[d]
    if not isinstance(x, Tensor):
        spacing = 1 if x is None and dx is None else (dx if dx is not None else x)
        if n == 0:
            return y.sum(d) * 0
        return (y.sum(d) - (y.select(d, 0) + y.select(d, -1)) * 0.5) * spacing
    if x.dim() == 1:
        if x.shape[0] != n:
            raise RuntimeError(f"holoflow.trapezoid: there must be one `x` value for each sample point, got "
                               f"{x.shape[0]} x values for {n} samples along dim {d}")
        shape = [1] * y.dim()
        shape[d] = n
        x = reshape(x, *shape)
        xd = d
    else:
        xd = d - y.dim() + x.dim()
    if n == 0:
        return y.sum(d) * 0
    dxs = x.narrow(xd, 1, n - 1) - x.narrow(xd, 0, n - 1)
    # ATen's order: (left + right) * dx (a complex add multiplies its second operand by alpha = 1)
    return ((y.narrow(d, 0, n - 1) + y.narrow(d, 1, n - 1)) * dxs).sum(d) / 2


def trapz(y: Tensor, x=None, *, dx=None, dim: int = -1) -> Tensor:
    """``torch.trapz``: :func:`trapezoid`'s older name."""
    return trapezoid(y, x, dx=dx, dim=dim)


def cumulative_trapezoid(y: Tensor, x: Tensor | None = None, *, dx: float | None = None, dim: int = -1) -> Tensor:
    """The running trapezoidal integral of ``y`` along ``dim`` (sample points ``x`` or spacing
    ``dx``, default 1), as ``torch.cumulative_trapezoid``."""
    d = normalize_dim("cumulative_trapezoid", dim, y.dim())
    if x is not None and dx is not None:
        raise RuntimeError("holoflow.cumulative_trapezoid: received both x and dx; pass one of them")
    n = y.shape[d]
    # ATen's order: left + right (a complex add multiplies its second operand by alpha = 1)
    pairs = y.narrow(d, 0, n - 1) + y.narrow(d, 1, n - 1) if n else y
    if not isinstance(x, Tensor):
        return (pairs * ((1.0 if dx is None else dx) / 2.0)).cumsum(d)
    if x.dim() == 1:
        if x.shape[0] != n:
            raise RuntimeError(f"holoflow.cumulative_trapezoid: there must be one `x` value for each sample point, "
                               f"got {x.shape[0]} x values for {n} samples along dim {d}")
        x = x.reshape([n if a == d else 1 for a in range(y.dim())])
        xd = d
    else:
        xd = d - y.dim() + x.dim()
    if n == 0:
        return y.cumsum(d)
    steps = x.narrow(xd, 1, n - 1) - x.narrow(xd, 0, n - 1)
    return (pairs * steps).cumsum(d) / 2.0


for _name in ("diff",):
    setattr(Tensor, _name, globals()[_name])
