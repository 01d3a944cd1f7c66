"""``MultivariateNormal(loc, covariance_matrix | precision_matrix | scale_tril)``: a Gaussian over
the last dim, parameterized internally by the lower Cholesky factor ``scale_tril`` (as torch's);
reparameterized samples ``loc + scale_tril @ eps`` draw ``eps`` as torch does."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..core.tensor import Tensor
from ..ops.creation import empty, eye
from ..ops.linalg import cholesky_inverse
from ..ops.linalg_solve import cholesky, solve_triangular
from . import constraints
from .base import Distribution, broadcast_all

__all__ = ["MultivariateNormal"]


def _precision_to_scale_tril(P: Tensor) -> Tensor:
    """torch's inverse-free factor of ``P^-1``: the Cholesky factor of ``P`` flipped on both axes,
    flipped back and transposed, then inverted as a triangular solve against the identity."""
    Lf = cholesky(P.flip(-2, -1))
    L_inv = Lf.flip(-2, -1).transpose(-2, -1)
    return solve_triangular(L_inv, eye(P.shape[-1], dtype=P.dtype, device=P.device), upper=False)


class MultivariateNormal(Distribution):
    """A Gaussian with mean ``loc`` (..., k) and exactly one of a positive-definite
    ``covariance_matrix``, ``precision_matrix`` or lower-triangular ``scale_tril`` (..., k, k);
    batch dims of the mean and the matrix broadcast together."""

    arg_constraints = {"loc": constraints.real_vector, "covariance_matrix": constraints.positive_definite,
                       "precision_matrix": constraints.positive_definite, "scale_tril": constraints.lower_cholesky}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: Any, covariance_matrix: Tensor | None = None, precision_matrix: Tensor | None = None,
                 scale_tril: Tensor | None = None, validate_args: bool | None = None) -> None:
        if not isinstance(loc, Tensor):
            (loc,) = broadcast_all(loc)
        if loc.dim() < 1:
            raise ValueError("loc must be at least one-dimensional.")
        if (covariance_matrix is not None) + (scale_tril is not None) + (precision_matrix is not None) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or scale_tril may be specified.")
        matrix, name = next((m, n) for m, n in ((scale_tril, "scale_tril"), (covariance_matrix, "covariance_matrix"),
                                                (precision_matrix, "precision_matrix")) if m is not None)
        if matrix.dim() < 2:
            raise ValueError(f"{name} matrix must be at least two-dimensional, with optional leading batch dimensions")
        k = loc.shape[-1]
        if tuple(matrix.shape[-2:]) != (k, k):
            raise ValueError(f"holoflow.distributions.MultivariateNormal: {name} of shape {tuple(matrix.shape)} "
                             f"does not match loc's event size {k}")
        batch_shape = torch.broadcast_shapes(tuple(matrix.shape[:-2]), tuple(loc.shape[:-1]))
        full = batch_shape + (k, k)
        self.loc = loc.expand(batch_shape + (k,))
        if scale_tril is not None:
            self.scale_tril = scale_tril.expand(full)
        elif covariance_matrix is not None:
            self.covariance_matrix = covariance_matrix.expand(full)
        else:
            self.precision_matrix = precision_matrix.expand(full)
        super().__init__(torch.Size(batch_shape), torch.Size((k,)), validate_args=validate_args)
        if scale_tril is not None:   # the factor is taken after the checks, as torch's
            self._unbroadcasted_scale_tril = scale_tril
        elif covariance_matrix is not None:
            self._unbroadcasted_scale_tril = cholesky(covariance_matrix)
        else:
            self._unbroadcasted_scale_tril = _precision_to_scale_tril(precision_matrix)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "MultivariateNormal":
        new = self._get_checked_instance(MultivariateNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape + self.event_shape)
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        for name in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name].expand(batch_shape + self.event_shape * 2)
        return self._expanded(new, batch_shape)

    def __getattr__(self, name: str) -> Any:
        # the parameterizations not given are computed on first use, as torch's lazy properties
        tril = self.__dict__.get("_unbroadcasted_scale_tril")
        if tril is None:
            raise AttributeError(name)
        full = tuple(self._batch_shape) + tuple(self._event_shape) * 2
        if name == "scale_tril":
            value = tril.expand(full)
        elif name == "covariance_matrix":
            value = (tril @ tril.mT).expand(full)
        elif name == "precision_matrix":
            value = cholesky_inverse(tril).expand(full)   # (torch's: from the factor)
        else:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        self.__dict__[name] = value
        return value

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        full = tuple(self._batch_shape) + tuple(self._event_shape)
        return self._unbroadcasted_scale_tril.pow(2).sum(-1).expand(full)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        eps = empty(*shape, dtype=self.loc.dtype, device=self.loc.device).normal_()
        return self.loc + (self._unbroadcasted_scale_tril @ eps.unsqueeze(-1)).squeeze(-1)

    def _half_log_det(self) -> Tensor:
        return self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)

    def log_prob(self, value: Any) -> Tensor:
        diff = value - self.loc
        k = self._event_shape[0]
        tril = self._unbroadcasted_scale_tril
        tril = tril.expand(tuple(diff.shape[:-1]) + (k, k))
        maha = solve_triangular(tril, diff.unsqueeze(-1), upper=False).squeeze(-1).pow(2).sum(-1)
        return -0.5 * (k * math.log(2 * math.pi) + maha) - self._half_log_det()

    def entropy(self) -> Tensor:
        k = self._event_shape[0]
        h = 0.5 * k * (1.0 + math.log(2 * math.pi)) + self._half_log_det()
        return h if not self._batch_shape else h.expand(self._batch_shape)
