"""``VonMises(loc, concentration)``: the circular distribution ``exp(k cos(x - loc)) / (2 pi I0(k))``,
with torch's polynomial approximations of ``log I0``/``log I1`` (Abramowitz and Stegun). Samples are
Best and Fisher's rejection loop (1979), in float64 as torch's, drawing the same ``rand`` batches
in the same order from holoflow's generator, so a seed gives torch's draws."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..core import grad_mode
from ..core.tensor import Tensor
from ..ops.creation import rand, zeros
from ..ops.elementwise import where
from . import constraints
from .base import Distribution
from .utils import broadcast_all, lazy_property

__all__ = ["VonMises"]


def _eval_poly(y: Tensor, coef: list[float]) -> Tensor:
    coef = list(coef)
    result: Any = coef.pop()
    while coef:
        result = coef.pop() + y * result
    return result


_I0_COEF_SMALL = [1.0, 3.5156229, 3.0899424, 1.2067492, 0.2659732, 0.360768e-1, 0.45813e-2]
_I0_COEF_LARGE = [0.39894228, 0.1328592e-1, 0.225319e-2, -0.157565e-2, 0.916281e-2, -0.2057706e-1, 0.2635537e-1,
                  -0.1647633e-1, 0.392377e-2]
_I1_COEF_SMALL = [0.5, 0.87890594, 0.51498869, 0.15084934, 0.2658733e-1, 0.301532e-2, 0.32411e-3]
_I1_COEF_LARGE = [0.39894228, -0.3988024e-1, -0.362018e-2, 0.163801e-2, -0.1031555e-1, 0.2282967e-1,
                  -0.2895312e-1, 0.1787654e-1, -0.420059e-2]
_COEF_SMALL = [_I0_COEF_SMALL, _I1_COEF_SMALL]
_COEF_LARGE = [_I0_COEF_LARGE, _I1_COEF_LARGE]


def _log_modified_bessel_fn(x: Tensor, order: int = 0) -> Tensor:
    """``log(I_order(x))`` for ``x > 0`` and ``order`` 0 or 1."""
    if order not in (0, 1):
        raise AssertionError(f"holoflow.distributions.von_mises: order must be 0 or 1, got {order}")
    y = x / 3.75
    y = y * y
    small = _eval_poly(y, _COEF_SMALL[order])
    if order == 1:
        small = x.abs() * small
    small = small.log()
    y = 3.75 / x
    large = x - 0.5 * x.log() + _eval_poly(y, _COEF_LARGE[order]).log()
    return where(x < 3.75, small, large)


def _rejection_sample(loc: Tensor, concentration: Tensor, proposal_r: Tensor, x: Tensor) -> Tensor:
    """Best and Fisher's loop: every round draws ``rand((3,) + x.shape)`` and keeps the first
    accepted angle of each element, until all are accepted."""
    done = zeros(*x.shape, dtype=torch.bool, device=loc.device)
    while not bool(done.all()):
        u1, u2, u3 = rand(*((3,) + tuple(x.shape)), dtype=loc.dtype, device=loc.device).unbind()
        z = (math.pi * u1).cos()
        f = (1 + proposal_r * z) / (proposal_r + z)
        c = concentration * (proposal_r - f)
        accept = ((c * (2 - c) - u2) > 0) | ((c / u2).log() + 1 - c >= 0)
        if bool(accept.any()):
            x = where(accept, (u3 - 0.5).sign() * f.acos(), x)
            done = done | accept
    return (x + math.pi + loc) % (2 * math.pi) - math.pi


class VonMises(Distribution):
    """Angles (radians) around ``loc`` with ``concentration`` > 0; ``loc`` and values may be any
    real numbers, read modulo 2 pi. ``mean`` and ``variance`` are the circular ones."""

    arg_constraints = {"loc": constraints.real, "concentration": constraints.positive}
    support = constraints.real
    has_rsample = False

    def __init__(self, loc: Any, concentration: Any, validate_args: bool | None = None) -> None:
        self.loc, self.concentration = broadcast_all(loc, concentration)
        super().__init__(self.loc.shape, torch.Size(), validate_args)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        log_prob = self.concentration * (value - self.loc).cos()
        return log_prob - math.log(2 * math.pi) - _log_modified_bessel_fn(self.concentration, order=0)

    @lazy_property
    def _loc(self) -> Tensor:
        return self.loc.to(torch.float64)

    @lazy_property
    def _concentration(self) -> Tensor:
        return self.concentration.to(torch.float64)

    @lazy_property
    def _proposal_r(self) -> Tensor:
        kappa = self._concentration
        tau = 1 + (1 + 4 * kappa ** 2).sqrt()
        rho = (tau - (2 * tau).sqrt()) / (2 * kappa)
        proposal_r = (1 + rho ** 2) / (2 * rho)
        # second order Taylor expansion around 0 for small kappa
        return where(kappa < 1e-5, 1 / kappa + kappa, proposal_r)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """Always drawn in float64 (single precision can hang the loop for small concentrations,
        torch issue #88443), then cast to ``loc``'s dtype."""
        with grad_mode.no_grad():
            shape = self._extended_shape(sample_shape)
            x = zeros(*shape, dtype=self._loc.dtype, device=self.loc.device)
            return _rejection_sample(self._loc, self._concentration, self._proposal_r, x).to(self.loc.dtype)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "VonMises":
        # torch's: a new instance from the expanded parameters (validate_args kept only if given)
        validate_args = self.__dict__.get("_validate_args")
        return type(self)(self.loc.expand(batch_shape), self.concentration.expand(batch_shape),
                          validate_args=validate_args)

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @lazy_property
    def variance(self) -> Tensor:  # type: ignore[override]
        return 1 - (_log_modified_bessel_fn(self.concentration, order=1)
                    - _log_modified_bessel_fn(self.concentration, order=0)).exp()
