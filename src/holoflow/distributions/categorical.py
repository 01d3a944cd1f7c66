"""``Categorical(probs=... | logits=...)``: samples by ``multinomial`` as torch draws them."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..core.dtype import finfo
from ..core.tensor import Tensor
from ..ops.creation import arange, full
from ..ops.random_ops import multinomial
from . import constraints
from .base import Distribution, as_size
from .bernoulli import _one_of
from .utils import clamp_probs, lazy_property, logits_to_probs, probs_to_logits

__all__ = ["Categorical", "clamp_probs"]


class Categorical(Distribution):
    """One of ``K`` categories (the last dim of ``probs``/``logits``); batch dims before it."""

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    has_enumerate_support = True

    def __init__(self, probs: Any = None, logits: Any = None, validate_args: bool | None = None) -> None:
        _one_of("Categorical", probs, logits)
        name, param = ("probs", probs) if probs is not None else ("logits", logits)
        if param.dim() < 1:
            raise ValueError(f"holoflow.distributions.Categorical: `{name}` parameter must be at least "
                             f"one-dimensional")
        if probs is not None:
            self.probs = probs / probs.sum(-1, keepdim=True)
        else:
            self.logits = logits - logits.logsumexp(dim=-1, keepdim=True)
        self._param = self.probs if probs is not None else self.logits
        self._num_events = self._param.shape[-1]
        super().__init__(self._param.shape[:-1], validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "Categorical":
        new = self._get_checked_instance(Categorical, _instance)
        batch_shape = torch.Size(batch_shape)
        param_shape = batch_shape + (self._num_events,)
        if "probs" in self.__dict__:
            new.probs = new._param = self.probs.expand(param_shape)
        if "logits" in self.__dict__:
            new.logits = new._param = self.logits.expand(param_shape)
        new._num_events = self._num_events
        return self._expanded(new, batch_shape)

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self) -> constraints.Constraint:
        return constraints.integer_interval(0, self._num_events - 1)

    @lazy_property
    def logits(self) -> Tensor:
        return probs_to_logits(self.probs)

    @lazy_property
    def probs(self) -> Tensor:
        return logits_to_probs(self.logits)

    @property
    def param_shape(self) -> torch.Size:
        return self._param.shape

    @property
    def mean(self) -> Tensor:
        return full(self._extended_shape(), math.nan, dtype=self.probs.dtype, device=self.probs.device)

    @property
    def mode(self) -> Tensor:
        return self.probs.argmax(dim=-1)

    @property
    def variance(self) -> Tensor:
        return full(self._extended_shape(), math.nan, dtype=self.probs.dtype, device=self.probs.device)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """The categories ``0 .. K-1`` along a new leading dim, (expanded to) the batch shape."""
        values = arange(self._num_events, device=self._param.device).view((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values

    def sample(self, sample_shape: Any = ()) -> Tensor:
        # torch draws without no_grad too (multinomial is not differentiable)
        shape = as_size(sample_shape)
        probs_2d = self.probs.reshape(-1, self._num_events)
        samples_2d = multinomial(probs_2d, shape.numel(), True).T
        return samples_2d.reshape(self._extended_shape(shape))

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        value = value.long().unsqueeze(-1)
        shape = torch.broadcast_shapes(tuple(value.shape), tuple(self.logits.shape))
        value, log_pmf = value.expand(shape)[..., :1], self.logits.expand(shape)
        return log_pmf.gather(-1, value).squeeze(-1)

    def entropy(self) -> Tensor:
        logits = self.logits.clamp(min=finfo(self.logits.dtype).min)
        return -(logits * self.probs).sum(-1)
