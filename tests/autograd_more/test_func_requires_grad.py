"""``requires_grad`` as code inside holoflow.func's transforms reads it, against torch.func: inside
vmap, jvp and jacfwd torch hands the function wrapped tensors that don't require grad there, so a
layer that branches on the flag (hooks its input) takes the other branch; inside grad, vjp and
jacrev they do; linearize runs its function on plain autograd (what requires grad outside does).
``requires_grad_()`` inside those transforms is refused, as torch's. Each program runs through
torch and holoflow."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow

X = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)
W = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75], [-0.5, 1.0, 0.1]], np.float32)


def _plain(v):
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, (torch.Tensor, flow.Tensor)):
        return v.detach().numpy()
    return v


def _same(got, want):
    got, want = _plain(got), _plain(want)
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, np.ndarray):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        assert got == want


class _Model:
    """A linear map (its weight requires grad, closed over by the function) and a layer that
    clips its input's gradient with a hook when that input requires grad, as user code does."""

    def __init__(self, lib):
        self.lib, self.w, self.seen = lib, lib.tensor(W, requires_grad=True), []

    def __call__(self, x):
        h = x @ self.w
        self.seen.append((x.requires_grad, h.requires_grad, self.w.requires_grad))
        if h.requires_grad:
            h.register_hook(lambda g: g.clamp(-0.1, 0.1))
        return self.lib.tanh(h) * 3.0


def _transformed(lib, how):
    """(the transform's result, the weight's gradient through it, what the layer saw)."""
    F, m = lib.func, _Model(lib)
    x, t = lib.tensor(X), lib.tensor(X[::-1].copy())
    total = lambda y: (y * y).sum()   # noqa: E731
    if how == "vmap":
        out = F.vmap(m)(x)
    elif how == "vmap(input requires grad)":
        out = F.vmap(m)(lib.tensor(X, requires_grad=True))
    elif how == "jvp":
        out = F.jvp(m, (x,), (t,))
    elif how == "jacfwd":
        out = F.jacfwd(m)(x[0])
    elif how == "linearize":
        y, fn = F.linearize(m, x)   # (torch's jvp_fn is not differentiable in what the function
        out = (y, fn(t).detach())   # closes over: the gradient compared is the output's alone)
    elif how == "grad":
        out = F.grad(lambda a: total(m(a)))(x)
    elif how == "vjp":
        y, back = F.vjp(m, x)
        out = (y, back(t)[0])
    elif how == "jacrev":
        out = F.jacrev(m)(x[0])
    elif how == "vmap(grad)":
        out = F.vmap(F.grad(lambda a: total(m(a))))(x)
    elif how == "grad(vmap)":
        out = F.grad(lambda a: total(F.vmap(m)(a)))(x)
    else:
        raise AssertionError(how)
    outs = list(out) if isinstance(out, tuple) else [out]
    sum(total(o) for o in outs).backward()
    return outs, m.w.grad, m.seen[:1]


HOW = ["vmap", "vmap(input requires grad)", "jvp", "jacfwd", "linearize", "grad", "vjp", "jacrev", "vmap(grad)",
       "grad(vmap)"]


@pytest.mark.parametrize("how", HOW)
def test_a_layer_that_hooks_its_input_when_it_requires_grad_agrees_with_torch(how):
    # holoflow told the layer its input required grad inside vmap and forward mode (autograd records
    # there), so the layer registered a hook there, which holoflow refuses: RuntimeError where torch
    # skips the hook; under grad, vjp and jacrev both hook and clip
    want, got = _transformed(torch, how), _transformed(flow, how)
    assert got[2] == want[2], f"the layer saw (input, h, weight) requires_grad {got[2]}, torch's {want[2]}"
    _same(got[0], want[0])
    _same(got[1], want[1])


def _flags(lib, how):
    """What a function reads of its input, a result, a closed-over parameter and a product."""
    F, w, seen = lib.func, lib.tensor(W[0], requires_grad=True), []

    def f(x):
        y = x.sin()
        seen.append((x.requires_grad, y.requires_grad, w.requires_grad, (y * w).requires_grad,
                     x[0].requires_grad, y.detach().requires_grad))
        return (y * w).sum()

    x = lib.tensor(X[0])
    {"vmap": lambda: F.vmap(f)(lib.tensor(X)),
     "jvp": lambda: F.jvp(f, (x,), (x,)),
     "jvp(input requires grad)": lambda: F.jvp(f, (lib.tensor(X[0], requires_grad=True),), (x,)),
     "jacfwd": lambda: F.jacfwd(f)(x),
     "grad": lambda: F.grad(f)(x),
     "jacrev": lambda: F.jacrev(f)(x),
     "grad(jvp)": lambda: F.grad(lambda a: F.jvp(f, (a,), (a,))[1])(x),
     "jvp(grad)": lambda: F.jvp(F.grad(f), (x,), (x,)),
     "vmap(jacrev)": lambda: F.vmap(F.jacrev(f))(lib.tensor(X)),
     "linearize": lambda: F.linearize(f, x),
     "linearize(input requires grad)": lambda: F.linearize(f, lib.tensor(X[0], requires_grad=True)),
     "grad(linearize)": lambda: F.grad(lambda a: F.linearize(f, a)[0])(x),
     }[how]()
    return seen[0]


@pytest.mark.parametrize("how", ["vmap", "jvp", "jvp(input requires grad)", "jacfwd", "grad", "jacrev", "grad(jvp)",
                                 "jvp(grad)", "vmap(jacrev)", "linearize", "linearize(input requires grad)",
                                 "grad(linearize)"])
def test_requires_grad_inside_a_transform_is_torch_funcs(how):
    # (holoflow said True for the input, its results and views inside vmap and forward mode)
    assert _flags(flow, how) == _flags(torch, how)


def test_autograd_still_records_what_the_function_is_told_does_not_require_grad():
    # the flag code reads is torch.func's; holoflow's ops that ask whether they record still do:
    # an in-place activation and a fill_ with a tensor (both copy what they save when recording)
    # under jvp and vmap, then an outer backward, against torch
    def run(lib):
        w = lib.tensor(W, requires_grad=True)
        x = lib.tensor(X, requires_grad=True)

        def f(a):
            h = a @ w
            h[..., 0].fill_(a.sum() * 0.5 - 0.3)   # (off elu's kink at 0)
            lib.nn.functional.elu(h, inplace=True)
            return h.tanh() * a
        y, t = lib.func.jvp(f, (x,), (lib.ones_like(x),))
        v = lib.func.vmap(f)(x)
        (y.sum() + t.sum() + v.sum()).backward()
        return [y, t, v, x.grad, w.grad]
    _same(run(flow), run(torch))


@pytest.mark.parametrize("how", ["grad", "vjp", "jvp", "vmap", "jacrev", "jacfwd", "linearize"])
@pytest.mark.parametrize("what", ["input", "result", "fresh"])
def test_requires_grad__inside_a_transform_is_refused_as_torchs(how, what):
    # holoflow made the tensor require grad (and went on) where torch refuses
    def run(lib):
        F = lib.func
        make = {"input": lambda a: a, "result": lambda a: a * 2.0, "fresh": lambda a: lib.ones(3)}[what]

        def f(a):
            make(a).requires_grad_()
            return a.sin()
        x = lib.tensor(X[0])
        {"grad": lambda: F.grad(lambda a: f(a).sum())(x), "vjp": lambda: F.vjp(f, x),
         "jvp": lambda: F.jvp(f, (x,), (x,)), "vmap": lambda: F.vmap(f)(lib.tensor(X)),
         "jacrev": lambda: F.jacrev(f)(x), "jacfwd": lambda: F.jacfwd(f)(x),
         "linearize": lambda: F.linearize(f, x)}[how]()
    if how == "linearize":   # (torch's runs the function on plain autograd, which allows it)
        run(torch)
        run(flow)
        return
    with pytest.raises(RuntimeError, match="requires_grad_"):
        run(torch)
    with pytest.raises(RuntimeError, match=r"requires_grad_\(\) there"):
        run(flow)


@pytest.mark.parametrize("how", ["grad", "vmap"])
@pytest.mark.parametrize("create_graph", [False, True])
def test_autograd_functional_inside_a_transform_is_refused_as_torchs(how, create_graph):
    # torch's autograd.functional makes its inputs require grad with requires_grad_(), refused
    # inside a transform unless create_graph keeps an input that requires grad there (grad's)
    def run(lib):
        def f(a):
            return lib.autograd.functional.jacobian(lambda y: y * y, a, create_graph=create_graph).sum()
        x = lib.tensor(X[0])
        return lib.func.grad(f)(x) if how == "grad" else lib.func.vmap(f)(lib.tensor(X))
    refused = how == "vmap" or not create_graph
    if refused:
        for lib in (torch, flow):
            with pytest.raises(RuntimeError, match="requires_grad_"):
                run(lib)
    else:
        _same(run(flow), run(torch))


def test_outside_transforms_and_in_library_code_nothing_changes():
    # a tensor made to require grad outside, and the factories' requires_grad=True inside
    def run(lib):
        seen = []

        def f(a):
            p = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
            seen.append(p.requires_grad)
            return (a * p).sum()
        x = lib.ones(3).requires_grad_()
        return [lib.func.grad(f)(x), x.requires_grad, seen]
    _same(run(flow), run(torch))
