"""``Bernoulli(probs=... | logits=...)``: log_prob/entropy through BCE-with-logits, as torch."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..core import grad_mode
from ..core.tensor import Tensor
from ..nn.functional import binary_cross_entropy_with_logits as _bce_logits
from ..ops.creation import arange
from ..ops.random_ops import bernoulli as _bernoulli
from . import constraints
from .exp_family import ExponentialFamily
from .utils import broadcast_all, lazy_property, logits_to_probs, probs_to_logits

__all__ = ["Bernoulli"]


def _one_of(name: str, probs: Any, logits: Any) -> None:
    if (probs is None) == (logits is None):
        raise ValueError(f"holoflow.distributions.{name}: either `probs` or `logits` must be specified, "
                         f"but not both")


class Bernoulli(ExponentialFamily):
    """1 with probability ``probs`` (or ``sigmoid(logits)``), else 0."""

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.boolean
    has_enumerate_support = True
    _mean_carrier_measure = 0

    def __init__(self, probs: Any = None, logits: Any = None, validate_args: bool | None = None) -> None:
        _one_of("Bernoulli", probs, logits)
        if probs is not None:
            (self.probs,) = broadcast_all(probs)
        else:
            (self.logits,) = broadcast_all(logits)
        self._param = self.probs if probs is not None else self.logits
        super().__init__(self._param.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "Bernoulli":
        new = self._get_checked_instance(Bernoulli, _instance)
        batch_shape = torch.Size(batch_shape)
        if "probs" in self.__dict__:
            new.probs = new._param = self.probs.expand(batch_shape)
        if "logits" in self.__dict__:
            new.logits = new._param = self.logits.expand(batch_shape)
        return self._expanded(new, batch_shape)

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
        return self.probs

    @property
    def variance(self) -> Tensor:
        return self.probs * (1 - self.probs)

    @property
    def mode(self) -> Tensor:
        mode = (self.probs >= 0.5).to(self.probs.dtype)
        return mode.masked_fill(self.probs == 0.5, math.nan)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """``[0., 1.]`` along a new leading dim, (expanded to) the batch shape."""
        values = arange(2, dtype=self._param.dtype, device=self._param.device).view(
            (-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values

    def sample(self, sample_shape: Any = ()) -> Tensor:
        with grad_mode.no_grad():
            return _bernoulli(self.probs.expand(self._extended_shape(sample_shape)))

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -_bce_logits(logits, value, reduction="none")

    def entropy(self) -> Tensor:
        return _bce_logits(self.logits, self.probs, reduction="none")

    @property
    def _natural_params(self) -> tuple[Tensor]:
        return (self.probs.logit(),)

    def _log_normalizer(self, x: Tensor) -> Tensor:
        return x.exp().log1p()
