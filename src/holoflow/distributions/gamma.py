"""``Gamma(concentration, rate)``: reparameterized samples from torch's gamma sampler (its implicit
gradient), ``log_prob``/``entropy``/``cdf`` as torch's formulas."""
from __future__ import annotations

from typing import Any

import torch

from ..core.dtype import finfo
from ..core.tensor import Tensor
from ..ops.elementwise import igamma
from ..ops.random_dists import standard_gamma
from . import constraints
from .exp_family import ExponentialFamily
from ..ops.elementwise import xlogy
from .utils import as_tensor_like, broadcast_all

__all__ = ["Gamma"]


class Gamma(ExponentialFamily):
    """Density ``rate^a x^(a-1) exp(-rate x) / Gamma(a)`` for ``a = concentration``."""

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _mean_carrier_measure = 0

    def __init__(self, concentration: Any, rate: Any, validate_args: bool | None = None) -> None:
        self.concentration, self.rate = broadcast_all(concentration, rate)
        super().__init__(self.concentration.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "Gamma":
        new = self._get_checked_instance(Gamma, _instance)
        batch_shape = torch.Size(batch_shape)
        new.concentration = self.concentration.expand(batch_shape)
        new.rate = self.rate.expand(batch_shape)
        return self._expanded(new, batch_shape)

    @property
    def mean(self) -> Tensor:
        return self.concentration / self.rate

    @property
    def mode(self) -> Tensor:
        return ((self.concentration - 1) / self.rate).clamp(min=0)

    @property
    def variance(self) -> Tensor:
        return self.concentration / self.rate.pow(2)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        value = standard_gamma(self.concentration.expand(shape)) / self.rate.expand(shape)
        # a draw that underflowed to 0 would make log_prob -inf: clamp it, outside the graph, as torch
        value.detach().clamp_(min=finfo(value.dtype).tiny)
        return value

    def log_prob(self, value: Any) -> Tensor:
        value = as_tensor_like(value, self.rate)
        if self._validate_args:
            self._validate_sample(value)
        return (xlogy(self.concentration, self.rate) + xlogy(self.concentration - 1, value)
                - self.rate * value - self.concentration.lgamma())

    def entropy(self) -> Tensor:
        c = self.concentration
        return c - self.rate.log() + c.lgamma() + (1.0 - c) * c.digamma()

    @property
    def _natural_params(self) -> tuple[Tensor, Tensor]:
        return self.concentration - 1, -self.rate

    def _log_normalizer(self, x: Tensor, y: Tensor) -> Tensor:
        return (x + 1).lgamma() + (x + 1) * (-y.reciprocal()).log()

    def cdf(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return igamma(self.concentration, self.rate * value)
