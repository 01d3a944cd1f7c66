"""``Wishart(df, covariance_matrix | precision_matrix | scale_tril)``: positive-definite matrices
``X = L A A^T L^T`` (Bartlett decomposition: ``A``'s diagonal are square roots of Chi2(df - i)
draws, holoflow's Gamma sampler, its strict lower triangle standard normals), reparameterized in
``df`` and the scale, drawing as torch's so a seed gives torch's samples.

torch's singular-sample correction is kept as torch runs it eagerly: it tests ``support.check``
(true for a *regular* sample) as "is singular", so every call warns "Singular sample detected."
and redraws once; holoflow does the same, so the draws stay torch's."""
from __future__ import annotations

import math
import warnings
from numbers import Number
from typing import Any

import torch

from ..core.dtype import finfo
from ..core.tensor import Tensor
from ..ops.numeric import mvlgamma
from ..ops.creation import arange, eye, randn, tensor
from ..ops.scatter import index_copy
from ..ops.stacking import diag_embed
from ..ops.layout import flip
from ..ops.linalg import cholesky_solve, slogdet
from ..ops.linalg_solve import cholesky, solve_triangular
from . import constraints
from .chi2 import Chi2
from .exp_family import ExponentialFamily
from .utils import lazy_property, vec_to_tril_matrix

__all__ = ["Wishart"]

_log_2 = math.log(2)


def _mvdigamma(x: Tensor, p: int) -> Tensor:
    if not bool(x.gt((p - 1) / 2).all()):
        raise AssertionError(f"holoflow.distributions.Wishart: wrong domain for the multivariate digamma function "
                             f"(expected every value > {(p - 1) / 2})")
    return (x.unsqueeze(-1) - arange(p, dtype=x.dtype, device=x.device).div(2).expand(tuple(x.shape) + (-1,))
            ).digamma().sum(-1)


def _clamp_above_eps(x: Tensor) -> Tensor:
    return x.clamp(min=finfo(x.dtype).eps)


def _precision_to_scale_tril(P: Tensor) -> Tensor:
    """The lower Cholesky factor of ``inv(P)`` without inverting ``P`` (torch's flip trick)."""
    Lf = cholesky(flip(P, (-2, -1)))
    L_inv = flip(Lf, (-2, -1)).transpose(-2, -1)
    Id = eye(P.shape[-1], dtype=P.dtype, device=P.device)
    return solve_triangular(L_inv, Id, upper=False)


class Wishart(ExponentialFamily):
    """Degrees of freedom ``df`` > p - 1 and exactly one of a positive-definite
    ``covariance_matrix``/``precision_matrix`` or a lower-triangular ``scale_tril`` (..., p, p)."""

    support = constraints.positive_definite
    has_rsample = True
    _mean_carrier_measure = 0

    @property
    def arg_constraints(self) -> dict:  # type: ignore[override]
        return {"covariance_matrix": constraints.positive_definite, "precision_matrix": constraints.positive_definite,
                "scale_tril": constraints.lower_cholesky, "df": constraints.greater_than(self.event_shape[-1] - 1)}

    def __init__(self, df: Any, covariance_matrix: Tensor | None = None, precision_matrix: Tensor | None = None,
                 scale_tril: Tensor | None = None, validate_args: bool | None = None) -> None:
        if (covariance_matrix is not None) + (scale_tril is not None) + (precision_matrix is not None) != 1:
            raise AssertionError("holoflow.distributions.Wishart: exactly one of covariance_matrix or "
                                 "precision_matrix or scale_tril may be specified.")
        param = next(p for p in (covariance_matrix, precision_matrix, scale_tril) if p is not None)
        if param.dim() < 2:
            raise ValueError(f"holoflow.distributions.Wishart: the matrix parameter must be at least "
                             f"two-dimensional (..., p, p), with optional leading batch dimensions, got shape "
                             f"{tuple(param.shape)}")
        if isinstance(df, Number):
            batch_shape = torch.Size(param.shape[:-2])
            self.df = tensor(df, dtype=param.dtype, device=param.device)
        else:
            batch_shape = torch.Size(torch.broadcast_shapes(tuple(param.shape[:-2]), tuple(df.shape)))
            self.df = df.expand(batch_shape)
        event_shape = torch.Size(param.shape[-2:])
        p = event_shape[-1]
        if bool(self.df.le(p - 1).any()):
            raise ValueError(f"holoflow.distributions.Wishart: value of df={df} expected to be greater than "
                             f"ndim - 1 = {p - 1}.")
        full = tuple(batch_shape) + (-1, -1)
        if scale_tril is not None:
            self.scale_tril = param.expand(full)
        elif covariance_matrix is not None:
            self.covariance_matrix = param.expand(full)
        else:
            self.precision_matrix = param.expand(full)
        if bool(self.df.lt(p).any()):
            warnings.warn("Low df values detected. Singular samples are highly likely to occur for ndim - 1 < df "
                          "< ndim.", stacklevel=2)
        super().__init__(batch_shape, event_shape, validate_args=validate_args)
        self._batch_dims = [-(x + 1) for x in range(len(self._batch_shape))]
        if scale_tril is not None:
            self._unbroadcasted_scale_tril = scale_tril
        elif covariance_matrix is not None:
            self._unbroadcasted_scale_tril = cholesky(covariance_matrix)
        else:
            self._unbroadcasted_scale_tril = _precision_to_scale_tril(precision_matrix)
        self._dist_chi2 = self._chi2(batch_shape)

    def _chi2(self, batch_shape: torch.Size) -> Chi2:
        """Chi2(df - i) for i < p: the squared diagonal of Bartlett's factor."""
        tril = self._unbroadcasted_scale_tril
        offs = arange(self._event_shape[-1], dtype=tril.dtype, device=tril.device)
        return Chi2(df=self.df.unsqueeze(-1) - offs.expand(tuple(batch_shape) + (-1,)))

    def expand(self, batch_shape: Any, _instance: Any = None) -> "Wishart":
        new = self._get_checked_instance(Wishart, _instance)
        batch_shape = torch.Size(batch_shape)
        cov_shape = batch_shape + self.event_shape
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril.expand(cov_shape)
        new.df = self.df.expand(batch_shape)
        new._batch_dims = [-(x + 1) for x in range(len(batch_shape))]
        for name in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name].expand(cov_shape)
        self._expanded(new, batch_shape)
        new._dist_chi2 = new._chi2(batch_shape)
        return new

    @lazy_property
    def scale_tril(self) -> Tensor:
        return self._unbroadcasted_scale_tril.expand(self._batch_shape + self._event_shape)

    @lazy_property
    def covariance_matrix(self) -> Tensor:
        L = self._unbroadcasted_scale_tril
        return (L @ L.transpose(-2, -1)).expand(self._batch_shape + self._event_shape)

    @lazy_property
    def precision_matrix(self) -> Tensor:
        L = self._unbroadcasted_scale_tril
        identity = eye(self._event_shape[-1], device=L.device, dtype=L.dtype)
        return cholesky_solve(identity, L).expand(self._batch_shape + self._event_shape)

    def _per_batch(self, t: Tensor) -> Tensor:
        return t.view(tuple(self._batch_shape) + (1, 1))

    @property
    def mean(self) -> Tensor:
        return self._per_batch(self.df) * self.covariance_matrix

    @property
    def mode(self) -> Tensor:
        factor = self.df - self.covariance_matrix.shape[-1] - 1
        return self._per_batch(factor.masked_fill(factor <= 0, math.nan)) * self.covariance_matrix

    @property
    def variance(self) -> Tensor:
        V = self.covariance_matrix
        diag_V = V.diagonal(dim1=-2, dim2=-1)
        return self._per_batch(self.df) * (V.pow(2) + diag_V.unsqueeze(-1) * diag_V.unsqueeze(-2))

    def _bartlett_sampling(self, sample_shape: Any = ()) -> Tensor:
        p = self._event_shape[-1]
        noise = diag_embed(_clamp_above_eps(self._dist_chi2.rsample(sample_shape).sqrt()), dim1=-2, dim2=-1)
        off = randn(*(torch.Size(sample_shape) + self._batch_shape + (p * (p - 1) // 2,)), dtype=noise.dtype,
                    device=noise.device)
        noise = noise + vec_to_tril_matrix(off, diag=-1)
        chol = self._unbroadcasted_scale_tril @ noise
        return chol @ chol.transpose(-2, -1)

    def _flagged(self, sample: Tensor, positive_definite: bool) -> Tensor:
        ok = self.support.check(sample)
        flags = ok if positive_definite else ~ok
        return flags.amax(self._batch_dims) if self._batch_shape else flags

    def rsample(self, sample_shape: Any = (), max_try_correction: int | None = None) -> Tensor:
        """Bartlett samples; then torch's eager correction loop (see the module's note): the flagged
        samples are redrawn, up to ``max_try_correction`` (default 10) times, while any redraw is
        singular. A sample may still be singular (its ``log_prob`` then is -inf)."""
        if max_try_correction is None:
            max_try_correction = 10
        sample_shape = torch.Size(sample_shape)
        sample = self._bartlett_sampling(sample_shape)
        flagged = self._flagged(sample, positive_definite=True)   # torch's test, as torch runs it
        if not bool(flagged.any()):
            return sample
        warnings.warn("Singular sample detected.", stacklevel=2)
        n = math.prod(sample_shape)
        rest = tuple(sample.shape[len(sample_shape):])
        flat = sample.reshape((n,) + rest)
        todo = flagged.reshape(n).nonzero().squeeze(-1)
        for _ in range(max_try_correction):
            sample_new = self._bartlett_sampling(todo.shape)
            flat = index_copy(flat, 0, todo, sample_new)
            todo = todo[self._flagged(sample_new, positive_definite=False)]
            if todo.numel() == 0:
                break
        return flat.reshape(sample.shape)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        nu = self.df
        p = self._event_shape[-1]
        L = self._unbroadcasted_scale_tril
        return (-nu * (p * _log_2 / 2 + L.diagonal(dim1=-2, dim2=-1).log().sum(-1)) - mvlgamma(nu / 2, p=p)
                + (nu - p - 1) / 2 * slogdet(value).logabsdet
                - cholesky_solve(value, L).diagonal(dim1=-2, dim2=-1).sum(dim=-1) / 2)

    def entropy(self) -> Tensor:
        nu = self.df
        p = self._event_shape[-1]
        L = self._unbroadcasted_scale_tril
        return ((p + 1) * (p * _log_2 / 2 + L.diagonal(dim1=-2, dim2=-1).log().sum(-1)) + mvlgamma(nu / 2, p=p)
                - (nu - p - 1) / 2 * _mvdigamma(nu / 2, p=p) + nu * p / 2)

    @property
    def _natural_params(self) -> tuple[Tensor, Tensor]:
        p = self._event_shape[-1]
        return -self.precision_matrix / 2, (self.df - p - 1) / 2

    def _log_normalizer(self, x: Tensor, y: Tensor) -> Tensor:  # type: ignore[override]
        p = self._event_shape[-1]
        return (y + (p + 1) / 2) * (-slogdet(-2 * x).logabsdet + _log_2 * p) + mvlgamma(y + (p + 1) / 2, p=p)
