"""holoflow.func against torch.func where they parted: linearize's record under a reverse pass
around it (no_grad regions, saved tensors written in place), Jacobian-vector products
differentiated with respect to their tangents. Each program runs through torch and holoflow and
the values (or exception classes) must agree."""
from __future__ import annotations

import pytest
import torch

import holoflow as flow

from .test_func_levels import X, T, _same, _t




def _region(lib, a):
    b = a * 1.0
    with lib.no_grad():
        c = b * b   # (forward mode runs through it, a reverse pass around does not)
    return c * a.sin()


# -- linearize, as jvp, seals its no_grad regions and marks its stale copies -----------------------

def test_a_reverse_pass_around_linearize_sees_its_no_grad_region_as_constant():
    # holoflow's linearize left its function's no_grad region recorded: grad through its output
    # saw through the region (silent: [0.70, 2.22, 1.97] where torch gives [0.22, 0.54, -1.66])
    def run(lib):
        return lib.func.grad(lambda a: lib.func.linearize(lambda b: _region(lib, b), a)[0].sum())(_t(lib, X))
    _same(run(flow), run(torch))


def test_a_reverse_pass_through_linearize_tangents_is_jvps():
    # torch's own linearize reads uninitialized memory there; its jvp is the reference. holoflow's
    # linearize saw through the region too (silent), and a second call of jvp_fn must agree
    t = _t(torch, T)
    want = torch.func.grad(lambda a: torch.func.jvp(lambda b: _region(torch, b), (a,), (t,))[1].sum())(_t(torch, X))

    def h(a):
        fn = flow.func.linearize(lambda b: _region(flow, b), a)[1]
        return fn(_t(flow, T)).sum() + fn(_t(flow, T) * 2.0).sum()
    _same(flow.func.grad(h)(_t(flow, X)), want * 3.0)


_WRITTEN = lambda a: (lambda b: (b.sin(), b.mul_(2.0))[0])(a * 1.0)   # noqa: E731  (sin saved b)


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
@pytest.mark.parametrize("nest", ["grad", "vjp"])
def test_a_reverse_pass_around_linearize_refuses_a_saved_tensor_written_in_place(lib, nest):
    # holoflow computed from its forward mode's copy of b (silent), where torch refuses the write
    t = _t(lib, T)
    fn = lambda a: lib.func.linearize(_WRITTEN, a)[1](t)   # noqa: E731
    with pytest.raises(RuntimeError, match="modified by an in-?place operation"):
        if nest == "grad":
            lib.func.grad(lambda a: fn(a).sum())(_t(lib, X))
        else:
            lib.func.vjp(fn, _t(lib, X))[1](t)


# -- J t is differentiable with respect to t ------------------------------------------------------

def _sin_x(a):
    return a.sin() * a


@pytest.mark.parametrize("which", ["jvp", "linearize"])
@pytest.mark.parametrize("outer", ["grad", "jvp", "backward"])
def test_jacobian_vector_products_are_differentiable_in_the_tangent(which, outer):
    # holoflow detached J t unless the primals were recorded outside: grad, jvp and backward with
    # respect to the tangent gave zeros or raised (silent zeros)
    def run(lib):
        x = _t(lib, X)
        if which == "jvp":
            fn = lambda s: lib.func.jvp(_sin_x, (x,), (s,))[1]   # noqa: E731
        else:
            fn = lib.func.linearize(_sin_x, x)[1]
        if outer == "grad":
            return lib.func.grad(lambda s: fn(s).sum())(_t(lib, T))
        if outer == "jvp":
            return lib.func.jvp(fn, (_t(lib, T),), (_t(lib, X),))[1]
        s = _t(lib, T, rg=True)
        return lib.autograd.grad((fn(s) * _t(lib, X)).sum(), s)[0]
    _same(run(flow), run(torch))


def test_a_gradient_in_both_the_primal_and_the_tangent():
    def run(lib):
        g = lib.func.grad(lambda a, s: lib.func.jvp(_sin_x, (a,), (s,))[1].pow(2).sum(), argnums=(0, 1))
        return g(_t(lib, X), _t(lib, T))
    for got, want in zip(run(flow), run(torch)):
        _same(got, want)


# -- saved-tensor hooks under grad, vjp and jacrev --------------------------------------------------

def _checkpointed(lib):
    from holoflow.utils.checkpoint import checkpoint as flow_checkpoint
    from torch.utils.checkpoint import checkpoint as torch_checkpoint
    ck = torch_checkpoint if lib is torch else flow_checkpoint
    return lambda a: ck(lambda b: b.sin() * b, a, use_reentrant=False).sum()


def _hooks(lib):
    return lib.autograd.graph.saved_tensors_hooks(lambda p: p, lambda p: p)


def _hooks_around_grad(lib, x):
    with _hooks(lib):
        return lib.func.grad(lambda a: (a * a).sum())(x)


_REFUSED = {
    "grad(checkpoint)": lambda lib, x: lib.func.grad(_checkpointed(lib))(x),
    "vjp(checkpoint)": lambda lib, x: lib.func.vjp(_checkpointed(lib), x),
    "jacrev(checkpoint)": lambda lib, x: lib.func.jacrev(_checkpointed(lib))(x),
    "hessian(checkpoint)": lambda lib, x: lib.func.hessian(_checkpointed(lib))(x),
    "vmap(grad(checkpoint))": lambda lib, x: lib.func.vmap(lib.func.grad(_checkpointed(lib)))(x.reshape(3, 1)),
    "hooks around grad": _hooks_around_grad,
}


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
@pytest.mark.parametrize("name", sorted(_REFUSED))
def test_reverse_transforms_refuse_saved_tensor_hooks(lib, name):
    # torch.func's grad, vjp and jacrev refuse saved-tensor hooks (a non-reentrant checkpoint is
    # such hooks), pushed inside the function or around the transform; holoflow ran them
    with pytest.raises(RuntimeError, match="support saved tensor hooks"):
        _REFUSED[name](lib, _t(lib, X))
    with _hooks(lib):   # (refused only while the transform runs)
        pass


def test_forward_transforms_and_vmap_allow_saved_tensor_hooks():
    def run(lib):
        f, x = _checkpointed(lib), _t(lib, X)
        with _hooks(lib):
            got = [lib.func.vmap(f)(x.reshape(3, 1)), lib.func.jacfwd(f)(x), *lib.func.jvp(f, (x,), (_t(lib, T),))]
        vjp_fn = lib.func.vjp(lambda a: (a * a).sum(), x)[1]
        with _hooks(lib):   # (torch's vjp_fn runs outside the refusal)
            got.append(vjp_fn(_t(lib, 1.0))[0])
        return got
    for got, want in zip(run(flow), run(torch)):
        _same(got, want)


# -- a tensor handed in and returned as it is ----------------------------------------------------

def test_an_aux_output_that_is_an_enclosing_transforms_input_stays_differentiable():
    # fuzzer seed 25747: grad's aux returning jacrev's input b unchanged was detached (a leaf's
    # history was taken to reach nothing outside), so jacrev gave zeros for d aux / d b where
    # torch gives the identity (silent); a closed-over parameter returned as aux likewise
    def run(lib):
        w = lib.tensor([0.25, -0.5, 1.0], requires_grad=True)

        def f(a, b):
            return (a * a * b).sum(), (b, b * 2.0, w)
        a, b = lib.tensor([1.0, 2.0, 3.0]), lib.tensor([0.5, -1.0, 2.0])
        jac = lib.func.jacrev(lambda x, y: lib.func.grad(f, argnums=0, has_aux=True)(x, y)[1][:2],
                              argnums=(0, 1))(a, b)
        aux = lib.func.grad(f, has_aux=True)(a, b)[1][2]
        (aux * aux).sum().backward()
        return [jac[0][0], jac[0][1], jac[1][0], jac[1][1], aux.requires_grad, w.grad]
    got, want = run(flow), run(torch)
    assert got[4] == want[4]
    for g, t in zip(got[:4] + got[5:], want[:4] + want[5:]):
        _same(g, t)
