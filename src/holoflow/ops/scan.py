"""Scans along one dim: cumsum, cumprod (and reverse_cumsum, cumsum's transpose).

SBP: a split on any axis but the scanned one stays split; cumsum is linear, so P -> P.
"""
from __future__ import annotations

import torch

from ..core import dtype as _dtype
from ..core.dispatch import apply
from ..core.errors import normalize_dim
from ..core.registry import defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from . import elementwise as E
from .family import CAST

__all__ = ["cumsum", "cumprod"]


def scan_sbp(linear: bool):
    def rule(metas, attrs):
        sigs = [((B,), (B,))] + [((S(a),), (S(a),)) for a in range(len(metas[0].shape)) if a != attrs["dim"]]
        return sigs + [((P,), (P,))] if linear else sigs
    return rule


def _cast_to(g: Tensor, dtype: torch.dtype) -> Tensor:
    return g if g._data.dtype == dtype else apply(CAST, g, dtype=dtype)


def _reverse_cumsum(x, dim):
    return x.flip(dim).cumsum(dim).flip(dim)


def _cumsum_grad(c, dy):
    return (_cast_to(apply(REVERSE_CUMSUM, dy, dim=c.dim), c.dtypes[0]),)


def _cumprod_grad(c, dy):
    """Exact with zeros, in O(n): before the first zero, sum_{j>=i} dy_j out_j / x_i; at the first
    zero k, prod_{m<k} x_m * sum_{j>=k} dy_j prod_{k<m<=j} x_m; after it, 0."""
    x, out, d = c.inputs[0], c.out, c.dim
    zero = x == 0
    nzeros = apply(CUMSUM, zero, dim=d, dtype=None)
    upto_first = nzeros == zero     # no zero strictly before this position (bool promotes to 0/1)
    first = E.logical_and(zero, upto_first)
    safe = E.where(zero, 1.0, x)
    before = apply(REVERSE_CUMSUM, dy * out, dim=d) / safe
    tail = apply(CUMPROD, E.where(upto_first, 1.0, x), dim=d, dtype=None)
    at_zero = apply(CUMPROD, safe, dim=d, dtype=None) * apply(REVERSE_CUMSUM, dy * tail, dim=d)
    g = E.where(first, at_zero, E.where(upto_first, before, 0.0))
    return (_cast_to(g, c.dtypes[0]),)


_SCAN = dict(family="scan")
CUMSUM = defop("cumsum", lambda x, dim, dtype: torch.cumsum(x, dim, dtype=dtype), grad=_cumsum_grad,
               sbp=scan_sbp(linear=True), **_SCAN)
REVERSE_CUMSUM = defop("reverse_cumsum", _reverse_cumsum, sbp=scan_sbp(linear=True), **_SCAN,
                       grad=lambda c, dy: (apply(CUMSUM, dy, dim=c.dim, dtype=None),))
CUMPROD = defop("cumprod", lambda x, dim, dtype: torch.cumprod(x, dim, dtype=dtype), grad=_cumprod_grad,
                save="both", sbp=scan_sbp(linear=False), **_SCAN)


def _dim(op: str, dim: int, ndim: int) -> int:
    if not isinstance(dim, int):
        raise TypeError(f"holoflow.{op}: dim must be an int, got {dim!r}")
    return normalize_dim(op, dim, ndim)


def cumsum(input: Tensor, dim: int, *, dtype=None) -> Tensor:
    """Cumulative sum along ``dim``, as ``torch.cumsum``."""
    return apply(CUMSUM, input, dim=_dim("cumsum", dim, input.dim()),
                 dtype=_dtype.to_torch(dtype) if dtype is not None else None)


def cumprod(input: Tensor, dim: int, *, dtype=None) -> Tensor:
    """Cumulative product along ``dim``, as ``torch.cumprod`` (exact gradient with zeros)."""
    return apply(CUMPROD, input, dim=_dim("cumprod", dim, input.dim()),
                 dtype=_dtype.to_torch(dtype) if dtype is not None else None)


Tensor.cumsum = cumsum
Tensor.cumprod = cumprod
