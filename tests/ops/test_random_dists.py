"""The distributions' samplers (ops/random_dists.py): torch's Gamma and Dirichlet kernels under one
seed (values and reparameterized gradients equal torch's), their gradient kernels, SBP rules."""
import pytest
import torch

import holoflow as flow
from harness import F32, F64, Case, parametrize
from holoflow.ops.random_dists import dirichlet_grad, sample_dirichlet, standard_gamma, standard_gamma_grad
from torch.distributions.dirichlet import _Dirichlet

# torch's _sample_dirichlet has no derivative of its own: torch.distributions wraps it in _Dirichlet,
# whose backward is what holoflow's op declares
_torch_dirichlet = _Dirichlet.apply


def _positive(*shape, gen, dtype, low=0.3):
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 3 + low).to(dtype)


def _simplex_args(dt, g):
    alpha = _positive(4, 3, gen=g, dtype=dt)
    x = torch._sample_dirichlet(alpha, generator=torch.Generator().manual_seed(5))
    return (x, alpha, alpha.sum(-1, True).expand_as(alpha).contiguous()), {}


CASES = [
    Case("standard_gamma", standard_gamma, torch._standard_gamma,
         lambda dt, g: ((_positive(5, 6, gen=g, dtype=dt),), {}), random=True),
    Case("standard_gamma-small-concentration", standard_gamma, torch._standard_gamma,
         lambda dt, g: ((_positive(40, gen=g, dtype=dt, low=0.05),), {}), random=True),
    Case("sample_dirichlet", sample_dirichlet, _torch_dirichlet,
         lambda dt, g: ((_positive(4, 3, gen=g, dtype=dt),), {}), random=True),
    Case("sample_dirichlet-3d", sample_dirichlet, _torch_dirichlet,
         lambda dt, g: ((_positive(2, 3, 5, gen=g, dtype=dt),), {}), random=True),
    Case("standard_gamma_grad", standard_gamma_grad, torch._standard_gamma_grad,
         lambda dt, g: ((_positive(5, 6, gen=g, dtype=dt), _positive(5, 6, gen=g, dtype=dt)), {}), grad=False),
    Case("dirichlet_grad", dirichlet_grad, torch._dirichlet_grad, _simplex_args, grad=False),
]

# (no case has a gradcheck, so parametrize makes none: samplers, and grad ops without derivatives;
# rsample gradients are compared with torch's in tests/lib/test_distributions_more.py)
globals().update(parametrize(CASES))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_generator_argument_draws_from_it(dtype):
    alpha = torch.tensor([0.5, 1.5, 4.0], dtype=dtype)
    want = torch._standard_gamma(alpha, generator=torch.Generator().manual_seed(11))
    got = standard_gamma(flow.from_torch(alpha), generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(got.to_torch(), want)
    want = torch._sample_dirichlet(alpha, generator=torch.Generator().manual_seed(12))
    got = sample_dirichlet(flow.from_torch(alpha), generator=torch.Generator().manual_seed(12))
    torch.testing.assert_close(got.to_torch(), want)


def test_dirichlet_sample_needs_a_simplex_dim():
    with pytest.raises(ValueError, match="holoflow.sample_dirichlet"):
        sample_dirichlet(flow.tensor(1.0))
