"""Optimizer / lr-scheduler combinations vs torch: complex parameters, LBFGS state round trips,
flag errors and torch's scheduler warnings (found by probing holoflow.optim against torch.optim)."""
import warnings

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow import optim

RNG = np.random.default_rng(0)
W_C = (RNG.standard_normal((2, 3)) + 1j * RNG.standard_normal((2, 3))).astype(np.complex64)
W_R = RNG.standard_normal(3).astype(np.float32)
G_C = [(RNG.standard_normal((2, 3)) + 1j * RNG.standard_normal((2, 3))).astype(np.complex64) for _ in range(5)]
G_R = [RNG.standard_normal(3).astype(np.float32) for _ in range(5)]

COMPLEX_CASES = [
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("Adam", dict(lr=0.1)),
    ("Adam", dict(lr=0.1, amsgrad=True, foreach=False)),
    ("AdamW", dict(lr=0.1, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.1, centered=True, momentum=0.5)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.1)),
    ("Adadelta", dict()),
    ("Adamax", dict(lr=0.1)),
    ("NAdam", dict(lr=0.1)),
    ("RAdam", dict(lr=0.1, decoupled_weight_decay=True, weight_decay=0.1)),
]


def _run_complex(lib, name, kw):
    p = lib.tensor(W_C.copy(), requires_grad=True)
    q = lib.tensor(W_R.copy(), requires_grad=True)
    opt = getattr(lib.optim, name)([p, q], **kw)
    for i, (g, h) in enumerate(zip(G_C, G_R)):
        p.grad, q.grad = lib.tensor(g.copy()), lib.tensor(h.copy())
        opt.step()
        if i == 2:   # state_dict round trip into a fresh optimizer, then go on
            sd = opt.state_dict()
            opt = getattr(lib.optim, name)([p, q], **kw)
            opt.load_state_dict(sd)
    state = {k: tuple(v.shape) for k, v in opt.state_dict()["state"][0].items() if hasattr(v, "shape")}
    return p.detach().numpy(), q.detach().numpy(), state


@pytest.mark.parametrize("name,kw", COMPLEX_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(COMPLEX_CASES)])
def test_complex_params_step_like_torch(name, kw):
    # torch steps a complex parameter as view_as_real (real and imaginary parts as separate
    # elements); holoflow used complex arithmetic (wrong numbers) or failed (Adamax, amsgrad)
    tp, tq, tstate = _run_complex(torch, name, kw)
    fp, fq, fstate = _run_complex(flow, name, kw)
    np.testing.assert_allclose(fp, tp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fq, tq, rtol=1e-5, atol=1e-5)
    assert fstate == tstate   # complex state, the parameter's shape


def _lbfgs(lib, kw):
    rng = np.random.default_rng(1)
    A, y = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    w = lib.tensor(rng.standard_normal(3).astype(np.float32), requires_grad=True)
    Am, ym = lib.tensor(A), lib.tensor(y)
    opt = lib.optim.LBFGS([w], **kw)
    losses = []
    for i in range(4):
        def closure():
            opt.zero_grad()
            loss = ((Am @ w - ym) ** 2).sum() + (w ** 4).sum()
            loss.backward()
            return loss
        losses.append(float(opt.step(closure).detach()))
        if i == 1:
            sd = opt.state_dict()
            opt = lib.optim.LBFGS([w], **kw)
            opt.load_state_dict(sd)
    return w.detach().numpy(), losses


@pytest.mark.parametrize("kw", [dict(lr=1, max_iter=5), dict(lr=1, max_iter=4, line_search_fn="strong_wolfe")])
def test_lbfgs_state_dict_round_trip_continues_like_torch(kw):
    # load_state_dict turned LBFGS's torch search state (d, H_diag, ...) into holoflow Tensors:
    # the next step raised TypeError
    tw, tl = _lbfgs(torch, kw)
    fw, fl = _lbfgs(flow, kw)
    np.testing.assert_allclose(fw, tw, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fl, tl, rtol=1e-6)


def test_fused_and_foreach_together_raise_runtime_error_at_construction():
    p = flow.nn.Parameter(flow.zeros(2))
    with pytest.raises(RuntimeError):
        torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], fused=True, foreach=True)
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        optim.Adam([p], fused=True, foreach=True)
    with pytest.raises(RuntimeError):
        optim.SGD([p], lr=0.1, fused=True, foreach=True)


def _sched_warnings(lib, opt_first, make_opt=None):
    p = lib.nn.Parameter(lib.ones(2))
    opt = make_opt(lib, p) if make_opt else lib.optim.SGD([p], lr=0.1)
    sched = lib.optim.lr_scheduler.StepLR(opt, 2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if opt_first:
            if isinstance(opt, lib.optim.LBFGS):
                def closure():
                    opt.zero_grad()
                    loss = (p * p).sum()
                    loss.backward()
                    return loss
                opt.step(closure)
            else:
                opt.step()
        sched.step()
        sched.step()
    return [str(x.message) for x in w if issubclass(x.category, UserWarning)]


@pytest.mark.parametrize("opt_first", [False, True])
def test_scheduler_step_before_optimizer_step_warns_as_torch(opt_first):
    t = _sched_warnings(torch, opt_first)
    f = _sched_warnings(flow, opt_first)
    assert len(f) == len(t)
    assert all(x.startswith("Detected call of `lr_scheduler.step()` before `optimizer.step()`") for x in f)


def test_no_scheduler_warning_after_lbfgs_step():
    def mk(lib, p):
        return lib.optim.LBFGS([p], max_iter=2)
    assert _sched_warnings(torch, True, mk) == []
    assert _sched_warnings(flow, True, mk) == []


def test_scheduler_step_with_epoch_warns_deprecation():
    p = flow.nn.Parameter(flow.zeros(2))
    opt = optim.SGD([p], lr=0.1)
    s = optim.lr_scheduler.StepLR(opt, 3, 0.5)
    opt.step()
    with pytest.warns(UserWarning, match="epoch parameter in `scheduler.step\\(\\)`"):
        s.step(10)
    assert s.get_last_lr() == [0.1 * 0.5 ** 3]
