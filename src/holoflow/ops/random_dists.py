"""The samplers ``holoflow.distributions`` needs beyond random_ops.py: torch's Gamma and Dirichlet
kernels with their reparameterized gradients (``_standard_gamma`` / ``_standard_gamma_grad``,
``_sample_dirichlet`` / ``_dirichlet_grad``).

The draws are torch's own CPU kernels on torch's generator (``generator=None``: the default one),
so ``holoflow.manual_seed(s)`` reproduces ``torch.manual_seed(s)``'s samples, and a global
tensor's shard draws from the generator distributed/rng.py hands its kernel. The gradients are
torch's (implicit reparameterization); the two ``*_grad`` kernels have no derivative in torch
either, so they are declared non-differentiable.
"""
from __future__ import annotations

import torch

from ..core import generators
from ..core.dispatch import apply
from ..core.errors import ArgValueError
from ..core.registry import defop
from ..core.sbp import B, S
from ..core.tensor import Tensor
from .family import elementwise_sbp, like_first_input, tensor_metas

__all__ = ["standard_gamma", "standard_gamma_grad", "sample_dirichlet", "dirichlet_grad"]


def _gen(generator, like: Tensor):
    """The caller's generator, else (eager, on a simulated rank) the rank's own (core/generators.py)."""
    return generators.for_op(generator, like)


def _batch_sbp(metas, attrs):
    """A sampler over the last dim (a simplex): split on any other axis, or broadcast."""
    tens = tensor_metas(metas)
    nd = len(tens[0].shape)
    return [((B,) * len(tens), (B,))] + [((S(a),) * len(tens), (S(a),)) for a in range(nd - 1)]


# d sample / d concentration at fixed uniform noise (torch's implicit gradient of the gamma sampler)
STANDARD_GAMMA_GRAD = defop("standard_gamma_grad", lambda alpha, sample: torch._standard_gamma_grad(alpha, sample),
                            sbp=elementwise_sbp(), shape=like_first_input, differentiable=False)
STANDARD_GAMMA = defop("standard_gamma", lambda alpha, generator: torch._standard_gamma(alpha, generator=generator),
                       grad=lambda c, dy: (dy * apply(STANDARD_GAMMA_GRAD, c.inputs[0], c.out),),
                       save="both", sbp=elementwise_sbp(), shape=like_first_input, random=True, family="random")
DIRICHLET_GRAD = defop("dirichlet_grad", lambda x, alpha, total: torch._dirichlet_grad(x, alpha, total),
                       sbp=elementwise_sbp(), shape=like_first_input, differentiable=False)


def _dirichlet_backward(c, dy):
    """torch's ``_Dirichlet.backward``: the per-coordinate implicit gradient, projected onto the
    simplex's tangent space (the sample sums to one)."""
    x, alpha = c.out, c.inputs[0]
    total = alpha.sum(-1, True).expand_as(alpha)
    grad = apply(DIRICHLET_GRAD, x, alpha, total)
    return (grad * (dy - (x * dy).sum(-1, True)),)


# torch's Dirichlet sampler has no meta kernel: the shape rule says the sample is shaped like alpha
SAMPLE_DIRICHLET = defop("sample_dirichlet",
                         lambda alpha, generator: torch._sample_dirichlet(alpha, generator=generator),
                         grad=_dirichlet_backward, save="both", sbp=_batch_sbp, shape=like_first_input,
                         random=True, family="random")


def standard_gamma(concentration: Tensor, generator=None) -> Tensor:
    """A Gamma(``concentration``, rate 1) draw per element (``torch._standard_gamma``),
    differentiable in ``concentration``."""
    return apply(STANDARD_GAMMA, concentration, generator=_gen(generator, concentration))


def standard_gamma_grad(concentration: Tensor, sample: Tensor) -> Tensor:
    """d sample / d concentration of ``standard_gamma`` at its ``sample`` (``torch._standard_gamma_grad``)."""
    return apply(STANDARD_GAMMA_GRAD, concentration, sample)


def sample_dirichlet(concentration: Tensor, generator=None) -> Tensor:
    """A Dirichlet(``concentration``) draw along the last dim (``torch._sample_dirichlet``),
    differentiable in ``concentration``."""
    if concentration.dim() < 1:
        raise ArgValueError("holoflow.sample_dirichlet: concentration must be at least one-dimensional (the last "
                            "dim is the simplex), got a 0-d tensor")
    return apply(SAMPLE_DIRICHLET, concentration, generator=_gen(generator, concentration))


def dirichlet_grad(x: Tensor, concentration: Tensor, total: Tensor) -> Tensor:
    """The implicit gradient of a Dirichlet sample's coordinates (``torch._dirichlet_grad``)."""
    return apply(DIRICHLET_GRAD, x, concentration, total)
