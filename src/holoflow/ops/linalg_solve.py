"""Inverses, solvers and factorizations of ``torch.linalg`` on LAPACK kernels: ``det``/``inv``
(``inverse``)/``solve``/``cholesky``, LU (factor, unpack, solve), triangular solves, least squares,
the general eigendecomposition, Householder products, LDL and the ``_ex`` forms (SVD, QR and eigh
are in ops/decomp.py; products and matrix functions in ops/linalg.py).

Each is a primitive on its ATen kernel whose backward is ATen's derivative (ops/torch_vjp.py),
so values and gradients are torch's. A singular input raises ``torch.linalg.LinAlgError`` naming
the op, as torch does. SBP: a leading (batch) axis splits every input and output alike, offered
only where all inputs share their batch dims (no broadcasting between them).
"""
from __future__ import annotations

from collections import namedtuple
from typing import Callable

import torch

from ..core import interpret
from ..core.dispatch import apply
from ..core.errors import DTypeError, ShapeError
from ..core.registry import defop
from ..core.sbp import B, S
from ..core.tensor import Tensor
from .torch_vjp import defop_vjp

__all__ = ["det", "inverse", "lu_unpack", "lu_solve", "triangular_solve"]


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


def _named_errors(name: str, fn: Callable) -> Callable:
    """``fn`` with torch's LinAlgError (a singular input) re-raised naming ``holoflow.linalg.<name>``."""
    def kernel(*args, **attrs):
        try:
            return fn(*args, **attrs)
        except torch.linalg.LinAlgError as e:
            raise torch.linalg.LinAlgError(f"holoflow.{name}: {str(e).splitlines()[0]}") from None
    return kernel


def _batch_sigs(tensors: list, n_out: int) -> list:
    """Broadcast everything, or split every tensor and output on one shared batch axis."""
    nb = len(tensors[0].shape) - 2
    batch = tuple(tensors[0].shape[:nb])
    sigs = [((B,) * len(tensors), (B,) * n_out)]
    if all(tuple(t.shape[:nb]) == batch for t in tensors):
        sigs += [((S(a),) * len(tensors), (S(a),) * n_out) for a in range(nb)]
    return sigs


def _fwd_sbp(n_out: int) -> Callable:
    return lambda metas, attrs: _batch_sigs([m for m in metas if hasattr(m, "shape")], n_out)


def _bwd_sbp(metas, attrs):
    return _batch_sigs([m for m in metas if hasattr(m, "shape")], len(attrs["diff"]))


def _op(name: str, fn: Callable, n_out: int = 1, outputs: tuple | None = None, sbp: Callable | None = None):
    """A ``defop_vjp`` matrix op on ``fn`` with batch-axis SBP rules."""
    return defop_vjp(name, _named_errors(name.replace("linalg_", "linalg."), fn), sbp=sbp or _fwd_sbp(n_out),
                     bwd_sbp=_bwd_sbp, family="linalg", outputs=outputs)


INV_EX = _op("linalg_inv_ex", lambda A, check_errors: torch.linalg.inv_ex(A, check_errors=check_errors), 2,
             ("inverse", "info"))
CHOLESKY_EX = _op("linalg_cholesky_ex", lambda A, upper, check_errors: torch.linalg.cholesky_ex(
    A, upper=upper, check_errors=check_errors), 2, ("L", "info"))
SOLVE_EX = _op("linalg_solve_ex", lambda A, B_, left, check_errors: torch.linalg.solve_ex(
    A, B_, left=left, check_errors=check_errors), 2, ("result", "info"))
LU_FACTOR_EX = _op("linalg_lu_factor_ex", lambda A, pivot, check_errors: torch.linalg.lu_factor_ex(
    A, pivot=pivot, check_errors=check_errors), 3, ("LU", "pivots", "info"))
LU = _op("linalg_lu", lambda A, pivot: torch.linalg.lu(A, pivot=pivot), 3, ("P", "L", "U"))
LU_UNPACK = _op("lu_unpack", lambda LU_, piv, unpack_data, unpack_pivots: torch.lu_unpack(
    LU_, piv, unpack_data, unpack_pivots), 3, ("P", "L", "U"))
LU_SOLVE = _op("linalg_lu_solve", lambda LU_, piv, B_, left, adjoint: torch.linalg.lu_solve(
    LU_, piv, B_, left=left, adjoint=adjoint))
SOLVE_TRIANGULAR = _op("linalg_solve_triangular", lambda A, B_, upper, left, unitriangular:
                       torch.linalg.solve_triangular(A, B_, upper=upper, left=left, unitriangular=unitriangular))
# residuals / rank / singular_values may be empty (0,) whatever the batch: broadcast only
def _lstsq(A: torch.Tensor, B_: torch.Tensor, rcond, driver):
    """torch.linalg.lstsq; on meta tensors (graph tracing: ATen has no meta kernel) the shapes torch
    documents for full-rank inputs."""
    if A.device.type != "meta":
        return torch.linalg.lstsq(A, B_, rcond=rcond, driver=driver)
    (m, n), k, batch = A.shape[-2:], B_.shape[-1], torch.broadcast_shapes(A.shape[:-2], B_.shape[:-2])
    driver = driver or "gelsy"

    def empty(shape, dtype=A.dtype):
        return A.new_empty(shape, dtype=dtype)
    return (empty((*batch, n, k)), empty((*batch, k) if m > n and driver != "gelsy" else (0,)),
            empty(batch if driver != "gels" else (0,), torch.int64),
            empty((*batch, min(m, n)) if driver in ("gelsd", "gelss") else (0,)))


LSTSQ = _op("linalg_lstsq", _lstsq, 4,
            ("solution", "residuals", "rank", "singular_values"),
            sbp=lambda metas, attrs: [((B, B), (B,) * 4)])
EIG = _op("linalg_eig", torch.linalg.eig, 2, ("eigenvalues", "eigenvectors"))
EIGVALS = _op("linalg_eigvals", torch.linalg.eigvals)
HOUSEHOLDER = _op("linalg_householder_product", torch.linalg.householder_product)
# torch has no derivative for LDL: plain (non-differentiable) primitives
LDL_FACTOR_EX = defop("linalg_ldl_factor_ex", _named_errors("linalg.ldl_factor_ex", lambda A, hermitian, check_errors:
                      torch.linalg.ldl_factor_ex(A, hermitian=hermitian, check_errors=check_errors)),
                      sbp=_fwd_sbp(3), differentiable=False, family="linalg", outputs=("LD", "pivots", "info"))
LDL_SOLVE = defop("linalg_ldl_solve", _named_errors("linalg.ldl_solve", lambda LD, piv, B_, hermitian:
                  torch.linalg.ldl_solve(LD, piv, B_, hermitian=hermitian)),
                  sbp=_fwd_sbp(1), differentiable=False, family="linalg")

InvEx = namedtuple("linalg_inv_ex", ["inverse", "info"])
CholeskyEx = namedtuple("linalg_cholesky_ex", ["L", "info"])
SolveEx = namedtuple("linalg_solve_ex", ["result", "info"])
LuFactor = namedtuple("linalg_lu_factor", ["LU", "pivots"])
LuFactorEx = namedtuple("linalg_lu_factor_ex", ["LU", "pivots", "info"])
PLU = namedtuple("linalg_lu", ["P", "L", "U"])
LuUnpack = namedtuple("lu_unpack", ["P", "L", "U"])
Lstsq = namedtuple("linalg_lstsq", ["solution", "residuals", "rank", "singular_values"])
Eig = namedtuple("linalg_eig", ["eigenvalues", "eigenvectors"])
LdlFactor = namedtuple("linalg_ldl_factor", ["LD", "pivots"])
LdlFactorEx = namedtuple("linalg_ldl_factor_ex", ["LD", "pivots", "info"])
TriangularSolve = namedtuple("triangular_solve", ["solution", "cloned_coefficient"])


def _matrix(name: str, A, what: str = "A") -> Tensor:
    if not isinstance(A, Tensor):
        raise TypeError(f"holoflow.{name}: {what} must be a tensor, got {type(A).__name__}")
    if A.dim() < 2:
        raise ShapeError(f"holoflow.{name}: {what} must be a tensor of matrices (*, m, n), got shape "
                         f"{tuple(A.shape)}")
    return A


def inv_ex(A: Tensor, *, check_errors: bool = False) -> InvEx:
    """The inverse and LAPACK's ``info`` (non-zero: singular), as ``torch.linalg.inv_ex``."""
    _square("linalg.inv_ex", A)
    return InvEx(*apply(INV_EX, A, check_errors=bool(check_errors)))


def cholesky_ex(A: Tensor, *, upper: bool = False, check_errors: bool = False) -> CholeskyEx:
    """The Cholesky factor and ``info`` (non-zero: not positive-definite)."""
    _square("linalg.cholesky_ex", A)
    return CholeskyEx(*apply(CHOLESKY_EX, A, upper=bool(upper), check_errors=bool(check_errors)))


def solve_ex(A: Tensor, B: Tensor, *, left: bool = True, check_errors: bool = False) -> SolveEx:
    """``linalg.solve``'s result and ``info`` (non-zero: singular)."""
    _square("linalg.solve_ex", A)
    if not isinstance(B, Tensor):
        raise TypeError(f"holoflow.linalg.solve_ex: B must be a tensor, got {type(B).__name__}")
    return SolveEx(*apply(SOLVE_EX, A, B, left=bool(left), check_errors=bool(check_errors)))


def lu_factor_ex(A: Tensor, *, pivot: bool = True, check_errors: bool = False) -> LuFactorEx:
    """The packed LU factorization, its 1-based pivots and ``info``."""
    _matrix("linalg.lu_factor_ex", A)
    return LuFactorEx(*apply(LU_FACTOR_EX, A, pivot=bool(pivot), check_errors=bool(check_errors)))


def lu_factor(A: Tensor, *, pivot: bool = True) -> LuFactor:
    """``(LU, pivots)`` as ``torch.linalg.lu_factor`` (a singular matrix raises)."""
    _matrix("linalg.lu_factor", A)
    LU_, piv, _ = apply(LU_FACTOR_EX, A, pivot=bool(pivot), check_errors=True)
    return LuFactor(LU_, piv)


def lu(A: Tensor, *, pivot: bool = True) -> PLU:
    """``A = P L U`` as a ``(P, L, U)`` namedtuple, as ``torch.linalg.lu``."""
    _matrix("linalg.lu", A)
    P, L, U = apply(LU, A, pivot=bool(pivot))
    return PLU(P.detach(), L, U)   # the permutation has no gradient, as in torch


def lu_unpack(LU_data: Tensor, LU_pivots: Tensor, unpack_data: bool = True, unpack_pivots: bool = True) -> LuUnpack:
    """``(P, L, U)`` from ``lu_factor``'s packed result, as ``torch.lu_unpack``."""
    _matrix("lu_unpack", LU_data, "LU_data")
    P, L, U = apply(LU_UNPACK, LU_data, LU_pivots, unpack_data=bool(unpack_data), unpack_pivots=bool(unpack_pivots))
    return LuUnpack(P.detach(), L, U)


def linalg_lu_solve(LU: Tensor, pivots: Tensor, B: Tensor, *, left: bool = True, adjoint: bool = False) -> Tensor:
    """``X`` with ``A X = B`` from ``A``'s ``lu_factor``, as ``torch.linalg.lu_solve``."""
    _square("linalg.lu_solve", LU)
    _matrix("linalg.lu_solve", B, "B")
    return apply(LU_SOLVE, LU, pivots, B, left=bool(left), adjoint=bool(adjoint))


def lu_solve(b: Tensor, LU_data: Tensor, LU_pivots: Tensor) -> Tensor:
    """The legacy ``torch.lu_solve(b, LU_data, LU_pivots)``."""
    b, LU_data = interpret.composite("lu_solve", b, LU_data)
    return linalg_lu_solve(LU_data, LU_pivots, b)


def solve_triangular(A: Tensor, B: Tensor, *, upper: bool, left: bool = True, unitriangular: bool = False) -> Tensor:
    """``X`` with ``A X = B`` (``X A = B`` when not ``left``) for triangular ``A``."""
    _square("linalg.solve_triangular", A)
    _matrix("linalg.solve_triangular", B, "B")
    return apply(SOLVE_TRIANGULAR, A, B, upper=bool(upper), left=bool(left), unitriangular=bool(unitriangular))


def triangular_solve(b: Tensor, A: Tensor, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False) -> TriangularSolve:
    """The legacy ``torch.triangular_solve``: ``(solution, cloned_coefficient)``."""
    _square("triangular_solve", A)
    coeff = A.transpose(-2, -1) if transpose else A
    x = solve_triangular(coeff, b, upper=bool(upper) != bool(transpose), unitriangular=unitriangular)
    return TriangularSolve(x, A.clone())


_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def lstsq(A: Tensor, B: Tensor, rcond: float | None = None, *, driver: str | None = None) -> Lstsq:
    """Least-squares solution of ``A X = B`` with residuals, rank and singular values (CPU drivers
    'gels', 'gelsy' (default), 'gelsd', 'gelss'), as ``torch.linalg.lstsq``."""
    _matrix("linalg.lstsq", A)
    if not isinstance(B, Tensor) or B.dim() < 1:
        raise ShapeError(f"holoflow.linalg.lstsq: B must be a tensor of at least 1 dim, got {B!r}")
    if driver is not None and driver not in _DRIVERS:
        raise RuntimeError(f"holoflow.linalg.lstsq: driver must be one of {_DRIVERS} (CPU), got {driver!r}")
    solution, residuals, rank, sv = apply(LSTSQ, A, B, rcond=rcond, driver=driver)
    return Lstsq(solution, residuals, rank, sv.detach())   # torch differentiates solution and residuals


def eig(A: Tensor) -> Eig:
    """Complex eigenvalues and eigenvectors of a general square matrix, as ``torch.linalg.eig``
    (its gradient needs a loss invariant to the eigenvectors' phases, as torch checks)."""
    _square("linalg.eig", A)
    return Eig(*apply(EIG, A))


def eigvals(A: Tensor) -> Tensor:
    """The complex eigenvalues of a general square matrix."""
    _square("linalg.eigvals", A)
    return apply(EIGVALS, A)


def householder_product(A: Tensor, tau: Tensor) -> Tensor:
    """The first ``n`` columns of the product of Householder reflectors ``(A[:, i], tau[i])``."""
    _matrix("linalg.householder_product", A)
    if A.shape[-1] > A.shape[-2]:
        raise RuntimeError(f"holoflow.linalg.householder_product: A must have at least as many rows as columns, "
                           f"got shape {tuple(A.shape)}")
    return apply(HOUSEHOLDER, A, tau)


def ldl_factor_ex(A: Tensor, *, hermitian: bool = False, check_errors: bool = False) -> LdlFactorEx:
    """The compact LDL factorization (not differentiable in torch), pivots and ``info``."""
    _square("linalg.ldl_factor_ex", A)
    return LdlFactorEx(*apply(LDL_FACTOR_EX, A, hermitian=bool(hermitian), check_errors=bool(check_errors)))


def ldl_factor(A: Tensor, *, hermitian: bool = False) -> LdlFactor:
    """``(LD, pivots)`` as ``torch.linalg.ldl_factor``."""
    _square("linalg.ldl_factor", A)
    LD, piv, _ = apply(LDL_FACTOR_EX, A, hermitian=bool(hermitian), check_errors=True)
    return LdlFactor(LD, piv)


def ldl_solve(LD: Tensor, pivots: Tensor, B: Tensor, *, hermitian: bool = False) -> Tensor:
    """``X`` with ``A X = B`` from ``A``'s ``ldl_factor``."""
    _square("linalg.ldl_solve", LD)
    _matrix("linalg.ldl_solve", B, "B")
    return apply(LDL_SOLVE, LD, pivots, B, hermitian=bool(hermitian))


Tensor.lu_solve = lu_solve
Tensor.triangular_solve = triangular_solve
