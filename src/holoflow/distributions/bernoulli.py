"""``Bernoulli(probs=... | logits=...)``: log_prob/entropy through BCE-with-logits, as torch."""
from __future__ import annotations

from typing import Any

from ..core import grad_mode
from ..core.tensor import Tensor
from ..nn.functional import binary_cross_entropy_with_logits as _bce_logits
from ..ops.creation import arange
from ..ops.random_ops import bernoulli as _bernoulli
from .base import Distribution, broadcast_all
from .categorical import clamp_probs

__all__ = ["Bernoulli"]


class Bernoulli(Distribution):
    """1 with probability ``probs`` (or ``sigmoid(logits)``), else 0."""

    def __init__(self, probs: Any = None, logits: Any = None, validate_args: bool | None = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("holoflow.distributions.Bernoulli: either `probs` or `logits` must be "
                             "specified, but not both")
        if probs is not None:
            (self.probs,) = broadcast_all(probs)
            if self._validates(validate_args):
                self._check(((self.probs >= 0) & (self.probs <= 1)).all(), "probs", self.probs, "Interval(0, 1)")
            p = clamp_probs(self.probs)
            self.logits = p.log() - (-p).log1p()
        else:
            (self.logits,) = broadcast_all(logits)
            self.probs = self.logits.sigmoid()
        super().__init__(self.probs.shape)

    @property
    def mean(self) -> Tensor:
        return self.probs

    @property
    def variance(self) -> Tensor:
        return self.probs * (1 - self.probs)

    @property
    def mode(self) -> Tensor:
        mode = (self.probs >= 0.5).to(self.probs.dtype)
        return mode.masked_fill(self.probs == 0.5, float("nan"))

    has_enumerate_support = True

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """``[0., 1.]`` along a new leading dim, (expanded to) the batch shape."""
        values = arange(2, dtype=self.probs.dtype, device=self.probs.device).view((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values

    def sample(self, sample_shape: Any = ()) -> Tensor:
        with grad_mode.no_grad():
            return _bernoulli(self.probs.expand(self._extended_shape(sample_shape)))

    def log_prob(self, value: Any) -> Tensor:
        logits, value = broadcast_all(self.logits, value)
        return -_bce_logits(logits, value, reduction="none")

    def entropy(self) -> Tensor:
        return _bce_logits(self.logits, self.probs, reduction="none")
