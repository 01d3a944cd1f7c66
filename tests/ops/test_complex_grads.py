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
    # contractions and solvers: each once gave the unconjugated (or no) gradient
    "einsum": lambda lib, z, w: lib.einsum("ij,jk->ik", z.reshape(2, 2), w.reshape(2, 2)).reshape(4),
    "einsum_4d": lambda lib, z, w: lib.einsum("bixy,ioxy->boxy", z.reshape(1, 2, 2, 1),
                                              w.reshape(2, 1, 2, 1)).reshape(2),
    "einsum_outer": lambda lib, z, w: lib.einsum("i,j->ij", z, w).sum(0),
    "addmm": lambda lib, z, w: lib.addmm(z.reshape(2, 2), w.reshape(2, 2), z.reshape(2, 2), beta=0.5,
                                         alpha=2).reshape(4),
    "addmm_complex_scalars": lambda lib, z, w: lib.addmm(z.reshape(2, 2), w.reshape(2, 2), w.reshape(2, 2),
                                                         beta=0.5 - 1j, alpha=1 + 2j).reshape(4),
    "baddbmm": lambda lib, z, w: lib.baddbmm(z.reshape(1, 2, 2), z.reshape(1, 2, 2), w.reshape(1, 2, 2)).reshape(4),
    "addbmm": lambda lib, z, w: lib.addbmm(w.reshape(2, 2), z.reshape(2, 2, 1), w.reshape(2, 1, 2)).reshape(4),
    "addmv": lambda lib, z, w: lib.addmv(z[:2], w.reshape(2, 2), z[2:]),
    "addr": lambda lib, z, w: lib.addr(z.reshape(2, 2), w[:2], z[2:]).reshape(4),
    "linear": lambda lib, z, w: lib.nn.functional.linear(z.reshape(2, 2), w.reshape(2, 2), z[:2]).reshape(4),
    "cumprod": lambda lib, z, w: lib.cumprod(z * w, 0),
    "det": lambda lib, z, w: lib.linalg.det(z.reshape(2, 2)).reshape(1) * w,
    "inv": lambda lib, z, w: lib.linalg.inv(z.reshape(2, 2)).reshape(4) * w,
    "solve": lambda lib, z, w: lib.linalg.solve(z.reshape(2, 2), w.reshape(2, 2)).reshape(4),
    "vecdot": lambda lib, z, w: lib.linalg.vecdot(z.reshape(2, 2), w.reshape(2, 2)),
    # a real tensor promoted by cat/stack takes the real part of its share (it once took the complex one)
    "cat_real_complex": lambda lib, z, w: lib.cat([z.abs(), w]),
    "stack_real_complex": lambda lib, z, w: lib.stack([lib.angle(z), w]),
    # decompositions of complex matrices were refused ("expected a floating point input")
    "svdvals": lambda lib, z, w: lib.linalg.svdvals(z.reshape(2, 2)) * w[:2],
    "svd_legacy_v": lambda lib, z, w: lib.svd(z.reshape(2, 2))[2].abs().reshape(4) * w,
    "qr": lambda lib, z, w: lib.linalg.qr(z.reshape(2, 2)).R.abs().reshape(4) * w,
    "eigvalsh": lambda lib, z, w: lib.linalg.eigvalsh(z.reshape(2, 2) + z.reshape(2, 2).mH) * w[:2],
}


def _grads(lib, program):
    z = flow.tensor(Z.numpy(), requires_grad=True) if lib is flow else Z.clone().requires_grad_()
    w = flow.tensor(W.numpy(), requires_grad=True) if lib is flow else W.clone().requires_grad_()
    y = program(lib, z, w)
    (lib.view_as_real(y) * lib.tensor([1.0, -0.5])).sum().backward()
    return [None if t.grad is None else torch.as_tensor(t.grad.resolve_conj().numpy()) for t in (z, w)]


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


def test_complex_vecdot_conjugates_first_operand():
    """torch.linalg.vecdot is sum(conj(x) * y) over the dim; it once skipped the conjugate."""
    got = flow.linalg.vecdot(flow.tensor(Z.numpy()).reshape(2, 2), flow.tensor(W.numpy()).reshape(2, 2), dim=0)
    torch.testing.assert_close(torch.as_tensor(got.numpy()), torch.linalg.vecdot(Z.reshape(2, 2), W.reshape(2, 2), dim=0))


CONVS = {
    "conv1d": (lambda F, x, w, b: F.conv1d(x, w, b, padding="same", dilation=2), (2, 3, 8), (4, 3, 3), (4,)),
    "conv2d": (lambda F, x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2), (2, 4, 5, 5), (4, 2, 3, 3),
               (4,)),
    "conv3d": (lambda F, x, w, b: F.conv3d(x, w), (1, 2, 3, 3, 3), (2, 2, 2, 2, 2), None),
    "conv_transpose1d": (lambda F, x, w, b: F.conv_transpose1d(x, w, b, stride=2, output_padding=1), (1, 2, 5),
                         (2, 3, 3), (3,)),
    "conv_transpose2d": (lambda F, x, w, b: F.conv_transpose2d(x, w, stride=2), (1, 2, 3, 3), (2, 3, 3, 3), None),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_complex_convolution_matches_torch(name):
    """Complex convolutions (torch computes them as three real ones) once raised
    NotImplementedError ('slow_conv2d_cpu' not implemented for 'ComplexFloat'); values and the
    conjugate gradients of input, weight and bias match torch."""
    fn, *shapes = CONVS[name]
    g = torch.Generator().manual_seed(4)
    data = [None if s is None else torch.randn(*s, dtype=torch.complex64, generator=g) for s in shapes]
    results = []
    for lib in (torch, flow):
        ins = [None if d is None else (flow.from_torch(d.clone()) if lib is flow else d.clone()).requires_grad_()
               for d in data]
        y = fn(lib.nn.functional, *ins)
        (lib.view_as_real(y) * lib.tensor([1.0, -0.5])).sum().backward()
        to = (lambda t: t.to_torch()) if lib is flow else (lambda t: t)
        results.append([to(y.detach())] + [to(t.grad) for t in ins if t is not None])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


DOUBLE = {
    "matmul": (lambda lib, a, b: a @ b, [(2, 3), (3, 2)]),
    "bmm": (lambda lib, a, b: lib.bmm(a, b), [(2, 2, 3), (2, 3, 2)]),
    "linear": (lambda lib, a, b: lib.nn.functional.linear(a, b), [(4, 3), (2, 3)]),
    "einsum": (lambda lib, a, b: lib.einsum("ij,jk->ik", a, b), [(2, 3), (3, 2)]),
    "addmm": (lambda lib, c, a, b: lib.addmm(c, a, b), [(2, 2), (2, 3), (3, 2)]),
}


@pytest.mark.parametrize("name", sorted(DOUBLE))
def test_complex_double_backward_equals_torch(name):
    """Gradients of gradients of complex products: the backward ops of matmul and linear once
    differentiated without conjugating, so a gradient penalty on complex weights came out wrong."""
    fn, shapes = DOUBLE[name]
    g = torch.Generator().manual_seed(5)
    data = [torch.randn(*s, dtype=torch.complex64, generator=g) for s in shapes]
    results = []
    for lib in (torch, flow):
        xs = [(flow.from_torch(d.clone()) if lib is flow else d.clone()).requires_grad_() for d in data]
        loss = lib.view_as_real(fn(lib, *xs)).pow(2).sum()
        gs = lib.autograd.grad(loss, xs, create_graph=True)
        gg = lib.autograd.grad(sum(lib.view_as_real(x).sin().sum() for x in gs), xs)
        results.append([torch.as_tensor(t.detach().resolve_conj().numpy()) for t in (*gs, *gg)])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
