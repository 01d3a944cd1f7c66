"""torch functions that were missing: ``fmax``/``fmin``, ``kthvalue``/``median``, ``bincount``,
``det``/``inverse`` and ``holoflow.linalg``'s ``det``/``inv``/``solve``/``cholesky``.

Each differentiable one is a primitive on its ATen kernel whose backward is ATen's derivative
(ops/torch_vjp.py), so values and gradients are torch's, ties and NaN rules included. SBP:
elementwise ops split like any elementwise op (the backward on equal shapes); reductions along
``dim`` split on any other axis; matrix functions split on their batch axes.
"""
from __future__ import annotations

from collections import namedtuple

import torch

from ..core.dispatch import apply
from ..core.errors import DTypeError, ShapeError, normalize_dim
from ..core.registry import defop
from ..core.sbp import B, S
from ..core.tensor import Tensor
from .family import elementwise_sbp
from .torch_vjp import defop_vjp

__all__ = ["fmax", "fmin", "kthvalue", "median", "bincount", "det", "inverse"]


def _same_shape_bwd_sbp(metas, attrs):
    """Backward of an elementwise op: all broadcast, or (equal shapes) all split alike."""
    shapes = [tuple(m.shape) for m in metas if hasattr(m, "shape")]
    sigs = [((B,) * len(shapes), (B,) * len(attrs["diff"]))]
    if len(set(shapes)) == 1:
        sigs += [((S(a),) * len(shapes), (S(a),) * len(attrs["diff"])) for a in range(len(shapes[0]))]
    return sigs


FMAX = defop_vjp("fmax", torch.fmax, sbp=elementwise_sbp(), bwd_sbp=_same_shape_bwd_sbp, family="elementwise")
FMIN = defop_vjp("fmin", torch.fmin, sbp=elementwise_sbp(), bwd_sbp=_same_shape_bwd_sbp, family="elementwise")


def _tensors(name: str, a, b) -> tuple[Tensor, Tensor]:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"holoflow.{name}: expected two tensors, got {type(a).__name__} and {type(b).__name__}")
    return a, b


def fmax(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise maximum that ignores NaN (NaN only where both are NaN), as ``torch.fmax``."""
    return apply(FMAX, *_tensors("fmax", input, other))


def fmin(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise minimum that ignores NaN (NaN only where both are NaN), as ``torch.fmin``."""
    return apply(FMIN, *_tensors("fmin", input, other))


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


# -- bincount --------------------------------------------------------------------------------------------

BINCOUNT = defop("bincount", lambda x, w, minlength: torch.bincount(x, w, minlength),
                 sbp=lambda metas, attrs: [((B,) * len([m for m in metas if hasattr(m, "shape")]), (B,))],
                 differentiable=False, family="other")


def bincount(input: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """Counts of each value of the 1-D non-negative integer ``input`` (summed ``weights``)."""
    if input.dim() != 1:
        raise ShapeError(f"holoflow.bincount: input must be 1-D, got shape {tuple(input.shape)}")
    if input.is_floating_point() or input.is_complex() or input.dtype is torch.bool:
        raise DTypeError(f"holoflow.bincount: input must be an integer tensor, got {input.dtype}")
    if weights is not None and tuple(weights.shape) != tuple(input.shape):
        raise ShapeError(f"holoflow.bincount: weights of shape {tuple(weights.shape)} must match the input's "
                         f"{tuple(input.shape)}")
    return apply(BINCOUNT, input, weights, minlength=int(minlength))  # negative values: the kernel names them


# -- matrix functions ---------------------------------------------------------------------------------

def _batch_sbp(n_in: int):
    def rule(metas, attrs):
        nd = len(metas[0].shape)
        return [((B,) * n_in, (B,))] + [((S(a),) * n_in, (S(a),)) for a in range(nd - 2)]
    return rule


def _batch_bwd_sbp(metas, attrs):
    n = len([m for m in metas if hasattr(m, "shape")])
    nd = len(metas[0].shape)
    k = len(attrs["diff"])
    return [((B,) * n, (B,) * k)] + [((S(a),) * n, (S(a),) * k) for a in range(nd - 2)]


DET = defop_vjp("linalg_det", torch.linalg.det, sbp=_batch_sbp(1), bwd_sbp=_batch_bwd_sbp, family="linalg")
INV = defop_vjp("linalg_inv", torch.linalg.inv, sbp=_batch_sbp(1), bwd_sbp=_batch_bwd_sbp, family="linalg")
CHOLESKY = defop_vjp("linalg_cholesky", lambda A, upper: torch.linalg.cholesky(A, upper=upper),
                     sbp=_batch_sbp(1), bwd_sbp=_batch_bwd_sbp, family="linalg")
SOLVE = defop_vjp("linalg_solve", lambda A, b, left: torch.linalg.solve(A, b, left=left),
                  sbp=lambda metas, attrs: [((B, B), (B,))], bwd_sbp=lambda metas, attrs: [
                      ((B,) * len([m for m in metas if hasattr(m, "shape")]), (B,) * len(attrs["diff"]))],
                  family="linalg")


def _square(name: str, A: Tensor) -> None:
    if not isinstance(A, Tensor):
        raise TypeError(f"holoflow.{name}: expected a tensor, got {type(A).__name__}")
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ShapeError(f"holoflow.{name}: expected a tensor of square matrices (*, n, n), got shape "
                         f"{tuple(A.shape)}")
    if not (A.is_floating_point() or A.is_complex()):
        raise DTypeError(f"holoflow.{name}: expected a floating point or complex input, got {A.dtype}")


def det(A: Tensor) -> Tensor:
    """The determinant of each square matrix of ``A``, as ``torch.linalg.det``."""
    _square("linalg.det", A)
    return apply(DET, A)


def inv(A: Tensor) -> Tensor:
    """The inverse of each square matrix of ``A``, as ``torch.linalg.inv`` (a singular matrix raises)."""
    _square("linalg.inv", A)
    return apply(INV, A)


def cholesky(A: Tensor, *, upper: bool = False) -> Tensor:
    """The Cholesky factor of each Hermitian positive-definite matrix, as ``torch.linalg.cholesky``."""
    _square("linalg.cholesky", A)
    return apply(CHOLESKY, A, upper=bool(upper))


def solve(A: Tensor, B_: Tensor, *, left: bool = True) -> Tensor:
    """``X`` with ``A X = B`` (``X A = B`` when not ``left``), as ``torch.linalg.solve``."""
    _square("linalg.solve", A)
    if not isinstance(B_, Tensor):
        raise TypeError(f"holoflow.linalg.solve: B must be a tensor, got {type(B_).__name__}")
    return apply(SOLVE, A, B_, left=bool(left))


inverse = inv
