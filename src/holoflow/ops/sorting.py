"""Sorting: sort, argsort, topk, unique, searchsorted, and the searches and tests against sorted or
listed values ``bucketize`` and ``isin`` (imported by ops/indexing.py)."""
from __future__ import annotations

import torch

from ..core.dispatch import apply
from ..core.dtype import int64 as _int64
from ..core.errors import HoloflowError, normalize_dim
from ..core.sbp import B, S
from ..core.tensor import Tensor
from .family import defop
from .pointwise import _tensor

__all__ = ["sort", "argsort", "topk", "unique", "searchsorted", "msort"]


def _along_dim_sbp(metas, attrs):
    """Outputs computed along ``dim``: split on any other axis (every output split alike)."""
    nd, d, n = len(metas[0].shape), attrs["dim"], 2
    return [((B,), (B,) * n)] + [((S(a),), (S(a),) * n) for a in range(nd) if a != d]


def _scatter_back_grad(ctx, dy, _unused_indices_grad=None):
    from .scatter import GATHER_BACKWARD
    return (apply(GATHER_BACKWARD, dy, ctx.outs[1], dim=ctx.dim, shape=tuple(ctx.shapes[0])),)


SORT = defop("sort", lambda x, dim, descending, stable: torch.sort(x, dim=dim, descending=descending, stable=stable),
             grad=_scatter_back_grad, sbp=_along_dim_sbp, save="output", saved_outputs=(1,),
             outputs=("values", "indices"),
             family="sorting")
TOPK = defop("topk", lambda x, k, dim, largest, sorted: torch.topk(x, k, dim, largest, sorted),  # noqa: A006
             grad=_scatter_back_grad, sbp=_along_dim_sbp, save="output", saved_outputs=(1,),
             outputs=("values", "indices"),
             family="sorting")


def _dim(op: str, dim: int, x: Tensor) -> int:
    return normalize_dim(op, dim, x.dim()) if x.dim() else 0


def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """Sorted values along ``dim`` and their indices, as a (values, indices) namedtuple."""
    return apply(SORT, input, dim=_dim("sort", dim, input), descending=descending, stable=stable)


def argsort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The indices that sort ``input`` along ``dim``."""
    return sort(input, dim, descending, stable).indices


def msort(input: Tensor) -> Tensor:
    return sort(input, 0).values


class KRangeError(HoloflowError, IndexError):
    """k out of range: torch raises RuntimeError; also an IndexError, which holoflow raised before."""


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    """The ``k`` largest (or smallest) entries along ``dim`` and their indices (a namedtuple)."""
    d = _dim("topk", dim, input)
    size = input.shape[d] if input.dim() else 1
    if not 0 <= k <= size:
        raise KRangeError(f"holoflow.topk: k={k} is out of range for dim {d} of size {size} (selected index k "
                          f"out of range); legal k are 0..{size}")
    return apply(TOPK, input, k=k, dim=d, largest=largest, sorted=sorted)


UNIQUE = defop("unique", lambda x, sorted, dim: torch.unique(x, sorted, True, True, dim),  # noqa: A006
               sbp=lambda metas, attrs: [((B,), (B, B, B))], family="sorting", differentiable=False)


def unique(input: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim: int | None = None):
    """The distinct values (or slices along ``dim``), optionally with the inverse map and counts."""
    d = None if dim is None else normalize_dim("unique", dim, input.dim())
    values, inverse, counts = apply(UNIQUE, input, sorted=sorted, dim=d)
    out = (values,) + ((inverse,) if return_inverse else ()) + ((counts,) if return_counts else ())
    return out[0] if len(out) == 1 else out


def _searchsorted_sbp(metas, attrs):
    """(sorted_sequence, values[, sorter]): a 1-D sequence (and its sorter) is broadcast to
    every split of the values; an N-D one splits with the values on any batch axis."""
    seq, vals = metas[0], metas[1]
    n = 2 if metas[2] is None else 3

    def sig(seq_sbp, vals_sbp, out):
        return ((seq_sbp, vals_sbp, seq_sbp)[:n], (out,))
    sigs = [sig(B, B, B)]
    if len(seq.shape) == 1:
        return sigs + [sig(B, S(a), S(a)) for a in range(len(vals.shape))]
    return sigs + [sig(S(a), S(a), S(a)) for a in range(len(seq.shape) - 1)]


def _searchsorted_kernel(seq, vals, sorter, out_int32, right):
    return torch.searchsorted(seq, vals.contiguous(), out_int32=out_int32, right=right, sorter=sorter)


SEARCHSORTED = defop("searchsorted", _searchsorted_kernel, sbp=_searchsorted_sbp, family="sorting",
                     differentiable=False)


def searchsorted(sorted_sequence: Tensor, input, *, out_int32: bool = False, right: bool = False,
                 side: str | None = None, sorter: Tensor | None = None) -> Tensor:
    """Insertion points of ``input`` (a tensor or a number) into the last dim of
    ``sorted_sequence``, as ``torch.searchsorted``; with ``sorter`` (int64 indices that sort that
    dim) the sequence need not be sorted."""
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"holoflow.searchsorted: side can only be 'left' or 'right' but got {side!r}")
        if side == "left" and right:
            raise RuntimeError("holoflow.searchsorted: side and right can't be set to opposites, got side of "
                               "left while right was True")
        right = side == "right"
    if not isinstance(input, Tensor):   # a number: a 0-d tensor, allowed with a 1-D sequence only (torch's rule)
        if sorted_sequence.dim() != 1:
            raise RuntimeError(f"holoflow.searchsorted: input value can be a scalar only when boundaries tensor "
                               f"dimension is 1, but got boundaries of shape {tuple(sorted_sequence.shape)}")
        input = Tensor._make(torch.tensor(input, device=sorted_sequence._data.device))
    if sorter is not None:
        if sorter.dtype is not _int64:
            raise RuntimeError(f"holoflow.searchsorted: sorter must be a tensor of long dtype but got {sorter.dtype}")
        if tuple(sorter.shape) != tuple(sorted_sequence.shape):
            raise RuntimeError(f"holoflow.searchsorted: boundary and sorter must have the same size, but got "
                               f"boundaries of shape {tuple(sorted_sequence.shape)} and sorter of shape "
                               f"{tuple(sorter.shape)}")
    return apply(SEARCHSORTED, sorted_sequence, input, sorter, out_int32=bool(out_int32), right=bool(right))


Tensor.sort = sort
Tensor.argsort = argsort
Tensor.msort = msort
Tensor.topk = topk
Tensor.unique = unique


# -- membership, binning ---------------------------------------------------------------------------------

def _first_split_sbp(n_out: int = 1, shift: int = 0):
    """Input 0 split on any axis (the others broadcast) splits the output on the same axis (+ shift)."""
    def rule(metas, attrs):
        n = len([m for m in metas if hasattr(m, "shape")])
        sigs = [((B,) * n, (B,) * n_out)]
        if hasattr(metas[0], "shape"):
            sigs += [((S(a),) + (B,) * (n - 1), (S(a + shift),) * n_out) for a in range(len(metas[0].shape))]
        return sigs
    return rule


ISIN = defop("isin", lambda e, t, assume_unique, invert: torch.isin(e, t, assume_unique=assume_unique, invert=invert),
             sbp=_first_split_sbp(), differentiable=False)
BUCKETIZE = defop("bucketize", lambda x, b, out_int32, right: torch.bucketize(
    x.contiguous(), b, out_int32=out_int32, right=right), sbp=_first_split_sbp(), differentiable=False)


def isin(elements, test_elements, *, assume_unique: bool = False, invert: bool = False) -> Tensor:
    """Whether each of ``elements`` is in ``test_elements`` (either may be a number), as ``torch.isin``."""
    if not isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        raise TypeError("holoflow.isin(): at least one of 'elements' and 'test_elements' must be a Tensor")
    if not isinstance(elements, Tensor):
        elements = Tensor._make(torch.tensor(elements, device=test_elements.device.torch))
    return apply(ISIN, elements, test_elements, assume_unique=bool(assume_unique), invert=bool(invert))


def bucketize(input, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:
    """The bucket index of each value in the sorted 1-D ``boundaries``, as ``torch.bucketize``."""
    if _tensor("bucketize", boundaries, "boundaries").dim() != 1:
        raise RuntimeError(f"holoflow.bucketize: boundaries tensor must be 1 dimension, but got shape "
                           f"{tuple(boundaries.shape)}")
    if not isinstance(input, Tensor):
        input = Tensor._make(torch.tensor(input, device=boundaries.device.torch))
    return apply(BUCKETIZE, input, boundaries, out_int32=bool(out_int32), right=bool(right))


__all__ += ["isin", "bucketize"]
