"""``GeneralizedPareto(loc, scale, concentration)``: the tail distribution with survival function
``(1 + c z)^(-1/c)`` for ``z = (x - loc) / scale`` (``exp(-z)`` at ``c = 0``), torch's formulas
(after TensorFlow Probability's); reparameterized samples are the inverse cdf of one ``rand`` draw.

One divergence: torch compares ``concentration`` with a float32 zero in ``log_prob``/``cdf``, so a
float64 distribution raises RuntimeError there; holoflow compares within the parameters' dtype and
answers."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..core.tensor import Tensor
from ..ops.creation import ones_like, rand, zeros_like
from ..ops.elementwise import where
from . import constraints
from .base import Distribution
from .utils import broadcast_all

__all__ = ["GeneralizedPareto"]


class GeneralizedPareto(Distribution):
    """Special cases: Exponential (``loc = 0, concentration = 0``), Pareto (``concentration > 0,
    loc = scale / concentration``), Uniform (``concentration = -1``)."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive, "concentration": constraints.real}
    has_rsample = True

    def __init__(self, loc: Any, scale: Any, concentration: Any, validate_args: bool | None = None) -> None:
        self.loc, self.scale, self.concentration = broadcast_all(loc, scale, concentration)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "GeneralizedPareto":
        new = self._get_checked_instance(GeneralizedPareto, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape)
        new.scale = self.scale.expand(batch_shape)
        new.concentration = self.concentration.expand(batch_shape)
        return self._expanded(new, batch_shape)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        u = rand(*self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.icdf(u)

    def _safe_concentration(self) -> tuple[Tensor, Tensor]:
        """(``concentration`` is 0 to isclose's tolerance, ``concentration`` with those set to 1)."""
        eq_zero = self.concentration.isclose(zeros_like(self.concentration))
        return eq_zero, where(eq_zero, ones_like(self.concentration), self.concentration)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        z = self._z(value)
        eq_zero, safe_conc = self._safe_concentration()
        y = 1 / safe_conc + ones_like(z)
        where_nonzero = where(y == 0, y, y * (safe_conc * z).log1p())
        return -self.scale.log() - where(eq_zero, z, where_nonzero)

    def log_survival_function(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        z = self._z(value)
        eq_zero, safe_conc = self._safe_concentration()
        return where(eq_zero, -z, -(safe_conc * z).log1p() / safe_conc)

    def log_cdf(self, value: Any) -> Tensor:
        return (-self.log_survival_function(value).exp()).log1p()

    def cdf(self, value: Any) -> Tensor:
        return self.log_cdf(value).exp()

    def icdf(self, value: Any) -> Tensor:
        eq_zero, safe_conc = self._safe_concentration()
        logu = (-value).log1p()
        where_nonzero = self.loc + self.scale / safe_conc * (-safe_conc * logu).expm1()
        return where(eq_zero, self.loc - self.scale * logu, where_nonzero)

    def _z(self, x: Any) -> Tensor:
        return (x - self.loc) / self.scale

    @property
    def mean(self) -> Tensor:
        valid = self.concentration < 1
        safe_conc = where(valid, self.concentration, 0.5)
        return where(valid, self.loc + self.scale / (1 - safe_conc), math.nan)

    @property
    def variance(self) -> Tensor:
        valid = self.concentration < 0.5
        safe_conc = where(valid, self.concentration, 0.25)
        return where(valid, self.scale ** 2 / ((1 - safe_conc) ** 2 * (1 - 2 * safe_conc)), math.nan)

    def entropy(self) -> Tensor:
        return (self.scale.log() + self.concentration + 1).broadcast_to(self._batch_shape)

    @property
    def mode(self) -> Tensor:
        return self.loc

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> constraints.Constraint:
        lower = self.loc
        upper = where(self.concentration < 0, lower - self.scale / self.concentration, math.inf)
        return constraints.interval(lower, upper)
