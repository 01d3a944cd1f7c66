"""The transforms of ``torch.distributions.transforms`` that act on whole events (vectors, matrices,
slices): ``IndependentTransform``, ``ReshapeTransform``, ``SoftmaxTransform``,
``StickBreakingTransform``, ``LowerCholeskyTransform``, ``PositiveDefiniteTransform``,
``CorrCholeskyTransform``, ``CatTransform``, ``StackTransform`` and
``CumulativeDistributionTransform``; ``holoflow.distributions.transforms`` exports them, and
``constraint_registry`` builds them from constraints."""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from ..core.dtype import finfo
from ..core.tensor import Tensor
from ..nn.functional import logsigmoid, softplus
from ..ops.creation import eye, ones
from ..ops.layout import pad
from ..ops.linalg_solve import cholesky
from ..ops.shape import cat, stack
from . import constraints
from .independent import sum_rightmost
from .transforms import Transform
from .utils import tril_matrix_to_vec, vec_to_tril_matrix

__all__ = ["CatTransform", "CorrCholeskyTransform", "CumulativeDistributionTransform", "IndependentTransform",
           "LowerCholeskyTransform", "PositiveDefiniteTransform", "ReshapeTransform", "SoftmaxTransform",
           "StackTransform", "StickBreakingTransform"]


def _too_few(shape: Sequence[int], n: int) -> None:
    if len(shape) < n:
        raise ValueError(f"holoflow.distributions.transforms: too few dimensions on input: shape {tuple(shape)}, "
                         f"need at least {n}")


class IndependentTransform(Transform):
    """``base_transform`` with its rightmost ``reinterpreted_batch_ndims`` dims taken into the event
    (its log-det summed over them)."""

    def __init__(self, base_transform: Transform, reinterpreted_batch_ndims: int, cache_size: int = 0) -> None:
        super().__init__(cache_size=cache_size)
        self.base_transform = base_transform.with_cache(cache_size)
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return IndependentTransform(self.base_transform, self.reinterpreted_batch_ndims, cache_size=cache_size)

    @constraints.dependent_property(is_discrete=False)
    def domain(self) -> constraints.Constraint:
        return constraints.independent(self.base_transform.domain, self.reinterpreted_batch_ndims)

    @constraints.dependent_property(is_discrete=False)
    def codomain(self) -> constraints.Constraint:
        return constraints.independent(self.base_transform.codomain, self.reinterpreted_batch_ndims)

    @property
    def bijective(self) -> bool:  # type: ignore[override]
        return self.base_transform.bijective

    @property
    def sign(self) -> int:
        return self.base_transform.sign

    def _call(self, x: Tensor) -> Tensor:
        _too_few(x.shape, self.domain.event_dim)
        return self.base_transform(x)

    def _inverse(self, y: Tensor) -> Tensor:
        _too_few(y.shape, self.codomain.event_dim)
        return self.base_transform.inv(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return sum_rightmost(self.base_transform.log_abs_det_jacobian(x, y), self.reinterpreted_batch_ndims)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_transform!r}, {self.reinterpreted_batch_ndims})"

    def forward_shape(self, shape: Sequence[int]) -> Sequence[int]:
        return self.base_transform.forward_shape(shape)

    def inverse_shape(self, shape: Sequence[int]) -> Sequence[int]:
        return self.base_transform.inverse_shape(shape)


class ReshapeTransform(Transform):
    """Reshapes the rightmost ``in_shape`` dims to ``out_shape`` (same number of elements)."""

    bijective = True

    def __init__(self, in_shape: Any, out_shape: Any, cache_size: int = 0) -> None:
        self.in_shape, self.out_shape = torch.Size(in_shape), torch.Size(out_shape)
        if self.in_shape.numel() != self.out_shape.numel():
            raise ValueError(f"holoflow.distributions.ReshapeTransform: in_shape {tuple(self.in_shape)} and "
                             f"out_shape {tuple(self.out_shape)} have different numbers of elements")
        super().__init__(cache_size=cache_size)

    @constraints.dependent_property
    def domain(self) -> constraints.Constraint:
        return constraints.independent(constraints.real, len(self.in_shape))

    @constraints.dependent_property
    def codomain(self) -> constraints.Constraint:
        return constraints.independent(constraints.real, len(self.out_shape))

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return ReshapeTransform(self.in_shape, self.out_shape, cache_size=cache_size)

    def _call(self, x: Tensor) -> Tensor:
        return x.reshape(tuple(x.shape[:x.dim() - len(self.in_shape)]) + tuple(self.out_shape))

    def _inverse(self, y: Tensor) -> Tensor:
        return y.reshape(tuple(y.shape[:y.dim() - len(self.out_shape)]) + tuple(self.in_shape))

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return x.new_zeros(tuple(x.shape[:x.dim() - len(self.in_shape)]))

    def _reshaped(self, shape: Sequence[int], src: torch.Size, dst: torch.Size) -> torch.Size:
        _too_few(shape, len(src))
        cut = len(shape) - len(src)
        if torch.Size(shape[cut:]) != src:
            raise ValueError(f"holoflow.distributions.ReshapeTransform: shape mismatch: expected "
                             f"{tuple(shape[cut:])} but got {tuple(src)}")
        return torch.Size(shape[:cut]) + dst

    def forward_shape(self, shape: Sequence[int]) -> Sequence[int]:
        return self._reshaped(shape, self.in_shape, self.out_shape)

    def inverse_shape(self, shape: Sequence[int]) -> Sequence[int]:
        return self._reshaped(shape, self.out_shape, self.in_shape)


class SoftmaxTransform(Transform):
    """Unconstrained vectors to the simplex by softmax (not bijective; the inverse is ``log``)."""

    domain = constraints.real_vector
    codomain = constraints.simplex

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SoftmaxTransform)

    __hash__ = object.__hash__

    def _call(self, x: Tensor) -> Tensor:
        probs = (x - x.max(-1, True)[0]).exp()
        return probs / probs.sum(-1, True)

    def _inverse(self, y: Tensor) -> Tensor:
        return y.log()

    def forward_shape(self, shape: Sequence[int]) -> Sequence[int]:
        _too_few(shape, 1)
        return shape

    inverse_shape = forward_shape


def _clipped_sigmoid(x: Tensor) -> Tensor:
    fi = finfo(x.dtype)
    return x.sigmoid().clamp(min=fi.tiny, max=1.0 - fi.eps)


def _offset(x: Tensor, n: int, first: int) -> Tensor:
    """``first - [1, 2, ..., n]`` (``first - ones(n).cumsum()``, as torch writes it)."""
    return first - ones(n, dtype=x.dtype, device=x.device).cumsum(-1)


class StickBreakingTransform(Transform):
    """R^(K-1) to the K-simplex by stick breaking (bijective; its log-det is cheap)."""

    domain = constraints.real_vector
    codomain = constraints.simplex
    bijective = True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StickBreakingTransform)

    __hash__ = object.__hash__

    def _call(self, x: Tensor) -> Tensor:
        z = _clipped_sigmoid(x - _offset(x, x.shape[-1], x.shape[-1] + 1).log())
        z_cumprod = (1 - z).cumprod(-1)
        return pad(z, [0, 1], value=1) * pad(z_cumprod, [1, 0], value=1)

    def _inverse(self, y: Tensor) -> Tensor:
        y_crop = y[..., :-1]
        offset = _offset(y, y_crop.shape[-1], y.shape[-1])
        sf = (1 - y_crop.cumsum(-1)).clamp(min=finfo(y.dtype).tiny)
        return y_crop.log() - sf.log() + offset.log()

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        x = x - _offset(x, x.shape[-1], x.shape[-1] + 1).log()
        return (-x + logsigmoid(x) + y[..., :-1].log()).sum(-1)

    def forward_shape(self, shape: Sequence[int]) -> Sequence[int]:
        _too_few(shape, 1)
        return tuple(shape[:-1]) + (shape[-1] + 1,)

    def inverse_shape(self, shape: Sequence[int]) -> Sequence[int]:
        _too_few(shape, 1)
        return tuple(shape[:-1]) + (shape[-1] - 1,)


class LowerCholeskyTransform(Transform):
    """A square matrix to a lower-triangular one with a positive diagonal (the strict lower part
    kept, the diagonal exponentiated)."""

    domain = constraints.independent(constraints.real, 2)
    codomain = constraints.lower_cholesky

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LowerCholeskyTransform)

    __hash__ = object.__hash__

    def _call(self, x: Tensor) -> Tensor:
        return x.tril(-1) + x.diagonal(dim1=-2, dim2=-1).exp().diag_embed()

    def _inverse(self, y: Tensor) -> Tensor:
        return y.tril(-1) + y.diagonal(dim1=-2, dim2=-1).log().diag_embed()


class PositiveDefiniteTransform(Transform):
    """A square matrix to a positive-definite one: ``L L^T`` of its LowerCholeskyTransform."""

    domain = constraints.independent(constraints.real, 2)
    codomain = constraints.positive_definite

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PositiveDefiniteTransform)

    __hash__ = object.__hash__

    def _call(self, x: Tensor) -> Tensor:
        x = LowerCholeskyTransform()(x)
        return x @ x.mT

    def _inverse(self, y: Tensor) -> Tensor:
        return LowerCholeskyTransform().inv(cholesky(y))


class CorrCholeskyTransform(Transform):
    """A vector of ``D (D - 1) / 2`` reals to the Cholesky factor of a D x D correlation matrix:
    tanh to (-1, 1), then stick breaking along each row (unit row norms)."""

    domain = constraints.real_vector
    codomain = constraints.corr_cholesky
    bijective = True

    def _call(self, x: Tensor) -> Tensor:
        x = x.tanh()
        eps = finfo(x.dtype).eps
        x = x.clamp(min=-1 + eps, max=1 - eps)
        r = vec_to_tril_matrix(x, diag=-1)
        z1m_cumprod_sqrt = (1 - r ** 2).sqrt().cumprod(-1)
        r = r + eye(r.shape[-1], dtype=r.dtype, device=r.device)
        return r * pad(z1m_cumprod_sqrt[..., :-1], [1, 0], value=1)

    def _inverse(self, y: Tensor) -> Tensor:
        y_cumsum = 1 - (y * y).cumsum(-1)
        y_cumsum_shifted = pad(y_cumsum[..., :-1], [1, 0], value=1)
        t = tril_matrix_to_vec(y, diag=-1) / tril_matrix_to_vec(y_cumsum_shifted, diag=-1).sqrt()
        return (t.log1p() - t.neg().log1p()) / 2   # atanh

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor, intermediates: Any = None) -> Tensor:
        y1m_cumsum = 1 - (y * y).cumsum(-1)
        stick_breaking_logdet = 0.5 * tril_matrix_to_vec(y1m_cumsum, diag=-2).log().sum(-1)
        tanh_logdet = -2 * (x + softplus(-2 * x) - math.log(2.0)).sum(-1)
        return stick_breaking_logdet + tanh_logdet

    def forward_shape(self, shape: Sequence[int]) -> Sequence[int]:
        _too_few(shape, 1)
        N = shape[-1]
        D = round((0.25 + 2 * N) ** 0.5 + 0.5)
        if D * (D - 1) // 2 != N:
            raise ValueError(f"holoflow.distributions.CorrCholeskyTransform: input of size {N} is not a "
                             f"flattened lower-diagonal number D (D - 1) / 2")
        return tuple(shape[:-1]) + (D, D)

    def inverse_shape(self, shape: Sequence[int]) -> Sequence[int]:
        _too_few(shape, 2)
        if shape[-2] != shape[-1]:
            raise ValueError(f"holoflow.distributions.CorrCholeskyTransform: input of shape {tuple(shape)} is "
                             f"not square")
        D = shape[-1]
        return tuple(shape[:-2]) + (D * (D - 1) // 2,)


def _check_slices(name: str, t: Tensor, dim: int, length: int, what: str) -> None:
    if not -t.dim() <= dim < t.dim():
        raise AssertionError(f"holoflow.distributions.{name}: dim {dim} out of range for {what} with {t.dim()} "
                             f"dimensions")
    if t.shape[dim] != length:
        raise AssertionError(f"holoflow.distributions.{name}: {what}.size({dim}) = {t.shape[dim]} must equal "
                             f"{length}")


class CatTransform(Transform):
    """``tseq[i]`` on the ``lengths[i]`` consecutive slices along ``dim``, concatenated."""

    def __init__(self, tseq: Sequence[Transform], dim: int = 0, lengths: Sequence[int] | None = None,
                 cache_size: int = 0) -> None:
        if not all(isinstance(t, Transform) for t in tseq):
            raise AssertionError("holoflow.distributions.CatTransform: all elements of tseq must be Transforms")
        if cache_size:
            tseq = [t.with_cache(cache_size) for t in tseq]
        super().__init__(cache_size=cache_size)
        self.transforms = list(tseq)
        self.lengths = list(lengths) if lengths is not None else [1] * len(self.transforms)
        if len(self.lengths) != len(self.transforms):
            raise AssertionError(f"holoflow.distributions.CatTransform: lengths ({len(self.lengths)}) must match "
                                 f"transforms ({len(self.transforms)})")
        self.dim = dim

    @property
    def event_dim(self) -> int:  # type: ignore[override]
        return max(t.event_dim for t in self.transforms)

    @property
    def length(self) -> int:
        return sum(self.lengths)

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return CatTransform(self.transforms, self.dim, self.lengths, cache_size)

    def _map(self, x: Tensor, inverse: bool) -> Tensor:
        _check_slices("CatTransform", x, self.dim, self.length, "y" if inverse else "x")
        out, start = [], 0
        for trans, length in zip(self.transforms, self.lengths):
            piece = x.narrow(self.dim, start, length)
            out.append(trans.inv(piece) if inverse else trans(piece))
            start += length
        return cat(out, dim=self.dim)

    def _call(self, x: Tensor) -> Tensor:
        return self._map(x, False)

    def _inverse(self, y: Tensor) -> Tensor:
        return self._map(y, True)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        _check_slices("CatTransform", x, self.dim, self.length, "x")
        _check_slices("CatTransform", y, self.dim, self.length, "y")
        logdetjacs, start = [], 0
        for trans, length in zip(self.transforms, self.lengths):
            ldj = trans.log_abs_det_jacobian(x.narrow(self.dim, start, length), y.narrow(self.dim, start, length))
            if trans.event_dim < self.event_dim:
                ldj = sum_rightmost(ldj, self.event_dim - trans.event_dim)
            logdetjacs.append(ldj)
            start += length
        dim = (self.dim - x.dim() if self.dim >= 0 else self.dim) + self.event_dim
        if dim < 0:   # the cat dim is a batch dim of the log-dets
            return cat(logdetjacs, dim=dim)
        total = logdetjacs[0]
        for t in logdetjacs[1:]:
            total = total + t
        return total

    @property
    def bijective(self) -> bool:  # type: ignore[override]
        return all(t.bijective for t in self.transforms)

    @constraints.dependent_property
    def domain(self) -> constraints.Constraint:
        return constraints.cat([t.domain for t in self.transforms], self.dim, self.lengths)

    @constraints.dependent_property
    def codomain(self) -> constraints.Constraint:
        return constraints.cat([t.codomain for t in self.transforms], self.dim, self.lengths)


class StackTransform(Transform):
    """``tseq[i]`` on slice ``i`` along ``dim``, stacked."""

    def __init__(self, tseq: Sequence[Transform], dim: int = 0, cache_size: int = 0) -> None:
        if not all(isinstance(t, Transform) for t in tseq):
            raise AssertionError("holoflow.distributions.StackTransform: all elements of tseq must be Transforms")
        if cache_size:
            tseq = [t.with_cache(cache_size) for t in tseq]
        super().__init__(cache_size=cache_size)
        self.transforms = list(tseq)
        self.dim = dim

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return StackTransform(self.transforms, self.dim, cache_size)

    def _slice(self, z: Tensor) -> list:
        return [z.select(self.dim, i) for i in range(z.shape[self.dim])]

    def _call(self, x: Tensor) -> Tensor:
        _check_slices("StackTransform", x, self.dim, len(self.transforms), "x")
        return stack([t(s) for s, t in zip(self._slice(x), self.transforms)], dim=self.dim)

    def _inverse(self, y: Tensor) -> Tensor:
        _check_slices("StackTransform", y, self.dim, len(self.transforms), "y")
        return stack([t.inv(s) for s, t in zip(self._slice(y), self.transforms)], dim=self.dim)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        _check_slices("StackTransform", x, self.dim, len(self.transforms), "x")
        _check_slices("StackTransform", y, self.dim, len(self.transforms), "y")
        return stack([t.log_abs_det_jacobian(a, b) for a, b, t in zip(self._slice(x), self._slice(y),
                                                                        self.transforms)], dim=self.dim)

    @property
    def bijective(self) -> bool:  # type: ignore[override]
        return all(t.bijective for t in self.transforms)

    @constraints.dependent_property
    def domain(self) -> constraints.Constraint:
        return constraints.stack([t.domain for t in self.transforms], self.dim)

    @constraints.dependent_property
    def codomain(self) -> constraints.Constraint:
        return constraints.stack([t.codomain for t in self.transforms], self.dim)


class CumulativeDistributionTransform(Transform):
    """A distribution's cdf as a transform onto the unit interval (its log-det is the log density):
    a copula's marginals, say."""

    bijective = True
    codomain = constraints.unit_interval
    sign = +1

    def __init__(self, distribution: Any, cache_size: int = 0) -> None:
        super().__init__(cache_size=cache_size)
        self.distribution = distribution

    @property
    def domain(self) -> constraints.Constraint:  # type: ignore[override]
        return self.distribution.support

    def _call(self, x: Tensor) -> Tensor:
        return self.distribution.cdf(x)

    def _inverse(self, y: Tensor) -> Tensor:
        return self.distribution.icdf(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return self.distribution.log_prob(x)

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return CumulativeDistributionTransform(self.distribution, cache_size=cache_size)

