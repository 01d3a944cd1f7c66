"""Matrix decompositions (SVD, QR, symmetric eigendecomposition) and ``cdist``.

Each is a primitive on its ATen kernel whose backward is ATen's derivative (ops/torch_vjp.py),
so values and gradients are torch's, sign conventions included. SBP: every leading (batch) axis
of the matrices splits every output alike; ``cdist`` also splits the rows of either operand.
``torch.linalg``-style functions (``linalg_svd`` ...) are re-exported by ``holoflow.linalg``;
``svd``/``qr`` here are the ``torch.svd``/``torch.qr`` forms.
"""
from __future__ import annotations

from collections import namedtuple

import torch

from ..core.dispatch import apply
from ..core.errors import DTypeError, ShapeError
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .torch_vjp import defop_vjp

__all__ = ["svd", "qr", "cdist"]


def _batch_sbp(n_out: int):
    """Forward: the matrix inputs (first tensor) split on a batch axis -> every output split so."""
    def rule(metas, attrs):
        nd = len(metas[0].shape)
        return [((B,), (B,) * n_out)] + [((S(a),), (S(a),) * n_out) for a in range(nd - 2)]
    return rule


def _batch_bwd_sbp(metas, attrs):
    """Backward ``(A, *dys) -> (dA,)``: a batch axis of A and of every dy -> that axis of dA."""
    n = len([m for m in metas if hasattr(m, "shape")])
    nd = len(metas[0].shape)
    return [((B,) * n, (B,))] + [((S(a),) * n, (S(a),)) for a in range(nd - 2)]


def _check_matrix(name: str, A: Tensor, square: bool = False) -> None:
    if A.dim() < 2 or (square and A.shape[-1] != A.shape[-2]):
        kind = "square matrices" if square else "matrices"
        raise ShapeError(f"holoflow.{name}: expected a tensor of {kind} (*, m, {'m' if square else 'n'}), "
                         f"got shape {tuple(A.shape)}")
    if not (A.is_floating_point() or A.is_complex()):
        raise DTypeError(f"holoflow.{name}: expected a floating point or complex input, got {A.dtype}")


# -- SVD ---------------------------------------------------------------------------------------------

SVD = defop_vjp("linalg_svd", lambda A, full_matrices: torch.linalg.svd(A, full_matrices=full_matrices),
                sbp=_batch_sbp(3), bwd_sbp=_batch_bwd_sbp, family="linalg", outputs=("U", "S", "Vh"))
SVDVALS = defop_vjp("linalg_svdvals", lambda A: torch.linalg.svdvals(A), sbp=_batch_sbp(1),
                    bwd_sbp=_batch_bwd_sbp, family="linalg")

_SvdResult = namedtuple("svd", ["U", "S", "V"])


def linalg_svd(A: Tensor, full_matrices: bool = True, *, driver: str | None = None):
    """``A = U diag(S) Vh`` as a ``(U, S, Vh)`` namedtuple, as ``torch.linalg.svd``."""
    _check_matrix("linalg.svd", A)
    return apply(SVD, A, full_matrices=bool(full_matrices))


def svdvals(A: Tensor, *, driver: str | None = None) -> Tensor:
    """The singular values of ``A``, descending."""
    _check_matrix("linalg.svdvals", A)
    return apply(SVDVALS, A)


def svd(input: Tensor, some: bool = True, compute_uv: bool = True):
    """``torch.svd``: ``(U, S, V)`` with ``V`` (not ``Vh``); ``some=False`` gives square U, V;
    ``compute_uv=False`` gives zero U and V, as torch does."""
    _check_matrix("svd", input)
    if not compute_uv:  # zero (m, m) and (n, n) U and V whatever ``some`` says, as torch gives
        s = svdvals(input)
        m, n = input.shape[-2], input.shape[-1]
        lead = tuple(input.shape[:-2])
        z = input.detach()
        u, v = z.new_zeros(lead + (m, m)), z.new_zeros(lead + (n, n))
        return _SvdResult(u, s, v)
    u, s, vh = linalg_svd(input, full_matrices=not some)
    return _SvdResult(u, s, vh.mH if vh.is_complex() else vh.transpose(-2, -1))


# -- QR ------------------------------------------------------------------------------------------------

QR = defop_vjp("linalg_qr", lambda A, mode: torch.linalg.qr(A, mode=mode), sbp=_batch_sbp(2),
               bwd_sbp=_batch_bwd_sbp, family="linalg", outputs=("Q", "R"))


def linalg_qr(A: Tensor, mode: str = "reduced"):
    """``A = Q R`` as a ``(Q, R)`` namedtuple; ``mode`` 'reduced', 'complete' or 'r'."""
    _check_matrix("linalg.qr", A)
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"holoflow.linalg.qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    return apply(QR, A, mode=mode)


def qr(input: Tensor, some: bool = True):
    """``torch.qr``: reduced (``some=True``) or complete QR."""
    return linalg_qr(input, "reduced" if some else "complete")


# -- eigh ------------------------------------------------------------------------------------------------

EIGH = defop_vjp("linalg_eigh", lambda A, UPLO: torch.linalg.eigh(A, UPLO=UPLO), sbp=_batch_sbp(2),
                 bwd_sbp=_batch_bwd_sbp, family="linalg", outputs=("eigenvalues", "eigenvectors"))
EIGVALSH = defop_vjp("linalg_eigvalsh", lambda A, UPLO: torch.linalg.eigvalsh(A, UPLO=UPLO), sbp=_batch_sbp(1),
                     bwd_sbp=_batch_bwd_sbp, family="linalg")


def _uplo(name: str, UPLO: str) -> str:
    if UPLO not in ("L", "U"):
        raise ValueError(f"holoflow.{name}: UPLO must be 'L' or 'U', got {UPLO!r}")
    return UPLO


def eigh(A: Tensor, UPLO: str = "L"):
    """Eigenvalues (ascending) and eigenvectors of a symmetric matrix, reading the ``UPLO``
    triangle, as ``torch.linalg.eigh``."""
    _check_matrix("linalg.eigh", A, square=True)
    return apply(EIGH, A, UPLO=_uplo("linalg.eigh", UPLO))


def eigvalsh(A: Tensor, UPLO: str = "L") -> Tensor:
    _check_matrix("linalg.eigvalsh", A, square=True)
    return apply(EIGVALSH, A, UPLO=_uplo("linalg.eigvalsh", UPLO))


Tensor.svd = svd
Tensor.qr = qr


# -- cdist -------------------------------------------------------------------------------------------------

def _cdist_sbp(metas, attrs):
    nd = len(metas[0].shape)
    sigs = [((B, B), (B,))] + [((S(a), S(a)), (S(a),)) for a in range(nd - 2)]
    sigs += [((S(nd - 2), B), (S(nd - 2),)), ((B, S(nd - 2)), (S(nd - 1),))]
    return sigs


def _cdist_bwd_sbp(metas, attrs):
    """``(x1, x2, dy) -> grads of attrs['diff']``: batch splits; rows of x1 (dy's rows) give
    x1's gradient split and x2's partial; rows of x2 (dy's columns) the converse."""
    nd, diff = len(metas[0].shape), attrs["diff"]

    def outs(per_input):
        return tuple(per_input[i] for i in diff)
    sigs = [((B, B, B), outs((B, B)))] + [((S(a),) * 3, outs((S(a), S(a)))) for a in range(nd - 2)]
    sigs.append(((S(nd - 2), B, S(nd - 2)), outs((S(nd - 2), P))))
    sigs.append(((B, S(nd - 2), S(nd - 1)), outs((P, S(nd - 2)))))
    return sigs


CDIST = defop_vjp("cdist", lambda x1, x2, p, compute_mode: torch.cdist(x1, x2, p, compute_mode), sbp=_cdist_sbp,
                  bwd_sbp=_cdist_bwd_sbp, family="distance")
_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")


def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode: str = "use_mm_for_euclid_dist_if_necessary") -> Tensor:
    """p-norm distances between the rows of ``x1`` ``(*, P, M)`` and of ``x2`` ``(*, R, M)``:
    ``(*, P, R)``, as ``torch.cdist`` (its gradient is 0 at zero distance)."""
    if x1.dim() < 2 or x2.dim() < 2 or x1.shape[-1] != x2.shape[-1]:
        raise ShapeError(f"holoflow.cdist: expected x1 (*, P, M) and x2 (*, R, M) with equal M, got {tuple(x1.shape)} "
                         f"and {tuple(x2.shape)}")
    try:
        batch = tuple(torch.broadcast_shapes(tuple(x1.shape[:-2]), tuple(x2.shape[:-2])))
    except RuntimeError:
        raise ShapeError(f"holoflow.cdist: the batch dims of x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} cannot be "
                         f"broadcast") from None
    if tuple(x1.shape[:-2]) != batch:   # broadcast batch dims as torch does (expand: gradients sum back)
        x1 = x1.expand(*batch, *x1.shape[-2:])
    if tuple(x2.shape[:-2]) != batch:
        x2 = x2.expand(*batch, *x2.shape[-2:])
    if p < 0:
        raise ValueError(f"holoflow.cdist: p must be non-negative, got {p}")
    if compute_mode not in _MODES:
        raise ValueError(f"holoflow.cdist: compute_mode must be one of {_MODES}, got {compute_mode!r}")
    return apply(CDIST, x1, x2, p=float(p), compute_mode=compute_mode)
