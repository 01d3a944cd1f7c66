"""``Uniform(low, high)``: reparameterized samples ``low + rand * (high - low)``, as torch."""
from __future__ import annotations

from typing import Any

from ..core.tensor import Tensor
from ..ops.creation import rand
from .base import Distribution, broadcast_all

__all__ = ["Uniform"]


class Uniform(Distribution):
    """Uniform on ``[low, high)``."""

    has_rsample = True

    def __init__(self, low: Any, high: Any, validate_args: bool | None = None) -> None:
        self.low, self.high = broadcast_all(low, high)
        if self._validates(validate_args):
            self._check((self.low < self.high).all(), "low", self.low, "LessThan(high)")
        super().__init__(self.low.shape)

    @property
    def mean(self) -> Tensor:
        return (self.high + self.low) / 2

    @property
    def variance(self) -> Tensor:
        return (self.high - self.low).pow(2) / 12

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        u = rand(*self._extended_shape(sample_shape), dtype=self.low.dtype, device=self.low.device)
        return self.low + u * (self.high - self.low)

    def log_prob(self, value: Any) -> Tensor:
        lb = self.low.le(value).type_as(self.low)
        ub = self.high.gt(value).type_as(self.low)
        return (lb * ub).log() - (self.high - self.low).log()

    def entropy(self) -> Tensor:
        return (self.high - self.low).log()

    def cdf(self, value: Any) -> Tensor:
        return ((value - self.low) / (self.high - self.low)).clamp(min=0, max=1)
