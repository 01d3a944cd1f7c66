"""Gather/scatter family: gather, scatter, scatter_add, index_select, index_add, index_fill
(imported and re-exported by ops/indexing.py)."""
from __future__ import annotations

import torch

from ..core.dispatch import apply, apply_inplace
from ..core.errors import normalize_dim
from ..core.registry import Meta
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .family import defop, needs

__all__ = ["gather", "scatter", "scatter_add", "index_select", "index_add", "index_fill", "take_along_dim"]


# -- gather / scatter --------------------------------------------------------------------------------

def _gather_sbp(metas, attrs):
    x, idx, d = metas[0], metas[1], attrs["dim"]
    sigs = [((B, B), (B,)), ((P, B), (P,)), ((B, S(d)), (S(d),))]
    return sigs + [((S(a), S(a)), (S(a),)) for a in range(len(x.shape))
                   if a != d and x.shape[a] == idx.shape[a]]


def _gather_backward_sbp(metas, attrs):
    dy, d, shape = metas[0], attrs["dim"], attrs["shape"]
    sigs = [((B, B), (B,)), ((P, B), (P,)), ((S(d), S(d)), (P,))]
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


def take_along_dim(input: Tensor, indices: Tensor, dim: int) -> Tensor:
    return gather(input, dim, indices)


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
    """Writes ``src`` (a tensor, or the number ``value``) into ``input`` at ``index`` along ``dim``."""
    if reduce is not None:
        raise NotImplementedError("holoflow.scatter: reduce= is not supported; use scatter_add")
    src = value if src is None else src
    return apply(SCATTER, input, index, src, dim=normalize_dim("scatter", dim, input.dim()))


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


def index_fill(input: Tensor, dim: int, index: Tensor, value: float) -> Tensor:
    """Sets the entries ``index`` of dim ``dim`` to the number ``value``."""
    return apply(INDEX_FILL, input, index, dim=normalize_dim("index_fill", dim, input.dim()), value=value)


def _inplace(op, name: str):
    def method(self: Tensor, dim: int, index: Tensor, *args, **attrs) -> Tensor:
        d = normalize_dim(name, dim, self.dim())
        return apply_inplace(op, self, index, *args, dim=d, **attrs)
    method.__name__ = name + "_"
    return method


for _name in __all__:
    setattr(Tensor, _name, globals()[_name])
Tensor.scatter_ = lambda self, dim, index, src=None, *, value=None: _inplace(SCATTER, "scatter")(
    self, dim, index, value if src is None else src)
Tensor.scatter_add_ = _inplace(SCATTER_ADD, "scatter_add")
Tensor.index_add_ = lambda self, dim, index, source, *, alpha=1: _inplace(INDEX_ADD, "index_add")(
    self, dim, index, source, alpha=alpha)
Tensor.index_fill_ = lambda self, dim, index, value: _inplace(INDEX_FILL, "index_fill")(
    self, dim, index, value=value)
