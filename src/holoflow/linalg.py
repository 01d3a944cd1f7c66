"""``holoflow.linalg``: norms and products, as ``torch.linalg`` (composites of holoflow ops)."""
from __future__ import annotations

from .core.errors import ArgValueError, UnsupportedError, normalize_dim
from .core.tensor import Tensor
from .ops.linalg import matmul, vecdot
from .ops.decomp import svdvals as _svdvals
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
    if ord in (2, -2, "nuc"):
        return _spectral_norm(A, ord, d0, d1, keepdim)
    if ord not in (1, -1, float("inf"), float("-inf")):
        raise RuntimeError(f"holoflow.linalg.matrix_norm: order {ord!r} not supported; supported: 'fro', 'nuc', "
                           f"2, -2, 1, -1, inf, -inf")
    summed, rest = (d0, d1) if abs(ord) == 1 else (d1, d0)   # 1: max column sum; inf: max row sum
    sums = A.abs().sum(summed, keepdim=keepdim)
    rest = rest if keepdim else rest - (summed < rest)
    return (amax if ord > 0 else amin)(sums, rest, keepdim)


def _spectral_norm(A: Tensor, ord, d0: int, d1: int, keepdim: bool) -> Tensor:  # noqa: A002
    """The largest (2) or smallest (-2) singular value, or their sum ('nuc'), over dims (d0, d1)."""
    s = _svdvals(A.movedim((d0, d1), (-2, -1)))
    out = s.sum(-1) if ord == "nuc" else (amax if ord == 2 else amin)(s, -1)
    if keepdim:
        for d in sorted((d0, d1)):
            out = out.unsqueeze(d)
    return out


def norm(A: Tensor, ord=None, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A002
    """A vector norm (dim an int, or a 1-D input) or a matrix norm (dim a pair, or a 2-D input);
    with ``ord`` and ``dim`` both None, the 2-norm of the flattened input."""
    if isinstance(dim, int):
        dim = (dim,)
    if ord is None and dim is None:
        return vector_norm(A, 2, None, keepdim, dtype=dtype)
    if dim is None and A.dim() not in (1, 2):   # torch refuses to guess vector or matrix norm
        raise ArgValueError(f"holoflow.linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. "
                            f"Got {A.dim()}D.")
    if (dim is not None and len(dim) == 2) or (dim is None and A.dim() == 2):
        return matrix_norm(A, "fro" if ord is None else ord, dim or (-2, -1), keepdim, dtype=dtype)
    if isinstance(ord, str):
        raise ArgValueError(f"holoflow.linalg.norm: ord={ord!r} is a matrix norm: it needs a pair of dims (or a 2-D "
                            f"input without dim), got dim={dim!r} for an input of shape {tuple(A.shape)}")
    return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)

# decompositions (issue 12): primitives with ATen's derivatives, in ops/decomp.py
from .ops.decomp import eigh, eigvalsh, linalg_qr as qr, linalg_svd as svd, svdvals  # noqa: E402

__all__ += ["svd", "svdvals", "qr", "eigh", "eigvalsh"]

from .ops.linalg_solve import cholesky, det, inv, solve  # noqa: E402

__all__ += ["det", "inv", "solve", "cholesky"]

import torch as _torch  # noqa: E402

from .ops import linalg as _ops  # noqa: E402
from .ops.linalg import matrix_exp, matrix_power, slogdet  # noqa: E402

__all__ += ["cross", "matrix_exp", "matrix_power", "slogdet", "pinv"]


def cross(input: Tensor, other: Tensor, *, dim: int = -1) -> Tensor:  # noqa: A002
    """The cross product of 3-vectors along ``dim`` (default the last), as ``torch.linalg.cross``."""
    return _ops.cross(input, other, dim=dim)


def pinv(A: Tensor, *, atol=None, rtol=None, hermitian: bool = False) -> Tensor:
    """The pseudo-inverse, as ``torch.linalg.pinv``: singular values below ``max(atol, rtol *
    largest)`` count as zero (``rtol`` defaults to ``eps * max(m, n)`` of the dtype when ``atol``
    is not given, else to 0); ``hermitian``: ``A`` is Hermitian, decomposed by ``eigh``."""
    if A.dim() < 2:
        raise ArgValueError(f"holoflow.linalg.pinv: expected a tensor of matrices (*, m, n), got shape "
                            f"{tuple(A.shape)}")
    return _ops.linalg_pinv(A, _tolerance("atol", atol), _tolerance("rtol", rtol), bool(hermitian))


def _tolerance(name: str, value) -> float | None:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise UnsupportedError(f"holoflow.linalg.pinv: {name} must be a number (or a one-element tensor); "
                                   f"per-matrix tolerances of shape {tuple(value.shape)} are not supported")
        return float(value.item())
    return None if value is None else float(value)


# -- LU, triangular, least squares, eig and the _ex forms: primitives in ops/linalg_solve.py --------------
from .ops.layout import diagonal as _diagonal  # noqa: E402
from .ops.shape import cat as _cat  # noqa: E402
from .ops.linalg_solve import (  # noqa: E402
    cholesky_ex, eig, eigvals, householder_product, inv_ex, ldl_factor, ldl_factor_ex, ldl_solve, lstsq, lu,
    lu_factor, lu_factor_ex, linalg_lu_solve as lu_solve, solve_ex, solve_triangular,
)

__all__ += ["matrix_rank", "lstsq", "lu_factor", "lu_factor_ex", "lu", "lu_solve", "solve_triangular", "cond",
            "multi_dot", "vander", "tensorinv", "tensorsolve", "diagonal", "householder_product", "eig", "eigvals",
            "inv_ex", "cholesky_ex", "solve_ex", "ldl_factor", "ldl_factor_ex", "ldl_solve"]


def _tol(x, like: Tensor):
    """``atol``/``rtol``: a Python number or a tensor broadcast against the batch dims."""
    return x if isinstance(x, Tensor) else like.new_tensor(float(x))


def matrix_rank(A: Tensor, tol=None, hermitian: bool = False, *, atol=None, rtol=None) -> Tensor:
    """The number of singular values above ``max(atol, rtol * largest)`` (int64), as
    ``torch.linalg.matrix_rank``; ``rtol`` defaults to ``eps * max(m, n)``, or 0 where ``atol > 0``;
    the legacy positional ``tol`` is ``atol`` with ``rtol = 0``."""
    if A.dim() < 2:
        raise RuntimeError(f"holoflow.linalg.matrix_rank: expected a tensor of matrices (*, m, n), got shape "
                           f"{tuple(A.shape)}")
    if tol is not None:
        atol, rtol = tol, 0.0
    s = eigvalsh(A).abs() if hermitian else _svdvals(A)
    s = s.detach()
    eps_rtol = _torch.finfo(s._data.dtype).eps * max(A.shape[-2], A.shape[-1])
    atol_t = _tol(0.0 if atol is None else atol, s)
    if rtol is None:
        rtol_t = _tol(eps_rtol, s) if atol is None else (atol_t <= 0).to(s.dtype) * eps_rtol
    else:
        rtol_t = _tol(rtol, s)
    smax = amax(s, -1) if s.shape[-1] else s.sum(-1)
    limit = (rtol_t * smax).maximum(atol_t)
    return (s > limit.unsqueeze(-1)).sum(-1)


def cond(A: Tensor, p=None) -> Tensor:
    """The condition number ``norm(A, p) * norm(inv(A), p)`` (``p`` None/2/-2: from the singular
    values, any shape), as ``torch.linalg.cond``; a singular square matrix gives inf."""
    if A.dim() < 2:
        raise RuntimeError(f"holoflow.linalg.cond: expected a tensor of matrices (*, m, n), got shape "
                           f"{tuple(A.shape)}")
    if p is None or p in (2, -2):
        s = _svdvals(A)
        big, small = s[..., 0], s[..., -1]
        return big / small if p != -2 else small / big
    if p not in ("fro", "nuc", 1, -1, float("inf"), float("-inf")):
        raise RuntimeError(f"holoflow.linalg.cond: got an invalid norm type {p!r}; expected None, 'fro', 'nuc', "
                           f"2, -2, 1, -1, inf or -inf")
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"holoflow.linalg.cond: p={p!r} needs square matrices, got shape {tuple(A.shape)}")
    inverse, info = inv_ex(A)
    out = matrix_norm(A, p) * matrix_norm(inverse, p)
    return out.masked_fill(info > 0, float("inf"))


def multi_dot(tensors) -> Tensor:
    """The product of ``tensors`` (the first may be 1-D: a row; the last 1-D: a column), multiplied
    left to right, as ``torch.linalg.multi_dot``."""
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"holoflow.linalg.multi_dot: expected at least 2 tensors but got {len(tensors)}")
    for i, t in enumerate(tensors):
        allowed = (1, 2) if i in (0, len(tensors) - 1) else (2,)
        if t.dim() not in allowed:
            raise RuntimeError(f"holoflow.linalg.multi_dot: tensor {i} must be {' or '.join(f'{d}D' for d in allowed)}"
                               f" but got {t.dim()}D")
    out = tensors[0]
    for t in tensors[1:]:
        out = matmul(out, t)
    return out


def vander(x: Tensor, *, N: int | None = None) -> Tensor:
    """The Vandermonde matrix ``x[..., i] ** j`` for ``j < N`` (default ``x.shape[-1]``)."""
    if x.dim() < 1:
        raise RuntimeError("holoflow.linalg.vander: x must have at least one dimension")
    n = x.shape[-1] if N is None else N
    if n <= 1:
        raise RuntimeError(f"holoflow.linalg.vander: N must be greater than 1, got {n}")
    cols = x.unsqueeze(-1).expand(*x.shape, n - 1)
    ones = x.detach().new_ones(tuple(x.shape) + (1,))
    return _cat([ones, cols], -1).cumprod(-1)


def _numel(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def tensorinv(A: Tensor, ind: int = 2) -> Tensor:
    """The inverse with respect to ``tensordot(_, _, ind)``, as ``torch.linalg.tensorinv``."""
    if ind <= 0:
        raise RuntimeError(f"holoflow.linalg.tensorinv: expected a strictly positive integer for ind, got {ind}")
    rows, cols = tuple(A.shape[:ind]), tuple(A.shape[ind:])
    if _numel(rows) != _numel(cols):
        raise RuntimeError(f"holoflow.linalg.tensorinv: expected prod(A.shape[:ind]) == prod(A.shape[ind:]), got "
                           f"{rows} and {cols}")
    return inv(A.reshape(_numel(rows), _numel(cols))).reshape(tuple(cols) + tuple(rows))


def tensorsolve(A: Tensor, B: Tensor, dims=None) -> Tensor:
    """``X`` with ``tensordot(A, X, X.ndim) = B``; ``dims`` of A move to the end first."""
    if dims is not None:
        dims = [normalize_dim("linalg.tensorsolve", d, A.dim()) for d in dims]
        A = A.movedim(dims, list(range(A.dim() - len(dims), A.dim())))
    out_shape = tuple(A.shape[B.dim():])
    if _numel(A.shape[:B.dim()]) != B.numel() or _numel(out_shape) != B.numel():
        raise RuntimeError(f"holoflow.linalg.tensorsolve: expected prod(A.shape[B.ndim:]) == prod(A.shape[:B.ndim]) "
                           f"== B.numel(), got A {tuple(A.shape)} and B {tuple(B.shape)}")
    return solve(A.reshape(B.numel(), -1), B.reshape(-1)).reshape(tuple(out_shape))


def diagonal(A: Tensor, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """The diagonals of the matrices over ``(dim1, dim2)``, as ``torch.linalg.diagonal``."""
    return _diagonal(A, offset, dim1, dim2)
