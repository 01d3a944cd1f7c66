"""holoflow.func's transform levels and forward mode against torch.func: levels are per thread,
forward mode runs through no_grad regions and checkpoints, what ``requires_grad`` reports inside
the transforms, in-place writes under forward mode. Each program runs through torch and holoflow
and the values (or exception classes) must agree."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import holoflow as flow


def _t(lib, values, rg: bool = False):
    return lib.tensor(values, dtype=lib.float64, requires_grad=rg)


def _np(x) -> np.ndarray:
    return np.asarray(x.detach().tolist(), dtype=np.float64)


def _same(got, want) -> None:
    np.testing.assert_allclose(_np(got), _np(want), rtol=1e-10, atol=1e-12)


X, T = [0.5, 1.0, 2.0], [1.0, -0.5, 2.0]


# -- levels are per thread ------------------------------------------------------------------------

@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_a_transform_in_another_thread_does_not_change_which_hooks_fire(lib):
    # thread A sits inside grad(f) (one level deep) while this thread runs a plain backward with a
    # hook: holoflow's level was process-wide, so the backward here ran at A's level and skipped
    # the hook registered at level 0 (silent)
    inside, done = threading.Event(), threading.Event()
    got = {}

    def body(a):
        inside.set()
        done.wait(30)
        return (a * a).sum()

    def other():
        got["g"] = lib.func.grad(body)(_t(lib, X))

    x = _t(lib, X, rg=True)
    y = x * 2.0
    y.register_hook(lambda g: g * 10.0)
    th = threading.Thread(target=other)
    th.start()
    try:
        assert inside.wait(30)
        y.sum().backward()
    finally:
        done.set()
        th.join(30)
    _same(x.grad, _t(lib, [20.0] * 3))
    _same(got["g"], _t(lib, [2 * v for v in X]))


# -- checkpoint(use_reentrant=False) --------------------------------------------------------------

def _ck(lib):
    if lib is torch:
        return torch.utils.checkpoint.checkpoint
    from holoflow.utils.checkpoint import checkpoint
    return checkpoint


def _checkpoint_program(lib) -> list:
    ck = _ck(lib)
    x, w = _t(lib, X, rg=True), _t(lib, [1.5, -1.0, 0.5], rg=True)
    (g,) = lib.autograd.grad(ck(lambda a: (a * w).sin() * a, x, use_reentrant=False).sum(), x, create_graph=True)
    untouched = w.grad is None
    second = lib.autograd.grad(g.sum(), (x, w))
    f = (lambda a: ck(lambda b: b.sin() * b * w, a, use_reentrant=False))
    _, tangent = lib.func.jvp(f, (x.detach(),), (_t(lib, T),))
    jac = lib.func.jacfwd(f)(x.detach())
    y = ck(lambda a: (a * w).exp(), x, use_reentrant=False)
    y.sum().backward()
    return [lib.tensor([float(untouched)]), g, *second, tangent, jac, x.grad, w.grad]


def test_a_non_reentrant_checkpoint_is_the_graph_itself():
    # holoflow's recomputed in a custom Function's backward without create_graph: no second
    # derivative (no error: zeros), zero tangents under jvp/jacfwd (silent), and autograd.grad of
    # x alone wrote .grad into the closed-over w
    for got, want in zip(_checkpoint_program(flow), _checkpoint_program(torch)):
        _same(got, want)


def test_a_non_reentrant_checkpoint_replays_random_draws():
    ck = _ck(flow)
    x = _t(flow, X, rg=True)
    flow.manual_seed(3)
    y = ck(lambda a: flow.nn.functional.dropout(a.sin(), 0.5) * a, x, use_reentrant=False)
    y.sum().backward()
    flow.manual_seed(3)
    x2 = _t(flow, X, rg=True)
    (flow.nn.functional.dropout(x2.sin(), 0.5) * x2).sum().backward()
    _same(x.grad, x2.grad)


# -- no_grad does not stop forward mode ----------------------------------------------------------

def _region_fn(lib, how: str):
    def f(a):
        if how == "no_grad":
            with lib.no_grad():
                b = a.sin()
        elif how == "set_grad_enabled":
            with lib.set_grad_enabled(False):
                b = a.sin()
        elif how == "decorator":
            b = lib.no_grad()(lambda v: v.sin())(a)
        elif how == "enable_grad":   # (enable_grad inside: every level records again)
            with lib.no_grad(), lib.enable_grad():
                b = a.sin()
        else:
            with lib.inference_mode():   # (torch's forward AD stops here)
                b = a.sin()
        return b * a
    return f


@pytest.mark.parametrize("how", ["no_grad", "set_grad_enabled", "decorator", "enable_grad", "inference"])
def test_forward_mode_runs_through_no_grad(how):
    # holoflow's forward mode is reverse mode, which no_grad stopped: zero tangents (silent)
    def run(lib):
        f = _region_fn(lib, how)
        x, t = _t(lib, X), _t(lib, T)
        out, tangent = lib.func.jvp(f, (x,), (t,))
        return [out, tangent, lib.func.jacfwd(f)(x), lib.func.linearize(f, x)[1](t)]
    for got, want in zip(run(flow), run(torch)):
        _same(got, want)


def test_a_reverse_transform_around_forward_mode_does_not_see_through_no_grad():
    # the region forward mode records is a constant to the grad around it, as torch's
    def run(lib):
        f, t = _region_fn(lib, "no_grad"), _t(lib, T)
        w = _t(lib, [0.3, -0.2, 0.9], rg=True)
        primal = lib.func.grad(lambda a: lib.func.jvp(f, (a,), (t,))[0].sum())(_t(lib, X))
        out = lib.func.jvp(lambda a: _region_fn(lib, "no_grad")(a * w), (_t(lib, X),), (t,))[0]
        (gw,) = lib.autograd.grad(out.sum(), w)
        return [primal, gw]
    for got, want in zip(run(flow), run(torch)):
        _same(got, want)


def _scalar_region(lib):
    def f(a):
        with lib.no_grad():
            b = a.sin() * a
        return (b * a.exp()).sum() + (a * a).sum()
    return f


_AROUND = {
    "jvp(grad)": lambda lib, x, t: lib.func.jvp(lib.func.grad(_scalar_region(lib)), (x,), (t,)),
    "hessian": lambda lib, x, t: (lib.func.hessian(_scalar_region(lib))(x),),
    "jacfwd(jacrev)": lambda lib, x, t: (lib.func.jacfwd(lib.func.jacrev(_scalar_region(lib)))(x),),
    "jacrev(jacrev)": lambda lib, x, t: (lib.func.jacrev(lib.func.jacrev(_scalar_region(lib)))(x),),
    "vmap(jvp)": lambda lib, x, t: lib.func.vmap(lambda a, b: lib.func.jvp(_region_fn(lib, "no_grad"), (a,), (b,)))(
        x.reshape(3, 1), t.reshape(3, 1)),
    "jvp(vmap)": lambda lib, x, t: lib.func.jvp(lib.func.vmap(_region_fn(lib, "no_grad")), (x.reshape(3, 1),),
                                                (t.reshape(3, 1),)),
    "jvp(jvp)": lambda lib, x, t: lib.func.jvp(lambda a: lib.func.jvp(_region_fn(lib, "no_grad"), (a,), (t,))[1],
                                               (x,), (t,)),
}


@pytest.mark.parametrize("name", sorted(_AROUND))
def test_no_grad_inside_transforms_composed_with_forward_mode(name):
    # a reverse transform inside forward mode sees the region as a constant, the forward mode
    # around it sees through (jvp(grad(f)), hessian: holoflow's tangents through it were zeros)
    for got, want in zip(_AROUND[name](flow, _t(flow, X), _t(flow, T)), _AROUND[name](torch, _t(torch, X), _t(torch, T))):
        _same(got, want)


@pytest.mark.parametrize("name", ["grad(jvp tangent)", "jacrev(jacfwd)", "vjp(jvp)", "closure"])
def test_reverse_mode_over_a_tangent_through_no_grad(name):
    # the tangent's terms from inside the region come from the region's nodes' rules, run in
    # forward mode's reverse passes: they record into the region too, so a reverse pass around
    # takes them as constants, as torch's (computed under no_grad there); holoflow's
    # differentiated them (silent)
    def run(lib):
        x, t, f = _t(lib, X), _t(lib, T), _region_fn(lib, "no_grad")
        if name == "jacrev(jacfwd)":
            return lib.func.jacrev(lib.func.jacfwd(_scalar_region(lib)))(x)
        if name == "vjp(jvp)":
            return lib.func.vjp(lambda a: lib.func.jvp(f, (a,), (t,))[1], x)[1](t)[0]
        if name == "closure":
            w = _t(lib, [0.3, -0.2, 0.9], rg=True)
            return lib.autograd.grad(lib.func.jvp(lambda a: f(a * w) * w, (x,), (t,))[1].sum(), w)[0]
        return lib.func.grad(lambda a: lib.func.jvp(f, (a,), (t,))[1].sum())(x)
    _same(run(flow), run(torch))


# -- in-place writes under forward mode ------------------------------------------------------------

_WRITES = {
    "saved_then_written": lambda a: (lambda b: (b.sin(), b.mul_(2.0))[0])(a * 1.0),
    "saved_then_written_view": lambda a: (lambda b: ((b * b).sum(0), b[1].exp_())[0])(a.reshape(3, 1) * 1.0),
    "sigmoid_": lambda a: (a * 1.0).sigmoid_() * a,
    "copy_": lambda a: (a * 2.0).copy_(a.sin()),
}


@pytest.mark.parametrize("name", sorted(_WRITES))
def test_forward_mode_reads_what_the_ops_saw_before_a_later_write(name):
    # torch's forward mode computes a tangent as the op runs; holoflow's reverse passes read the
    # saved tensor after the function returned, and the write in between raised the version error
    def run(lib):
        f, x, t = _WRITES[name], _t(lib, X), _t(lib, T)
        return [*lib.func.jvp(f, (x,), (t,)), lib.func.jacfwd(f)(x), lib.func.linearize(f, x)[1](t)]
    for got, want in zip(run(flow), run(torch)):
        _same(got, want)


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
@pytest.mark.parametrize("nest", ["jvp(grad)", "grad(jvp)", "jacrev(jacfwd)"])
def test_a_reverse_transform_with_forward_mode_still_refuses_the_write(lib, nest):
    # reverse mode reads the saved tensor itself (inside forward mode) or through the tangent's
    # record (around it): torch's refuses the write, and so does holoflow's, which computed
    # grad(jvp(f)) from its forward mode's copy (test_fuzz_func seed 3943)
    f, x, t = _WRITES["saved_then_written"], _t(lib, X), _t(lib, T)
    with pytest.raises(RuntimeError, match="modified by an in-?place operation"):
        if nest == "jvp(grad)":
            lib.func.jvp(lib.func.grad(lambda a: f(a).sum()), (x,), (t,))
        elif nest == "grad(jvp)":
            lib.func.grad(lambda a: lib.func.jvp(f, (a,), (t,))[1].sum())(x)
        else:
            lib.func.jacrev(lib.func.jacfwd(f))(x)


# -- node hooks and retain_grad belong to their transform's level --------------------------------

def _node_hook_program(lib) -> list:
    calls = []
    x = _t(lib, X, rg=True)
    z = _t(lib, T, rg=True) * 2.0   # (recorded outside: its node belongs to the code outside)

    def f(a):
        y = a.sin()
        y.grad_fn.register_hook(lambda gi, go: calls.append("post"))
        y.grad_fn.register_prehook(lambda go: calls.append("pre"))
        z.grad_fn.register_prehook(lambda go: calls.append("outer"))
        return (y * y * z).sum()
    g, v = lib.func.grad_and_value(f)(x)
    inside = list(calls)
    calls.clear()
    v.backward()
    return [inside, list(calls)]


def test_a_node_hook_inside_a_transform_fires_in_its_backward_alone():
    # holoflow's node hooks were not level-tagged: those registered inside grad fired again in a
    # backward outside, and changed its gradients when they returned any (silent)
    assert _node_hook_program(flow) == _node_hook_program(torch)


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
@pytest.mark.parametrize("transform", ["grad", "vmap", "jvp"])
def test_retain_grad_inside_a_transform_is_refused(lib, transform):
    w = _t(lib, T, rg=True)

    def f(a):
        y = a * w
        y.retain_grad()
        return y.sum() if transform == "grad" else y
    x = _t(lib, X)
    with pytest.raises(RuntimeError):
        if transform == "grad":
            lib.func.grad(f)(x)
        elif transform == "vmap":
            lib.func.vmap(f)(x)
        else:
            lib.func.jvp(f, (x,), (x,))


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_forward_mode_runs_where_saved_tensor_hooks_are_disabled(lib):
    # (forward mode's copies of what is saved are holoflow's own saved-tensor hooks, which
    # disable_saved_tensors_hooks does not refuse)
    x = _t(lib, X)

    def f(a):
        with lib.autograd.graph.disable_saved_tensors_hooks("no hooks here"):
            return a.sin() * a
    with lib.autograd.graph.disable_saved_tensors_hooks("no hooks here"):
        outside = lib.func.jvp(lambda a: a.sin() * a, (x,), (x,))[1]
    _same(lib.func.jvp(f, (x,), (x,))[1], outside)
    _same(outside, x.cos() * x * x + x.sin() * x)


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_a_non_reentrant_checkpoint_checks_what_it_recomputes(lib):
    ck, runs = _ck(lib), [0]

    def f(a):   # (saves a tensor of another shape when run again)
        runs[0] += 1
        return (a[:4 - runs[0]].sin() * 2.0).sum()
    x = _t(lib, X + [3.0], rg=True)
    with pytest.raises(RuntimeError, match="metadata"):
        ck(f, x, use_reentrant=False).backward()


def test_is_grad_enabled_inside_no_grad_under_jvp_is_false_as_torchs():
    """Forward mode keeps recording through a no_grad region (its tangents), but the flag user code
    reads there is torch's: False (holoflow said True)."""
    def flags(lib):
        seen = []

        def f(x):
            with lib.no_grad():
                seen.append(lib.is_grad_enabled())
            seen.append(lib.is_grad_enabled())
            return x * 2
        lib.func.jvp(f, (lib.ones(2),), (lib.ones(2),))
        return seen
    assert flags(flow) == flags(torch)
