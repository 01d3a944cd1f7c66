"""``Categorical(probs=... | logits=...)``: samples by ``multinomial`` as torch draws them."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..core import grad_mode
from ..core.dtype import finfo
from ..core.tensor import Tensor
from ..ops.creation import arange, full
from ..ops.random_ops import multinomial
from .base import Distribution, as_size

__all__ = ["Categorical", "clamp_probs"]


def clamp_probs(p: Tensor) -> Tensor:
    eps = finfo(p.dtype).eps
    return p.clamp(min=eps, max=1 - eps)


class Categorical(Distribution):
    """One of ``K`` categories (the last dim of ``probs``/``logits``); batch dims before it."""

    def __init__(self, probs: Any = None, logits: Any = None, validate_args: bool | None = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("holoflow.distributions.Categorical: either `probs` or `logits` must be "
                             "specified, but not both")
        if probs is not None:
            if probs.dim() < 1:
                raise ValueError("holoflow.distributions.Categorical: `probs` parameter must be at least "
                                 "one-dimensional")
            if self._validates(validate_args):
                self._check((probs >= 0).all(), "probs", probs, "Simplex()")
            self.probs = probs / probs.sum(-1, keepdim=True)
            self.logits = clamp_probs(self.probs).log()
        else:
            if logits.dim() < 1:
                raise ValueError("holoflow.distributions.Categorical: `logits` parameter must be at least "
                                 "one-dimensional")
            self.logits = logits - logits.logsumexp(dim=-1, keepdim=True)
            self.probs = self.logits.softmax(-1)
        self._num_events = self.probs.shape[-1]
        super().__init__(self.probs.shape[:-1])

    @property
    def mean(self) -> Tensor:
        return full(self._extended_shape(), math.nan, dtype=self.probs.dtype, device=self.probs.device)

    @property
    def mode(self) -> Tensor:
        return self.probs.argmax(dim=-1)

    @property
    def variance(self) -> Tensor:
        return full(self._extended_shape(), math.nan, dtype=self.probs.dtype, device=self.probs.device)

    has_enumerate_support = True

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """The categories ``0 .. K-1`` along a new leading dim, (expanded to) the batch shape."""
        values = arange(self._num_events, device=self.probs.device).view((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values

    def sample(self, sample_shape: Any = ()) -> Tensor:
        shape = as_size(sample_shape)
        with grad_mode.no_grad():
            probs_2d = self.probs.reshape(-1, self._num_events)
            samples_2d = multinomial(probs_2d, shape.numel(), True).T
            return samples_2d.reshape(self._extended_shape(shape))

    def log_prob(self, value: Tensor) -> Tensor:
        value = value.long().unsqueeze(-1)
        shape = torch.broadcast_shapes(tuple(value.shape), tuple(self.logits.shape))
        value, log_pmf = value.expand(shape)[..., :1], self.logits.expand(shape)
        return log_pmf.gather(-1, value).squeeze(-1)

    def entropy(self) -> Tensor:
        logits = self.logits.clamp(min=finfo(self.logits.dtype).min)
        return -(logits * self.probs).sum(-1)
