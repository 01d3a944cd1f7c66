"""holoflow.compile (torch.compile's API): a module or function traced into the graph IR, forward
and backward, and run as two lowered plans inside one autograd Function. Every compiled run is
checked against the same code run eagerly (same numbers, bit for bit with the plain-kernel
backend), and every case that cannot be traced against eager with its warning."""
import warnings

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow import mock_torch
from holoflow.graph import compile_module

nn = flow.nn


def _pair(make):
    """Two copies of ``make()`` with the same weights."""
    flow.manual_seed(0)
    a, b = make(), make()
    b.load_state_dict(a.state_dict())
    return a, b


def _same(x, y):
    assert (x is None) == (y is None)
    if x is not None:
        assert torch.equal(x.detach().to_torch(), y.detach().to_torch()), (x, y)


def _mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.LayerNorm(16), nn.Dropout(0.0), nn.Linear(16, 3))


def _eager_warnings(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in seen if "holoflow.compile" in str(w.message)]


def test_a_compiled_module_trains_as_eager_bit_for_bit():
    model, ref = _pair(_mlp)
    compiled = flow.compile(model, backend="eager")
    opts = [flow.optim.AdamW(m.parameters(), lr=0.05) for m in (model, ref)]
    xs = [flow.randn(5, 6) for _ in range(4)]
    for x in xs:
        losses = []
        for m, opt in zip((compiled, ref), opts):
            opt.zero_grad()
            loss = (m(x) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss)
        _same(*losses)
    for p, q in zip(model.parameters(), ref.parameters()):
        _same(p, q)
        _same(p.grad, q.grad)
    with flow.no_grad():   # inference: the forward plan alone
        _same(compiled(xs[0]), ref(xs[0]))
    plans = compiled._compiler.plans.values()
    assert [p.bwd is not None for p in plans] == [True, False]


def test_input_gradients_retain_graph_and_outputs_of_every_kind():
    w = flow.randn(4, 3, requires_grad=True)
    zeroed = flow.randn(2, requires_grad=True)   # (read, its gradient all zeros)

    def f(x, scale):
        y = x @ w
        return {"y": y * scale, "top": y.argmax(1), "total": (y * zeroed.sum() * 0 + y).sum(), "n": 3, "none": None}

    cf = flow.compile(f, backend="eager")
    x1 = flow.randn(5, 4, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    got, want = cf(x1, 2.0), f(x2, 2.0)
    assert got["n"] == 3 and got["none"] is None and not got["top"].requires_grad
    _same(got["top"], want["top"])
    for out in (got, want):
        (out["y"].sum() + out["total"]).backward(retain_graph=True)
        out["total"].backward()   # a second backward through the retained graph
    _same(x1.grad, x2.grad)
    g_w = w.grad.clone()
    w.grad = None
    (f(x2.detach(), 2.0)["y"].sum() + 2 * f(x2.detach(), 2.0)["total"]).backward()
    assert torch.allclose(g_w.to_torch(), 2 * w.grad.to_torch())   # (both runs accumulated into w)


def test_batchnorm_running_stats_and_train_eval_switches():
    make = lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())  # noqa: E731
    model, ref = _pair(make)
    compiled = flow.compile(model, backend="eager")
    x = flow.randn(2, 3, 6, 6)
    for _ in range(3):
        compiled(x).sum().backward()
        ref(x).sum().backward()
    for a, b in zip(model.buffers(), ref.buffers()):
        _same(a, b)
    _same(model[0].weight.grad, ref[0].weight.grad)
    model.eval()
    ref.eval()
    _same(compiled(x), ref(x))
    assert model[1].num_batches_tracked.item() == 3


def test_custom_functions_and_tensor_hooks_run_once():
    class Straight(flow.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.round()

        @staticmethod
        def backward(ctx, g):
            return g * 2

    lin, ref = _pair(lambda: nn.Linear(3, 3))
    seen = {"post": 0}
    for m in (lin, ref):
        m.weight.register_hook(lambda g: g * 10)
    lin.bias.register_post_accumulate_grad_hook(lambda p: seen.__setitem__("post", seen["post"] + 1))

    def f(m, x):
        return Straight.apply(m(x)).sum()
    cf = flow.compile(lambda x: f(lin, x), backend="eager")
    x = flow.randn(4, 3)
    for _ in range(2):
        cf(x).backward()
        f(ref, x).backward()
    _same(lin.weight.grad, ref.weight.grad)   # the hook scaled once, the custom backward doubled
    _same(lin.bias.grad, ref.bias.grad)
    assert seen["post"] == 2


def test_dropout_draws_anew_each_call_and_backward_uses_that_calls_mask():
    drop = flow.compile(nn.Dropout(0.5), backend="eager")
    x = flow.ones(400, requires_grad=True)
    a, b = drop(x), drop(x)
    assert not torch.equal(a.to_torch(), b.to_torch())
    a.sum().backward()
    _same(x.grad, (a != 0).float() * 2)


def test_calls_that_cannot_be_traced_run_eagerly_with_one_warning():
    def branchy(x):
        return x * 2 if x.sum() > 0 else x * 3
    cf = flow.compile(branchy, backend="eager")
    out, seen = _eager_warnings(lambda: cf(flow.ones(3)))
    assert out.tolist() == [2.0] * 3 and len(seen) == 1 and "bool()" in seen[0]
    out, seen = _eager_warnings(lambda: cf(-flow.ones(3)))
    assert out.tolist() == [-3.0] * 3 and seen == []   # (the signature is known to run eagerly)
    with pytest.raises(RuntimeError, match=r"fullgraph=True\): branchy cannot be traced whole: tracing failed"):
        flow.compile(branchy, backend="eager", fullgraph=True)(flow.ones(3))

    hooked = nn.Linear(3, 2)
    hooked.register_forward_hook(lambda m, i, o: o * 2)
    x = flow.randn(2, 3)
    out, seen = _eager_warnings(lambda: flow.compile(hooked, backend="eager")(x))
    _same(out, hooked(x))
    assert "has forward or backward hooks" in seen[0]

    stash = [flow.randn(3)]   # a tensor reached through a list: not guarded, so not traced

    def hidden(x):
        return x + stash[0]
    out, seen = _eager_warnings(lambda: flow.compile(hidden, backend="eager")(flow.zeros(3)))
    _same(out, stash[0])
    assert "neither parameters, buffers nor tensor attributes" in seen[0]

    def writes(x):
        x.mul_(2)
        return x + 1
    y = flow.ones(2)
    out, seen = _eager_warnings(lambda: flow.compile(writes, backend="eager")(y))
    assert y.tolist() == [2.0, 2.0] and out.tolist() == [3.0, 3.0] and "writes its input(s) [0]" in seen[0]

    out, seen = _eager_warnings(lambda: flow.compile(lambda x: x, backend="eager")(y))
    assert out is y and "returns one of its inputs" in seen[0]


def test_double_backward_and_a_changed_saved_tensor_are_refused():
    lin = nn.Linear(3, 1)
    cl = flow.compile(lin, backend="eager")
    x = flow.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"cannot be differentiated \(backward\(create_graph=True\)"):
        flow.autograd.grad(cl(x).sum(), x, create_graph=True)
    out = cl(x).sum()
    with flow.no_grad():
        lin.weight.add_(1.0)   # the forward read it; backward needs its old value
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*shape \\(1, 3\\)"):
        out.backward()


def test_each_signature_traces_once_and_the_cache_is_bounded():
    lin, ref = _pair(lambda: nn.Linear(4, 2))
    cl = flow.compile(lin, backend="eager")
    plans = cl._compiler.plans
    x = flow.randn(3, 4)
    cl(x)
    cl(flow.randn(3, 4))
    assert len(plans) == 1
    lin.weight.requires_grad_(False)   # frozen: no gradient, a new plan
    cl(x).sum().backward()
    assert lin.weight.grad is None and lin.bias.grad is not None and len(plans) == 2
    lin.weight.requires_grad_(True)
    with flow.autocast("cpu", dtype=flow.bfloat16):
        assert cl(x).dtype == flow.bfloat16
    assert cl(x).dtype == flow.float32 and len(plans) == 3
    lin.weight = nn.Parameter(flow.zeros(2, 4))   # a new object: traced anew, not the old one read
    ref.weight = nn.Parameter(flow.zeros(2, 4))
    _same(cl(x), ref(x))
    n = len(plans)
    for rows in range(1, compile_module.CACHE_SIZE_LIMIT - n + 1):
        cl(flow.randn(rows + 10, 4))
    assert len(plans) == compile_module.CACHE_SIZE_LIMIT
    out, seen = _eager_warnings(lambda: cl(flow.randn(99, 4)))
    assert "cache size limit" in seen[0] and tuple(out.shape) == (99, 2)
    out, seen = _eager_warnings(lambda: cl(flow.randn(98, 4)))   # (said once; nothing more kept)
    assert seen == [] and tuple(out.shape) == (98, 2) and len(plans) == compile_module.CACHE_SIZE_LIMIT


def test_an_optimized_module_is_a_module_of_its_parent():
    inner = _mlp()
    compiled = flow.compile(inner, backend="eager")
    parent = nn.Sequential(compiled, nn.ReLU())
    assert len(list(parent.parameters())) == len(list(inner.parameters())) == 6
    assert list(compiled.state_dict())[0] == "_orig_mod.0.weight"   # (torch's prefix)
    parent.eval()
    inner.note = "mine"
    assert not inner.training and compiled.note == "mine"   # (attributes are the original's)
    x = flow.randn(2, 6)
    _same(parent(x), inner(x).relu())


def test_a_compiled_call_inside_an_nn_graph_is_traced_by_the_graph():
    lin = nn.Linear(3, 2)
    cl = flow.compile(lin, backend="eager")

    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = lin

        def build(self, x):
            return cl(x) * 2
    x = flow.randn(4, 3)
    _same(G()(x), lin(x) * 2)
    assert cl._compiler.plans == {}


def test_decorators_and_methods():
    @flow.compile(backend="eager")
    def double(x):
        return x * 2

    class Scaler(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(flow.tensor(3.0))

        @flow.compile(backend="eager")
        def scale(self, x):
            return x * self.s
    assert double(flow.ones(2)).tolist() == [2.0, 2.0] and double.__name__ == "double"
    m = Scaler()
    m.scale(flow.ones(2)).sum().backward()
    assert m.s.grad.item() == 2.0


def test_torch_compile_under_mock_torch_trains_as_uncompiled():
    src = """
import torch
import torch.nn as nn

def run(compile_it):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if compile_it:
        model = torch.compile(model, backend="eager")
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, type(model).__name__
compiled, plain = run(True), run(False)
"""
    g = {"__name__": "user_script"}
    with mock_torch.enable():
        exec(compile(src, "<script>", "exec"), g)
    assert g["compiled"][0] == g["plain"][0] and g["compiled"][1] == "OptimizedModule"


def test_the_inductor_backend_trains_the_gpt_example_as_eager():
    from holoflow.examples import corpus, gpt
    cfg = gpt.Config(n_layer=1, n_embd=32, n_head=2, block_size=16, batch_size=4)
    data = corpus.encode(corpus.load_text(20_000))
    xb, yb = corpus.get_batch(data, cfg.block_size, cfg.batch_size, np.random.default_rng(0))
    x, y = flow.from_numpy(xb), flow.from_numpy(yb)
    runs = []
    for compiled in (False, True):
        flow.manual_seed(0)
        model = gpt.make_model(flow, cfg)
        opt = gpt.make_optimizer(flow, model, cfg)
        step_model = flow.compile(model) if compiled else model
        runs.append([gpt.train_step(flow, step_model, opt, x, y, 1e-3, cfg) for _ in range(3)])
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-5)


def test_saved_tensor_hooks_make_the_call_eager():
    lin, ref = _pair(lambda: nn.Linear(3, 3))
    cl = flow.compile(lin, backend="eager")
    x = flow.randn(2, 3, requires_grad=True)
    cl(x).sum().backward()   # traced without hooks
    packed = []

    def pack(t):
        packed.append(tuple(t.shape))
        return t
    with flow.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        cl(x).sum().backward()   # eager under the hooks: they see what eager's nodes save
    assert packed
    ref(x.detach().requires_grad_()).sum().backward()
    ref(x.detach().requires_grad_()).sum().backward()
    _same(lin.weight.grad, ref.weight.grad)


def test_module_compile_in_place_keeps_hooks_eager():
    lin, ref = _pair(lambda: nn.Linear(3, 2))
    calls = []
    lin.register_forward_hook(lambda m, i, o: calls.append(tuple(o.shape)) or o * 2)
    ref.register_forward_hook(lambda m, i, o: o * 2)
    assert lin.compile(backend="eager") is None
    x = flow.randn(4, 3, requires_grad=True)
    for _ in range(2):
        out, seen = _eager_warnings(lambda: lin(x))
        _same(out, ref(x))
        assert seen == []   # (the hook runs around the compiled forward, not inside a trace)
    assert calls == [(4, 2), (4, 2)] and isinstance(lin.forward, compile_module.CompiledFunction)
    assert [type(p).__name__ for p in lin.forward._compiler.plans.values()] == ["_Plan"]
    lin.compile(backend="eager")   # again: the original forward compiled anew, not the compiled one
    assert lin.forward._orig_mod.__func__ is nn.Linear.forward
    lin.compile(disable=True)
    assert "forward" not in lin.__dict__
    with pytest.raises(TypeError, match="keyword arguments"):
        lin.compile("eager")
