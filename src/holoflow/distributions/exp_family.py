"""``ExponentialFamily``: densities ``exp(<t(x), theta> - F(theta) + k(x))``; entropy (and the KL of
two members of one family) from the log normalizer ``F`` by a Bregman divergence, its gradient taken
by holoflow's autograd, as torch's."""
from __future__ import annotations

from typing import Any

from ..autograd import grad as _grad
from ..core import grad_mode
from ..core.tensor import Tensor
from .base import Distribution

__all__ = ["ExponentialFamily"]


class ExponentialFamily(Distribution):
    """Base of the exponential families: subclasses give ``_natural_params``, ``_log_normalizer``
    and ``_mean_carrier_measure``."""

    @property
    def _natural_params(self) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def _log_normalizer(self, *natural_params: Tensor) -> Tensor:
        raise NotImplementedError

    @property
    def _mean_carrier_measure(self) -> float:
        raise NotImplementedError

    def entropy(self) -> Tensor:
        """``F(theta) - <theta, grad F(theta)> - E[k(x)]``."""
        result: Any = -self._mean_carrier_measure
        nparams = [p.detach().requires_grad_() for p in self._natural_params]
        with grad_mode.enable_grad():
            lg_normal = self._log_normalizer(*nparams)
            gradients = _grad(lg_normal.sum(), nparams, create_graph=True)
        result = result + lg_normal
        for np, g in zip(nparams, gradients):
            result = result - (np * g).reshape(tuple(self._batch_shape) + (-1,)).sum(-1)
        return result
