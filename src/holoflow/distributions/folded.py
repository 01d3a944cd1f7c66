"""``FoldedAtZero``: ``|X|`` for a distribution symmetric about 0 with a ``scale`` (what
HalfNormal and HalfCauchy share: the density doubled on x >= 0, the cdf and icdf folded, the
entropy less log 2)."""
from __future__ import annotations

import math
from typing import Any

from ..core.tensor import Tensor
from ..ops.creation import zeros_like
from ..ops.elementwise import where
from . import constraints
from .transformed_distribution import TransformedDistribution
from .utils import as_tensor_like

__all__ = ["FoldedAtZero"]


class FoldedAtZero(TransformedDistribution):
    arg_constraints = {"scale": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    @property
    def scale(self) -> Tensor:
        return self.base_dist.scale

    @property
    def mode(self) -> Tensor:
        return zeros_like(self.scale)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        value = as_tensor_like(value, self.base_dist.scale)
        log_prob = self.base_dist.log_prob(value) + math.log(2)
        return where(value >= 0, log_prob, -math.inf)

    def cdf(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return 2 * self.base_dist.cdf(value) - 1

    def icdf(self, prob: Any) -> Tensor:
        return self.base_dist.icdf((prob + 1) / 2)

    def entropy(self) -> Tensor:
        return self.base_dist.entropy() - math.log(2)
