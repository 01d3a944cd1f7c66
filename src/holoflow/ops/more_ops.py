"""torch functions that were missing: ``addcmul``/``addcdiv`` (torch's fused kernels), ``fmax``/``fmin``,
``kthvalue``/``median``, ``bincount``, ``det``/``inverse`` and ``holoflow.linalg``'s
``det``/``inv``/``solve``/``cholesky``; and composites of existing ops: ``atleast_1d/2d/3d``,
``column_stack``/``row_stack``/``dstack``, ``combinations``, ``cumulative_trapezoid``, ``chain_matmul``
and ``pdist`` (their gradients come from the parts).

Each differentiable one is a primitive on its ATen kernel whose backward is ATen's derivative
(ops/torch_vjp.py), so values and gradients are torch's, ties and NaN rules included. SBP:
elementwise ops split like any elementwise op (the backward on equal shapes); reductions along
``dim`` split on any other axis; matrix functions split on their batch axes.
"""
from __future__ import annotations

import itertools
from collections import namedtuple
from functools import reduce
from typing import Sequence

import torch

from ..core.dispatch import apply
from ..core.errors import DTypeError, ShapeError, UnsupportedError, normalize_dim
from ..core.registry import defop
from ..core.sbp import B, S
from ..core.tensor import Tensor
from .elementwise import _conj
from .family import elementwise_sbp, elementwise_shape, needs, reduce_grad
from .torch_vjp import defop_vjp

__all__ = ["addcmul", "addcdiv", "fmax", "fmin", "kthvalue", "median", "bincount", "det", "inverse", "atleast_1d",
           "atleast_2d", "atleast_3d", "column_stack", "row_stack", "dstack", "combinations", "cumulative_trapezoid",
           "chain_matmul", "pdist"]


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


# -- torch's fused pointwise kernels --------------------------------------------------------------------

def _addcmul_grad(c, dy):
    """torch's derivatives: ``dy``; ``dy * conj(t2 * value)``; ``dy * conj(t1 * value)`` (the
    products with ``value`` even when it is 1: a complex infinity times 1 has a NaN part)."""
    _, t1, t2 = c.inputs
    return (reduce_grad(dy, c, 0) if needs(c, 0) else None,
            reduce_grad(dy * _conj(t2 * c.value), c, 1) if needs(c, 1) else None,
            reduce_grad(dy * _conj(t1 * c.value), c, 2) if needs(c, 2) else None)


def _addcdiv_grad(c, dy):
    """torch's derivatives: ``dy``; ``dy * conj(value / t2)`` (``value`` filled in t2's dtype);
    ``-dy * conj(value * t1 / (t2 * t2))``."""
    _, t1, t2 = c.inputs
    return (reduce_grad(dy, c, 0) if needs(c, 0) else None,
            reduce_grad(dy * _conj(t2.new_full((), c.value) / t2), c, 1) if needs(c, 1) else None,
            reduce_grad(-dy * _conj(t1 * c.value / (t2 * t2)), c, 2) if needs(c, 2) else None)


def _addcmul_kernel(x, t1, t2, value=1):
    return torch.addcmul(x, t1, t2, value=value)


def _addcdiv_kernel(x, t1, t2, value=1):
    return torch.addcdiv(x, t1, t2, value=value)


# one kernel each (``self + value * t1 * t2`` in torch's order: a composite differed at complex
# infinities); linear in (input, tensor1) jointly for a fixed tensor2, and addcmul in (input, tensor2)
ADDCMUL = defop("addcmul", _addcmul_kernel, grad=_addcmul_grad, save="inputs", saved_inputs=(1, 2),
                family="elementwise", shape=elementwise_shape("addcmul", _addcmul_kernel),
                sbp=elementwise_sbp(("PPB", "PBP")), inplace_kernel=torch.Tensor.addcmul_)
ADDCDIV = defop("addcdiv", _addcdiv_kernel, grad=_addcdiv_grad, save="inputs", saved_inputs=(1, 2),
                family="elementwise", shape=elementwise_shape("addcdiv", _addcdiv_kernel),
                sbp=elementwise_sbp(("PPB",)), inplace_kernel=torch.Tensor.addcdiv_)


def _addc_args(name: str, tensors: tuple, value) -> int | float | complex | bool:
    for arg, t in zip(("input", "tensor1", "tensor2"), tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"holoflow.{name}(): argument '{arg}' must be Tensor, not {type(t).__name__}")
    if isinstance(value, Tensor):   # (torch takes a one-element tensor as the Scalar)
        if value.numel() != 1:
            raise TypeError(f"holoflow.{name}(): argument 'value' must be a Number or a one-element tensor, "
                            f"got shape {tuple(value.shape)}")
        value = value.item()
    if name == "addcdiv" and not any(t.is_floating_point() or t.is_complex() for t in tensors[1:]):
        raise RuntimeError(f"holoflow.addcdiv: integer division with addcdiv is not supported (tensor1 is "
                           f"{tensors[1].dtype}, tensor2 {tensors[2].dtype}, as torch); use a floating point "
                           f"tensor1 or tensor2")
    return value


def addcmul(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """``input + value * tensor1 * tensor2`` with broadcasting, torch's kernel (its rounding and
    special values)."""
    value = _addc_args("addcmul", (input, tensor1, tensor2), value)
    return apply(ADDCMUL, input, tensor1, tensor2, value=value)


def addcdiv(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """``input + value * tensor1 / tensor2``, torch's kernel; as torch, not for two integer tensors."""
    value = _addc_args("addcdiv", (input, tensor1, tensor2), value)
    return apply(ADDCDIV, input, tensor1, tensor2, value=value)


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
        raise UnsupportedError(f"holoflow.bincount: input must be an integer tensor, got {input.dtype}")
    if weights is not None and tuple(weights.shape) != tuple(input.shape):
        raise ShapeError(f"holoflow.bincount: weights of shape {tuple(weights.shape)} must match the input's "
                         f"{tuple(input.shape)}")
    return apply(BINCOUNT, input, weights, minlength=int(minlength))  # negative values: the kernel names them


Tensor.bincount = bincount


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


def cumulative_trapezoid(y: Tensor, x: Tensor | None = None, *, dx: float | None = None, dim: int = -1) -> Tensor:
    """The running trapezoidal integral of ``y`` along ``dim`` (sample points ``x`` or spacing
    ``dx``, default 1), as ``torch.cumulative_trapezoid``."""
    d = normalize_dim("cumulative_trapezoid", dim, y.dim())
    if x is not None and dx is not None:
        raise RuntimeError("holoflow.cumulative_trapezoid: received both x and dx; pass one of them")
    n = y.shape[d]
    # ATen's order: left + right (a complex add multiplies its second operand by alpha = 1)
    pairs = y.narrow(d, 0, n - 1) + y.narrow(d, 1, n - 1) if n else y
    if not isinstance(x, Tensor):
        return (pairs * ((1.0 if dx is None else dx) / 2.0)).cumsum(d)
    if x.dim() == 1:
        if x.shape[0] != n:
            raise RuntimeError(f"holoflow.cumulative_trapezoid: there must be one `x` value for each sample point, "
                               f"got {x.shape[0]} x values for {n} samples along dim {d}")
        x = x.reshape([n if a == d else 1 for a in range(y.dim())])
        xd = d
    else:
        xd = d - y.dim() + x.dim()
    if n == 0:
        return y.cumsum(d)
    steps = x.narrow(xd, 1, n - 1) - x.narrow(xd, 0, n - 1)
    return (pairs * steps).cumsum(d) / 2.0


def chain_matmul(*matrices: Tensor) -> Tensor:
    """The product of the 2-d ``matrices`` left to right, as ``torch.chain_matmul``."""
    if not matrices:
        raise RuntimeError("holoflow.chain_matmul: expected one or more matrices")
    for i, m in enumerate(matrices):
        if m.dim() != 2:
            raise RuntimeError(f"holoflow.chain_matmul: matrix {i} has {m.dim()} dims, expected 2")
    return reduce(lambda a, b: a @ b, matrices[1:], matrices[0].clone() if len(matrices) == 1 else matrices[0])


def pdist(input: Tensor, p: float = 2.0) -> Tensor:
    """The ``p``-norm distances between the rows of ``input`` (N, M), pairs ``i < j`` in row
    order, as ``torch.pdist``."""
    if input.dim() != 2:
        raise RuntimeError(f"holoflow.pdist: only supports 2D tensors, got {input.dim()}D")
    if not input.is_floating_point():
        raise RuntimeError(f"holoflow.pdist: only supports floating-point dtypes, got {input.dtype}")
    if p < 0:
        raise RuntimeError(f"holoflow.pdist: only supports non-negative p values, got {p}")
    n = input.shape[0]
    i, j = (Tensor._make(t) for t in torch.triu_indices(n, n, 1, device=input._data.device))
    return (input.index_select(0, i) - input.index_select(0, j)).norm(p, dim=1)
