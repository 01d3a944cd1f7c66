"""``LKJCholesky(dim, concentration=1.0)``: lower Cholesky factors ``L`` of correlation matrices
with ``p(L L^T)`` proportional to ``det(L L^T)^(concentration - 1)`` (after NumPyro, as torch's).
Samples are the onion method (Lewandowski, Kurowicka and Joe, 2009), vectorized as torch's: one
Beta draw per row (holoflow's Beta sampler) then one ``randn`` batch, so a seed gives torch's draws."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..core import grad_mode
from ..core.dtype import finfo
from ..core.tensor import Tensor
from ..ops.numeric import mvlgamma
from ..ops.creation import arange, randn
from ..ops.stacking import diag_embed
from ..ops.shape import cat
from . import constraints
from .base import Distribution
from .beta import Beta
from .utils import broadcast_all

__all__ = ["LKJCholesky"]


class LKJCholesky(Distribution):
    """``dim`` x ``dim`` factors (``dim`` >= 2); ``concentration`` (eta) > 0, 1 for the uniform
    distribution over correlation matrices."""

    arg_constraints = {"concentration": constraints.positive}
    support = constraints.corr_cholesky

    def __init__(self, dim: int, concentration: Any = 1.0, validate_args: bool | None = None) -> None:
        if dim < 2:
            raise ValueError(f"holoflow.distributions.LKJCholesky: expected dim to be an integer greater than or "
                             f"equal to 2. Found dim={dim}.")
        self.dim = dim
        (self.concentration,) = broadcast_all(concentration)
        batch_shape = self.concentration.shape
        event_shape = torch.Size((dim, dim))
        # the Beta of each row's squared norm (Sec. 3.2 of the paper), vectorized over the rows
        marginal_conc = self.concentration + 0.5 * (self.dim - 2)
        offset = arange(self.dim - 1, dtype=self.concentration.dtype, device=self.concentration.device)
        offset = cat([offset.new_zeros((1,)), offset])
        beta_conc1 = offset + 0.5
        beta_conc0 = marginal_conc.unsqueeze(-1) - 0.5 * offset
        self._beta = Beta(beta_conc1, beta_conc0)
        super().__init__(batch_shape, event_shape, validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "LKJCholesky":
        new = self._get_checked_instance(LKJCholesky, _instance)
        batch_shape = torch.Size(batch_shape)
        new.dim = self.dim
        new.concentration = self.concentration.expand(batch_shape)
        new._beta = self._beta.expand(batch_shape + (self.dim,))
        return self._expanded(new, batch_shape)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """The onion method, sampling ``w`` (the factor's rows) directly: row ``i``'s direction is
        a normalized Gaussian over its first ``i`` entries, its squared norm a Beta draw."""
        with grad_mode.no_grad():
            y = self._beta.sample(sample_shape).unsqueeze(-1)
            u_normal = randn(*self._extended_shape(sample_shape), dtype=y.dtype, device=y.device).tril(-1)
            u_hypersphere = u_normal / u_normal.norm(dim=-1, keepdim=True)
            # the first row is 0 / 0: zero it
            first_row = (arange(self.dim, device=y.device) == 0).unsqueeze(-1)
            u_hypersphere = u_hypersphere.masked_fill(first_row, 0.0)
            w = y.sqrt() * u_hypersphere
            diag_elems = (1 - w.pow(2).sum(-1)).clamp(min=finfo(w.dtype).tiny).sqrt()
            return w + diag_embed(diag_elems)

    def log_prob(self, value: Any) -> Tensor:
        """``sum_i (2 (eta - 1) + dim - i) log L_ii`` (the density of ``L L^T`` times the Jacobian of
        the Cholesky map) minus the normalizer of the paper (p. 1999)."""
        if self._validate_args:
            self._validate_sample(value)
        diag_elems = value.diagonal(dim1=-1, dim2=-2)[..., 1:]
        order = arange(2, self.dim + 1, device=self.concentration.device)
        order = 2 * (self.concentration - 1).unsqueeze(-1) + self.dim - order
        unnormalized_log_pdf = (order * diag_elems.log()).sum(-1)
        dm1 = self.dim - 1
        alpha = self.concentration + 0.5 * dm1
        denominator = alpha.lgamma() * dm1
        numerator = mvlgamma(alpha - 0.5, dm1)
        # the paper's pi constant is D (D - 1) / 4 log(pi), mvlgamma's (D - 1)(D - 2) / 4 log(pi)
        pi_constant = 0.5 * dm1 * math.log(math.pi)
        return unnormalized_log_pdf - (pi_constant + numerator - denominator)
