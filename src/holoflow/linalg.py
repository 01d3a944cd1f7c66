"""``holoflow.linalg``: norms and products, as ``torch.linalg`` (composites of holoflow ops)."""
from __future__ import annotations

from .core.errors import ArgValueError, UnsupportedError, normalize_dim
from .core.tensor import Tensor
from .ops.linalg import matmul, vecdot
from .ops.reduction import amax, amin, vector_norm

__all__ = ["vector_norm", "matrix_norm", "norm", "matmul", "vecdot"]


def matrix_norm(A: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A002
    """Frobenius (``'fro'``) or induced 1/inf (and -1/-inf) norm over the two dims ``dim``.

    >>> holoflow.linalg.matrix_norm(holoflow.ones(2, 3), 1).item()
    2.0
    """
    if len(dim) != 2:
        raise ValueError(f"holoflow.linalg.matrix_norm: dim must be a pair of dims, got {dim!r}")
    d0, d1 = (normalize_dim("linalg.matrix_norm", d, A.dim()) for d in dim)
    if d0 == d1:
        raise ValueError(f"holoflow.linalg.matrix_norm: dims {dim!r} name the same dimension")
    if dtype is not None:
        A = A.to(dtype)
    if ord == "fro":
        return vector_norm(A, 2, (d0, d1), keepdim)
    if ord not in (1, -1, float("inf"), float("-inf")):
        raise UnsupportedError(f"holoflow.linalg.matrix_norm: ord={ord!r} is not supported (it needs an "
                               f"SVD); supported: 'fro', 1, -1, inf, -inf")
    summed, rest = (d0, d1) if abs(ord) == 1 else (d1, d0)   # 1: max column sum; inf: max row sum
    sums = A.abs().sum(summed, keepdim=keepdim)
    rest = rest if keepdim else rest - (summed < rest)
    return (amax if ord > 0 else amin)(sums, rest, keepdim)


def norm(A: Tensor, ord=None, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A002
    """A vector norm (dim an int, or a 1-D input) or a matrix norm (dim a pair, or a 2-D input);
    with ``ord`` and ``dim`` both None, the 2-norm of the flattened input."""
    if isinstance(dim, int):
        dim = (dim,)
    if ord is None and dim is None:
        return vector_norm(A, 2, None, keepdim, dtype=dtype)
    if (dim is not None and len(dim) == 2) or (dim is None and A.dim() == 2):
        return matrix_norm(A, "fro" if ord is None else ord, dim or (-2, -1), keepdim, dtype=dtype)
    if isinstance(ord, str):
        raise ArgValueError(f"holoflow.linalg.norm: ord={ord!r} is a matrix norm: it needs a pair of dims (or a 2-D "
                            f"input without dim), got dim={dim!r} for an input of shape {tuple(A.shape)}")
    return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)

# decompositions (issue 12): primitives with ATen's derivatives, in ops/decomp.py
from .ops.decomp import eigh, eigvalsh, linalg_qr as qr, linalg_svd as svd, svdvals  # noqa: E402

__all__ += ["svd", "svdvals", "qr", "eigh", "eigvalsh"]

from .ops.more_ops import cholesky, det, inv, solve  # noqa: E402

__all__ += ["det", "inv", "solve", "cholesky"]

import torch as _torch  # noqa: E402

from .ops import linalg as _ops  # noqa: E402
from .ops.linalg import matrix_exp, matrix_power, slogdet  # noqa: E402

__all__ += ["cross", "matrix_exp", "matrix_power", "slogdet", "pinv"]


def cross(input: Tensor, other: Tensor, *, dim: int = -1) -> Tensor:  # noqa: A002
    """The cross product of 3-vectors along ``dim`` (default the last), as ``torch.linalg.cross``."""
    return _ops.cross(input, other, dim=dim)


def pinv(A: Tensor, *, atol=None, rtol=None, hermitian: bool = False) -> Tensor:
    """The pseudo-inverse, as ``torch.linalg.pinv``: singular values below ``rtol`` times the
    largest count as zero (default ``eps * max(m, n)`` of the dtype)."""
    if atol is not None or hermitian:
        raise UnsupportedError("holoflow.linalg.pinv: atol= and hermitian=True are not supported; pass rtol= "
                               "(relative to the largest singular value)")
    if A.dim() < 2:
        raise ArgValueError(f"holoflow.linalg.pinv: expected a tensor of matrices (*, m, n), got shape "
                            f"{tuple(A.shape)}")
    if rtol is None:
        rtol = _torch.finfo(A._data.dtype).eps * max(A.shape[-2], A.shape[-1])
    return _ops.pinverse(A, float(rtol))
