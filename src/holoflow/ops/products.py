"""Tensor products composed of matmul and einsum: ``tensordot``, ``kron``, ``chain_matmul`` and
nn.functional's ``bilinear`` (matmul, einsum and the BLAS-style products are in ops/linalg.py).

Composites: gradients, SBP rules and nn.Graph come from their parts.
"""
from __future__ import annotations

import math
from functools import reduce

from ..core import interpret
from ..core.errors import ShapeError, normalize_dim
from ..core.tensor import Tensor
from .family import refuse_complex_grad
from .linalg import matmul, trilinear
from .pointwise import _tensor
from .shape import permute, reshape

__all__ = ["kron", "tensordot", "chain_matmul", "bilinear"]


def kron(input: Tensor, other: Tensor) -> Tensor:
    """The Kronecker product (shapes padded with leading 1s to equal rank), as ``torch.kron``."""
    a, b = _tensor("kron", input), _tensor("kron", other, "other")
    nd = max(a.dim(), b.dim())
    sa = (1,) * (nd - a.dim()) + tuple(a.shape)
    sb = (1,) * (nd - b.dim()) + tuple(b.shape)
    ai = reshape(a, tuple(v for s in sa for v in (s, 1)))
    bi = reshape(b, tuple(v for s in sb for v in (1, s)))
    return reshape(ai * bi, tuple(x * y for x, y in zip(sa, sb)))


def _dims_lists(dims, na: int, nb: int) -> tuple[list[int], list[int]]:
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"holoflow.tensordot expects dims >= 0, but got dims={dims}")
        if dims > min(na, nb):
            raise RuntimeError(f"holoflow.tensordot: dims={dims} exceeds the dimensions of the inputs ({na} and {nb})")
        return list(range(na - dims, na)), list(range(dims))
    da, db = dims
    da, db = ([da], [db]) if isinstance(da, int) else (list(da), list(db))
    if len(da) != len(db):
        raise RuntimeError(f"holoflow.tensordot: both dimension lists should have same length, got {da} and {db}")
    return [normalize_dim("tensordot", d, na) for d in da], [normalize_dim("tensordot", d, nb) for d in db]


def tensordot(a: Tensor, b: Tensor, dims=2, out=None) -> Tensor:
    """Sums products over ``dims`` of ``a`` and ``b``, as ``torch.tensordot``."""
    _tensor("tensordot", a, "a"), _tensor("tensordot", b, "b")
    da, db = _dims_lists(dims, a.dim(), b.dim())
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            raise RuntimeError(f"holoflow.tensordot: contracted dimensions need to match, but first has size "
                               f"{a.shape[i]} in dim {i} and second has size {b.shape[j]} in dim {j}")
    fa = [i for i in range(a.dim()) if i not in da]
    fb = [j for j in range(b.dim()) if j not in db]
    k = math.prod(a.shape[i] for i in da)
    am = reshape(permute(a, *fa, *da), math.prod(a.shape[i] for i in fa), k)
    bm = reshape(permute(b, *db, *fb), k, math.prod(b.shape[j] for j in fb))
    return reshape(matmul(am, bm), *[a.shape[i] for i in fa], *[b.shape[j] for j in fb])


def chain_matmul(*matrices: Tensor) -> Tensor:
    """The product of the 2-d ``matrices`` left to right, as ``torch.chain_matmul``."""
    if not matrices:
        raise RuntimeError("holoflow.chain_matmul: expected one or more matrices")
    for i, m in enumerate(matrices):
        if m.dim() != 2:
            raise RuntimeError(f"holoflow.chain_matmul: matrix {i} has {m.dim()} dims, expected 2")
    return reduce(lambda a, b: a @ b, matrices[1:], matrices[0].clone() if len(matrices) == 1 else matrices[0])


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y_o = x1 W_o x2 + b_o``: one einsum over ``(*, I1)``, ``(O, I1, I2)`` and ``(*, I2)``."""
    if (weight.dim() != 3 or input1.shape[-1] != weight.shape[1] or input2.shape[-1] != weight.shape[2]
            or tuple(input1.shape[:-1]) != tuple(input2.shape[:-1])):
        raise ShapeError(f"holoflow.bilinear: inputs {tuple(input1.shape)} and {tuple(input2.shape)} need equal "
                         f"leading dims and last dims matching weight (O, I1, I2) = {tuple(weight.shape)}")
    refuse_complex_grad("bilinear", input1, input2, weight)
    input1, input2, weight, bias = interpret.composite("bilinear", input1, input2, weight, bias)
    out = trilinear("...i,oij,...j->...o", input1, weight, input2)
    return out + bias if bias is not None else out


for _name in ("kron",):
    setattr(Tensor, _name, globals()[_name])
