"""torch's older linear-algebra entry points, as composites of holoflow ops (so they differentiate
and run on global tensors like their parts): the randomized ``svd_lowrank`` / ``pca_lowrank``,
the deprecated ``lu``, LAPACK's QR pieces ``geqrf`` (a primitive: torch has no derivative for it
either), ``orgqr`` and ``ormqr`` (from ``linalg.householder_product``), and the norms
``frobenius_norm``, ``nuclear_norm``, ``norm_except_dim``.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import torch

from ..core.dispatch import apply
from ..core.errors import ArgValueError, ShapeError, normalize_dim
from ..core.registry import defop
from ..core.tensor import Tensor
from .creation import randn, zeros
from .decomp import _batch_sbp, linalg_qr, linalg_svd, svdvals
from .family import refuse_complex_grad
from .linalg import matmul
from .shape import cat
from .linalg_solve import householder_product, lu_factor_ex
from .reduction import vector_norm

__all__ = ["svd_lowrank", "pca_lowrank", "lu", "frobenius_norm", "nuclear_norm", "norm_except_dim", "orgqr", "geqrf",
           "ormqr"]


def _tensor(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"holoflow.{name}(): argument 'input' must be a Tensor, not {type(x).__name__}")
    return x


def _floating(name: str, x: Tensor) -> None:
    if not (x.is_floating_point() or x.is_complex()):
        raise RuntimeError(f"holoflow.{name}: expected a floating point or complex input, got {x.dtype}")


def _adj(x: Tensor) -> Tensor:
    x = x.transpose(-2, -1)
    return x.conj() if x.is_complex() else x


def _range_basis(A: Tensor, q: int, niter: int) -> Tensor:
    """An orthonormal ``(..., m, q)`` basis approximately spanning ``A``'s range: ``A`` times a
    Gaussian sketch, sharpened by ``niter`` power iterations (re-orthonormalised each half step)."""
    n = A.shape[-1]
    sketch = randn(n, q, dtype=A.dtype, device=A.device)
    Q = linalg_qr(matmul(A, sketch)).Q
    AH = _adj(A)
    for _ in range(niter):
        Q = linalg_qr(matmul(AH, Q)).Q
        Q = linalg_qr(matmul(A, Q)).Q
    return Q


def svd_lowrank(A: Tensor, q: int | None = 6, niter: int | None = 2,
                M: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """A rank-``q`` approximate SVD ``A - M ≈ U diag(S) V^H`` by randomized range finding (Halko,
    Martinsson and Tropp, 2011), as ``torch.svd_lowrank``: returns ``(U, S, V)`` with ``U`` of
    shape ``(..., m, k)``, ``S`` ``(..., k)`` and ``V`` ``(..., n, k)``, ``k = min(q, m, n)``. Draws
    its sketch from the global random generator; exact when ``A - M`` has rank at most ``q``."""
    A = _tensor("svd_lowrank", A)
    _floating("svd_lowrank", A)
    if A.dim() < 2:
        raise ShapeError(f"holoflow.svd_lowrank: expected a matrix or a batch of matrices, got shape {tuple(A.shape)}")
    q = 6 if q is None else int(q)
    niter = 2 if niter is None else int(niter)
    m, n = A.shape[-2:]
    if q < 0:
        raise ArgValueError(f"holoflow.svd_lowrank: q must be non-negative, got {q}")
    if niter < 0:
        raise ArgValueError(f"holoflow.svd_lowrank: niter must be non-negative, got {niter}")
    if M is not None:
        A = A - M
    wide = m < n
    if wide:   # sketch the smaller side
        A = _adj(A)
    Q = _range_basis(A, q, niter)
    U_small, S, Vh = linalg_svd(matmul(_adj(Q), A), full_matrices=False)
    U, V = matmul(Q, U_small), _adj(Vh)
    return (V, S, U) if wide else (U, S, V)


def pca_lowrank(A: Tensor, q: int | None = None, center: bool = True,
                niter: int = 2) -> tuple[Tensor, Tensor, Tensor]:
    """``svd_lowrank`` of ``A`` with its column means removed (``center=True``), as
    ``torch.pca_lowrank``: the principal directions are ``V``'s columns, the projections
    ``A_centered @ V``. ``q`` defaults to ``min(6, m, n)``."""
    A = _tensor("pca_lowrank", A)
    if A.dim() < 2:
        raise ShapeError(f"holoflow.pca_lowrank: expected a matrix or a batch of matrices, got shape {tuple(A.shape)}")
    m, n = A.shape[-2:]
    q = min(6, m, n) if q is None else int(q)
    if not 0 <= q <= min(m, n):
        raise ArgValueError(f"holoflow.pca_lowrank: q={q} must be between 0 and min(m, n) = {min(m, n)}")
    if niter < 0:
        raise ArgValueError(f"holoflow.pca_lowrank: niter must be non-negative, got {niter}")
    if center:
        A = A - A.mean(dim=-2, keepdim=True)
    return svd_lowrank(A, q, niter=niter)


def lu(A: Tensor, pivot: bool = True, get_infos: bool = False, out: object = None) -> tuple[Tensor, ...]:
    """The deprecated ``torch.lu``: ``(LU, pivots)`` of ``A`` (``(LU, pivots, infos)`` with
    ``get_infos=True``; ``infos[i] > 0`` marks a singular matrix). Use
    ``holoflow.linalg.lu_factor`` / ``lu_factor_ex``."""
    A = _tensor("lu", A)
    if out is not None:
        raise TypeError("holoflow.lu: out= is not supported; assign the returned tensors")
    _warn_deprecated("lu", "holoflow.linalg.lu_factor / lu_factor_ex")
    res = lu_factor_ex(A, pivot=pivot)   # a singular input is no error (torch.lu's check is for bad arguments)
    return (res.LU, res.pivots, res.info) if get_infos else (res.LU, res.pivots)


_WARNED: set[str] = set()


def _warn_deprecated(name: str, instead: str) -> None:
    """Warns once per process, as torch's ``TORCH_WARN_ONCE``."""
    if name in _WARNED:
        return
    _WARNED.add(name)
    warnings.warn(f"holoflow.{name} is deprecated (as torch's); use {instead}", UserWarning, stacklevel=3)


def frobenius_norm(input: Tensor, dim: int | Sequence[int] = (), keepdim: bool = False) -> Tensor:
    """The 2-norm over at most two dims ``dim`` (every dim when empty), as the deprecated
    ``torch.frobenius_norm``: ``holoflow.linalg.vector_norm(input, 2, dim, keepdim)``."""
    input = _tensor("frobenius_norm", input)
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if len(dims) > 2:
        raise RuntimeError(f"holoflow.frobenius_norm: expected at most 2 dimensions, but got {len(dims)} "
                           f"dimensions instead")
    _floating("frobenius_norm", input)
    _warn_deprecated("frobenius_norm", "holoflow.linalg.vector_norm(A, 2, dim, keepdim)")
    return vector_norm(input, 2, dims or None, keepdim)


def nuclear_norm(input: Tensor, dim: Sequence[int] | bool | None = None, keepdim: bool = False) -> Tensor:
    """The sum of singular values over the matrix dims ``dim`` (the last two by default), as the
    deprecated ``torch.nuclear_norm(input, keepdim=False)`` / ``nuclear_norm(input, dim, keepdim)``."""
    input = _tensor("nuclear_norm", input)
    if isinstance(dim, bool):   # nuclear_norm(input, keepdim)
        dim, keepdim = None, dim
    _floating("nuclear_norm", input)
    if input.dim() < 2:
        raise RuntimeError(f"holoflow.nuclear_norm: expected a tensor with 2 or more dimensions, got shape "
                           f"{tuple(input.shape)}")
    if dim is None:
        dim = (-2, -1)
    if len(dim) != 2:
        raise RuntimeError(f"holoflow.nuclear_norm: dim must name exactly two dimensions, got {tuple(dim)}")
    d0, d1 = (normalize_dim("nuclear_norm", d, input.dim()) for d in dim)
    if d0 == d1:
        raise RuntimeError(f"holoflow.nuclear_norm: dims {tuple(dim)} name the same dimension")
    _warn_deprecated("nuclear_norm", "holoflow.linalg.matrix_norm(A, 'nuc', dim, keepdim)")
    rest = [d for d in range(input.dim()) if d not in (d0, d1)]
    values = svdvals(input.permute(*rest, d0, d1)).sum(-1)
    if keepdim:
        for d in sorted((d0, d1)):
            values = values.unsqueeze(d)
    return values


def norm_except_dim(v: Tensor, pow: float = 2, dim: int = 0) -> Tensor:  # noqa: A002 - torch's name
    """The ``pow``-norm over every dim but ``dim``, keeping all dims (size 1 but ``dim``), as
    ``torch.norm_except_dim`` (weight normalisation's norm); ``dim=-1``: the norm of all of ``v``,
    a 0-dim tensor."""
    v = _tensor("norm_except_dim", v)
    if dim == -1:
        return vector_norm(v, pow)
    d = normalize_dim("norm_except_dim", dim, v.dim())
    others = tuple(i for i in range(v.dim()) if i != d)
    if not others:
        return vector_norm(v.unsqueeze(0), pow, 0, keepdim=False).reshape(v.shape) if v.dim() else v.abs()
    return vector_norm(v, pow, others, keepdim=True)


def _lu_method(self: Tensor, pivot: bool = True, get_infos: bool = False) -> tuple[Tensor, ...]:
    return lu(self, pivot=pivot, get_infos=get_infos)


_lu_method.__name__ = _lu_method.__qualname__ = "lu"
_lu_method.__doc__ = lu.__doc__
Tensor.lu = _lu_method


def orgqr(input: Tensor, tau: Tensor) -> Tensor:
    """The product of Householder reflectors ``(input, tau)`` (as from ``geqrf``): an alias of
    ``holoflow.linalg.householder_product``, as ``torch.orgqr``."""
    return householder_product(input, tau)


def _geqrf_grad(c, *dys):
    raise NotImplementedError("holoflow.geqrf: the derivative for 'geqrf' is not implemented (as in torch); "
                              "differentiate holoflow.linalg.qr instead")


def _geqrf_kernel(A):
    try:
        return torch.geqrf(A)
    except RuntimeError as e:
        raise RuntimeError(f"holoflow.geqrf: {str(e).splitlines()[0]}") from None


GEQRF = defop("geqrf", _geqrf_kernel, grad=_geqrf_grad, sbp=_batch_sbp(2), outputs=("a", "tau"), family="linalg")


def geqrf(input: Tensor) -> tuple[Tensor, Tensor]:
    """LAPACK's QR factorisation ``(a, tau)``: R above ``a``'s diagonal, the Householder vectors
    below it and their scales in ``tau``, as ``torch.geqrf``. Not differentiable (as torch: the
    backward raises); ``orgqr``/``ormqr`` turn the result into Q or products with it."""
    input = _tensor("geqrf", input)
    if input.dim() < 2:
        raise RuntimeError(f"holoflow.geqrf: expected a matrix or a batch of matrices, got shape {tuple(input.shape)}")
    refuse_complex_grad("geqrf", input)
    return apply(GEQRF, input)


def ormqr(input: Tensor, input2: Tensor, input3: Tensor, left: bool = True, transpose: bool = False) -> Tensor:
    """``op(Q) @ input3`` (``left``) or ``input3 @ op(Q)``, ``Q`` the full product of the Householder
    reflectors ``(input, input2)`` (``geqrf``'s ``a`` and ``tau``) and ``op`` its conjugate
    transpose when ``transpose``, as ``torch.ormqr``; differentiable in all three."""
    A, tau, C = (_tensor("ormqr", t) for t in (input, input2, input3))
    m, k = A.shape[-2], tau.shape[-1]
    if k > min(m, A.shape[-1]):
        raise RuntimeError(f"holoflow.ormqr: tau has {k} entries, more than min(m, n) = {min(m, A.shape[-1])} "
                           f"for input of shape {tuple(A.shape)}")
    need = C.shape[-2] if left else C.shape[-1]
    if need != m:
        raise RuntimeError(f"holoflow.ormqr: input3 of shape {tuple(C.shape)} must have {m} "
                           f"{'rows' if left else 'columns'} (input has {m} rows)")
    V = A[..., :k]
    if m > k:   # the reflectors with tau = 0 are the identity: Q becomes the full m x m product
        V = cat([V, zeros(*A.shape[:-2], m, m - k, dtype=A.dtype, device=A.device)], -1)
        tau = cat([tau, zeros(*tau.shape[:-1], m - k, dtype=tau.dtype, device=tau.device)], -1)
    Q = householder_product(V, tau)
    if transpose:
        Q = _adj(Q)
    return matmul(Q, C) if left else matmul(C, Q)


Tensor.orgqr = orgqr
Tensor.geqrf = geqrf
Tensor.ormqr = ormqr
