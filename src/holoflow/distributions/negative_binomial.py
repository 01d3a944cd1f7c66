"""``NegativeBinomial(total_count, probs=... | logits=...)``: the number of successes before
``total_count`` failures; sampled as a Poisson of a Gamma draw, as torch."""
from __future__ import annotations

from typing import Any

import torch

from ..core import grad_mode
from ..core.tensor import Tensor
from ..nn.functional import logsigmoid
from ..ops.random_ops import poisson
from . import constraints
from .base import Distribution
from .binomial import count_and_param, expand_count_and_param
from .gamma import Gamma
from .utils import lazy_property, logits_to_probs, probs_to_logits

__all__ = ["NegativeBinomial"]


class NegativeBinomial(Distribution):
    """``P(k) = C(k + r - 1, k) p^k (1 - p)^r`` for ``r = total_count``, ``p = probs``."""

    arg_constraints = {"total_count": constraints.greater_than_eq(0),
                       "probs": constraints.half_open_interval(0.0, 1.0), "logits": constraints.real}
    support = constraints.nonnegative_integer

    def __init__(self, total_count: Any, probs: Any = None, logits: Any = None,
                 validate_args: bool | None = None) -> None:
        count_and_param(self, "NegativeBinomial", total_count, probs, logits)
        super().__init__(self._param.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "NegativeBinomial":
        new = self._get_checked_instance(NegativeBinomial, _instance)
        return expand_count_and_param(self, new, torch.Size(batch_shape))

    @property
    def mean(self) -> Tensor:
        return self.total_count * self.logits.exp()

    @property
    def mode(self) -> Tensor:
        return ((self.total_count - 1) * self.logits.exp()).floor().clamp(min=0.0)

    @property
    def variance(self) -> Tensor:
        return self.mean / (-self.logits).sigmoid()

    @lazy_property
    def logits(self) -> Tensor:
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self) -> Tensor:
        return logits_to_probs(self.logits, is_binary=True)

    @property
    def param_shape(self) -> torch.Size:
        return self._param.shape

    @lazy_property
    def _gamma(self) -> Gamma:
        return Gamma(concentration=self.total_count, rate=(-self.logits).exp(), validate_args=False)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        with grad_mode.no_grad():
            return poisson(self._gamma.sample(sample_shape=sample_shape))

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        r = self.total_count
        log_unnormalized_prob = r * logsigmoid(-self.logits) + value * logsigmoid(self.logits)
        log_normalization = -(r + value).lgamma() + (1.0 + value).lgamma() + r.lgamma()
        # the normalizer of r + k = 0 (r = 0, k = 0) is 1: lgamma(0) is inf there
        log_normalization = log_normalization.masked_fill(r + value == 0.0, 0.0)
        return log_unnormalized_prob - log_normalization
