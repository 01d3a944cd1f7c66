"""Adadelta, Adamax, NAdam, RAdam, LBFGS and the cyclic lr schedules vs torch, 20-40 steps."""
import math

import pytest
import torch

import holoflow as flow
from holoflow import optim
from holoflow.optim import lr_scheduler as FL
from torch.optim import lr_scheduler as TL

CASES = [
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.8, weight_decay=0.1, maximize=True)),
    ("Adamax", dict(lr=0.05)),
    ("Adamax", dict(lr=0.05, betas=(0.8, 0.95), weight_decay=0.1, maximize=True)),
    ("NAdam", dict(lr=0.05)),
    ("NAdam", dict(lr=0.05, weight_decay=0.1, momentum_decay=0.01)),
    ("NAdam", dict(lr=0.05, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    ("RAdam", dict(lr=0.05)),
    ("RAdam", dict(lr=0.05, betas=(0.9, 0.5), weight_decay=0.1)),   # rho_t > 5 from step 6
    ("RAdam", dict(lr=0.05, weight_decay=0.1, decoupled_weight_decay=True)),
]


def _pair(name, kw, dtype):
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(3, 4, generator=g, dtype=dtype), torch.randn(5, generator=g, dtype=dtype)]
    tp = [torch.nn.Parameter(w.clone()) for w in init]
    fp = [flow.from_torch(w.clone()).requires_grad_() for w in init]
    return tp, fp, getattr(torch.optim, name)(tp, **kw), getattr(optim, name)(fp, **kw)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_optimizer_matches_torch_over_20_steps(name, kw, dtype):
    tp, fp, topt, fopt = _pair(name, kw, dtype)
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        for t, f in zip(tp, fp):
            grad = torch.randn(t.shape, generator=g, dtype=dtype)
            t.grad, f.grad = grad.clone(), flow.from_torch(grad.clone())
        topt.step()
        fopt.step()
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-6)
    for t, f in zip(tp, fp):
        torch.testing.assert_close(f.to_torch(), t.detach(), **tol)
        for key, tv in topt.state[t].items():
            fv = fopt.state[f][key]
            torch.testing.assert_close(fv.to_torch(), tv, **tol, check_dtype=True)


def test_optimizer_bad_hyper_parameters_raise_value_error():
    p = [flow.zeros(2, requires_grad=True)]
    for name, kw in [("Adadelta", dict(rho=1.5)), ("Adamax", dict(betas=(1.0, 0.9))),
                     ("NAdam", dict(momentum_decay=-1)), ("RAdam", dict(lr=-1)), ("LBFGS", dict(lr=-1)),
                     ("LBFGS", dict(line_search_fn="armijo"))]:
        with pytest.raises(ValueError, match=name):
            getattr(optim, name)(p, **kw)


def _rosen_pair():
    x0 = torch.tensor([-1.5, 2.0, 0.5], dtype=torch.float64)
    return torch.nn.Parameter(x0.clone()), flow.from_torch(x0.clone()).requires_grad_()


def _rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


@pytest.mark.parametrize("kw", [dict(lr=0.1, max_iter=5, history_size=3),
                                dict(lr=1, max_iter=10, line_search_fn="strong_wolfe")])
def test_lbfgs_matches_torch(kw):
    tx, fx = _rosen_pair()
    topt, fopt = torch.optim.LBFGS([tx], **kw), optim.LBFGS([fx], **kw)
    evals = [0, 0]

    def closure(opt, x, i):
        def run():
            evals[i] += 1
            opt.zero_grad()
            loss = _rosen(x)
            loss.backward()
            return loss
        return run

    for _ in range(20):
        tl = topt.step(closure(topt, tx, 0))
        fl = fopt.step(closure(fopt, fx, 1))
        assert math.isclose(tl.item(), fl.item(), rel_tol=1e-10, abs_tol=1e-12)
    assert evals[0] == evals[1]
    torch.testing.assert_close(fx.to_torch(), tx.detach(), rtol=1e-9, atol=1e-10)
    assert topt.state[tx]["n_iter"] == fopt.state[fx]["n_iter"]


def test_lbfgs_needs_closure():
    with pytest.raises(TypeError, match="closure"):
        optim.LBFGS([flow.zeros(2, requires_grad=True)]).step()


def _sched_pair(opt_name, opt_kw):
    tp = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    fp = [flow.zeros(2, requires_grad=True), flow.zeros(2, requires_grad=True)]
    groups = lambda ps: [{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.05}]  # noqa: E731
    return getattr(torch.optim, opt_name)(groups(tp), **opt_kw), getattr(optim, opt_name)(groups(fp), **opt_kw)


SCHEDULES = [
    ("CyclicLR", "SGD", dict(base_lr=0.01, max_lr=0.1, step_size_up=4)),
    ("CyclicLR", "SGD", dict(base_lr=[0.01, 0.02], max_lr=0.1, step_size_up=3, step_size_down=5,
                             mode="triangular2")),
    ("CyclicLR", "Adam", dict(base_lr=0.01, max_lr=0.1, step_size_up=4, mode="exp_range", gamma=0.9)),
    ("CyclicLR", "SGD", dict(base_lr=0.01, max_lr=0.1, step_size_up=4, scale_fn=lambda x: 0.5 ** x,
                             cycle_momentum=False)),
    ("CosineAnnealingWarmRestarts", "SGD", dict(T_0=5)),
    ("CosineAnnealingWarmRestarts", "SGD", dict(T_0=3, T_mult=2, eta_min=0.001)),
]


@pytest.mark.parametrize("name,opt_name,kw", SCHEDULES, ids=[f"{s[0]}-{i}" for i, s in enumerate(SCHEDULES)])
def test_cyclic_schedules_match_torch(name, opt_name, kw):
    okw = dict(lr=0.1, momentum=0.9) if opt_name == "SGD" else dict(lr=0.1)
    topt, fopt = _sched_pair(opt_name, okw)
    ts, fs = getattr(TL, name)(topt, **kw), getattr(FL, name)(fopt, **kw)
    for _ in range(35):
        assert fs.get_last_lr() == ts.get_last_lr()
        for tg, fg in zip(topt.param_groups, fopt.param_groups):
            assert tg.get("momentum") == fg.get("momentum") and tg.get("betas") == fg.get("betas")
        topt.step()
        fopt.step()
        ts.step()
        fs.step()


def test_warm_restarts_fractional_epochs_match_torch():
    topt, fopt = _sched_pair("SGD", dict(lr=0.1))
    ts = TL.CosineAnnealingWarmRestarts(topt, T_0=3, T_mult=2)
    fs = FL.CosineAnnealingWarmRestarts(fopt, T_0=3, T_mult=2)
    for epoch in [0.5, 1.25, 3.0, 7.5, 10.0, 21.3]:
        ts.step(epoch)
        fs.step(epoch)
        assert fs.get_last_lr() == ts.get_last_lr()


def test_cyclic_lr_state_dict_round_trip_resumes():
    _, fopt = _sched_pair("SGD", dict(lr=0.1, momentum=0.9))
    fs = FL.CyclicLR(fopt, base_lr=0.01, max_lr=0.1, step_size_up=4)
    for _ in range(5):
        fs.step()
    sd = fs.state_dict()
    _, fopt2 = _sched_pair("SGD", dict(lr=0.1, momentum=0.9))
    fs2 = FL.CyclicLR(fopt2, base_lr=0.01, max_lr=0.1, step_size_up=4)
    fs2.load_state_dict(sd)
    fs.step()
    fs2.step()
    assert fs2.get_last_lr() == fs.get_last_lr()
    with pytest.raises(ValueError, match="mode"):
        FL.CyclicLR(fopt2, base_lr=0.01, max_lr=0.1, mode="sawtooth")
