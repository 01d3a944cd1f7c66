"""``Multinomial(total_count=1, probs=... | logits=...)``: counts of ``total_count`` categorical
draws; samples count ``Categorical`` draws made in torch's order."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..core.tensor import Tensor
from ..ops.creation import ones_like, tensor, zeros
from . import constraints
from .base import Distribution
from .binomial import Binomial
from .categorical import Categorical
from .utils import broadcast_all

__all__ = ["Multinomial"]


class Multinomial(Distribution):
    """The counts per category (the last dim of ``probs``/``logits``) of ``total_count`` draws."""

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}

    def __init__(self, total_count: int = 1, probs: Any = None, logits: Any = None,
                 validate_args: bool | None = None) -> None:
        if not isinstance(total_count, int):
            raise NotImplementedError("inhomogeneous total_count is not supported")
        self.total_count = total_count
        self._categorical = Categorical(probs=probs, logits=logits)
        self._binomial = Binomial(total_count=total_count, probs=self.probs)
        super().__init__(self._categorical.batch_shape, self._categorical.param_shape[-1:],
                         validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "Multinomial":
        new = self._get_checked_instance(Multinomial, _instance)
        batch_shape = torch.Size(batch_shape)
        new.total_count = self.total_count
        new._categorical = self._categorical.expand(batch_shape)
        return self._expanded(new, batch_shape)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self) -> constraints.Constraint:
        return constraints.multinomial(self.total_count)

    @property
    def logits(self) -> Tensor:
        return self._categorical.logits

    @property
    def probs(self) -> Tensor:
        return self._categorical.probs

    @property
    def param_shape(self) -> torch.Size:
        return self._categorical.param_shape

    @property
    def mean(self) -> Tensor:
        return self.probs * self.total_count

    @property
    def variance(self) -> Tensor:
        return self.total_count * self.probs * (1 - self.probs)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        sample_shape = torch.Size(sample_shape)
        samples = self._categorical.sample(torch.Size((self.total_count,)) + sample_shape)
        # (total_count, *sample, *batch) -> (*sample, *batch, total_count), then count per category
        order = list(range(1, samples.dim())) + [0]
        samples = samples.permute(*order)
        counts = zeros(self._extended_shape(sample_shape), dtype=samples.dtype, device=samples.device)
        counts = counts.scatter_add(-1, samples, ones_like(samples))
        return counts.type_as(self.probs)

    def entropy(self) -> Tensor:
        n = tensor(self.total_count)
        cat_entropy = self._categorical.entropy()
        term1 = n * cat_entropy - (n + 1).lgamma()
        support = self._binomial.enumerate_support(expand=False)[1:]
        binomial_probs = self._binomial.log_prob(support).exp()
        weights = (support + 1).lgamma()
        term2 = (binomial_probs * weights).sum([0, -1])
        return term1 + term2

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        log_factorial_n = (value.sum(-1) + 1).lgamma()
        log_factorial_xs = (value + 1).lgamma().sum(-1)
        # 0 * -inf is 0: a category of probability 0 that was never drawn
        logits = logits.masked_fill((value == 0) & (logits == -math.inf), 0)
        log_powers = (logits * value).sum(-1)
        return log_factorial_n - log_factorial_xs + log_powers
