"""Optimizers vs torch.optim: same weights, same grads, several steps; state_dict format."""
import pytest
import torch

import holoflow as flow
from holoflow import optim
from holoflow.core.errors import UnsupportedError

CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.05)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.1, momentum=0.5, dampening=0.3, maximize=True)),
    ("Adam", dict(lr=0.05)),
    ("Adam", dict(lr=0.05, betas=(0.8, 0.9), weight_decay=0.1, amsgrad=True)),
    ("Adam", dict(lr=0.05, maximize=True, eps=1e-3)),
    ("AdamW", dict(lr=0.05)),
    ("AdamW", dict(lr=0.05, weight_decay=0.3, amsgrad=True)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, alpha=0.9, centered=True, momentum=0.8, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.2, weight_decay=0.1)),
]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(CASES)]


def _pair(name, kw, foreach, dtype=torch.float64, groups=False):
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(3, 4, generator=g, dtype=dtype), torch.randn(5, generator=g, dtype=dtype),
            torch.randn(2, 2, generator=g, dtype=dtype)]
    tp = [torch.nn.Parameter(w.clone()) for w in init]
    fp = [flow.from_torch(w.clone()).requires_grad_() for w in init]
    if groups:
        tp = [{"params": tp[:2]}, {"params": tp[2:], "lr": 0.003}]
        fp = [{"params": fp[:2]}, {"params": fp[2:], "lr": 0.003}]
    return getattr(torch.optim, name)(tp, **kw), getattr(optim, name)(fp, foreach=foreach, **kw)


def _params(opt):
    return [p for grp in opt.param_groups for p in grp["params"]]


def _steps(topt, fopt, n, seed=1, skip=None):
    g = torch.Generator().manual_seed(seed)
    for step in range(n):
        for i, (tp, fp) in enumerate(zip(_params(topt), _params(fopt))):
            if skip is not None and step == 0 and i == skip:   # a param without grad this step
                tp.grad, fp.grad = None, None
                continue
            grad = torch.randn(tp.shape, generator=g, dtype=tp.dtype)
            tp.grad, fp.grad = grad.clone(), flow.from_torch(grad.clone())
        topt.step()
        fopt.step()


def _assert_same(topt, fopt, exact):
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-12, atol=1e-13)
    for tp, fp in zip(_params(topt), _params(fopt)):
        torch.testing.assert_close(fp.to_torch(), tp.detach(), **tol)
    for tp, fp in zip(_params(topt), _params(fopt)):
        ts, fs = topt.state[tp], fopt.state[fp]
        assert sorted(ts) == sorted(fs)
        for k in ts:
            torch.testing.assert_close(fs[k].to_torch(), ts[k], **tol)
            assert fs[k].dtype == flow.float32 if k == "step" else fs[k].dtype == fp.dtype


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_foreach_path_matches_torch_exactly(name, kw):
    topt, fopt = _pair(name, kw, foreach=None)
    _steps(topt, fopt, 6, skip=1)
    _assert_same(topt, fopt, exact=True)


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_op_path_matches_torch(name, kw):
    topt, fopt = _pair(name, kw, foreach=False)
    _steps(topt, fopt, 6, skip=1)
    _assert_same(topt, fopt, exact=False)


@pytest.mark.parametrize("name,kw", CASES[1::2], ids=IDS[1::2])
def test_param_groups_with_different_lrs(name, kw):
    topt, fopt = _pair(name, kw, foreach=None, groups=True)
    _steps(topt, fopt, 4)
    _assert_same(topt, fopt, exact=True)
    assert [g["lr"] for g in fopt.param_groups] == [g["lr"] for g in topt.param_groups]


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_state_dict_format_and_round_trip(name, kw):
    topt, fopt = _pair(name, kw, foreach=None, groups=True)
    _steps(topt, fopt, 3)
    tsd, fsd = topt.state_dict(), fopt.state_dict()
    assert sorted(fsd) == ["param_groups", "state"]
    assert sorted(fsd["state"]) == sorted(tsd["state"])
    for k in tsd["state"]:
        assert sorted(fsd["state"][k]) == sorted(tsd["state"][k])
    for tg, fg in zip(tsd["param_groups"], fsd["param_groups"]):
        assert fg == {k: v for k, v in tg.items()}, (fg, tg)
    # a fresh optimizer loaded from the state continues exactly like torch's
    fresh_t, fresh_f = _pair(name, kw, foreach=None, groups=True)
    for a, b in zip(_params(fresh_t), _params(topt)):
        a.data.copy_(b.data)
    for a, b in zip(_params(fresh_f), _params(fopt)):
        a._data.copy_(b._data)
    fresh_t.load_state_dict(tsd)
    fresh_f.load_state_dict(fsd)
    assert fresh_f.state[_params(fresh_f)[0]] is not fopt.state[_params(fopt)[0]]
    _steps(fresh_t, fresh_f, 2, seed=7)
    _assert_same(fresh_t, fresh_f, exact=True)


def test_load_torch_state_dict_into_holoflow():
    topt, fopt = _pair("Adam", dict(lr=0.01), foreach=None)
    _steps(topt, fopt, 2)
    fopt2 = optim.Adam([flow.from_torch(p.detach().clone()).requires_grad_() for p in _params(topt)], lr=0.01)
    fopt2.load_state_dict(topt.state_dict())     # torch tensors in the state are converted
    _steps(topt, fopt2, 2, seed=3)
    _assert_same(topt, fopt2, exact=True)


def test_float32_params_and_closure():
    topt, fopt = _pair("Adam", dict(lr=0.01), foreach=None, dtype=torch.float32)
    _steps(topt, fopt, 3)
    _assert_same(topt, fopt, exact=True)
    calls = []
    loss = fopt.step(lambda: calls.append(flow.is_grad_enabled()) or 1.5)
    assert loss == 1.5 and calls == [True]


def test_parameter_identity_and_zero_grad():
    p = flow.from_torch(torch.ones(3)).requires_grad_()
    data = p._data
    opt = optim.SGD([p], lr=0.5)
    p.grad = flow.ones(3)
    opt.step()
    assert p._data is data and p.tolist() == [0.5, 0.5, 0.5]
    opt.zero_grad(set_to_none=False)
    assert p.grad.tolist() == [0.0, 0.0, 0.0]
    opt.zero_grad()
    assert p.grad is None


def test_errors():
    p = flow.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.Adam([], lr=0.1)
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([p], lr=0.1, nesterov=True)
    opt = optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match="parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})


def test_add_param_group_gets_defaults():
    a, b = flow.ones(2, requires_grad=True), flow.ones(3, requires_grad=True)
    opt = optim.Adam([a], lr=0.1, betas=(0.5, 0.6))
    opt.add_param_group({"params": b, "lr": 0.2})
    assert opt.param_groups[1]["betas"] == (0.5, 0.6) and opt.param_groups[1]["lr"] == 0.2


class _PlainSGD(optim.Optimizer):
    """A new optimizer written once, as an update rule over a lowering's list operations."""

    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr, foreach=None))

    def _update(self, V, group, params, grads, states):
        V.add_(V.of(params), V.of(grads), alpha=-group["lr"])


@pytest.mark.parametrize("foreach", [None, False])
def test_one_update_rule_runs_with_either_lowering(foreach):
    """``_update`` alone gives a working optimizer: the foreach lowering (torch storages) and the
    op lowering (holoflow ops) both run it, to torch.optim.SGD's numbers."""
    topt, _ = _pair("SGD", dict(lr=0.1), foreach=None)
    fopt = _PlainSGD([flow.from_torch(p.detach().clone()).requires_grad_() for p in _params(topt)], lr=0.1)
    fopt.param_groups[0]["foreach"] = foreach
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for tp, fp in zip(_params(topt), _params(fopt)):
            grad = torch.randn(tp.shape, generator=g, dtype=tp.dtype)
            tp.grad, fp.grad = grad.clone(), flow.from_torch(grad.clone())
        topt.step()
        fopt.step()
    for tp, fp in zip(_params(topt), _params(fopt)):
        torch.testing.assert_close(fp.to_torch(), tp.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("name,kw", [c for c in CASES if c[0] in ("Adam", "AdamW", "SGD")])
def test_declared_fused_lowering_matches_torch_fused(name, kw):
    """Adam and SGD declare torch's fused kernel as a lowering of their rule: run directly it
    gives torch.optim's fused=True numbers."""
    topt, fopt = _pair(name, kw, foreach=None)
    topt = getattr(torch.optim, name)(_params(topt), fused=True, **kw)
    fused = type(fopt).fused_update
    assert fused is not None
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        for tp, fp in zip(_params(topt), _params(fopt)):
            grad = torch.randn(tp.shape, generator=g, dtype=tp.dtype)
            tp.grad, fp.grad = grad.clone(), flow.from_torch(grad.clone())
        topt.step()
        group = fopt.param_groups[0]
        params = group["params"]
        fused(group, params, [p.grad for p in params], [fopt._state_of(p, group) for p in params])
    _assert_same(topt, fopt, exact=True)


@pytest.mark.parametrize("name,kw", [c for c in CASES if c[0] in ("Adam", "AdamW", "SGD")])
def test_fused_flag_runs_torch_fused_kernel_in_eager(name, kw):
    """fused=True in eager gives torch.optim's fused=True numbers (one kernel per device/dtype:
    a float32 and a float64 parameter in one group)."""
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g, dtype=torch.float64)]
    tp = [torch.nn.Parameter(w.clone()) for w in init]
    fp = [flow.from_torch(w.clone()).requires_grad_() for w in init]
    topt = getattr(torch.optim, name)(tp, fused=True, **kw)
    fopt = getattr(optim, name)(fp, fused=True, **kw)
    _steps(topt, fopt, 4)
    _assert_same(topt, fopt, exact=True)


def test_fused_flag_errors():
    p = flow.from_torch(torch.ones(3)).requires_grad_()
    p.grad = flow.ones(3)
    with pytest.raises(RuntimeError, match="cannot be `True` together"):  # torch's class, at construction
        optim.Adam([p], fused=True, foreach=True)

    class NoKernel(optim.SGD):   # (every built-in that takes ``fused`` has torch's kernel)
        fused_update = None

    with pytest.raises(UnsupportedError, match="NoKernel: fused=True is not supported"):
        NoKernel([p], lr=0.1, fused=True).step()


def test_fused_flag_in_a_graph_trains_like_eager_fused():
    """nn.Graph with AdamW(fused=True): the trace takes the graph's own lowering (no error), and
    the weights follow torch's fused AdamW."""
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(4, 3, generator=g)
    xs = [torch.randn(5, 3, generator=g) for _ in range(3)]
    tw = torch.nn.Parameter(w0.clone())
    topt = torch.optim.AdamW([tw], lr=0.1, fused=True)
    fw = flow.nn.Parameter(flow.from_torch(w0.clone()))
    fopt = optim.AdamW([fw], lr=0.1, fused=True)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(fopt)

        def build(self, x):
            loss = (x @ fw.t()).square().sum()
            loss.backward()
            return loss
    train = Train()
    for x in xs:
        topt.zero_grad()
        (x @ tw.t()).square().sum().backward()
        topt.step()
        train(flow.from_torch(x))
    torch.testing.assert_close(fw.to_torch(), tw.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [dict(lr=0.1, momentum=0.9), dict(lr=0.1, momentum=0.9, nesterov=True)])
def test_fused_sgd_with_a_param_first_stepped_later(kw):
    """SGD(fused=True) where one parameter has no gradient on the first step: its momentum buffer
    starts from its own first gradient (torch's rule), the others' keep going (torch's fused path
    cannot take that mix; its per-parameter path is the reference)."""
    topt, fopt = _pair("SGD", kw, foreach=False)
    fopt = optim.SGD(_params(fopt), fused=True, **kw)
    _steps(topt, fopt, 4, skip=1)
    _assert_same(topt, fopt, exact=False)


def test_step_hooks_like_torch():
    """Optimizer.register_step_pre_hook/post_hook and the global ones: their order, what they
    receive, a pre hook replacing step's arguments (a closure), removal, LBFGS's own step."""
    from holoflow.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook as t_post
    from torch.optim.optimizer import register_optimizer_step_pre_hook as t_pre
    logs = []
    for lib, pre, post in ((torch, t_pre, t_post), (flow, register_optimizer_step_pre_hook,
                                                    register_optimizer_step_post_hook)):
        log = []
        w = lib.nn.Parameter(lib.tensor([1.0, -2.0]))
        hs = [pre(lambda o, a, k: log.append(("global-pre", type(o).__name__, len(a), sorted(k)))),
              post(lambda o, a, k: log.append(("global-post", o.param_groups[0]["lr"])))]
        for name in ("SGD", "LBFGS"):
            opt = getattr(lib.optim, name)([w], lr=0.1)

            def loss():
                opt.zero_grad()
                out = (w * w * w).sum()
                out.backward()
                return out
            hs.append(opt.register_step_pre_hook(lambda o, a, k: ((o,), {"closure": loss}) if len(a) == 1 else None))
            hs.append(opt.register_step_post_hook(lambda o, a, k: log.append(("post", len(a), sorted(k)))))
            log.append(opt.step().item())        # the pre hook passes the closure
            hs.pop().remove()
            log.append(opt.step(loss).item())
        for h in hs:
            h.remove()
        opt.step(loss)
        log.append(w.detach().tolist())
        logs.append(log)
    assert logs[1] == logs[0]
    opt = flow.optim.SGD([flow.nn.Parameter(flow.ones(1))], lr=0.1)
    opt.register_step_pre_hook(lambda o, a, k: 3)
    with pytest.raises(RuntimeError, match="must return None or a tuple"):
        opt.step()


def test_state_dict_hooks_like_torch():
    """Optimizer.register_state_dict_pre/post_hook and register_load_state_dict_pre/post_hook
    (they were missing: AttributeError): their order (prepend too), a post hook's or load pre
    hook's replacement dict, removal, and the loaded state."""
    logs = []
    for lib in (torch, flow):
        log = []
        w = lib.nn.Parameter(lib.tensor([1.0, -2.0]))
        opt = lib.optim.Adam([w], lr=0.1)
        w.grad = lib.tensor([0.5, 0.25])
        opt.step()
        opt.register_state_dict_pre_hook(lambda o: log.append(("pre", len(o.state))))
        opt.register_state_dict_pre_hook(lambda o: log.append("pre-first"), prepend=True)
        opt.register_state_dict_post_hook(lambda o, sd: {**sd, "extra": 7})
        h = opt.register_state_dict_post_hook(lambda o, sd: log.append(("post", sorted(sd))))
        sd = opt.state_dict()
        h.remove()
        log.append(sorted(opt.state_dict()))
        fresh = lib.optim.Adam([w], lr=0.5)

        def rename(o, sd):   # a checkpoint library's pre hook: drops its key, changes the lr
            log.append(("load-pre", sd.pop("extra")))
            return {**sd, "param_groups": [{**g, "lr": 0.01} for g in sd["param_groups"]]}
        fresh.register_load_state_dict_pre_hook(rename)
        fresh.register_load_state_dict_post_hook(lambda o: log.append(("load-post", o.param_groups[0]["lr"])))
        fresh.load_state_dict(sd)
        log.append(("kept", "extra" in sd))    # (loading works on a shallow copy)
        log.append(float(fresh.state[w]["step"]))
        logs.append(log)
    assert logs[1] == logs[0]
