"""Tensors assembled from other tensors: ``atleast_1d/2d/3d``, ``column_stack``/``row_stack``/
``dstack``, ``block_diag``, ``cartesian_prod``, ``combinations``, ``diag_embed``/``diagflat``,
``vander`` and ``rot90``; with their Tensor methods.

The stacking functions, ``combinations``, ``diagflat``, ``vander`` and ``rot90`` are composites of
shape ops (their gradients come from the parts); ``diag_embed``, ``block_diag`` and
``cartesian_prod`` are primitives with ATen's derivative (ops/torch_vjp.py).
"""
from __future__ import annotations

import itertools
from typing import Sequence

import torch

from ..core.dispatch import apply
from ..core.errors import normalize_dim
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .layout import diag
from .pointwise import _tensor
from .shape import cat, reshape
from .torch_vjp import defop_vjp

__all__ = ["atleast_1d", "atleast_2d", "atleast_3d", "column_stack", "row_stack", "dstack", "combinations",
           "diag_embed", "block_diag", "cartesian_prod", "diagflat", "vander", "rot90"]


# -- composites: shape helpers, combinations, integration, distances -----------------------------------

def _at_least(name: str, shape_of):
    """``atleast_Nd``: each tensor viewed with at least N dims (``shape_of(shape)`` gives the new
    shape; tensors already there come back as they are)."""
    def fn(*tensors):
        one = len(tensors) == 1 and isinstance(tensors[0], Tensor)
        if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
            tensors = tuple(tensors[0])
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"holoflow.{name}: expected tensors, got {type(t).__name__}")
        outs = tuple(t.reshape(shape_of(tuple(t.shape))) for t in tensors)
        return outs[0] if one else outs
    fn.__name__ = name
    fn.__doc__ = f"Each tensor as a view with at least {name[-2]} dims, as ``torch.{name}``."
    return fn


atleast_1d = _at_least("atleast_1d", lambda s: s or (1,))
atleast_2d = _at_least("atleast_2d", lambda s: s if len(s) >= 2 else (1, *s) if s else (1, 1))
atleast_3d = _at_least("atleast_3d", lambda s: s if len(s) >= 3 else (*s, 1) if len(s) == 2 else
                       (1, *s, 1) if s else (1, 1, 1))


def _tensor_list(name: str, tensors: Sequence[Tensor]) -> list[Tensor]:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"holoflow.{name}: expected a list or tuple of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise RuntimeError(f"holoflow.{name}: expects a non-empty TensorList")
    return list(tensors)


def _cat(tensors: list[Tensor], dim: int) -> Tensor:
    from .shape import cat   # shape's modules import this one (reduction, linalg)
    return cat(tensors, dim)


def column_stack(tensors: Sequence[Tensor]) -> Tensor:
    """Tensors side by side as columns (0-d and 1-d ones become columns), as ``torch.column_stack``."""
    ts = _tensor_list("column_stack", tensors)
    return _cat([t.reshape(t.numel(), 1) if t.dim() <= 1 else t for t in ts], 1)


def row_stack(tensors: Sequence[Tensor]) -> Tensor:
    """Tensors stacked as rows (``vstack``), as ``torch.row_stack``."""
    return _cat(list(atleast_2d(_tensor_list("row_stack", tensors))), 0)


def dstack(tensors: Sequence[Tensor]) -> Tensor:
    """Tensors stacked along the third axis (after ``atleast_3d``), as ``torch.dstack``."""
    return _cat(list(atleast_3d(_tensor_list("dstack", tensors))), 2)


def combinations(input: Tensor, r: int = 2, with_replacement: bool = False) -> Tensor:
    """The length-``r`` combinations of the 1-d ``input``'s entries, one per row, as
    ``torch.combinations`` (``itertools.combinations`` order)."""
    if input.dim() != 1:
        raise RuntimeError(f"holoflow.combinations: expect a 1D vector, but got shape {list(input.shape)}")
    if r < 0:
        raise RuntimeError(f"holoflow.combinations: expect a non-negative number, but got {r}")
    if r == 0:
        return input.new_empty(0)
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = list(pick(range(input.shape[0]), r))
    index = torch.tensor([i for row in rows for i in row], dtype=torch.int64, device=input._data.device)
    return input.index_select(0, Tensor._make(index)).reshape(len(rows), r)


def _all_b(n_out: int = 1):
    def rule(metas, attrs):
        return [((B,) * len([m for m in metas if hasattr(m, "shape")]), (B,) * n_out)]
    return rule


def _all_b_bwd(metas, attrs):
    return [((B,) * len([m for m in metas if hasattr(m, "shape")]), (B,) * len(attrs["diff"]))]


# -- primitives with ATen's derivative ---------------------------------------------------------------

def _diag_embed_sbp(metas, attrs):
    """Batch axis a of the input is the a-th output axis other than dim1/dim2."""
    nd = len(metas[0].shape)
    rest = [a for a in range(nd + 1) if a not in (attrs["dim1"], attrs["dim2"])]
    return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(rest[a]),)) for a in range(nd - 1)]


def _diag_embed_bwd_sbp(metas, attrs):
    nd = len(metas[0].shape)
    rest = [a for a in range(nd + 1) if a not in (attrs["dim1"], attrs["dim2"])]
    return [((B, B), (B,)), ((B, P), (P,))] + [((S(a), S(rest[a])), (S(a),)) for a in range(nd - 1)]


DIAG_EMBED = defop_vjp("diag_embed", lambda x, offset, dim1, dim2: torch.diag_embed(x, offset, dim1, dim2),
                       sbp=_diag_embed_sbp, bwd_sbp=_diag_embed_bwd_sbp, family="shape")
BLOCK_DIAG = defop_vjp("block_diag", torch.block_diag, sbp=_all_b(), bwd_sbp=_all_b_bwd, family="shape")
CARTESIAN_PROD = defop_vjp("cartesian_prod", torch.cartesian_prod, sbp=_all_b(), bwd_sbp=_all_b_bwd, family="shape")


def diag_embed(input: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """A tensor whose diagonals (``offset``, in the planes ``dim1``/``dim2``) are ``input``'s last dim,
    as ``torch.diag_embed``."""
    nd = _tensor("diag_embed", input).dim() + 1
    d1, d2 = normalize_dim("diag_embed", dim1, nd), normalize_dim("diag_embed", dim2, nd)
    if d1 == d2:
        raise RuntimeError(f"holoflow.diag_embed: diagonal dimensions cannot be identical {dim1}, {dim2}")
    return apply(DIAG_EMBED, input, offset=int(offset), dim1=d1, dim2=d2)


def block_diag(*tensors: Tensor) -> Tensor:
    """A block-diagonal matrix of 0-, 1- or 2-d ``tensors``, as ``torch.block_diag``."""
    for i, t in enumerate(tensors):
        if _tensor("block_diag", t, f"tensors[{i}]").dim() > 2:
            raise RuntimeError(f"holoflow.block_diag: input tensors must have 2 or fewer dimensions. Input {i} "
                               f"has {t.dim()} dimensions (shape {tuple(t.shape)})")
    return apply(BLOCK_DIAG, *tensors)


def cartesian_prod(*tensors: Tensor) -> Tensor:
    """The Cartesian product of 1-d ``tensors`` (one row per combination), as ``torch.cartesian_prod``."""
    for i, t in enumerate(tensors):
        if _tensor("cartesian_prod", t, f"tensors[{i}]").dim() != 1:
            raise RuntimeError(f"holoflow.cartesian_prod: expect a 1D vector, but got shape {tuple(t.shape)}")
    return apply(CARTESIAN_PROD, *tensors)


def diagflat(input: Tensor, offset: int = 0) -> Tensor:
    """A square matrix with the flattened input on its ``offset`` diagonal, as ``torch.diagflat``."""
    return diag(reshape(_tensor("diagflat", input), (-1,)), offset)


def vander(x: Tensor, N: int | None = None, increasing: bool = False) -> Tensor:
    """The Vandermonde matrix of the 1-d ``x`` with ``N`` columns, as ``torch.vander``."""
    if _tensor("vander", x, "x").dim() != 1:
        raise RuntimeError(f"holoflow.vander: x must be a one-dimensional tensor, got shape {tuple(x.shape)}")
    if N is not None and N < 0:
        raise RuntimeError(f"holoflow.vander: N must be non-negative, got N={N}")
    n = x.shape[0] if N is None else N
    if n == 0:
        return x.unsqueeze(1).narrow(1, 0, 0)
    # ATen's algorithm (ones, then a running product), out of place: torch's own backward of
    # vander fails on its in-place cumprod_, this one is the same values with a gradient
    cols = cat([x.unsqueeze(1).mul(0).add(1), x.unsqueeze(1).expand(x.shape[0], n - 1)], 1).cumprod(1)
    return cols if increasing else cols.flip(1)


def rot90(input: Tensor, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
    """Rotates by 90 degrees ``k`` times in the plane ``dims`` (from the first towards the second
    axis), as ``torch.rot90``."""
    x = _tensor("rot90", input)
    if len(dims) != 2:
        raise RuntimeError(f"holoflow.rot90: expected total rotation dims == 2, but got dims = {len(dims)}")
    if x.dim() < 2:
        raise RuntimeError(f"holoflow.rot90: expected total dims >= 2, but got total dims = {x.dim()}")
    d0, d1 = (normalize_dim("rot90", d, x.dim()) for d in dims)
    if d0 == d1:
        raise RuntimeError(f"holoflow.rot90: expected rotation dims to be different, but got dim0 = {d0} and "
                           f"dim1 = {d1}")
    k %= 4
    if k == 1:
        return x.flip(d1).transpose(d0, d1)
    if k == 2:
        return x.flip(d0, d1)
    if k == 3:
        return x.flip(d0).transpose(d0, d1)
    return x.clone()


for _name in ("rot90", "diag_embed", "diagflat"):
    setattr(Tensor, _name, globals()[_name])
