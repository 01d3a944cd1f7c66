"""``Independent(base, n)``: reinterprets the rightmost ``n`` batch dims of ``base`` as event dims
(log_prob and entropy summed over them), as ``torch.distributions.Independent``."""
from __future__ import annotations

import operator
from typing import Any

import torch

from ..core.tensor import Tensor
from . import constraints
from .base import Distribution

__all__ = ["Independent", "sum_rightmost"]


def sum_rightmost(value: Tensor, dim: int) -> Tensor:
    """Sums the rightmost ``dim`` dims of ``value`` (torch.distributions.utils._sum_rightmost)."""
    if dim == 0:
        return value
    return value.reshape(tuple(value.shape[:-dim]) + (-1,)).sum(-1)


class Independent(Distribution):
    """``base_distribution`` with its rightmost ``reinterpreted_batch_ndims`` batch dims moved into
    the event shape: a diagonal Normal as one multivariate event, say."""

    arg_constraints: dict = {}

    def __init__(self, base_distribution: Distribution, reinterpreted_batch_ndims: int,
                 validate_args: bool | None = None) -> None:
        if not isinstance(base_distribution, Distribution):
            raise TypeError(f"holoflow.distributions.Independent: base_distribution must be a Distribution, "
                            f"got {type(base_distribution).__name__}")
        try:
            reinterpreted_batch_ndims = operator.index(reinterpreted_batch_ndims)
        except TypeError:
            raise TypeError(f"holoflow.distributions.Independent: reinterpreted_batch_ndims must be an int, "
                            f"got {type(reinterpreted_batch_ndims).__name__}") from None
        if reinterpreted_batch_ndims < 0:
            raise ValueError(f"holoflow.distributions.Independent: reinterpreted_batch_ndims must be >= 0, "
                             f"got {reinterpreted_batch_ndims}")
        if reinterpreted_batch_ndims > len(base_distribution.batch_shape):
            raise ValueError(f"Expected reinterpreted_batch_ndims <= len(base_distribution.batch_shape), "
                             f"actual {reinterpreted_batch_ndims} vs {len(base_distribution.batch_shape)}")
        shape = base_distribution.batch_shape + base_distribution.event_shape
        event_dim = reinterpreted_batch_ndims + len(base_distribution.event_shape)
        self.base_dist = base_distribution
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims
        super().__init__(shape[:len(shape) - event_dim], shape[len(shape) - event_dim:],
                         validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "Independent":
        new = self._get_checked_instance(Independent, _instance)
        batch_shape = torch.Size(batch_shape)
        new.base_dist = self.base_dist.expand(batch_shape + self.event_shape[:self.reinterpreted_batch_ndims])
        new.reinterpreted_batch_ndims = self.reinterpreted_batch_ndims
        return self._expanded(new, batch_shape)

    @property
    def has_rsample(self) -> bool:  # type: ignore[override]
        return self.base_dist.has_rsample

    @constraints.dependent_property
    def support(self) -> constraints.Constraint:
        result = self.base_dist.support
        if self.reinterpreted_batch_ndims:
            result = constraints.independent(result, self.reinterpreted_batch_ndims)
        return result

    @property
    def has_enumerate_support(self) -> bool:
        if self.reinterpreted_batch_ndims > 0:
            return False
        return getattr(self.base_dist, "has_enumerate_support", False)

    @property
    def mean(self) -> Tensor:
        return self.base_dist.mean

    @property
    def mode(self) -> Tensor:
        return self.base_dist.mode

    @property
    def variance(self) -> Tensor:
        return self.base_dist.variance

    @property
    def stddev(self) -> Tensor:
        return self.base_dist.stddev

    def sample(self, sample_shape: Any = ()) -> Tensor:
        return self.base_dist.sample(sample_shape)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self.base_dist.rsample(sample_shape)

    def log_prob(self, value: Any) -> Tensor:
        return sum_rightmost(self.base_dist.log_prob(value), self.reinterpreted_batch_ndims)

    def entropy(self) -> Tensor:
        return sum_rightmost(self.base_dist.entropy(), self.reinterpreted_batch_ndims)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        if self.reinterpreted_batch_ndims > 0:
            raise NotImplementedError("Enumeration over cartesian product is not implemented")
        return self.base_dist.enumerate_support(expand=expand)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_dist}, {self.reinterpreted_batch_ndims})"
