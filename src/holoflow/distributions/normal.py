"""``Normal(loc, scale)``: reparameterized samples ``loc + eps * scale``, as torch draws them."""
from __future__ import annotations

import math
from typing import Any

from ..core import grad_mode
from ..core.tensor import Tensor
from ..ops.creation import empty
from ..ops.creation import normal as _normal
from .base import LOG_SQRT_2PI, Distribution, broadcast_all

__all__ = ["Normal"]


class Normal(Distribution):
    """A Gaussian with mean ``loc`` and standard deviation ``scale`` (broadcast together)."""

    has_rsample = True

    def __init__(self, loc: Any, scale: Any, validate_args: bool | None = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        if self._validates(validate_args):
            self._check((self.scale > 0).all(), "scale", self.scale, "GreaterThan(lower_bound=0.0)")
        super().__init__(self.loc.shape)

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def stddev(self) -> Tensor:
        return self.scale

    @property
    def variance(self) -> Tensor:
        return self.scale.pow(2)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        with grad_mode.no_grad():
            return _normal(self.loc.expand(shape), self.scale.expand(shape))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        eps = empty(*self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device).normal_()
        return self.loc + eps * self.scale

    def log_prob(self, value: Any) -> Tensor:
        var = self.scale ** 2
        return -((value - self.loc) ** 2) / (2 * var) - self.scale.log() - LOG_SQRT_2PI

    def entropy(self) -> Tensor:
        return 0.5 + 0.5 * math.log(2 * math.pi) + self.scale.log()

    def cdf(self, value: Any) -> Tensor:
        return 0.5 * (1 + ((value - self.loc) * self.scale.reciprocal() / math.sqrt(2)).erf())

    def icdf(self, value: Any) -> Tensor:
        return self.loc + self.scale * (2 * value - 1).erfinv() * math.sqrt(2)
