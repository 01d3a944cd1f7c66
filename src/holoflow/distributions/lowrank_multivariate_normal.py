"""``LowRankMultivariateNormal(loc, cov_factor, cov_diag)``: a Gaussian whose covariance is
``cov_factor @ cov_factor.T + diag(cov_diag)``; log-determinant and Mahalanobis distance through
the small "capacitance" matrix ``I + W.T D^-1 W`` (matrix determinant lemma and Woodbury), as
torch's. Samples ``loc + W eps_W + sqrt(D) eps_D`` draw ``eps_W`` then ``eps_D`` as torch does."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..core.tensor import Tensor
from ..ops.creation import empty, eye
from ..ops.stacking import diag_embed
from ..ops.linalg_solve import cholesky, solve_triangular
from . import constraints
from .base import Distribution
from .utils import lazy_property

__all__ = ["LowRankMultivariateNormal"]


def _batch_mv(bmat: Tensor, bvec: Tensor) -> Tensor:
    """Matrix-vector products over broadcast batch dims."""
    return (bmat @ bvec.unsqueeze(-1)).squeeze(-1)


def _batch_mahalanobis(bL: Tensor, bx: Tensor) -> Tensor:
    """``|L^-1 x|^2`` for lower-triangular ``L`` (..., n, n) and ``x`` (..., n), batch dims broadcast."""
    n = bx.shape[-1]
    batch = torch.broadcast_shapes(tuple(bL.shape[:-2]), tuple(bx.shape[:-1]))
    sol = solve_triangular(bL.expand(batch + (n, n)), bx.expand(batch + (n,)).unsqueeze(-1), upper=False)
    return sol.squeeze(-1).pow(2).sum(-1)


def _batch_capacitance_tril(W: Tensor, D: Tensor) -> Tensor:
    """The Cholesky factor of ``I + W.T @ inv(D) @ W``."""
    m = W.shape[-1]
    K = (W.mT / D.unsqueeze(-2)) @ W
    return cholesky(K + eye(m, dtype=K.dtype, device=K.device))


def _batch_lowrank_logdet(W: Tensor, D: Tensor, capacitance_tril: Tensor) -> Tensor:
    """``log|W W.T + D| = log|C| + log|D|`` (matrix determinant lemma)."""
    return 2 * capacitance_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1) + D.log().sum(-1)


def _batch_lowrank_mahalanobis(W: Tensor, D: Tensor, x: Tensor, capacitance_tril: Tensor) -> Tensor:
    """``x.T inv(W W.T + D) x`` by the Woodbury identity."""
    Wt_Dinv = W.mT / D.unsqueeze(-2)
    Wt_Dinv_x = _batch_mv(Wt_Dinv, x)
    return (x.pow(2) / D).sum(-1) - _batch_mahalanobis(capacitance_tril, Wt_Dinv_x)


class LowRankMultivariateNormal(Distribution):
    """A Gaussian over the last dim of ``loc`` (..., n) with covariance ``W W.T + diag(D)`` for
    ``W = cov_factor`` (..., n, rank) and ``D = cov_diag`` (..., n); batch dims broadcast."""

    arg_constraints = {"loc": constraints.real_vector, "cov_factor": constraints.independent(constraints.real, 2),
                       "cov_diag": constraints.independent(constraints.positive, 1)}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: Tensor, cov_factor: Tensor, cov_diag: Tensor, validate_args: bool | None = None) -> None:
        name = "holoflow.distributions.LowRankMultivariateNormal"
        if loc.dim() < 1:
            raise ValueError(f"{name}: loc must be at least one-dimensional (..., n), got a 0-d tensor.")
        event_shape = torch.Size(loc.shape[-1:])
        if cov_factor.dim() < 2:
            raise ValueError(f"{name}: cov_factor must be at least two-dimensional, with optional leading batch "
                             f"dimensions, got shape {tuple(cov_factor.shape)}")
        if tuple(cov_factor.shape[-2:-1]) != tuple(event_shape):
            raise ValueError(f"{name}: cov_factor must be a batch of matrices with shape {event_shape[0]} x m, got "
                             f"shape {tuple(cov_factor.shape)}")
        if tuple(cov_diag.shape[-1:]) != tuple(event_shape):
            raise ValueError(f"{name}: cov_diag must be a batch of vectors with shape {tuple(event_shape)}, got "
                             f"shape {tuple(cov_diag.shape)}")
        try:
            full = torch.broadcast_shapes(tuple(loc.shape) + (1,), tuple(cov_factor.shape),
                                          tuple(cov_diag.shape) + (1,))
        except RuntimeError as e:
            raise ValueError(f"{name}: incompatible batch shapes: loc {tuple(loc.shape)}, cov_factor "
                             f"{tuple(cov_factor.shape)}, cov_diag {tuple(cov_diag.shape)}; their batch dims must "
                             f"broadcast") from e
        self.cov_factor = cov_factor.expand(full)
        self.loc = loc.expand(full[:-1])
        self.cov_diag = cov_diag.expand(full[:-1])
        batch_shape = torch.Size(full[:-2])
        self._unbroadcasted_cov_factor = cov_factor
        self._unbroadcasted_cov_diag = cov_diag
        self._capacitance_tril = _batch_capacitance_tril(cov_factor, cov_diag)
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "LowRankMultivariateNormal":
        new = self._get_checked_instance(LowRankMultivariateNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        loc_shape = batch_shape + self.event_shape
        new.loc = self.loc.expand(loc_shape)
        new.cov_diag = self.cov_diag.expand(loc_shape)
        new.cov_factor = self.cov_factor.expand(loc_shape + tuple(self.cov_factor.shape[-1:]))
        new._unbroadcasted_cov_factor = self._unbroadcasted_cov_factor
        new._unbroadcasted_cov_diag = self._unbroadcasted_cov_diag
        new._capacitance_tril = self._capacitance_tril
        return self._expanded(new, batch_shape)

    def _full(self, *event: int) -> tuple:
        return tuple(self._batch_shape) + event

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @lazy_property
    def variance(self) -> Tensor:  # type: ignore[override]
        n = self._event_shape[0]
        return (self._unbroadcasted_cov_factor.pow(2).sum(-1) + self._unbroadcasted_cov_diag).expand(self._full(n))

    @lazy_property
    def scale_tril(self) -> Tensor:
        """``D^1/2 chol(I + D^-1/2 W W.T D^-1/2)``: a well-conditioned Cholesky (eigenvalues >= 1)."""
        n = self._event_shape[0]
        sqrt_d = self._unbroadcasted_cov_diag.sqrt().unsqueeze(-1)
        dw = self._unbroadcasted_cov_factor / sqrt_d
        K = dw @ dw.mT + eye(n, dtype=dw.dtype, device=dw.device)
        return (sqrt_d * cholesky(K)).expand(self._full(n, n))

    @lazy_property
    def covariance_matrix(self) -> Tensor:
        n = self._event_shape[0]
        W = self._unbroadcasted_cov_factor
        return (W @ W.mT + diag_embed(self._unbroadcasted_cov_diag)).expand(self._full(n, n))

    @lazy_property
    def precision_matrix(self) -> Tensor:
        """``inv(D) - A.T A`` with ``A = C^-1 W.T inv(D)`` (Woodbury)."""
        n = self._event_shape[0]
        Wt_Dinv = self._unbroadcasted_cov_factor.mT / self._unbroadcasted_cov_diag.unsqueeze(-2)
        A = solve_triangular(self._capacitance_tril, Wt_Dinv, upper=False)
        return (diag_embed(self._unbroadcasted_cov_diag.reciprocal()) - A.mT @ A).expand(self._full(n, n))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        w_shape = tuple(shape[:-1]) + tuple(self.cov_factor.shape[-1:])
        eps_W = empty(*w_shape, dtype=self.loc.dtype, device=self.loc.device).normal_()
        eps_D = empty(*shape, dtype=self.loc.dtype, device=self.loc.device).normal_()
        return (self.loc + _batch_mv(self._unbroadcasted_cov_factor, eps_W)
                + self._unbroadcasted_cov_diag.sqrt() * eps_D)

    def _log_det(self) -> Tensor:
        return _batch_lowrank_logdet(self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag,
                                     self._capacitance_tril)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        diff = value - self.loc
        M = _batch_lowrank_mahalanobis(self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag, diff,
                                       self._capacitance_tril)
        return -0.5 * (self._event_shape[0] * math.log(2 * math.pi) + self._log_det() + M)

    def entropy(self) -> Tensor:
        H = 0.5 * (self._event_shape[0] * (1.0 + math.log(2 * math.pi)) + self._log_det())
        return H if len(self._batch_shape) == 0 else H.expand(self._batch_shape)
