"""Scans along one dim: cumsum, cumprod (and reverse_cumsum, cumsum's transpose), cummax/cummin
(values and indices), logcumsumexp; with the in-place ``cumsum_``/``cumprod_``.

SBP: a split on any axis but the scanned one stays split; cumsum is linear, so P -> P.
"""
from __future__ import annotations

import torch

from ..core import dtype as _dtype
from ..core import grad_mode
from ..core.dispatch import apply, apply_inplace
from ..core.errors import normalize_dim
from ..core.interpret import is_lazy
from ..core.registry import defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from . import elementwise as E
from .family import CAST, differentiable_dtype, holomorphic, refuse_complex_grad
from .layout import flip
from .scatter import GATHER_BACKWARD
from .shape import cat, stack

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
    """torch's: the gradient cast to the input's dtype first, then summed (``cumsum(x, dtype=float16)``
    of a float32 x sums its gradient in float32)."""
    return (apply(REVERSE_CUMSUM, _cast_to(dy, c.dtypes[0]), dim=c.dim),)


def _cumprod_grad(c, dy):
    """torch's ``cumprod_backward`` (written for real tensors; holomorphic conjugates around it):
    ``reversed_cumsum(out * dy) / x`` when the input holds no zero anywhere; otherwise, while
    backward records (``create_graph``), the O(n^2) sum of omitted products (differentiable: the
    masked form's derivative is not cumprod's second derivative); else the masked O(n) form. In a
    trace (values unknown) the zero-safe forms."""
    x, out, d = c.inputs[0], c.out, c.dim
    if dy._data.dtype != x._data.dtype:   # (torch: grad.to(self.scalar_type()) first)
        if x._data.is_complex() and not dy._data.is_complex():
            # a real dy (dtype=float64) of a complex x: holomorphic's conjugates did not run, and
            # torch's rule conjugates for its complex input: x's values, not the real parts out has
            dy = E.conj(_cast_to(dy, x._data.dtype))
            return (E.conj(_cast_to(_cumprod_input_grad(x, out, dy, d), x._data.dtype)),)
        dy = _cast_to(dy, x._data.dtype)
    # (and the gradient in x's dtype: ``out`` is in the dtype= asked for, float64 for a bfloat16 x)
    return (_cast_to(_cumprod_input_grad(x, out, dy, d), x._data.dtype),)


def _cumprod_input_grad(x: Tensor, out: Tensor, dy: Tensor, d: int) -> Tensor:
    n = x.shape[d] if x.dim() else 1
    if x.numel() <= 1 or n == 1:
        return dy
    if not (is_lazy() or x._data.is_meta) and not bool((x == 0).any()):
        return apply(REVERSE_CUMSUM, out * dy, dim=d) / x
    if grad_mode.is_grad_enabled():
        return _omitted_products_grad(x, dy, d, n)
    return _first_zero_grad(x, out, dy, d, n)


def _first_zero_grad(x: Tensor, out: Tensor, dy: Tensor, d: int, n: int) -> Tensor:
    """Per slice: before the first zero z1, reversed_cumsum(w) / x of ``w = out * dy`` masked to
    [0, z1); at z1, sum over [z1, z2) of dy times the products of x after z1, times out[z1 - 1];
    after z1, 0 (torch's masks, so its NaN and inf where seeds or inputs are not finite)."""
    zeros = apply(CUMSUM, x == 0, dim=d, dtype=None)
    before = zeros == 0
    w = E.where(before, out * dy, 0.0)
    g = E.where(before, apply(REVERSE_CUMSUM, w, dim=d) / x, 0.0)
    one = zeros == 1
    first_index = one.to(torch.uint8).argmax(d, keepdim=True)
    first = E.logical_and(x == 0, one)
    between = E.logical_and(one, E.logical_not(first))
    prev = out.gather(d, (first_index - 1).clamp(min=0))
    prev = E.where(first_index == 0, 1.0, prev)
    at_first = (apply(CUMPROD, E.where(between, x, 1.0), dim=d, dtype=None) * E.where(one, dy, 0.0)).sum(
        d, keepdim=True) * prev
    return E.where(first, at_first, g)


def _omitted_products_grad(x: Tensor, dy: Tensor, d: int, n: int) -> Tensor:
    """``dx_k = sum_{j>=k} dy_j prod_{i<=j, i!=k} x_i``, one slice per k (torch's GradMode path)."""
    ones = dy.new_ones(tuple(1 if a == d else s for a, s in enumerate(x.shape)))
    slices = []
    for k in range(n):
        if k == 0:
            omitted = cat([ones, apply(CUMPROD, x.narrow(d, 1, n - 1), dim=d, dtype=None)], d)
        else:
            until = x.narrow(d, 0, k).prod(d, keepdim=True)
            if k == n - 1:
                omitted = until
            else:
                after = apply(CUMPROD, x.narrow(d, k + 1, n - k - 1), dim=d, dtype=None)
                omitted = cat([until, until.expand(tuple(after.shape)) * after], d)
        slices.append((dy.narrow(d, k, n - k) * omitted).sum(d))
    return stack(slices, d)


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
               sbp=scan_sbp(linear=True), inplace_kernel=lambda x, dim, dtype: x.cumsum_(dim, dtype=dtype), **_SCAN)
REVERSE_CUMSUM = defop("reverse_cumsum", _reverse_cumsum, sbp=scan_sbp(linear=True), **_SCAN,
                       grad=lambda c, dy: (apply(CUMSUM, dy, dim=c.dim, dtype=None),))
CUMPROD = holomorphic(defop("cumprod", lambda x, dim, dtype: torch.cumprod(x, dim, dtype=dtype),
                            grad=_cumprod_grad, save="both", sbp=scan_sbp(linear=False),
                            inplace_kernel=lambda x, dim, dtype: x.cumprod_(dim, dtype=dtype), **_SCAN))
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
    return apply(CUMSUM, input, dim=_dim("cumsum", dim, input.dim()),
                 dtype=differentiable_dtype("cumsum", input, dtype))


def cumprod(input: Tensor, dim: int, *, dtype=None) -> Tensor:
    """Cumulative product along ``dim``, as ``torch.cumprod`` (exact gradient with zeros)."""
    return apply(CUMPROD, input, dim=_dim("cumprod", dim, input.dim()),
                 dtype=differentiable_dtype("cumprod", input, dtype))


def cummax(input: Tensor, dim: int):
    """Running maximum along ``dim`` and the index of each (the last of equal ones, NaN wins),
    as ``torch.cummax``: a (values, indices) namedtuple."""
    out = apply(CUMMAX, input, dim=_dim("cummax", dim, input.dim()))
    refuse_complex_grad("cummax", input)   # (after the kernel: it refuses complex values)
    return out


def cummin(input: Tensor, dim: int):
    """Running minimum along ``dim`` and its indices, as ``torch.cummin``."""
    out = apply(CUMMIN, input, dim=_dim("cummin", dim, input.dim()))
    refuse_complex_grad("cummin", input)
    return out


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
