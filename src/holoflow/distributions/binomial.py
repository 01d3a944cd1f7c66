"""``Binomial(total_count=1, probs=... | logits=...)``: samples from torch's binomial sampler
(``holoflow.binomial``), log_prob in the logits (stable at probs near 0 and 1), as torch's."""
from __future__ import annotations

from typing import Any

import torch

from ..core import grad_mode
from ..core.tensor import Tensor
from ..ops.creation import arange
from ..ops.random_ops import binomial
from . import constraints
from .base import Distribution
from .bernoulli import _one_of
from .utils import broadcast_all, lazy_property, logits_to_probs, probs_to_logits

__all__ = ["Binomial"]


def _clamp_by_zero(x: Tensor) -> Tensor:
    # max(x, 0) whose gradient at 0 is 1/2 (torch's choice)
    return (x.clamp(min=0) + x - x.clamp(max=0)) / 2


def count_and_param(d: Any, name: str, total_count: Any, probs: Any, logits: Any) -> None:
    """``d.total_count`` and ``d.probs`` or ``d.logits`` broadcast together (the count in the
    parameter's dtype), and ``d._param``: Binomial's and NegativeBinomial's parametrisation."""
    _one_of(name, probs, logits)
    param = probs if probs is not None else logits
    count, value = broadcast_all(total_count, param)
    d.total_count = count.type_as(value)
    setattr(d, "probs" if probs is not None else "logits", value)
    d._param = value


def expand_count_and_param(d: Any, new: Any, batch_shape: torch.Size) -> Any:
    """``new`` (an instance of ``d``'s class) with ``d``'s count and parameter expanded."""
    new.total_count = d.total_count.expand(batch_shape)
    if "probs" in d.__dict__:
        new.probs = new._param = d.probs.expand(batch_shape)
    if "logits" in d.__dict__:
        new.logits = new._param = d.logits.expand(batch_shape)
    return d._expanded(new, batch_shape)


class Binomial(Distribution):
    """The number of successes in ``total_count`` Bernoulli(``probs``) trials."""

    arg_constraints = {"total_count": constraints.nonnegative_integer, "probs": constraints.unit_interval,
                       "logits": constraints.real}
    has_enumerate_support = True

    def __init__(self, total_count: Any = 1, probs: Any = None, logits: Any = None,
                 validate_args: bool | None = None) -> None:
        count_and_param(self, "Binomial", total_count, probs, logits)
        super().__init__(self._param.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "Binomial":
        new = self._get_checked_instance(Binomial, _instance)
        return expand_count_and_param(self, new, torch.Size(batch_shape))

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self) -> constraints.Constraint:
        return constraints.integer_interval(0, self.total_count)

    @lazy_property
    def logits(self) -> Tensor:
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self) -> Tensor:
        return logits_to_probs(self.logits, is_binary=True)

    @property
    def param_shape(self) -> torch.Size:
        return self._param.shape

    @property
    def mean(self) -> Tensor:
        return self.total_count * self.probs

    @property
    def mode(self) -> Tensor:
        return ((self.total_count + 1) * self.probs).floor().clamp(max=self.total_count)

    @property
    def variance(self) -> Tensor:
        return self.total_count * self.probs * (1 - self.probs)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        with grad_mode.no_grad():
            return binomial(self.total_count.expand(shape), self.probs.expand(shape))

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        n = self.total_count
        log_factorial_n = (n + 1).lgamma()
        log_factorial_k = (value + 1).lgamma()
        log_factorial_nmk = (n - value + 1).lgamma()
        # n * log(1 + exp(logits)) as n * (max(logits, 0) + log1p(exp(-|logits|))): no overflow
        normalize_term = (n * _clamp_by_zero(self.logits) + n * (-self.logits.abs()).exp().log1p()
                          - log_factorial_n)
        return value * self.logits - log_factorial_k - log_factorial_nmk - normalize_term

    def _homogeneous_count(self, what: str) -> int:
        total_count = int(self.total_count.max())
        if not self.total_count.min() == total_count:
            raise NotImplementedError(f"Inhomogeneous total count not supported by `{what}`.")
        return total_count

    def entropy(self) -> Tensor:
        self._homogeneous_count("entropy")
        log_prob = self.log_prob(self.enumerate_support(False))
        return -(log_prob.exp() * log_prob).sum(0)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        total_count = self._homogeneous_count("enumerate_support")
        values = arange(1 + total_count, dtype=self._param.dtype, device=self._param.device)
        values = values.view((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values
