"""Scans along one dim: cumsum, cumprod (and reverse_cumsum, cumsum's transpose), cummax/cummin
(values and indices), logcumsumexp; with the in-place ``cumsum_``/``cumprod_``.

SBP: a split on any axis but the scanned one stays split; cumsum is linear, so P -> P.
"""
from __future__ import annotations

import torch

from ..core import dtype as _dtype
from ..core.dispatch import apply, apply_inplace
from ..core.errors import normalize_dim
from ..core.registry import defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from . import elementwise as E
from .family import CAST, holomorphic
from .layout import flip
from .scatter import GATHER_BACKWARD

__all__ = ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"]


def scan_sbp(linear: bool, n_out: int = 1):
    def rule(metas, attrs):
        sigs = [((B,), (B,) * n_out)] + [((S(a),), (S(a),) * n_out) for a in range(len(metas[0].shape))
                                         if a != attrs["dim"]]
        return sigs + [((P,), (P,) * n_out)] if linear else sigs
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


def _cumextreme_grad(c, dy, _unused_indices_grad=None):
    """cummax/cummin: each output's gradient goes to the element it copied (ATen's scatter_add)."""
    if not c.shapes[0]:
        return (dy,)
    return (apply(GATHER_BACKWARD, dy, c.outs[1], dim=c.dim, shape=tuple(c.shapes[0])),)


def _reverse_logcumsumexp(x: Tensor, dim: int) -> Tensor:
    return flip(apply(LOGCUMSUMEXP, flip(x, dim), dim=dim), dim)


def _logcumsumexp_grad(c, dy):
    """sum_{j>=i} dy_j exp(x_i - out_j), in log space as ATen: the positive and negative parts of
    dy summed separately, so nothing overflows (-inf stands for log 0)."""
    x, out, d = c.inputs[0], c.out, c.dim
    log_abs = dy.abs().log()
    parts = [_reverse_logcumsumexp(E.where(sel, log_abs - out, float("-inf")), d) + x for sel in (dy > 0, dy < 0)]
    return (parts[0].exp() - parts[1].exp(),)


_SCAN = dict(family="scan")
CUMSUM = defop("cumsum", lambda x, dim, dtype: torch.cumsum(x, dim, dtype=dtype), grad=_cumsum_grad,
               sbp=scan_sbp(linear=True), **_SCAN)
REVERSE_CUMSUM = defop("reverse_cumsum", _reverse_cumsum, sbp=scan_sbp(linear=True), **_SCAN,
                       grad=lambda c, dy: (apply(CUMSUM, dy, dim=c.dim, dtype=None),))
CUMPROD = holomorphic(defop("cumprod", lambda x, dim, dtype: torch.cumprod(x, dim, dtype=dtype),
                            grad=_cumprod_grad, save="both", sbp=scan_sbp(linear=False), **_SCAN))
_CUMEXTREME = dict(grad=_cumextreme_grad, save="output", saved_outputs=(1,), outputs=("values", "indices"),
                   sbp=scan_sbp(linear=False, n_out=2), **_SCAN)
CUMMAX = defop("cummax", lambda x, dim: torch.cummax(x, dim), **_CUMEXTREME)
CUMMIN = defop("cummin", lambda x, dim: torch.cummin(x, dim), **_CUMEXTREME)
LOGCUMSUMEXP = defop("logcumsumexp", lambda x, dim: torch.logcumsumexp(x, dim), grad=_logcumsumexp_grad,
                     save="both", sbp=scan_sbp(linear=False), **_SCAN)


def _dim(op: str, dim: int, ndim: int) -> int:
    if not isinstance(dim, int):
        raise TypeError(f"holoflow.{op}: dim must be an int, got {dim!r}")
    return normalize_dim(op, dim, ndim)


def _tdtype(dtype):
    return _dtype.to_torch(dtype) if dtype is not None else None


def cumsum(input: Tensor, dim: int, *, dtype=None) -> Tensor:
    """Cumulative sum along ``dim``, as ``torch.cumsum``."""
    return apply(CUMSUM, input, dim=_dim("cumsum", dim, input.dim()), dtype=_tdtype(dtype))


def cumprod(input: Tensor, dim: int, *, dtype=None) -> Tensor:
    """Cumulative product along ``dim``, as ``torch.cumprod`` (exact gradient with zeros)."""
    return apply(CUMPROD, input, dim=_dim("cumprod", dim, input.dim()), dtype=_tdtype(dtype))


def cummax(input: Tensor, dim: int):
    """Running maximum along ``dim`` and the index of each (the last of equal ones, NaN wins),
    as ``torch.cummax``: a (values, indices) namedtuple."""
    return apply(CUMMAX, input, dim=_dim("cummax", dim, input.dim()))


def cummin(input: Tensor, dim: int):
    """Running minimum along ``dim`` and its indices, as ``torch.cummin``."""
    return apply(CUMMIN, input, dim=_dim("cummin", dim, input.dim()))


def logcumsumexp(input: Tensor, dim: int) -> Tensor:
    """``log(cumsum(exp(x)))`` along ``dim``, computed stably, as ``torch.logcumsumexp``."""
    return apply(LOGCUMSUMEXP, input, dim=_dim("logcumsumexp", dim, input.dim()))


def _inplace(op):
    """``x.cumsum_(dim, *, dtype=None)`` / ``x.cumprod_``: the scan written into ``x``."""
    def method(self: Tensor, dim: int, *, dtype=None) -> Tensor:
        return apply_inplace(op, self, dim=_dim(op.name + "_", dim, self.dim()), dtype=_tdtype(dtype))
    method.__name__ = method.__qualname__ = op.name + "_"
    return method


for _name in __all__:
    setattr(Tensor, _name, globals()[_name])
Tensor.cumsum_ = _inplace(CUMSUM)
Tensor.cumprod_ = _inplace(CUMPROD)
