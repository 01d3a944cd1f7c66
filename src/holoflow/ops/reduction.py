"""Reductions: sum, mean, prod, amax/amin, max/min (values, indices), argmax/argmin, var, std,
logsumexp, vector norms, all/any, count_nonzero; order statistics (nanmedian, mode, quantile,
nanquantile), nanmean, trace, dist; scans (cumsum, cumprod, cummax, ...) in ``scan.py``.

Every reduction carries its reduced dims as a normalized tuple attr ``dim`` (or an int/None where
torch's kernel only takes one dim) plus ``keepdim``. One SBP rule serves the family: a split on a
kept axis stays split (renumbered when the reduced axes are dropped); a split on a reduced axis
gives partial-sum only for ops linear in their input (sum, mean, count_nonzero); broadcast is
always legal. Grad rules are holoflow ops; max/min/amax/amin send gradients only to the winners.
quantile/nanquantile, nanmean, trace and dist are composites written as ATen writes them (sort,
gather, lerp; nansum over the count; a diagonal's sum; a norm), so their gradients are torch's.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Sequence

import torch

from ..core import dtype as _dtype
from ..core import grad_mode, interpret
from ..core.dispatch import apply
from ..core.errors import ArgValueError, DTypeError, ShapeError, UnsupportedError, normalize_dim
from ..core.interpret import is_lazy
from ..core.registry import defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from . import elementwise as E
from . import out_arg
from .creation import full_like
from .family import CAST, differentiable_dtype, holomorphic, refuse_complex_grad
from .order_stats import kthvalue, median

__all__ = ["sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "aminmax",
           "var", "std", "var_mean", "std_mean", "logsumexp", "norm", "all", "any",
           "count_nonzero", "nansum", "nanmean", "nanmedian", "mode", "quantile", "nanquantile", "trace",
           "dist"]

_sum = sum  # Python's, before the torch-named one


# -- dims --------------------------------------------------------------------------------------

def reduce_dims(op: str, dim, ndim: int) -> tuple[int, ...]:
    """Normalized, sorted reduced dims; ``None`` or ``()`` means every dim (as torch's sum)."""
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim) if isinstance(dim, (tuple, list)) else None
    if dims is None or [d for d in dims if not isinstance(d, int)]:  # (all/any are ops here)
        raise TypeError(f"holoflow.{op}: dim must be an int, a tuple of ints or None, got {dim!r}")
    out = tuple(sorted(normalize_dim(op, d, ndim) for d in dims))
    if len(set(out)) != len(out):
        raise RuntimeError(f"holoflow.{op}: dim {dim} names a dimension more than once")
    return out if ndim else ()


def one_dim(op: str, dim, ndim: int) -> int | None:
    """A single dim (or None) for kernels that take one: prod, argmax, cumsum..."""
    if dim is None:
        return None
    if not isinstance(dim, int):
        raise TypeError(f"holoflow.{op}: dim must be an int or None, got {dim!r}")
    return normalize_dim(op, dim, ndim)


def _reduced(ndim: int, attrs: dict) -> set[int]:
    dim = attrs.get("dim")
    if dim is None or dim == ():
        return set(range(ndim))
    return {dim} if isinstance(dim, int) else set(dim)


def _out_axis(a: int, reduced: set, keepdim: bool) -> int:
    return a if keepdim else a - _sum(d < a for d in reduced)


def reduce_sbp(linear: bool = False, n_out: int = 1):
    """The family's SBP rule (one mesh axis): S on kept axes -> S (renumbered); S on a reduced
    axis -> P and P -> P when the op is linear in its input; B -> B."""
    def rule(metas, attrs):
        ndim = len(metas[0].shape)
        reduced, keep = _reduced(ndim, attrs), attrs.get("keepdim", False)
        sigs = [((B,), (B,) * n_out)]
        for a in range(ndim):
            if a not in reduced:
                sigs.append(((S(a),), (S(_out_axis(a, reduced, keep)),) * n_out))
            elif linear:
                sigs.append(((S(a),), (P,) * n_out))
        if linear:
            sigs.append(((P,), (P,) * n_out))
        return sigs
    return rule


# -- grad helpers: broadcast a reduced gradient back, scatter/gather at indices ----------------

def _unreduce_kernel(dy, shape, dim, keepdim):
    if not keepdim:
        for d in sorted(dim):
            dy = dy.unsqueeze(d)
    return dy.expand(shape)


def _unreduce_map(attrs, out_ndim: int) -> list[int]:
    """Output axis of each input axis of ``unreduce`` (the kept axes, in order)."""
    dims = set(attrs["dim"]) if attrs["dim"] else set(range(out_ndim))
    if attrs["keepdim"]:
        return list(range(out_ndim))
    return [a for a in range(out_ndim) if a not in dims]


def _unreduce_sbp(metas, attrs):
    """B, P, and S on each axis the reduction kept whole (a reduced axis kept as size 1 is not
    one: a shard of it may be empty, and the gradient's sum keeps it at 1)."""
    shape = tuple(attrs["shape"])
    axes = _unreduce_map(attrs, len(shape))
    reduced = set(attrs["dim"]) if attrs["dim"] else set(range(len(shape)))
    sigs = [((B,), (B,)), ((P,), (P,))]
    for a, d in enumerate(metas[0].shape):
        if d == shape[axes[a]] and axes[a] not in reduced:
            sigs.append(((S(a),), (S(axes[a]),)))
    return sigs


def _unreduce_local(attrs, metas, local_metas, in_sbps):
    shape = list(attrs["shape"])
    axes = _unreduce_map(attrs, len(shape))
    for a, (g, l) in enumerate(zip(metas[0].shape, local_metas[0].shape)):
        if g != l:
            shape[axes[a]] = l
    return {**attrs, "shape": tuple(shape)}


UNREDUCE = defop("unreduce", _unreduce_kernel, sbp=_unreduce_sbp, local_attrs=_unreduce_local,
                 grad=lambda c, g: (apply(SUM, g, dim=c.dim, keepdim=c.keepdim, dtype=None),),
                 family="broadcast")


def unreduce(dy: Tensor, shape: Sequence[int], dim: tuple, keepdim: bool) -> Tensor:
    """Broadcasts a reduction's output (or gradient) back to the input ``shape``."""
    return apply(UNREDUCE, dy, shape=tuple(shape), dim=tuple(dim), keepdim=keepdim)


def _at_index_scatter(dy, idx, shape, dim, keepdim):
    if not shape:
        return dy.clone()
    if not keepdim:
        dy, idx = dy.unsqueeze(dim), idx.unsqueeze(dim)
    return torch.zeros(shape, dtype=dy.dtype, device=dy.device).scatter(dim, idx, dy)


def _at_index_gather(x, idx, dim, keepdim):
    if x.dim() == 0:
        return x.clone()
    out = x.gather(dim, idx if keepdim else idx.unsqueeze(dim))
    return out if keepdim else out.squeeze(dim)


def _index_axes(ndim: int, dim: int, keepdim: bool) -> list[tuple[int, int]]:
    """(full-shape axis, index-shape axis) for each axis other than ``dim``."""
    return [(a, a if keepdim else a - (a > dim)) for a in range(ndim) if a != dim]


def _scatter_sbp(metas, attrs):
    sigs = [((B, B), (B,)), ((P, B), (P,))]
    for full, small in _index_axes(len(attrs["shape"]), attrs["dim"], attrs["keepdim"]):
        sigs.append(((S(small), S(small)), (S(full),)))
    return sigs


def _gather_sbp(metas, attrs):
    sigs = [((B, B), (B,)), ((P, B), (P,))]
    for full, small in _index_axes(len(metas[0].shape), attrs["dim"], attrs["keepdim"]):
        sigs.append(((S(full), S(small)), (S(small),)))
    return sigs


def _scatter_local(attrs, metas, local_metas, in_sbps):
    shape = list(attrs["shape"])
    for full, small in _index_axes(len(shape), attrs["dim"], attrs["keepdim"]):
        shape[full] = local_metas[0].shape[small]
    return {**attrs, "shape": tuple(shape)}


AT_INDEX_SCATTER = defop(
    "at_index_scatter", _at_index_scatter, sbp=_scatter_sbp, local_attrs=_scatter_local,
    save="inputs", family="indexing",
    grad=lambda c, g: (apply(AT_INDEX_GATHER, g, c.inputs[1], dim=c.dim, keepdim=c.keepdim), None))
AT_INDEX_GATHER = defop(
    "at_index_gather", _at_index_gather, sbp=_gather_sbp, save="inputs", family="indexing",
    grad=lambda c, g: (apply(AT_INDEX_SCATTER, g, c.inputs[1], shape=tuple(c.shapes[0]), dim=c.dim,
                             keepdim=c.keepdim), None))


def _cast_to(g: Tensor, dtype: torch.dtype) -> Tensor:
    return g if g._data.dtype == dtype else apply(CAST, g, dtype=dtype)


def _all_dims(c) -> tuple:
    return tuple(sorted(_reduced(len(c.shapes[0]), c.attrs)))


def _back(c, t: Tensor) -> Tensor:
    """``t`` (shaped like the op's output) broadcast to the input's shape."""
    return unreduce(t, c.shapes[0], _all_dims(c), c.keepdim)


# -- the ops ----------------------------------------------------------------------------------

def _sum_grad(c, dy):
    return (_cast_to(_back(c, dy), c.dtypes[0]),)


def _mean_kernel(x, dim, keepdim, dtype, count):
    """Local sum over the GLOBAL count, so a shard of a split reduced axis gives a partial sum."""
    local = 1
    for d in (dim if x.dim() else ()):
        local *= x.shape[d]
    if local == count:
        return torch.mean(x, dim, keepdim=keepdim, dtype=dtype)
    return torch.sum(x, dim, keepdim=keepdim, dtype=dtype) / count


def _mean_grad(c, dy):
    return (_cast_to(_back(c, dy) / c.count, c.dtypes[0]),)


def _extreme_grad(c, dy):
    """amax/amin: torch splits the gradient evenly among ties."""
    x = c.inputs[0]
    mask = apply(CAST, x == _back(c, c.out), dtype=dy._data.dtype)
    count = apply(SUM, mask, dim=_all_dims(c), keepdim=True, dtype=None)
    return (_back(c, dy) * mask / count,)


def _at_index_grad(c, dy, _):
    idx = c.outs[1]
    if not c.shapes[0]:
        return (dy,)
    return (apply(AT_INDEX_SCATTER, dy, idx, shape=tuple(c.shapes[0]), dim=c.dim, keepdim=c.keepdim),)


def _evenly_grad(c, dy):
    """max / min / nanmedian of all elements: torch shares the gradient evenly among the elements
    equal to the result (the NaN ones when the result is NaN); the others get zeros, selected
    (torch's CPU rule: an infinite gradient leaves them 0)."""
    x, out = c.inputs[0], c.out
    hit = E.logical_or(x == out, E.logical_and(x.isnan(), out.isnan()))
    count = apply(SUM, hit, dim=tuple(range(len(c.shapes[0]))), keepdim=False, dtype=dy._data.dtype)
    return (E.where(hit, dy / count, 0.0),)


def _nansum_grad(c, dy):
    """ATen's: the gradient times ``not isnan(x)`` (a multiplication: an inf gradient gives NaN at
    the NaN elements, as torch's nanmean of an all-NaN row does)."""
    x = c.inputs[0]
    kept = apply(CAST, x.isnan().logical_not(), dtype=c.dtypes[0])
    return (_cast_to(_back(c, dy), c.dtypes[0]) * kept,)


def _prod_grad(c, dy):
    """torch's rule: ``prod / x`` when the input holds no zero anywhere, else (and in a trace,
    where values are unknown, as torch's meta path) the product of the other elements from
    exclusive products both ways, exact with zeros and infinities. With ``dtype``, of the input
    cast to it, as torch's kernel multiplies (``prod(complex, dtype=float64)``: the real parts)."""
    x = c.inputs[0]
    if c.dtype is not None and c.dtype != x._data.dtype:
        x = apply(CAST, x, dtype=c.dtype)
    dims = _all_dims(c)
    g = _back(c, dy)
    if not dims:   # (a 0-d input: dy in the input's dtype, as every other case)
        return (_cast_to(dy, c.dtypes[0]),)
    zeros = None if is_lazy() or x._data.is_meta else int((x == 0).sum())   # (meta: torch's path too)
    if zeros == 0:
        others = _back(c, _prod_kernel_op(x, c)) / x
    elif zeros is not None and zeros > 1 and len(dims) == x.dim() and not grad_mode.is_grad_enabled():
        return (apply(E.ZEROS_LIKE, x),)   # (torch's shortcut for a whole product with two zeros)
    else:
        others = _others_product(x, dims)
    return (_cast_to(g * others, c.dtypes[0]),)


def _prod_kernel_op(x: Tensor, c) -> Tensor:
    return apply(PROD, x, dim=_all_dims(c), keepdim=c.keepdim, dtype=None)


def _others_product(x: Tensor, dims: tuple) -> Tensor:
    """Per element, the product of the others in its slice over ``dims`` (torch's
    ``prod_safe_zeros_backward``): the reduced dims moved last and flattened into one."""
    nd, rest = x.dim(), [d for d in range(x.dim()) if d not in dims]
    order = rest + list(dims)
    y = x.permute(order) if order != list(range(nd)) else x
    flat = y.reshape(tuple(y.shape[:len(rest)]) + (-1,))
    n = flat.shape[-1]
    ones = flat.new_ones(tuple(flat.shape[:-1]) + (1,))
    before = cat([ones, flat.narrow(-1, 0, n - 1)], -1).cumprod(-1)
    after = cat([ones, flat.narrow(-1, 1, n - 1).flip(-1)], -1).cumprod(-1).flip(-1)
    out = (before * after).reshape(tuple(y.shape))
    return out.permute([order.index(d) for d in range(nd)]) if order != list(range(nd)) else out


def _prod_kernel(x, dim, keepdim, dtype):
    if len(dim) == x.dim() and not keepdim:
        return torch.prod(x, dtype=dtype)
    for d in sorted(dim, reverse=True):
        x, dtype = torch.prod(x, d, keepdim=keepdim, dtype=dtype), None
    return x


def _var_grad(c, dy):
    x = c.inputs[0]
    dims = _all_dims(c)
    n = 1
    for d in dims:
        n *= c.shapes[0][d]
    mu = apply(MEAN, x, dim=dims, keepdim=True, dtype=None, count=n)
    if c.dim is None and n <= c.correction:
        # torch's var_backward over every element (dim=None, or a 0-d input) with no degree of
        # freedom left: NaN where x is its mean, else inf, whatever the sign of 2 / dof
        return (apply(CAST, _back(c, dy) * E.where(x == mu, float("nan"), float("inf")), dtype=c.dtypes[0]),)
    scale = 2.0 / (n - c.correction) if n != c.correction else float("inf")
    return ((_back(c, dy) * scale) * (x - mu),)   # torch's order: (2 / dof) * dy first (complex x: inf * 0j)


def _std_grad(c, dy):
    """torch's std_backward: var's gradient of ``dy / (2 std)``, 0 where std is 0."""
    return _var_grad(c, E.where(c.out == 0, 0.0, dy / (c.out * 2)))


def _logsumexp_grad(c, dy):
    x = c.inputs[0]
    return (_back(c, dy) * E._conj((x - _back(c, c.out)).exp()),)   # torch: dy * conj(exp(x - out))


def _norm_kernel(x, ord, dim, keepdim, dtype):  # noqa: A002
    return torch.linalg.vector_norm(x, ord, dim, keepdim, dtype=dtype)


def _norm_grad(c, dy):
    """torch's ``norm_backward``, case by case (its masks, and where the gradient multiplies)."""
    x, p = c.inputs[0], c.ord
    norm, g = _back(c, c.out), _back(c, dy)
    if p == 0:   # (torch's rule returns no gradient: the count of non-zeros is flat, and None, not zeros)
        return (None,)
    sgn = E.sgn(x)
    if p == 1:
        out = sgn * g
    elif p == 2:
        out = g * E.where(norm == 0, 0.0, x / norm)
    elif p in (float("inf"), float("-inf")):   # amax of |x|, its NaNs counted as maxima
        a = x.abs()
        mask = apply(CAST, E.logical_or(a == norm, a.isnan()), dtype=g._data.dtype)
        out = sgn * (g / apply(SUM, mask, dim=_all_dims(c), keepdim=True, dtype=None) * mask)
    elif p < 1:
        out = sgn * E.where(x == 0, 0.0, x.abs() ** (p - 1)) * g * norm ** (1 - p)
    else:
        scale = E.where(norm == 0, 0.0, g / norm ** (p - 1))
        out = (sgn * x.abs() ** (p - 1) if p < 2 else x * x.abs() ** (p - 2)) * scale
    return (_cast_to(out, c.dtypes[0]),)


def _split_partial_sbp(metas, attrs):
    """Linear in pieces of the input, not in partial sums of its elements (count_nonzero; nansum,
    whose NaN would sit on one rank while the others' parts of that element count): a split of a
    reduced axis gives P, a P input does not."""
    return [s for s in reduce_sbp(linear=True)(metas, attrs) if s[0] != (P,)]


_RED = dict(family="reduction")
SUM = defop("sum", lambda x, dim, keepdim, dtype: torch.sum(x, dim, keepdim=keepdim, dtype=dtype),
            grad=_sum_grad, sbp=reduce_sbp(linear=True), **_RED)
NANSUM = defop("nansum", lambda x, dim, keepdim, dtype: torch.nansum(x, dim, keepdim=keepdim, dtype=dtype),
               grad=_nansum_grad, save="inputs", sbp=_split_partial_sbp, **_RED)
MEAN = defop("mean", _mean_kernel, grad=_mean_grad, sbp=reduce_sbp(linear=True), averages=True, **_RED)
PROD = holomorphic(defop("prod", _prod_kernel, grad=_prod_grad, save="inputs", sbp=reduce_sbp(), **_RED))
AMAX = defop("amax", lambda x, dim, keepdim: torch.amax(x, dim, keepdim), grad=_extreme_grad,
             save="both", sbp=reduce_sbp(), **_RED)
AMIN = defop("amin", lambda x, dim, keepdim: torch.amin(x, dim, keepdim), grad=_extreme_grad,
             save="both", sbp=reduce_sbp(), **_RED)
MAX = defop("max", lambda x, dim, keepdim: torch.max(x, dim, keepdim), grad=_at_index_grad,
            save="output", saved_outputs=(1,), outputs=("values", "indices"), sbp=reduce_sbp(n_out=2),
            **_RED)
MIN = defop("min", lambda x, dim, keepdim: torch.min(x, dim, keepdim), grad=_at_index_grad,
            save="output", saved_outputs=(1,), outputs=("values", "indices"), sbp=reduce_sbp(n_out=2),
            **_RED)
ARGMAX = defop("argmax", lambda x, dim, keepdim: torch.argmax(x, dim, keepdim), sbp=reduce_sbp(), **_RED)
ARGMIN = defop("argmin", lambda x, dim, keepdim: torch.argmin(x, dim, keepdim), sbp=reduce_sbp(), **_RED)
VAR = defop("var", lambda x, dim, correction, keepdim: torch.var(x, dim or None, correction=correction,
                                                                   keepdim=keepdim),
            grad=_var_grad, save="inputs", sbp=reduce_sbp(), **_RED)
# (aten's std kernel: its square root rounds from the accumulation type, so sqrt(var) differs)
STD = defop("std", lambda x, dim, correction, keepdim: torch.std(x, dim or None, correction=correction,
                                                                 keepdim=keepdim),
            grad=_std_grad, save="both", sbp=reduce_sbp(), **_RED)
LOGSUMEXP = defop("logsumexp", lambda x, dim, keepdim: torch.logsumexp(x, dim, keepdim),
                  grad=_logsumexp_grad, save="both", sbp=reduce_sbp(), **_RED)
VECTOR_NORM = defop("vector_norm", _norm_kernel, grad=_norm_grad, save="both", sbp=reduce_sbp(),
                    grad_none=lambda attrs: attrs.get("ord") == 0, **_RED)
ALL = defop("all", lambda x, dim, keepdim: torch.all(x, dim, keepdim=keepdim), sbp=reduce_sbp(), **_RED)
ANY = defop("any", lambda x, dim, keepdim: torch.any(x, dim, keepdim=keepdim), sbp=reduce_sbp(), **_RED)
_AT_INDEX = dict(grad=_at_index_grad, save="output", saved_outputs=(1,), outputs=("values", "indices"),
                 sbp=reduce_sbp(n_out=2), **_RED)
NANMEDIAN = defop("nanmedian", lambda x, dim, keepdim: torch.nanmedian(x, dim, keepdim), **_AT_INDEX)
MODE = defop("mode", lambda x, dim, keepdim: torch.mode(x, dim, keepdim), **_AT_INDEX)
MAX_ALL = defop("max_all", lambda x: torch.max(x), grad=_evenly_grad, save="both", sbp=reduce_sbp(), **_RED)
MIN_ALL = defop("min_all", lambda x: torch.min(x), grad=_evenly_grad, save="both", sbp=reduce_sbp(), **_RED)
# std's square root: torch's gradient is 0 where the deviation is 0 (a constant slice), not 0 * inf
NANMEDIAN_ALL = defop("nanmedian_all", lambda x: torch.nanmedian(x), grad=_evenly_grad, save="both",
                      sbp=reduce_sbp(), **_RED)
COUNT_NONZERO = defop("count_nonzero", lambda x, dim: torch.count_nonzero(x, dim), sbp=_split_partial_sbp, **_RED)


# -- public functions -------------------------------------------------------------------------

def _tdtype(dtype):
    return _dtype.to_torch(dtype) if dtype is not None else None


def sum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A001
    """Sum over ``dim`` (an int, a tuple, or None for all), as ``torch.sum``.

    >>> holoflow.sum(holoflow.ones(2, 3), dim=1).tolist()
    [3.0, 3.0]
    """
    dims = reduce_dims("sum", dim, input.dim())
    return apply(SUM, input, dim=dims, keepdim=keepdim, dtype=differentiable_dtype("sum", input, dtype))


def nansum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Sum treating NaN as zero, as ``torch.nansum``."""
    dims = reduce_dims("nansum", dim, input.dim())
    return apply(NANSUM, input, dim=dims, keepdim=keepdim, dtype=differentiable_dtype("nansum", input, dtype))


def mean(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Mean over ``dim``, as ``torch.mean`` (floating inputs, or pass ``dtype``)."""
    dims = reduce_dims("mean", dim, input.dim())
    count = 1
    for d in dims:
        count *= input.shape[d]
    return apply(MEAN, input, dim=dims, keepdim=keepdim, dtype=_tdtype(dtype), count=count)


def prod(input: Tensor, dim: int | None = None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Product of all elements, or over one ``dim``, as ``torch.prod``."""
    dims = reduce_dims("prod", one_dim("prod", dim, input.dim()), input.dim())
    return apply(PROD, input, dim=dims, keepdim=keepdim, dtype=differentiable_dtype("prod", input, dtype))


def _every_dim_of_empty(name: str, input: Tensor, dim) -> None:
    """torch's refusal (RuntimeError) to take an extreme over every dim of an empty tensor by
    default; a listed empty dim is an IndexError (the kernel's)."""
    if input.numel() == 0 and (dim is None or not isinstance(dim, int) and len(dim) == 0):
        raise ShapeError(f"holoflow.{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                         f"Specify the reduction dim with the 'dim' argument")


def amax(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    """Maximum over ``dim`` (all dims by default); the gradient is shared evenly among ties."""
    _every_dim_of_empty("amax", input, dim)
    out = apply(AMAX, input, dim=reduce_dims("amax", dim, input.dim()), keepdim=keepdim)
    refuse_complex_grad("amax", input)   # (after the kernel: it refuses complex values)
    return out


def amin(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    """Minimum over ``dim`` (all dims by default); the gradient is shared evenly among ties."""
    _every_dim_of_empty("amin", input, dim)
    out = apply(AMIN, input, dim=reduce_dims("amin", dim, input.dim()), keepdim=keepdim)
    refuse_complex_grad("amin", input)
    return out


def _extreme(name: str, full_op, dim_op, binary_fn, input: Tensor, dim, keepdim: bool):
    if isinstance(dim, Tensor):
        return binary_fn(input, dim)
    if dim is None:
        if keepdim:
            raise TypeError(f"holoflow.{name}: keepdim needs a dim")
        if input.numel() == 0:
            raise RuntimeError(f"holoflow.{name}: the input of shape {tuple(input.shape)} has no elements; "
                               f"give a dim to reduce over (a non-empty one), as torch requires")
        return apply(full_op, input)
    return apply(dim_op, input, dim=one_dim(name, dim, input.dim()), keepdim=keepdim)


def max(input: Tensor, dim=None, keepdim: bool = False):  # noqa: A001
    """``max(x)``: the largest element; ``max(x, dim)``: (values, indices); ``max(x, other)``:
    elementwise maximum, as ``torch.max``."""
    return _extreme("max", MAX_ALL, MAX, E.maximum, input, dim, keepdim)


def min(input: Tensor, dim=None, keepdim: bool = False):  # noqa: A001
    """``min(x)``, ``min(x, dim)`` -> (values, indices), or ``min(x, other)``, as ``torch.min``."""
    return _extreme("min", MIN_ALL, MIN, E.minimum, input, dim, keepdim)


def argmax(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the maximum (flattened when ``dim`` is None)."""
    return apply(ARGMAX, input, dim=one_dim("argmax", dim, input.dim()), keepdim=keepdim)


def argmin(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the minimum (flattened when ``dim`` is None)."""
    return apply(ARGMIN, input, dim=one_dim("argmin", dim, input.dim()), keepdim=keepdim)


_aminmax = namedtuple("aminmax", ("min", "max"))


def aminmax(input: Tensor, *, dim: int | None = None, keepdim: bool = False):
    """(min, max) over ``dim`` or all elements."""
    dims = () if dim is None else one_dim("aminmax", dim, input.dim())
    return _aminmax(amin(input, dims, keepdim), amax(input, dims, keepdim))


def _correction(name: str, unbiased, correction) -> float:
    if unbiased is not None and correction is not None:
        raise TypeError(f"holoflow.{name}: pass either unbiased or correction, not both")
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


def _var_args(name, input, dim, unbiased, keepdim, correction):
    if isinstance(dim, bool):  # torch's var(x, unbiased) positional form
        dim, unbiased = None, dim
    # (dim None stays None, as for a 0-d input: torch's gradient over every element differs
    # from its gradient over dims listed, where no degree of freedom is left)
    dims = reduce_dims(name, dim, input.dim())
    return None if dim is None or input.dim() == 0 else dims, _correction(name, unbiased, correction), keepdim


def var(input: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction=None) -> Tensor:
    """Variance with Bessel's ``correction`` (1 by default, or ``unbiased=False`` for 0)."""
    dims, corr, keep = _var_args("var", input, dim, unbiased, keepdim, correction)
    return apply(VAR, input, dim=dims, correction=corr, keepdim=keep)


def std(input: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction=None) -> Tensor:
    """Standard deviation (aten's kernel), with torch's gradient 0 where it is 0."""
    dims, corr, keep = _var_args("std", input, dim, unbiased, keepdim, correction)
    return apply(STD, input, dim=dims, correction=corr, keepdim=keep)


def var_mean(input: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
             correction=None) -> tuple[Tensor, Tensor]:
    """``(var, mean)`` over ``dim``."""
    dims, _, _ = _var_args("var_mean", input, dim, unbiased, keepdim, correction)
    return var(input, dim, unbiased, keepdim, correction=correction), mean(input, dims or None, keepdim)


def std_mean(input: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
             correction=None) -> tuple[Tensor, Tensor]:
    """``(std, mean)`` over ``dim``."""
    dims, _, _ = _var_args("std_mean", input, dim, unbiased, keepdim, correction)
    return std(input, dim, unbiased, keepdim, correction=correction), mean(input, dims or None, keepdim)


def logsumexp(input: Tensor, dim, keepdim: bool = False, *, out: Tensor | None = None) -> Tensor:
    """``log(sum(exp(x)))`` over ``dim``, computed stably."""
    if dim is None:   # (torch's parser: dim is an int or a tuple of ints, not optional)
        raise TypeError("holoflow.logsumexp(): argument 'dim' must be tuple of ints, not NoneType; name the dims "
                        "to reduce (all of them: tuple(range(x.dim())))")
    dims = reduce_dims("logsumexp", dim, input.dim())
    if out is None:
        return apply(LOGSUMEXP, input, dim=dims, keepdim=keepdim)
    took = out_arg.check_out("holoflow.logsumexp()", torch.logsumexp, out, (input, dim), {"keepdim": keepdim})
    return out_arg.write_out("holoflow.logsumexp()", _logsumexp_in(input, dims, keepdim, out), out, took is not None)


def _logsumexp_in(x: Tensor, dims: tuple, keepdim: bool, out) -> Tensor:
    """torch's ``logsumexp(x, out=o)``: the exponentials (in x's dtype, of an integer x in the
    default one) summed in out's dtype, its log plus the maxima there; a half x into a float32
    out is not rounded to half first."""
    dt = out._data.dtype if isinstance(out, Tensor) else None
    if x.is_complex() or dt is None or not (dt.is_floating_point or dt.is_complex) or x._data.dtype == dt:
        return apply(LOGSUMEXP, x, dim=dims, keepdim=keepdim)
    x = x if x.is_floating_point() else apply(CAST, x, dtype=torch.get_default_dtype())
    if not x.numel():
        return sum(x.exp(), dims, keepdim, dtype=dt).log()
    m = amax(x, dims, keepdim=True)
    m = E.where(m.abs() == float("inf"), 0.0, m)
    total = sum((x - m).exp(), dims, keepdim, dtype=dt).log()
    return apply(CAST, total + (m if keepdim else m.reshape(tuple(total.shape))), dtype=dt)   # (torch's add_)


def vector_norm(x: Tensor, ord: float = 2, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A002
    """``(sum |x|^ord)^(1/ord)`` over ``dim`` (inf/-inf: max/min of |x|; 0: count of non-zeros)."""
    if isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise TypeError(f"holoflow.linalg.vector_norm: ord must be a number (2, 1, inf, 0...), got {ord!r}")
    return apply(VECTOR_NORM, x, ord=float(ord), dim=reduce_dims("linalg.vector_norm", dim, x.dim()),
                 keepdim=keepdim, dtype=_tdtype(dtype))


def norm(input: Tensor, p="fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """``torch.norm``: a vector norm of the flattened tensor or over ``dim`` (``'fro'`` is 2)."""
    if p == "fro" or p is None:
        p = 2
    if p == "nuc":   # the sum of the singular values of the matrices over two dims
        dims = tuple(range(input.dim())) if dim is None else ((dim,) if isinstance(dim, int) else tuple(dim))
        if len(dims) != 2:
            raise RuntimeError(f"holoflow.norm: p='nuc' needs 2 dims (a matrix, or dim=(d0, d1)), got {dims} for a "
                               f"tensor of shape {tuple(input.shape)}")
        from .decomp import svdvals   # (ops/decomp.py imports this module)
        d0, d1 = (normalize_dim("norm", d, input.dim()) for d in dims)
        out = svdvals(input.movedim((d0, d1), (-2, -1))).sum(-1)
        if keepdim:
            for d in sorted((d0, d1)):
                out = out.unsqueeze(d)
        return out if dtype is None else out.to(dtype)
    if isinstance(p, str):
        raise UnsupportedError(f"holoflow.norm: p={p!r} is not supported; use p='fro', 'nuc', a number, inf or -inf")
    return vector_norm(input, p, dim, keepdim, dtype=dtype)


def _logical(name: str, op, input: Tensor, dim, keepdim: bool, out) -> Tensor:
    """``all``/``any``, and their ``out=``: into a uint8 ``out`` torch's kernel reduces the input
    cast to uint8 (``all([0.5, 1.0])`` is 0 there, its 0.5 truncated), so holoflow does too."""
    dims = None if dim is None else reduce_dims(name, dim, input.dim())
    if out is None:
        return apply(op, input, dim=dims, keepdim=keepdim)
    label, args = f"holoflow.{name}()", (input,) if dim is None else (input, dim)
    took = out_arg.check_out(label, getattr(torch, name), out, args, {} if dim is None else {"keepdim": keepdim})
    if isinstance(out, Tensor) and out._data.dtype == torch.uint8 and input._data.dtype != torch.uint8:
        input = apply(CAST, input, dtype=torch.uint8)
    return out_arg.write_out(label, apply(op, input, dim=dims, keepdim=keepdim), out, took is not None)


def all(input: Tensor, dim=None, keepdim: bool = False, *, out: Tensor | None = None) -> Tensor:  # noqa: A001
    """True where every element over ``dim`` is non-zero."""
    return _logical("all", ALL, input, dim, keepdim, out)


def any(input: Tensor, dim=None, keepdim: bool = False, *, out: Tensor | None = None) -> Tensor:  # noqa: A001
    """True where some element over ``dim`` is non-zero."""
    return _logical("any", ANY, input, dim, keepdim, out)


def count_nonzero(input: Tensor, dim=None) -> Tensor:
    """Number of non-zero elements over ``dim`` (int64)."""
    dims = None if dim is None else reduce_dims("count_nonzero", dim, input.dim())
    return apply(COUNT_NONZERO, input, dim=dims)


# -- order statistics, nanmean, trace, dist --------------------------------------------------------

def nanmean(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Mean of the non-NaN elements over ``dim`` (NaN where all are NaN), as ``torch.nanmean``."""
    if not (input.is_floating_point() or input.is_complex()):
        raise DTypeError(f"holoflow.nanmean: expected a floating point or complex input, got {input.dtype}")
    count = input.isnan().logical_not().sum(dim, keepdim)
    return nansum(input, dim, keepdim, dtype=dtype) / count


def nanmedian(input: Tensor, dim: int | None = None, keepdim: bool = False):
    """The lower median ignoring NaN: of all elements (a 0-d tensor, NaN if all are NaN), or along
    ``dim`` as a (values, indices) namedtuple, as ``torch.nanmedian``."""
    if dim is None:
        return apply(NANMEDIAN_ALL, input)
    return apply(NANMEDIAN, input, dim=one_dim("nanmedian", dim, input.dim()), keepdim=keepdim)


def mode(input: Tensor, dim: int = -1, keepdim: bool = False):
    """The most frequent value along ``dim`` (the smallest of equally frequent ones) and an index
    of it, as ``torch.mode``: a (values, indices) namedtuple."""
    out = apply(MODE, input, dim=one_dim("mode", dim, input.dim()), keepdim=keepdim)
    refuse_complex_grad("mode", input)   # (after the kernel: it refuses complex values)
    return out


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _check_q(name: str, input: Tensor, q) -> None:
    """``q`` checked as torch checks it: a number or a 0-d/1-D tensor of the input's dtype in [0, 1]."""
    if not isinstance(q, Tensor):
        if not 0 <= q <= 1:
            raise ArgValueError(f"holoflow.{name}: q must be in the range [0, 1] but got {q}")
        return
    if q.dim() > 1:
        raise ShapeError(f"holoflow.{name}: q must be a scalar or 1D tensor, got shape {tuple(q.shape)}")
    if q.dtype != input.dtype:
        raise DTypeError(f"holoflow.{name}: q tensor must be same dtype as the input tensor, got {q.dtype} "
                         f"and {input.dtype}")
    # read on the CPU only, as ATen (no device sync; a trace or a meta tensor has no values)
    if q.device.type == "cpu" and not is_lazy() and not bool(E.logical_and(q >= 0, q <= 1).all()):
        raise ArgValueError(f"holoflow.{name}: q values must be in the range [0, 1]")


def _sorted_along(name: str, input: Tensor, dim, keepdim: bool) -> Tensor:
    """The input sorted along the reduced dim(s), moved last; the other dims are the result's."""
    if dim is None or input.dim() == 0:
        if dim is not None:
            normalize_dim(name, dim, 0)
        lead = (1,) * input.dim() if keepdim else ()
        return input.reshape(-1).sort().values.reshape(lead + (input.numel(),))
    d = normalize_dim(name, dim, input.dim())
    moved = input.unsqueeze(-1).transpose(d, -1).sort().values
    return moved if keepdim else moved.squeeze(d)


def _quantile(name: str, input: Tensor, q, dim, keepdim: bool, interpolation: str, ignore_nan: bool) -> Tensor:
    """ATen's quantile: sort, turn q into (fractional) ranks, gather and interpolate. NaN ranks
    last: quantile gives NaN for a row with any NaN, nanquantile ranks among the others."""
    if input._data.dtype not in (torch.float32, torch.float64):
        raise DTypeError(f"holoflow.{name}: input tensor must be either float or double dtype, got {input.dtype}")
    if input.numel() == 0:
        raise ShapeError(f"holoflow.{name}: input tensor must be non-empty, got shape {tuple(input.shape)}")
    if interpolation not in _INTERPOLATIONS:
        raise ArgValueError(f"holoflow.{name}: interpolation must be one of {', '.join(_INTERPOLATIONS)}, "
                            f"but got {interpolation!r}")
    _check_q(name, input, q)
    values = _sorted_along(name, input, dim, keepdim)
    # a number: one per row, laid out like the rows (global where the input is)
    qt = q if isinstance(q, Tensor) else full_like(values.narrow(-1, 0, 1), q)
    last = values.shape[-1] - 1
    nan = values.isnan()
    if ignore_nan:   # ranks among the non-NaN values; rank 0 (a NaN) where all are NaN
        ranks = qt * (nan.logical_not().sum(-1, keepdim=True) - 1)
        ranks = E.where(ranks < 0, 0.0, ranks)
    else:
        ranks = E.where(nan.any(-1, keepdim=True), float(last), qt * last)
    if interpolation in ("lower", "higher", "nearest"):
        ranks = {"lower": ranks.floor, "higher": ranks.ceil, "nearest": ranks.round}[interpolation]()
    below = apply(CAST, ranks, dtype=torch.int64)
    out = values.gather(-1, below)
    if interpolation in ("linear", "midpoint"):
        above = values.gather(-1, apply(CAST, ranks.ceil(), dtype=torch.int64))
        out = E.lerp(out, above, 0.5 if interpolation == "midpoint" else ranks - below)
    return out.movedim(-1, 0) if isinstance(q, Tensor) and q.dim() == 1 else out.squeeze(-1)


def quantile(input: Tensor, q, dim: int | None = None, keepdim: bool = False, *,
             interpolation: str = "linear") -> Tensor:
    """The ``q``-th quantiles (a number, or a 1-D tensor: one leading output dim) of the flattened
    input or along ``dim``, as ``torch.quantile``; NaN where a row holds a NaN."""
    return _quantile("quantile", input, q, dim, keepdim, interpolation, ignore_nan=False)


def nanquantile(input: Tensor, q, dim: int | None = None, keepdim: bool = False, *,
                interpolation: str = "linear") -> Tensor:
    """``quantile`` ignoring NaN (NaN only where a row is all NaN), as ``torch.nanquantile``."""
    return _quantile("nanquantile", input, q, dim, keepdim, interpolation, ignore_nan=True)


def trace(input: Tensor) -> Tensor:
    """The sum of a matrix's main diagonal, as ``torch.trace`` (integers sum to int64)."""
    if input.dim() != 2:
        raise ShapeError(f"holoflow.trace: expected a matrix, but got a tensor of shape {tuple(input.shape)}")
    (input,) = interpret.composite("trace", input)
    return sum(input.diagonal())


def dist(input: Tensor, other: Tensor, p: float = 2) -> Tensor:
    """The ``p``-norm of ``input - other`` (broadcast), as ``torch.dist``."""
    return vector_norm(input - other, p)


for _name in ("sum", "nansum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin",
              "aminmax", "var", "std", "logsumexp", "norm", "all", "any", "count_nonzero", "nanmean",
              "nanmedian", "mode", "quantile", "nanquantile", "trace", "dist"):
    setattr(Tensor, _name, globals()[_name])
# median and kthvalue are declared in order_stats.py; their Tensor methods live with the reductions
Tensor.median = median
Tensor.kthvalue = kthvalue

from . import scan  # noqa: E402,F401  (cumsum, cumprod: their own module)
from .scan import cummax, cummin, cumprod, cumsum, logcumsumexp  # noqa: E402
from .shape import cat  # noqa: E402  (prod's gradient)

__all__ += ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"]
