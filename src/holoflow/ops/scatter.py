"""Gather/scatter family: gather, scatter, scatter_add, index_select, index_add, index_fill,
index_put, index_reduce, index_copy, masked_scatter, scatter_reduce, the view inverses
slice_scatter / select_scatter / diagonal_scatter and fill_diagonal_ (imported and re-exported by
ops/indexing.py)."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..core import interpret
from ..core.dispatch import apply, apply_inplace
from ..core.errors import normalize_dim
from ..core.registry import REGISTRY, Meta, Op
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .family import defop, needs, reduce_grad, refuse_complex_grad
from .layout import _rest_axes
from .norm import _one_split_bwd_sbp, _one_split_sbp
from .pointwise import _tensor
from .shape import RESHAPE
from .stacking import _all_b, _all_b_bwd
from .torch_vjp import defop_vjp

__all__ = ["gather", "scatter", "scatter_add", "index_select", "index_add", "index_fill", "take_along_dim",
           "index_put", "index_reduce", "slice_scatter", "select_scatter", "diagonal_scatter"]


# -- gather / scatter --------------------------------------------------------------------------------

def _gather_sbp(metas, attrs):
    x, idx, d = metas[0], metas[1], attrs["dim"]
    sigs = [((B, B), (B,)), ((P, B), (P,))] + ([((B, S(d)), (S(d),))] if idx.shape else [])   # (0-d: no axis)
    return sigs + [((S(a), S(a)), (S(a),)) for a in range(len(x.shape))
                   if a != d and x.shape[a] == idx.shape[a]]


def _gather_backward_sbp(metas, attrs):
    dy, d, shape = metas[0], attrs["dim"], attrs["shape"]
    sigs = [((B, B), (B,)), ((P, B), (P,))] + ([((S(d), S(d)), (P,))] if dy.shape else [])
    return sigs + [((S(a), S(a)), (S(a),)) for a in range(len(shape)) if a != d and shape[a] == dy.shape[a]]


def _shape_follows_dy(attrs, metas, local_metas, in_sbps):
    s = in_sbps[0]
    if not isinstance(s, S) or s.axis == attrs["dim"]:
        return attrs
    shape = list(attrs["shape"])
    shape[s.axis] = local_metas[0].shape[s.axis]
    return {**attrs, "shape": tuple(shape)}


GATHER = defop("gather", lambda x, index, dim: torch.gather(x, dim, index), sbp=_gather_sbp, save="inputs",
               family="indexing",
               grad=lambda ctx, dy: (apply(GATHER_BACKWARD, dy, ctx.inputs[1], dim=ctx.dim,
                                           shape=tuple(ctx.shapes[0])), None))
GATHER_BACKWARD = defop("gather_backward",
                        lambda dy, index, dim, shape: dy.new_zeros(shape).scatter_add_(dim, index, dy),
                        sbp=_gather_backward_sbp, local_attrs=_shape_follows_dy, save="inputs",
                        family="indexing",
                        grad=lambda ctx, dy: (apply(GATHER, dy, ctx.inputs[1], dim=ctx.dim), None))


def gather(input: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """``out[i][j] = input[index[i][j]][j]`` for dim 0 (and likewise for other dims)."""
    return apply(GATHER, input, index, dim=normalize_dim("gather", dim, input.dim()))


def take_along_dim(input: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """``gather`` along ``dim`` after broadcasting ``input`` and ``indices`` in every other dim,
    as ``torch.take_along_dim``; without ``dim``, along the flattened tensors."""
    if dim is None:
        return gather(input.reshape(-1), 0, indices.reshape(-1))
    if input.dim() != indices.dim():
        raise RuntimeError(f"holoflow.take_along_dim: input and indices should have the same number of dimensions, "
                           f"but got {input.dim()} dimensions for input and {indices.dim()} for indices")
    d = normalize_dim("take_along_dim", dim, input.dim())
    sizes = list(input.shape)
    sizes[d] = indices.shape[d]
    shape = list(torch.broadcast_shapes(tuple(sizes), tuple(indices.shape)))
    indices = indices.expand(shape)
    shape[d] = input.shape[d]
    return gather(input.expand(shape), d, indices)


def _scatter_sbp(metas, attrs):
    x, idx, src, d = metas[0], metas[1], metas[2], attrs["dim"]
    st = isinstance(src, Meta)
    sigs = [((B,) * (2 + st), (B,))]
    if st or src == 0:
        sigs.append(((P, B) + (P,) * st, (P,)))
    for a in range(len(x.shape)):
        if a != d and x.shape[a] == idx.shape[a] and (not st or src.shape[a] == idx.shape[a]):
            sigs.append(((S(a), S(a)) + (S(a),) * st, (S(a),)))
    return sigs


def _scatter_grad(ctx, dy):
    idx = ctx.inputs[1]
    gx = apply(SCATTER, dy, idx, 0.0, dim=ctx.dim) if needs(ctx, 0) else None
    gs = _gather_src(ctx, dy, idx) if needs(ctx, 2) else None
    return gx, None, gs


def _gather_src(ctx, dy, idx):
    g = apply(GATHER, dy, idx, dim=ctx.dim)
    if tuple(g.shape) != tuple(ctx.shapes[2]):   # src larger than index: the rest gets zeros
        pad = []
        for gs, ss in zip(reversed(g.shape), reversed(ctx.shapes[2])):
            pad += [0, ss - gs]
        from .layout import pad as _pad
        g = _pad(g, pad)
    return g


SCATTER = defop("scatter", lambda x, index, src, dim: torch.scatter(x, dim, index, src), sbp=_scatter_sbp,
                grad=_scatter_grad, save="inputs", family="indexing",
                inplace_kernel=lambda x, index, src, dim: x.scatter_(dim, index, src))
SCATTER_ADD = defop("scatter_add", lambda x, index, src, dim: torch.scatter_add(x, dim, index, src),
                    sbp=_scatter_sbp, save="inputs", family="indexing",
                    inplace_kernel=lambda x, index, src, dim: x.scatter_add_(dim, index, src),
                    grad=lambda ctx, dy: (dy if needs(ctx, 0) else None, None,
                                          _gather_src(ctx, dy, ctx.inputs[1]) if needs(ctx, 2) else None))


def scatter(input: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce=None) -> Tensor:
    """Writes ``src`` (a tensor, or the number ``value``) into ``input`` at ``index`` along ``dim``;
    ``reduce="add"`` / ``"multiply"`` combines instead (every occurrence of an index, with what is
    there), as torch's deprecated form: ``scatter_reduce`` with ``"sum"`` / ``"prod"``."""
    src = value if src is None else src
    d = normalize_dim("scatter", dim, input.dim())
    if reduce is None:
        return apply(SCATTER, input, index, src, dim=d)
    src, how = _scatter_reduction(input, index, src, reduce)
    return apply(REGISTRY["scatter_reduce"], input, index, src, dim=d, reduce=how, include_self=True)


_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}


def _scatter_reduction(input: Tensor, index: Tensor, src, reduce: str) -> tuple:
    """``scatter(..., reduce=reduce)`` as ``scatter_reduce`` (declared further down in
    this module; found in the registry): its source (a number: a tensor like ``index``) and reduction."""
    if reduce not in _SCATTER_REDUCE:
        raise RuntimeError(f"holoflow.scatter: reduce argument must be either 'add' or 'multiply', got {reduce!r}")
    if not isinstance(src, Tensor):
        src = input.new_full(tuple(index.shape), src)
    return src, _SCATTER_REDUCE[reduce]


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """Adds ``src`` into ``input`` at ``index`` along ``dim`` (duplicates accumulate)."""
    return apply(SCATTER_ADD, input, index, src, dim=normalize_dim("scatter_add", dim, input.dim()))


# -- index_select / index_add / index_fill --------------------------------------------------------------

def _index_select_sbp(metas, attrs):
    nd, d = len(metas[0].shape), attrs["dim"]
    sigs = [((B, B), (B,)), ((P, B), (P,))]
    if len(metas[1].shape) == 1:
        sigs.append(((B, S(0)), (S(d),)))
    return sigs + [((S(a), B), (S(a),)) for a in range(nd) if a != d]


def _index_select_backward_sbp(metas, attrs):
    nd, d = len(attrs["shape"]), attrs["dim"]
    sigs = [((B, B), (B,)), ((P, B), (P,))]
    if len(metas[1].shape) == 1:
        sigs.append(((S(d), S(0)), (P,)))
    return sigs + [((S(a), B), (S(a),)) for a in range(nd) if a != d]


INDEX_SELECT = defop("index_select", lambda x, index, dim: torch.index_select(x, dim, index),
                     sbp=_index_select_sbp, save="inputs", family="indexing",
                     grad=lambda ctx, dy: (apply(INDEX_SELECT_BACKWARD, dy, ctx.inputs[1], dim=ctx.dim,
                                                 shape=tuple(ctx.shapes[0])), None))
INDEX_SELECT_BACKWARD = defop(
    "index_select_backward",
    lambda dy, index, dim, shape: dy.new_zeros(shape).index_add_(dim, index.reshape(-1), dy),
    sbp=_index_select_backward_sbp, local_attrs=_shape_follows_dy, save="inputs", family="indexing",
    grad=lambda ctx, dy: (apply(INDEX_SELECT, dy, ctx.inputs[1], dim=ctx.dim), None))


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    """The entries ``index`` (1-d) of dim ``dim``."""
    return apply(INDEX_SELECT, input, index, dim=normalize_dim("index_select", dim, input.dim()))


def _index_add_sbp(metas, attrs):
    nd, d = len(metas[0].shape), attrs["dim"]
    sigs = [((B, B, B), (B,)), ((P, B, P), (P,))]
    return sigs + [((S(a), B, S(a)), (S(a),)) for a in range(nd) if a != d]


def _index_add_grad(ctx, dy):
    gs = None
    if needs(ctx, 2):
        gs = apply(INDEX_SELECT, dy, ctx.inputs[1], dim=ctx.dim)
        gs = gs if ctx.alpha == 1 else gs * ctx.alpha
    return (dy if needs(ctx, 0) else None, None, gs)


INDEX_ADD = defop("index_add", lambda x, index, src, dim, alpha: torch.index_add(x, dim, index, src, alpha=alpha),
                  sbp=_index_add_sbp, grad=_index_add_grad, save="inputs", family="indexing",
                  inplace_kernel=lambda x, index, src, dim, alpha: x.index_add_(dim, index, src, alpha=alpha))


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    """Adds ``alpha * source`` into the entries ``index`` of dim ``dim`` (duplicates accumulate)."""
    return apply(INDEX_ADD, input, index, source, dim=normalize_dim("index_add", dim, input.dim()), alpha=alpha)


def _index_fill_sbp(metas, attrs):
    nd, d = len(metas[0].shape), attrs["dim"]
    sigs = [((B, B), (B,))] + ([((P, B), (P,))] if attrs["value"] == 0 else [])
    return sigs + [((S(a), B), (S(a),)) for a in range(nd) if a != d]


INDEX_FILL = defop("index_fill", lambda x, index, dim, value: torch.index_fill(x, dim, index, value),
                   sbp=_index_fill_sbp, save="inputs", family="indexing",
                   inplace_kernel=lambda x, index, dim, value: x.index_fill_(dim, index, value),
                   grad=lambda ctx, dy: (apply(INDEX_FILL, dy, ctx.inputs[1], dim=ctx.dim, value=0.0), None))


def _index_fill_tensor_grad(ctx, dy):
    """``x``'s gradient is ``dy`` with the filled entries zeroed; the value's is what those
    entries (each once, duplicate indices or not) receive: ``dy`` minus that, summed."""
    index, d = ctx.inputs[1], ctx.dim
    gx = apply(INDEX_FILL, dy, index, dim=d, value=0.0)
    gv = reduce_grad((dy - gx).sum(), ctx, 2) if needs(ctx, 2) else None
    return gx if needs(ctx, 0) else None, None, gv


def _index_fill_tensor_sbp(metas, attrs):
    nd, d = len(metas[0].shape), attrs["dim"]
    return [((B, B, B), (B,)), ((P, B, P), (P,))] + [((S(a), B, B), (S(a),)) for a in range(nd) if a != d]


# the value as a 0-d tensor (differentiable, as torch's index_fill.int_Tensor)
INDEX_FILL_TENSOR = defop("index_fill_tensor", lambda x, index, value, dim: torch.index_fill(x, dim, index, value),
                          sbp=_index_fill_tensor_sbp, save="inputs", saved_inputs=(1,), family="indexing",
                          inplace_kernel=lambda x, index, value, dim: x.index_fill_(dim, index, value),
                          grad=_index_fill_tensor_grad)


def _index_fill_args(name: str, input: Tensor, dim: int, index: Tensor, value) -> tuple:
    d = normalize_dim(name, dim, input.dim())
    if not isinstance(value, Tensor):
        return INDEX_FILL, (index,), dict(dim=d, value=value)
    if value.dim() != 0:
        raise RuntimeError(f"holoflow.{name}: index_fill_ only supports a 0-dimensional value tensor, but got "
                           f"tensor with {value.dim()} dimension(s)")
    return INDEX_FILL_TENSOR, (index, value), dict(dim=d)


def index_fill(input: Tensor, dim: int, index: Tensor, value) -> Tensor:
    """Sets the entries ``index`` of dim ``dim`` to ``value``: a number, or a 0-d tensor (whose
    gradient is then what the filled entries receive)."""
    op, args, attrs = _index_fill_args("index_fill", input, dim, index, value)
    return apply(op, input, *args, **attrs)


def _index_fill_(self: Tensor, dim: int, index: Tensor, value) -> Tensor:
    op, args, attrs = _index_fill_args("index_fill_", self, dim, index, value)
    return apply_inplace(op, self, *args, **attrs)


# -- index_put (with accumulate) -------------------------------------------------------------------------

def _index_put_acc_grad(ctx, dy):
    """``x``'s gradient passes through; the values' is what the indexed positions of ``dy`` read,
    summed back to the values' shape (index_put's, as for ``x[indices] = values``)."""
    idx = ctx.inputs[2:]
    gv = None
    if needs(ctx, 1):
        gv = apply(INDEX, dy, *idx, spec=ctx.spec)
        vshape = tuple(ctx.shapes[1])
        if len(vshape) > gv.dim():   # a value with extra leading 1s, as torch allows
            gv = apply(RESHAPE, gv, shape=(1,) * (len(vshape) - gv.dim()) + tuple(gv.shape))
        gv = reduce_grad(gv, ctx, 1)
    return (dy if needs(ctx, 0) else None, gv) + (None,) * len(idx)


# ``spec`` (all "T": one index tensor per leading dim) is what index_put's SBP rule and the
# gradient's INDEX read; the kernel takes the tensors as torch's index_put does
INDEX_PUT_ACCUMULATE = defop(
    "index_put_accumulate", lambda x, v, *idx, spec: torch.index_put(x, idx, v, accumulate=True),
    inplace_kernel=lambda x, v, *idx, spec: x.index_put_(idx, v, accumulate=True),
    grad=_index_put_acc_grad, sbp=lambda metas, attrs: _index_put_sbp(metas, attrs), save="inputs",
    family="indexing",
    saved_inputs=lambda needs: tuple(range(2, len(needs))))   # the indices only


def _index_put_args(name: str, input: Tensor, indices, values) -> tuple[tuple, tuple, Tensor]:
    """(spec, index tensors, values) of ``index_put(input, indices, values)``, checked as torch
    checks them (a tuple of tensors, a tensor of ``input``'s dtype)."""
    if not isinstance(indices, (tuple, list)) or not all(isinstance(i, Tensor) for i in indices):
        got = type(indices).__name__ if not isinstance(indices, (tuple, list)) else \
            next(type(i).__name__ for i in indices if not isinstance(i, Tensor))
        raise TypeError(f"holoflow.{name}: indices must be a tuple of Tensors, got {got}")
    if not indices:
        raise RuntimeError(f"holoflow.{name}: needs at least one index tensor")
    if not isinstance(values, Tensor):
        raise TypeError(f"holoflow.{name}: values must be a Tensor, got {type(values).__name__}")
    if values._data.dtype != input._data.dtype:
        raise RuntimeError(f"holoflow.{name}: index put requires the source and destination dtypes to match, "
                           f"got {input.dtype} for the destination and {values.dtype} for the source")
    idx = tuple(_like_global(i, input) for i in indices)
    return (T,) * len(idx), idx, _like_global(values, input)


def index_put(input: Tensor, indices: Sequence[Tensor], values: Tensor, accumulate: bool = False) -> Tensor:
    """``input`` with ``values`` written at ``input[indices]`` (added there, duplicates included,
    with ``accumulate``), as ``torch.index_put``."""
    spec, idx, values = _index_put_args("index_put", input, indices, values)
    return apply(INDEX_PUT_ACCUMULATE if accumulate else INDEX_PUT, input, values, *idx, spec=spec)


def _index_put_(self: Tensor, indices: Sequence[Tensor], values: Tensor, accumulate: bool = False) -> Tensor:
    spec, idx, values = _index_put_args("index_put_", self, indices, values)
    return apply_inplace(INDEX_PUT_ACCUMULATE if accumulate else INDEX_PUT, self, values, *idx, spec=spec)


# -- index_reduce (torch's derivative: prod's zeros and amax/amin's ties are ATen's) -----------------------

_REDUCTIONS = ("prod", "mean", "amax", "amin")


def _index_reduce_sbp(metas, attrs):
    """(input, index, source[, dys]): everything broadcast, or input, source (and the gradients)
    split alike on a dim other than ``dim``, the index broadcast."""
    ts = [m for m in metas if isinstance(m, Meta)]
    n = len(ts)
    k = len(attrs["diff"]) if "diff" in attrs else 1   # the backward: one gradient per floating input
    axes = [a for a in range(len(ts[0].shape)) if a != attrs["dim"] and ts[0].shape[a] == ts[2].shape[a]]
    return [((B,) * n, (B,) * k)] + [((S(a), B) + (S(a),) * (n - 2), (S(a),) * k) for a in axes]


INDEX_REDUCE = defop_vjp(
    "index_reduce", lambda x, index, source, dim, reduce, include_self: torch.index_reduce(
        x, dim, index, source, reduce, include_self=include_self),
    sbp=_index_reduce_sbp, bwd_sbp=_index_reduce_sbp, family="indexing")


def _index_reduce_attrs(input: Tensor, dim: int, reduce: str, include_self: bool) -> dict:
    if reduce not in _REDUCTIONS:
        raise RuntimeError(f"holoflow.index_reduce: expected reduce to be one of prod, mean, amax or amin, "
                           f"got {reduce!r}")
    return {"dim": normalize_dim("index_reduce", dim, input.dim()), "reduce": reduce,
            "include_self": bool(include_self)}


def index_reduce(input: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *,
                 include_self: bool = True) -> Tensor:
    """``input`` with the slices ``index`` of dim ``dim`` reduced (``prod``, ``mean``, ``amax``,
    ``amin``) with ``source``'s, counting ``input``'s own values if ``include_self``, as
    ``torch.index_reduce``."""
    refuse_complex_grad("index_reduce", input, source)
    return apply(INDEX_REDUCE, input, index, source, **_index_reduce_attrs(input, dim, reduce, include_self))


def _index_reduce_(self: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    return apply_inplace(INDEX_REDUCE, self, index, source, **_index_reduce_attrs(self, dim, reduce, include_self))


# -- view inverses: slice_scatter, select_scatter, diagonal_scatter ------------------------------------------

def _into_view(view: str) -> Callable:
    """The kernel of a view's inverse: a copy of ``x`` whose region (the view op ``view`` of the
    copy) holds ``src`` (a tensor, or a number: the gradient's zeros)."""
    def kernel(x, src, **attrs):
        out = x.clone()
        region = REGISTRY[view].kernel(out, **attrs)
        if isinstance(src, torch.Tensor):
            region.copy_(src)
        else:
            region.fill_(src)
        return out
    return kernel


def _into_view_sbp(kept: Callable) -> Callable:
    """Broadcast; partial sums (the op is linear in both inputs; a number only if it is 0); and
    a split of each dim the view keeps whole (``kept(shape, attrs)``: input dim -> src dim)."""
    def rule(metas, attrs):
        st = isinstance(metas[1], Meta)
        sigs = [((B,) * (1 + st), (B,))]
        if st or metas[1] == 0:
            sigs.append(((P,) * (1 + st), (P,)))
        kept_dims = kept(tuple(metas[0].shape), attrs).items()
        return sigs + [((S(a),) + ((S(b),) if st else ()), (S(a),)) for a, b in kept_dims]
    return rule


def _scatter_into(name: str, view: str, kept: Callable) -> Op:
    """Declares ``name``: ``input`` with the region the view op ``view`` selects (same attrs)
    replaced by ``src``. Its gradient is ``dy`` with that region zeroed for ``input``, the region
    of ``dy`` for ``src``."""
    def grad(ctx, dy):
        gx = apply(op, dy, 0.0, **ctx.attrs) if needs(ctx, 0) else None
        gs = reduce_grad(apply(REGISTRY[view], dy, **ctx.attrs), ctx, 1) if needs(ctx, 1) else None
        return gx, gs
    op = defop(name, _into_view(view), grad=grad, sbp=_into_view_sbp(kept), family="indexing")
    return op


def _spec_kept(shape: tuple, attrs: dict) -> dict:
    return axis_map(attrs["spec"], [], len(shape))[0]


def _diagonal_kept(shape: tuple, attrs: dict) -> dict:
    return {a: k for k, a in enumerate(_rest_axes(len(shape), attrs["dim1"], attrs["dim2"]))}


SLICE_SCATTER = _scatter_into("slice_scatter", "getitem", _spec_kept)
SELECT_SCATTER = _scatter_into("select_scatter", "getitem", _spec_kept)
DIAGONAL_SCATTER = _scatter_into("diagonal_scatter", "diagonal", _diagonal_kept)


def _apply_into(op: Op, view: str, input: Tensor, src: Tensor, **attrs) -> Tensor:
    """``op`` (the inverse of the view op ``view``), with ``src`` checked against the region:
    torch takes exactly its shape, no broadcasting."""
    name = op.name
    if not isinstance(src, Tensor):
        raise TypeError(f"holoflow.{name}: src must be a Tensor, got {type(src).__name__}")
    region = REGISTRY[view].kernel(torch.empty(tuple(input.shape), device="meta"), **attrs).shape
    if tuple(src.shape) != tuple(region):
        raise RuntimeError(f"holoflow.{name}: expected src to have a size equal to the slice of self: src size "
                           f"{list(src.shape)}, slice size {list(region)}")
    return apply(op, input, _like_global(src, input), **attrs)


def slice_scatter(input: Tensor, src: Tensor, dim: int = 0, start: int | None = None, end: int | None = None,
                  step: int = 1) -> Tensor:
    """``input`` with ``input[..., start:end:step]`` (along ``dim``) replaced by ``src``, as
    ``torch.slice_scatter``."""
    d = normalize_dim("slice_scatter", dim, input.dim())
    if step <= 0:
        raise RuntimeError(f"holoflow.slice_scatter: slice step must be positive, got {step}")
    spec = (slice(None),) * d + (slice(start, end, step),)
    return _apply_into(SLICE_SCATTER, "getitem", input, src, spec=spec)


def select_scatter(input: Tensor, src: Tensor, dim: int, index: int) -> Tensor:
    """``input`` with the slice ``index`` of dim ``dim`` replaced by ``src``, as ``torch.select_scatter``."""
    if input.dim() == 0:
        raise IndexError("holoflow.select_scatter: select() cannot be applied to a 0-d tensor")
    d = normalize_dim("select_scatter", dim, input.dim())
    n = input.shape[d]
    if not -n <= index < n:
        raise IndexError(f"holoflow.select_scatter: index {index} is out of range for dim {d} of size {n}")
    spec = (slice(None),) * d + (index % n,)
    return _apply_into(SELECT_SCATTER, "getitem", input, src, spec=spec)


def diagonal_scatter(input: Tensor, src: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """``input`` with its diagonal (``offset``, in the planes ``dim1``/``dim2``) replaced by
    ``src``, as ``torch.diagonal_scatter``."""
    d1, d2 = normalize_dim("diagonal_scatter", dim1, input.dim()), normalize_dim("diagonal_scatter", dim2, input.dim())
    if d1 == d2:
        raise RuntimeError(f"holoflow.diagonal_scatter: diagonal dimensions cannot be identical {dim1}, {dim2}")
    return _apply_into(DIAGONAL_SCATTER, "diagonal", input, src, offset=offset, dim1=d1, dim2=d2)


# -- fill_diagonal_ ---------------------------------------------------------------------------------------

FILL_DIAGONAL = defop("fill_diagonal_", lambda x, value, wrap: x.clone().fill_diagonal_(value, wrap),
                      inplace_kernel=lambda x, value, wrap: x.fill_diagonal_(value, wrap),
                      grad=lambda ctx, dy: (apply(FILL_DIAGONAL, dy, value=0.0, wrap=ctx.wrap),),
                      sbp=lambda metas, attrs: [((B,), (B,))] + ([((P,), (P,))] if attrs["value"] == 0 else []),
                      family="indexing")


def fill_diagonal_(self: Tensor, fill_value, wrap: bool = False) -> Tensor:
    """Sets the main diagonal (all indices equal) to ``fill_value``; a tall matrix's diagonal
    restarts below a gap of one row with ``wrap``, as ``torch.Tensor.fill_diagonal_``."""
    shape = tuple(self.shape)
    if len(shape) < 2:
        raise RuntimeError(f"holoflow.fill_diagonal_: needs at least 2 dimensions, got shape {shape}")
    if len(shape) > 2 and len(set(shape)) > 1:
        raise RuntimeError(f"holoflow.fill_diagonal_: all dimensions of input must be of equal length, got "
                           f"shape {shape}")
    value = fill_value.item() if isinstance(fill_value, Tensor) else fill_value
    return apply_inplace(FILL_DIAGONAL, self, value=value, wrap=bool(wrap))


def _inplace(op, name: str):
    def method(self: Tensor, dim: int, index: Tensor, *args, **attrs) -> Tensor:
        d = normalize_dim(name, dim, self.dim())
        return apply_inplace(op, self, index, *args, dim=d, **attrs)
    method.__name__ = name + "_"
    return method


def _scatter_(self: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce=None) -> Tensor:
    src = value if src is None else src
    if reduce is None:
        return _inplace(SCATTER, "scatter")(self, dim, index, src)
    src, how = _scatter_reduction(self, index, src, reduce)
    return apply_inplace(REGISTRY["scatter_reduce"], self, index, src, dim=normalize_dim("scatter", dim, self.dim()),
                         reduce=how, include_self=True)


for _name in __all__:
    setattr(Tensor, _name, globals()[_name])
Tensor.scatter_ = _scatter_
Tensor.scatter_add_ = _inplace(SCATTER_ADD, "scatter_add")
Tensor.index_add_ = lambda self, dim, index, source, *, alpha=1: _inplace(INDEX_ADD, "index_add")(
    self, dim, index, source, alpha=alpha)
Tensor.index_fill_ = _index_fill_
Tensor.index_put_, Tensor.index_reduce_, Tensor.fill_diagonal_ = _index_put_, _index_reduce_, fill_diagonal_


def _scatter_axes(metas, attrs):
    """Axes other than ``dim`` where input, index and src have one size: split there."""
    ts = [m for m in metas if hasattr(m, "shape")][:3]
    return [a for a in range(len(ts[0].shape)) if a != attrs["dim"] and len({len(m.shape) for m in ts}) == 1
            and len({m.shape[a] for m in ts}) == 1]


def _index_copy_sbp(metas, attrs):  # (input, index, source): index stays broadcast
    ts = [m for m in metas if hasattr(m, "shape")]
    axes = [a for a in range(len(ts[0].shape)) if a != attrs["dim"] and len(ts[2].shape) == len(ts[0].shape)
            and ts[0].shape[a] == ts[2].shape[a]]
    k = len(attrs["diff"]) if "diff" in attrs else None
    n = len(ts)
    if k is None:
        return [((B, B, B), (B,))] + [((S(a), B, S(a)), (S(a),)) for a in axes]
    return [((B,) * n, (B,) * k)] + [((S(a), B, S(a)) + (S(a),) * (n - 3), (S(a),) * k) for a in axes]


INDEX_COPY = defop_vjp("index_copy", lambda x, index, src, dim: torch.index_copy(x, dim, index, src),
                       sbp=_index_copy_sbp, bwd_sbp=_index_copy_sbp, family="indexing")
MASKED_SCATTER = defop_vjp("masked_scatter", torch.masked_scatter, sbp=_all_b(), bwd_sbp=_all_b_bwd,
                           family="indexing")
SCATTER_REDUCE = defop_vjp(
    "scatter_reduce", lambda x, index, src, dim, reduce, include_self: torch.scatter_reduce(
        x, dim, index, src, reduce, include_self=include_self),
    sbp=_one_split_sbp(_scatter_axes), bwd_sbp=_one_split_bwd_sbp(_scatter_axes), family="indexing")


def index_copy(input: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """``input`` with the slices ``index`` along ``dim`` replaced by ``source``'s, as ``torch.index_copy``."""
    d = normalize_dim("index_copy", dim, _tensor("index_copy", input).dim())
    input, source = interpret.composite("index_copy", input, _tensor("index_copy", source, "source"))
    if _tensor("index_copy", index, "index")._data.dtype is not torch.int64:
        raise RuntimeError(f"holoflow.index_copy: expected a long tensor for index, but got {index.dtype}")
    if _tensor("index_copy", source, "source")._data.dtype != input._data.dtype:
        raise RuntimeError(f"holoflow.index_copy: self ({input.dtype}) and source ({source.dtype}) must have "
                           f"the same scalar type")
    return apply(INDEX_COPY, input, index, source, dim=d)


def masked_scatter(input: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """``input`` with the ``mask``ed positions filled from ``source`` in order, as ``torch.masked_scatter``."""
    if _tensor("masked_scatter", mask, "mask")._data.dtype is not torch.bool:
        raise RuntimeError(f"holoflow.masked_scatter: expected mask to be a bool tensor, got {mask.dtype}")
    if _tensor("masked_scatter", source, "source")._data.dtype != _tensor("masked_scatter", input)._data.dtype:
        raise RuntimeError(f"holoflow.masked_scatter: expected self and source to have same dtypes but got "
                           f"{input.dtype} and {source.dtype}")
    return apply(MASKED_SCATTER, input, mask, source)


def scatter_reduce(input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    """``src`` reduced into ``input`` at ``index`` along ``dim`` with ``reduce``, as ``torch.scatter_reduce``."""
    d = normalize_dim("scatter_reduce", dim, _tensor("scatter_reduce", input).dim())
    if _tensor("scatter_reduce", index, "index")._data.dtype is not torch.int64:
        raise RuntimeError(f"holoflow.scatter_reduce: expected dtype int64 for index, got {index.dtype}")
    if _tensor("scatter_reduce", src, "src")._data.dtype != input._data.dtype:
        raise RuntimeError(f"holoflow.scatter_reduce: expected self and src to have the same dtype, got "
                           f"{input.dtype} and {src.dtype}")
    if not (index.dim() == input.dim() == src.dim()) and index.numel():
        raise RuntimeError(f"holoflow.scatter_reduce: index {tuple(index.shape)}, self {tuple(input.shape)} and "
                           f"src {tuple(src.shape)} should all have the same number of dimensions")
    refuse_complex_grad("scatter_reduce", input, src)
    return apply(SCATTER_REDUCE, input, index, src, dim=d, reduce=reduce, include_self=bool(include_self))


for _name in ("index_copy", "masked_scatter", "scatter_reduce"):
    setattr(Tensor, _name, globals()[_name])

Tensor.index_copy_ = lambda self, dim, index, source: self.copy_(index_copy(self.clone(), dim, index, source))
Tensor.masked_scatter_ = lambda self, mask, source: self.copy_(masked_scatter(self.clone(), mask, source))
Tensor.scatter_reduce_ = lambda self, dim, index, src, reduce, *, include_self=True: self.copy_(
    scatter_reduce(self.clone(), dim, index, src, reduce, include_self=include_self))


__all__ += ["index_copy", "masked_scatter", "scatter_reduce"]

# index_put's op, rules and index helpers: ops/indexing.py imports this module at its end, so
# its names are bound here last, whichever of the two modules is imported first
from .indexing import INDEX, INDEX_PUT, T, _index_put_sbp, _like_global, axis_map  # noqa: E402
