"""holoflow.func against torch.func: functional_call, grad, grad_and_value, vjp, jvp, jacrev,
jacfwd, hessian, vmap and stack_module_state on the same functions and values, composed as users
compose them (per-sample gradients, ensembles, second derivatives), plus their errors."""
import numpy as np
import pytest
import torch

import holoflow as flow


def _t(x):
    """A holoflow tree as torch tensors (for comparison)."""
    if isinstance(x, flow.Tensor):
        return x.to_torch().detach()
    if isinstance(x, dict):
        return {k: _t(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_t(v) for v in x)
    return x


def _f(x):
    if isinstance(x, torch.Tensor):
        return flow.from_torch(x.clone())
    if isinstance(x, dict):
        return {k: _f(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_f(v) for v in x)
    return x


def _close(got, want, tol=1e-5):
    torch.testing.assert_close(_t(got), want, rtol=tol, atol=tol)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# functions written once for both libraries
def f_scalar(lib):
    return lambda x: (lib.sin(x) * x).sum() + (x ** 3).mean()


def f_two(lib):
    return lambda x, y: (lib.tanh(x @ y) ** 2).sum()


def f_vec(lib):
    return lambda x, y: (lib.sin(x) * y, (x * y).sum(0))


def f_tree(lib):
    return lambda p, x: ((x @ p["w"] + p["b"]).relu() ** 2).sum()


# -- grad / grad_and_value ------------------------------------------------------------------------

def test_grad_of_a_scalar_function_and_its_argnums():
    x, y = _rand(3, 4), _rand(4, 2, seed=1)
    _close(flow.func.grad(f_scalar(flow))(_f(x)), torch.func.grad(f_scalar(torch))(x))
    for nums in (0, 1, (0, 1), (1, 0)):
        _close(flow.func.grad(f_two(flow), argnums=nums)(_f(x), _f(y)),
               torch.func.grad(f_two(torch), argnums=nums)(x, y))


def test_grad_of_a_dict_of_parameters_with_aux_and_value():
    p, x = {"w": _rand(4, 3), "b": _rand(3, seed=2)}, _rand(5, 4, seed=3)

    def aux(lib):
        return lambda p, x: (f_tree(lib)(p, x), {"n": x.sum()})
    (g, (v, a)) = flow.func.grad_and_value(aux(flow), has_aux=True)(_f(p), _f(x))
    (tg, (tv, ta)) = torch.func.grad_and_value(aux(torch), has_aux=True)(p, x)
    _close(g, tg)
    _close(v, tv)
    _close(a, ta)
    assert not any(t.requires_grad for t in g.values()) and not v.requires_grad   # nothing outside records


def test_grad_of_grad_and_hessian():
    x = _rand(5)

    def second(lib):
        return lambda x: lib.func.grad(lambda z: (lib.sin(z) * z ** 2).sum())(x).sum()
    _close(flow.func.grad(second(flow))(_f(x)), torch.func.grad(second(torch))(x))
    _close(flow.func.hessian(f_scalar(flow))(_f(x)), torch.func.hessian(f_scalar(torch))(x))
    m = _rand(2, 3, seed=4)
    _close(flow.func.hessian(f_scalar(flow))(_f(m)), torch.func.hessian(f_scalar(torch))(m))


def test_grad_of_an_unused_input_is_zeros_and_inside_autograd_it_stays_differentiable():
    x, y = _rand(3), _rand(3, seed=1)
    g = flow.func.grad(lambda a, b: (a * 2).sum(), argnums=1)(_f(x), _f(y))
    _close(g, torch.zeros(3, dtype=torch.float64))
    xf = _f(x).requires_grad_(True)
    g = flow.func.grad(lambda z: (z ** 3).sum())(xf)          # 3 z^2, recorded
    (h,) = flow.autograd.grad(g.sum(), xf)
    _close(h, 6 * x)


def test_grad_needs_a_scalar_output():
    with pytest.raises(RuntimeError, match=r"holoflow\.func\.grad: the function must return a scalar.*\(3,\)"):
        flow.func.grad(lambda x: x * 2)(flow.ones(3))
    with pytest.raises(RuntimeError, match=r"argnums must be an int.*got 2"):
        flow.func.grad(lambda x: x.sum(), argnums=2)(flow.ones(3))


# -- vjp / jvp / jacobians ------------------------------------------------------------------------

def test_vjp_with_two_primals_and_two_outputs_called_twice():
    x, y = _rand(3, 4), _rand(3, 4, seed=1)
    out, fn = flow.func.vjp(f_vec(flow), _f(x), _f(y))
    tout, tfn = torch.func.vjp(f_vec(torch), x, y)
    _close(out, tout)
    for seed in (5, 6):
        cot = (_rand(3, 4, seed=seed), _rand(4, seed=seed + 10))
        _close(fn(_f(cot)), tfn(cot))
    with pytest.raises(RuntimeError, match="cotangents of shapes"):
        fn((flow.ones(2), flow.ones(4)))


def test_jvp_matches_forward_mode():
    x, y = _rand(3, 4), _rand(3, 4, seed=1)
    tx, ty = _rand(3, 4, seed=2), _rand(3, 4, seed=3)
    out, tan = flow.func.jvp(f_vec(flow), (_f(x), _f(y)), (_f(tx), _f(ty)))
    tout, ttan = torch.func.jvp(f_vec(torch), (x, y), (tx, ty))
    _close(out, tout)
    _close(tan, ttan)


@pytest.mark.parametrize("argnums", [0, (0, 1)])
def test_jacrev_and_jacfwd(argnums):
    x, y = _rand(3, 2), _rand(3, 2, seed=1)
    for ours, theirs in ((flow.func.jacrev, torch.func.jacrev), (flow.func.jacfwd, torch.func.jacfwd)):
        _close(ours(f_vec(flow), argnums)(_f(x), _f(y)), theirs(f_vec(torch), argnums)(x, y))


# -- functional_call / vmap / ensembles -------------------------------------------------------------

def _nets():
    flow.manual_seed(0)
    torch.manual_seed(0)
    fm = flow.nn.Sequential(flow.nn.Linear(4, 6), flow.nn.BatchNorm1d(6), flow.nn.Tanh(), flow.nn.Linear(6, 2))
    tm = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    tm.load_state_dict({k: v.to_torch() for k, v in fm.state_dict().items()})
    return fm, tm


def test_functional_call_replaces_parameters_and_buffers_then_restores_them():
    fm, tm = _nets()
    fm.eval()
    tm.eval()
    new = {"0.weight": _rand(6, 4).float(), "1.running_mean": _rand(6, seed=1).float(), "3.bias": _rand(2, seed=2).float()}
    x = _rand(5, 4, seed=3).float()
    before = {k: v.to_torch().clone() for k, v in fm.state_dict().items()}
    _close(flow.func.functional_call(fm, _f(new), (_f(x),)), torch.func.functional_call(tm, new, (x,)))
    for k, v in fm.state_dict().items():
        torch.testing.assert_close(v.to_torch(), before[k], rtol=0, atol=0)
    parts = ({"0.weight": _f(new["0.weight"])}, {"3.bias": _f(new["3.bias"])})
    _close(flow.func.functional_call(fm, parts, _f(x)),
           torch.func.functional_call(tm, ({"0.weight": new["0.weight"]}, {"3.bias": new["3.bias"]}), x))


def test_functional_call_ties_shared_weights_and_names_bad_keys():
    emb = flow.nn.Embedding(5, 3)
    head = flow.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    m = flow.nn.ModuleDict({"emb": emb, "head": head})
    w = flow.ones(5, 3)
    seen = {}

    def fwd(ids):
        seen["head"] = m["head"].weight
        return m["head"](m["emb"](ids))
    m.forward = fwd
    flow.func.functional_call(m, {"emb.weight": w}, (flow.tensor([1, 2]),))
    assert seen["head"] is w                 # the tied head follows, as torch's tie_weights=True
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\): 'nope'"):
        flow.func.functional_call(m, {"nope": w, "emb.weight": w}, (flow.tensor([1]),), strict=True)
    with pytest.raises(AttributeError, match="ModuleDict has no attribute `nope`"):
        flow.func.functional_call(m, {"nope.x": w}, (flow.tensor([1]),))
    with pytest.raises(RuntimeError, match=r"Missing key\(s\): 'bias'"):
        flow.func.functional_call(flow.nn.Linear(2, 2), {"weight": flow.ones(2, 2)}, (flow.ones(1, 2),), strict=True)
    with pytest.raises(ValueError, match="more than one dict"):
        flow.func.functional_call(flow.nn.Linear(2, 2), ({"bias": flow.ones(2)}, {"bias": flow.ones(2)}),
                                  (flow.ones(1, 2),))


def test_functional_call_swaps_plain_tensor_attributes_and_counts_tied_aliases_as_torch():
    """A key naming a plain tensor attribute (or none yet) sets it for the call, restored after;
    strict=True takes a tied model's deduplicated named_parameters(). (holoflow refused the
    first as an unexpected key and reported the tied alias missing)"""
    def run(lib):
        class Scaled(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = lib.nn.Embedding(4, 3)
                self.head = lib.nn.Linear(3, 4, bias=False)
                self.head.weight = self.emb.weight
                self.scale = lib.tensor(2.0)        # a plain attribute, not a buffer

            def forward(self, ids):
                out = self.head(self.emb(ids)) * self.scale
                return out + self.shift if hasattr(self, "shift") else out
        lib.manual_seed(0)
        m, ids = Scaled(), lib.tensor([1, 3])
        outs = [lib.func.functional_call(m, {"scale": lib.tensor(10.0)}, (ids,)),
                lib.func.functional_call(m, {"shift": lib.tensor(100.0)}, (ids,)),
                lib.func.functional_call(m, dict(m.named_parameters()), (ids,), strict=True)]
        return [o.detach().numpy() for o in outs], float(m.scale), hasattr(m, "shift")
    (want, *flags_t), (got, *flags_f) = run(torch), run(flow)
    assert flags_f == flags_t == [2.0, False]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_per_sample_gradients_vmap_of_grad_of_functional_call():
    fm, tm = _nets()
    fm.eval()
    tm.eval()
    x, y = _rand(6, 4, seed=1).float(), torch.tensor([0, 1, 1, 0, 1, 0])

    def loss(lib, model):
        def f(params, xi, yi):
            out = lib.func.functional_call(model, params, (xi.unsqueeze(0),))
            return lib.nn.functional.cross_entropy(out, yi.unsqueeze(0))
        return f
    fp = {k: v.detach() for k, v in fm.named_parameters()}
    tp = {k: v.detach() for k, v in tm.named_parameters()}
    got = flow.func.vmap(flow.func.grad(loss(flow, fm)), in_dims=(None, 0, 0))(fp, _f(x), _f(y))
    want = torch.func.vmap(torch.func.grad(loss(torch, tm)), in_dims=(None, 0, 0))(tp, x, y)
    _close(got, want)


def test_vmap_dims_and_errors():
    x = _rand(3, 4)
    f = lambda a, b: (a * b.sum(), a.sum())  # noqa: E731
    cases = [((0, 0), (_rand(3, 4), _rand(3, 5, seed=1)), (0, 0)),
             ((0, 1), (_rand(3, 4), _rand(5, 3, seed=1)), (1, 0)),
             ((1, None), (_rand(4, 3), _rand(5, seed=1)), 0),
             ((-1, 0), (_rand(4, 3), _rand(3, 2, seed=1)), (-1, 0))]
    for in_dims, (a, b), out_dims in cases:
        _close(flow.func.vmap(f, in_dims, out_dims)(_f(a), _f(b)), torch.func.vmap(f, in_dims, out_dims)(a, b))
    d = {"u": x, "v": _rand(3, seed=3)}
    _close(flow.func.vmap(lambda t: t["u"] * t["v"])(_f(d)), torch.func.vmap(lambda t: t["u"] * t["v"])(d))
    with pytest.raises(ValueError, match="different sizes"):
        flow.func.vmap(lambda a, b: a + b)(flow.ones(3), flow.ones(4))
    with pytest.raises(ValueError, match="at least one tensor to map over"):
        flow.func.vmap(lambda a: a, in_dims=(None,))(flow.ones(3))


def test_ensemble_with_stack_module_state():
    flow.manual_seed(1)
    fms = [flow.nn.Linear(3, 2) for _ in range(4)]
    tms = [torch.nn.Linear(3, 2) for _ in range(4)]
    for f, t in zip(fms, tms):
        t.load_state_dict({k: v.to_torch() for k, v in f.state_dict().items()})
    x = _rand(5, 3).float()
    fp, fb = flow.func.stack_module_state(fms)
    tp, tb = torch.func.stack_module_state(tms)
    _close(fp, {k: v.detach() for k, v in tp.items()})
    assert all(v.requires_grad for v in fp.values())
    base_f, base_t = fms[0], tms[0]
    got = flow.func.vmap(lambda p, b: flow.func.functional_call(base_f, (p, b), (_f(x),)))(fp, fb)
    want = torch.func.vmap(lambda p, b: torch.func.functional_call(base_t, (p, b), (x,)))(tp, tb)
    _close(got, want)


def test_mock_torch_exposes_func():
    from holoflow import mock_torch
    with mock_torch.enable():
        import torch as mocked
        assert mocked.func.functional_call is flow.func.functional_call


def test_vmap_randomness_modes():
    x = flow.ones(4, 64)
    drop = lambda r: flow.nn.functional.dropout(r, 0.5)  # noqa: E731
    with pytest.raises(RuntimeError, match="draws random numbers; pass randomness="):
        flow.func.vmap(drop)(x)
    same = flow.func.vmap(drop, randomness="same")(x).to_torch()
    assert all(torch.equal(same[0], r) for r in same) and 0 < (same[0] == 0).sum() < 64
    diff = flow.func.vmap(drop, randomness="different")(x).to_torch()
    assert not torch.equal(diff[0], diff[1])
    assert torch.equal(flow.func.vmap(lambda r: r * 2)(x).to_torch(), torch.full((4, 64), 2.0))   # no draws: fine
    with pytest.raises(RuntimeError, match="randomness must be"):       # torch's class
        flow.func.vmap(drop, randomness="sometimes")
