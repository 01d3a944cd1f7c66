"""``Dirichlet(concentration)``: reparameterized samples from torch's Dirichlet sampler (its implicit
gradient, projected onto the simplex), as torch's ``_Dirichlet`` function."""
from __future__ import annotations

from typing import Any

import torch

from ..core.tensor import Tensor
from ..ops.elementwise import where
from ..ops.nn_ops import one_hot
from ..ops.random_dists import sample_dirichlet
from . import constraints
from .exp_family import ExponentialFamily
from ..ops.elementwise import xlogy

__all__ = ["Dirichlet"]


class Dirichlet(ExponentialFamily):
    """A distribution on the simplex over the last dim of ``concentration``."""

    arg_constraints = {"concentration": constraints.independent(constraints.positive, 1)}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, concentration: Tensor, validate_args: bool | None = None) -> None:
        if concentration.dim() < 1:
            raise ValueError("holoflow.distributions.Dirichlet: `concentration` parameter must be at least "
                             "one-dimensional.")
        self.concentration = concentration
        super().__init__(concentration.shape[:-1], concentration.shape[-1:], validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "Dirichlet":
        new = self._get_checked_instance(Dirichlet, _instance)
        batch_shape = torch.Size(batch_shape)
        new.concentration = self.concentration.expand(batch_shape + self.event_shape)
        return self._expanded(new, batch_shape)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return sample_dirichlet(self.concentration.expand(self._extended_shape(sample_shape)))

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        c = self.concentration
        return xlogy(c - 1.0, value).sum(-1) + c.sum(-1).lgamma() - c.lgamma().sum(-1)

    @property
    def mean(self) -> Tensor:
        return self.concentration / self.concentration.sum(-1, True)

    @property
    def mode(self) -> Tensor:
        """The normalized ``concentration - 1`` (clamped at 0); where every concentration is below
        one, the vertex of the largest (torch's choice among the modes at the corners)."""
        # max(c - 1, 0) by where: its gradient drops what the unselected corner rows send back
        # (0/0 below), as torch's clamp backward does
        cm1 = where(self.concentration >= 1, self.concentration - 1, 0.0)
        at_corner = (self.concentration < 1).all(dim=-1, keepdim=True)
        mode = cm1 / where(at_corner, 1.0, cm1.sum(-1, True))
        corner = one_hot(mode.argmax(dim=-1), cm1.shape[-1]).to(mode.dtype)
        return where(at_corner, corner, mode)

    @property
    def variance(self) -> Tensor:
        con0 = self.concentration.sum(-1, True)
        return self.concentration * (con0 - self.concentration) / (con0.pow(2) * (con0 + 1))

    def entropy(self) -> Tensor:
        c = self.concentration
        k = c.shape[-1]
        a0 = c.sum(-1)
        return c.lgamma().sum(-1) - a0.lgamma() - (k - a0) * a0.digamma() - ((c - 1.0) * c.digamma()).sum(-1)

    @property
    def _natural_params(self) -> tuple[Tensor]:
        return (self.concentration,)

    def _log_normalizer(self, x: Tensor) -> Tensor:
        return x.lgamma().sum(-1) - x.sum(-1).lgamma()
