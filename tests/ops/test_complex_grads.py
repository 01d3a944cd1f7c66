"""Gradients through complex tensors follow torch's convention (the conjugate Wirtinger
derivative: ``dy * conj(f'(z))`` for a holomorphic ``f``), op by op, against torch. The rules are
written for real tensors; ops declared ``holomorphic`` (ops/family.py) conjugate around them."""
import pytest
import torch

import holoflow as flow

Z = torch.randn(4, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
W = torch.randn(4, dtype=torch.complex64, generator=torch.Generator().manual_seed(1))

PROGRAMS = {
    **{n: (lambda lib, z, w, n=n: getattr(lib, n)(z)) for n in
       ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "square", "reciprocal", "sin",
        "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "sigmoid", "neg")},
    **{n: (lambda lib, z, w, n=n: getattr(lib, n)(z, w)) for n in ("mul", "div", "add", "sub", "pow")},
    "pow_scalar": lambda lib, z, w: z ** 3,
    "scalar_pow": lambda lib, z, w: 2.0 ** z,
    "matmul": lambda lib, z, w: (z.reshape(2, 2) @ w.reshape(2, 2)).reshape(4),
    "prod": lambda lib, z, w: z.prod().reshape(1) * w,
    "abs": lambda lib, z, w: lib.abs(z) * w,
    "chain": lambda lib, z, w: (z * w).exp().sin() / (z + 2),
}


def _grads(lib, program):
    z = flow.tensor(Z.numpy(), requires_grad=True) if lib is flow else Z.clone().requires_grad_()
    w = flow.tensor(W.numpy(), requires_grad=True) if lib is flow else W.clone().requires_grad_()
    y = program(lib, z, w)
    (lib.view_as_real(y) * lib.tensor([1.0, -0.5])).sum().backward()
    return [None if t.grad is None else torch.as_tensor(t.grad.numpy()) for t in (z, w)]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_complex_gradient_equals_torch(name):
    want, got = _grads(torch, PROGRAMS[name]), _grads(flow, PROGRAMS[name])
    for a, b in zip(want, got):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_real_tensors_unchanged():
    x = flow.tensor([0.5, 1.0, 2.0], requires_grad=True)
    (x.exp() * x.log()).sum().backward()
    t = torch.tensor([0.5, 1.0, 2.0], requires_grad=True)
    (t.exp() * t.log()).sum().backward()
    assert torch.equal(x.grad._data, t.grad)
