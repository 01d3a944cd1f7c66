"""Order statistics along a dim: ``kthvalue`` and ``median`` (values and indices, or the lower
median of all entries); their Tensor methods are bound with the reductions in ops/reduction.py,
which also has ``nanmedian``, ``mode`` and the quantiles.

Primitives on ATen's kernels whose backward is ATen's derivative (ops/torch_vjp.py), so ties and
NaN rules are torch's. SBP: a split on any axis but ``dim`` stays split.
"""
from __future__ import annotations

from collections import namedtuple

import torch

from ..core.dispatch import apply
from ..core.errors import ShapeError, normalize_dim
from ..core.sbp import B, S
from ..core.tensor import Tensor
from .torch_vjp import defop_vjp

__all__ = ["kthvalue", "median"]


# -- order statistics along a dim ---------------------------------------------------------------------

def _along_dim_sbp(n_out: int):
    def rule(metas, attrs):
        nd = len(metas[0].shape)
        sigs = [((B,), (B,) * n_out)]
        for a in range(nd):
            if a != attrs["dim"]:
                out_axis = a if attrs["keepdim"] or a < attrs["dim"] else a - 1
                sigs.append(((S(a),), (S(out_axis),) * n_out))
        return sigs
    return rule


def _along_dim_bwd_sbp(metas, attrs):
    """``(x, dvalues, dindices) -> (dx,)``: an axis other than ``dim`` splits x and the grads."""
    nd = len(metas[0].shape)
    n = len([m for m in metas if hasattr(m, "shape")])
    sigs = [((B,) * n, (B,))]
    for a in range(nd):
        if a != attrs["dim"]:
            g = a if attrs["keepdim"] or a < attrs["dim"] else a - 1
            sigs.append(((S(a),) + (S(g),) * (n - 1), (S(a),)))
    return sigs


KTHVALUE = defop_vjp("kthvalue", lambda x, k, dim, keepdim: torch.kthvalue(x, k, dim, keepdim),
                     sbp=_along_dim_sbp(2), bwd_sbp=_along_dim_bwd_sbp, family="reduction",
                     outputs=("values", "indices"))
MEDIAN_DIM = defop_vjp("median_dim", lambda x, dim, keepdim: torch.median(x, dim, keepdim),
                       sbp=_along_dim_sbp(2), bwd_sbp=_along_dim_bwd_sbp, family="reduction",
                       outputs=("values", "indices"))
MEDIAN_ALL = defop_vjp("median_all", lambda x: torch.median(x), sbp=lambda metas, attrs: [((B,), (B,))],
                       bwd_sbp=lambda metas, attrs: [((B, B), (B,))], family="reduction")

_KthResult = namedtuple("kthvalue", ["values", "indices"])
_MedianResult = namedtuple("median", ["values", "indices"])


def kthvalue(input: Tensor, k: int, dim: int = -1, keepdim: bool = False):
    """The ``k``-th smallest entry along ``dim`` and its index, as ``torch.kthvalue``."""
    d = normalize_dim("kthvalue", dim, input.dim())
    size = input.shape[d] if input.dim() else 1
    if isinstance(k, bool) or not hasattr(k, "__index__"):
        raise TypeError(f"holoflow.kthvalue: k must be an int, got {type(k).__name__}")
    if not 1 <= int(k) <= size:
        raise ShapeError(f"holoflow.kthvalue: k={k} is out of range for dim {d} of size {size}; legal k are "
                         f"1..{size}")
    return _KthResult(*apply(KTHVALUE, input, k=int(k), dim=d, keepdim=bool(keepdim)))


def median(input: Tensor, dim: int | None = None, keepdim: bool = False):
    """The lower median of all entries (a 0-d tensor), or along ``dim`` with its index, as
    ``torch.median``."""
    if dim is None:
        if input.numel() == 0:
            raise ShapeError("holoflow.median: the median of an empty tensor is undefined; pass dim")
        return apply(MEDIAN_ALL, input)
    d = normalize_dim("median", dim, input.dim())
    if input.dim() and input.shape[d] == 0:
        raise ShapeError(f"holoflow.median: dim {d} of shape {tuple(input.shape)} is empty")
    return _MedianResult(*apply(MEDIAN_DIM, input, dim=d, keepdim=bool(keepdim)))
