"""Complex autograd follows torch's convention (the gradient w.r.t. z is dy * conj(dout/dz)):
conj, and the products/quotients whose gradients need it, against torch."""
import pytest
import torch
from harness import Case, parametrize

import holoflow as flow

C64 = torch.complex64


def _c(*shape, gen):
    return torch.complex(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))


CASES = [Case("conj", lambda x: flow.conj(x), lambda x: torch.conj_physical(x),
              lambda dt, g: ((_c(3, 4, gen=g),), {}), dtypes=(C64,))]
globals().update(parametrize(CASES))

PROGRAMS = {
    "mul": lambda L, a, b: a * b,
    "div": lambda L, a, b: a / b,
    "mul-broadcast": lambda L, a, b: a * b[:1],
    "conj-mul": lambda L, a, b: (a.conj() if L is flow else torch.conj_physical(a)) * b,
    "chain": lambda L, a, b: (a * b) / (a + b) * a,
    "real-times-complex": lambda L, a, b: a * 2.5 + b * a,
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_complex_gradients_match_torch(name):
    gen = torch.Generator().manual_seed(0)
    a0, b0, g0 = _c(2, 3, gen=gen), _c(2, 3, gen=gen), _c(2, 3, gen=gen)
    ta, tb = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    PROGRAMS[name](torch, ta, tb).backward(g0)
    fa, fb = flow.from_torch(a0.clone()).requires_grad_(), flow.from_torch(b0.clone()).requires_grad_()
    PROGRAMS[name](flow, fa, fb).backward(flow.from_torch(g0.clone()))
    torch.testing.assert_close(fa.grad.to_torch(), ta.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fb.grad.to_torch(), tb.grad, rtol=1e-5, atol=1e-6)
