"""``MixtureSameFamily(mixture, components)``: a mixture of ``k`` components of one family, the
rightmost batch dim of ``components`` indexing them, as ``torch.distributions.MixtureSameFamily``
(mixture density networks, Gaussian mixture models)."""
from __future__ import annotations

from typing import Any

import torch

from ..core import grad_mode
from ..core.tensor import Tensor
from . import constraints
from .base import Distribution, as_size
from .categorical import Categorical

__all__ = ["MixtureSameFamily"]


class MixtureSameFamily(Distribution):
    """``p(x) = sum_k mixture.probs[k] * components[k].prob(x)``; not reparameterizable (as
    torch's: ``sample`` draws the component indices, then every component, and gathers)."""

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, mixture_distribution: Categorical, component_distribution: Distribution,
                 validate_args: bool | None = None) -> None:
        if not isinstance(mixture_distribution, Categorical):
            raise ValueError("holoflow.distributions.MixtureSameFamily: the mixture distribution needs to be an "
                             f"instance of Categorical, got {type(mixture_distribution).__name__}")
        if not isinstance(component_distribution, Distribution):
            raise ValueError("holoflow.distributions.MixtureSameFamily: the component distribution needs to be "
                             f"an instance of Distribution, got {type(component_distribution).__name__}")
        mdbs, cdbs = mixture_distribution.batch_shape, component_distribution.batch_shape[:-1]
        for size1, size2 in zip(reversed(mdbs), reversed(cdbs)):
            if size1 != 1 and size2 != 1 and size1 != size2:
                raise ValueError(f"`mixture_distribution.batch_shape` ({mdbs}) is not compatible with "
                                 f"`component_distribution.batch_shape`({cdbs})")
        km = mixture_distribution.logits.shape[-1]
        kc = component_distribution.batch_shape[-1] if len(component_distribution.batch_shape) else None
        if km != kc:
            raise ValueError(f"`mixture_distribution component` ({km}) does not equal "
                             f"`component_distribution.batch_shape[-1]` ({kc})")
        self._mixture_distribution, self._component_distribution = mixture_distribution, component_distribution
        self._num_component = km
        event_shape = component_distribution.event_shape
        self._event_ndims = len(event_shape)
        super().__init__(cdbs, event_shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "MixtureSameFamily":
        batch_shape = torch.Size(batch_shape)
        new = self._get_checked_instance(MixtureSameFamily, _instance)
        new._component_distribution = self._component_distribution.expand(batch_shape + (self._num_component,))
        new._mixture_distribution = self._mixture_distribution.expand(batch_shape)
        new._num_component, new._event_ndims = self._num_component, self._event_ndims
        return self._expanded(new, batch_shape, new._component_distribution.event_shape)

    @constraints.dependent_property
    def support(self) -> constraints.Constraint:
        return constraints.MixtureSameFamilyConstraint(self._component_distribution.support)

    @property
    def mixture_distribution(self) -> Categorical:
        return self._mixture_distribution

    @property
    def component_distribution(self) -> Distribution:
        return self._component_distribution

    @property
    def mean(self) -> Tensor:
        probs = self._pad_mixture_dimensions(self.mixture_distribution.probs)
        return (probs * self.component_distribution.mean).sum(-1 - self._event_ndims)

    @property
    def variance(self) -> Tensor:
        """Law of total variance: the mean of the components' variances plus the variance of
        their means."""
        probs = self._pad_mixture_dimensions(self.mixture_distribution.probs)
        comp = self.component_distribution
        mean_cond_var = (probs * comp.variance).sum(-1 - self._event_ndims)
        var_cond_mean = (probs * (comp.mean - self._pad(self.mean)).pow(2.0)).sum(-1 - self._event_ndims)
        return mean_cond_var + var_cond_mean

    def cdf(self, x: Tensor) -> Tensor:
        cdf_x = self.component_distribution.cdf(self._pad(x))
        return (cdf_x * self.mixture_distribution.probs).sum(-1)

    def log_prob(self, x: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(x)
        log_prob_x = self.component_distribution.log_prob(self._pad(x))        # [S, B, k]
        log_mix_prob = self.mixture_distribution.logits.log_softmax(-1)       # [B, k]
        return (log_prob_x + log_mix_prob).logsumexp(-1)                      # [S, B]

    def sample(self, sample_shape: Any = ()) -> Tensor:
        sample_shape = as_size(sample_shape)
        with grad_mode.no_grad():
            gather_dim = len(sample_shape) + len(self.batch_shape)
            es = self.event_shape
            mix_sample = self.mixture_distribution.sample(sample_shape)       # [S, B]
            mix_shape = tuple(mix_sample.shape)
            comp_samples = self.component_distribution.sample(sample_shape)   # [S, B, k, E]
            index = mix_sample.reshape(mix_shape + (1,) * (len(es) + 1))
            index = index.repeat(*((1,) * len(mix_shape) + (1,) + tuple(es)))
            return comp_samples.gather(gather_dim, index).squeeze(gather_dim)

    def _pad(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-1 - self._event_ndims)

    def _pad_mixture_dimensions(self, x: Tensor) -> Tensor:
        cat_batch_ndims = len(self.mixture_distribution.batch_shape)
        pad_ndims = 0 if cat_batch_ndims == 1 else len(self.batch_shape) - cat_batch_ndims
        xs = tuple(x.shape)
        return x.reshape(xs[:-1] + (1,) * pad_ndims + xs[-1:] + (1,) * self._event_ndims)

    def __repr__(self) -> str:
        return f"MixtureSameFamily(\n  {self.mixture_distribution},\n  {self.component_distribution})"


