"""LR schedulers vs torch.optim.lr_scheduler, step by step on matching optimizers."""
import pytest
import torch
from torch.optim import lr_scheduler as TL

import holoflow as flow
from holoflow import optim
from holoflow.optim import lr_scheduler as FL


def _opts(name="SGD", **kw):
    kw = kw or dict(lr=0.1, momentum=0.9)
    t = getattr(torch.optim, name)([{"params": [torch.nn.Parameter(torch.ones(2))]},
                                    {"params": [torch.nn.Parameter(torch.ones(2))], "lr": kw["lr"] / 3}], **kw)
    f = getattr(optim, name)([{"params": [flow.ones(2, requires_grad=True)]},
                              {"params": [flow.ones(2, requires_grad=True)], "lr": kw["lr"] / 3}], **kw)
    return t, f


def _trace(opt, sched, steps, extra=None):
    out = [list(sched.get_last_lr())]
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append(list(sched.get_last_lr()) + ([g[extra] for g in opt.param_groups] if extra else []))
    return out


SIMPLE = [
    ("StepLR", dict(step_size=4, gamma=0.5)),
    ("MultiStepLR", dict(milestones=[3, 7, 7, 20], gamma=0.3)),
    ("ExponentialLR", dict(gamma=0.9)),
    ("CosineAnnealingLR", dict(T_max=10, eta_min=0.001)),
    ("LinearLR", dict(start_factor=0.25, end_factor=0.9, total_iters=8)),
    ("ConstantLR", dict(factor=0.5, total_iters=4)),
    ("PolynomialLR", dict(total_iters=12, power=2.0)),
]


@pytest.mark.parametrize("name,kw", SIMPLE, ids=[s[0] for s in SIMPLE])
def test_schedule_matches_torch(name, kw):
    t, f = _opts()
    ts, fs = getattr(TL, name)(t, **kw), getattr(FL, name)(f, **kw)
    assert _trace(f, fs, 30) == _trace(t, ts, 30)
    assert [g["lr"] for g in f.param_groups] == [g["lr"] for g in t.param_groups]


def test_lambda_lr():
    fn = [lambda e: 0.95 ** e, lambda e: 1.0 / (e + 1)]
    t, f = _opts()
    assert _trace(f, FL.LambdaLR(f, fn), 30) == _trace(t, TL.LambdaLR(t, fn), 30)
    t, f = _opts()
    mfn = lambda e: 0.9   # noqa: E731
    assert _trace(f, FL.MultiplicativeLR(f, mfn), 20) == _trace(t, TL.MultiplicativeLR(t, mfn), 20)


@pytest.mark.parametrize("kw", [dict(), dict(anneal_strategy="linear", pct_start=0.4),
                                dict(three_phase=True, div_factor=10.0)])
@pytest.mark.parametrize("opt", ["SGD", "Adam"])
def test_one_cycle_lr_with_momentum_or_betas(kw, opt):
    t, f = _opts(opt, lr=0.1)
    extra = "betas" if opt == "Adam" else "momentum"
    ts = TL.OneCycleLR(t, max_lr=[1.0, 0.5], total_steps=30, **kw)
    fs = FL.OneCycleLR(f, max_lr=[1.0, 0.5], total_steps=30, **kw)
    assert _trace(f, fs, 29, extra) == _trace(t, ts, 29, extra)
    with pytest.raises(ValueError, match="total_steps"):
        f.step(), fs.step(), fs.step()


def test_sequential_lr():
    t, f = _opts()
    ts = TL.SequentialLR(t, [TL.LinearLR(t, start_factor=0.1, total_iters=5),
                             TL.CosineAnnealingLR(t, T_max=20)], milestones=[5])
    fs = FL.SequentialLR(f, [FL.LinearLR(f, start_factor=0.1, total_iters=5),
                             FL.CosineAnnealingLR(f, T_max=20)], milestones=[5])
    assert _trace(f, fs, 30) == _trace(t, ts, 30)


def test_chained_scheduler():
    t, f = _opts()
    ts = TL.ChainedScheduler([TL.ConstantLR(t, factor=0.5, total_iters=3), TL.ExponentialLR(t, gamma=0.9)])
    fs = FL.ChainedScheduler([FL.ConstantLR(f, factor=0.5, total_iters=3), FL.ExponentialLR(f, gamma=0.9)])
    assert _trace(f, fs, 15) == _trace(t, ts, 15)


def test_reduce_lr_on_plateau():
    metrics = [1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.8, 0.85, 0.85, 0.85, 0.85, 0.85, 0.85] * 2
    for kw in (dict(patience=2, factor=0.5, cooldown=1), dict(mode="max", threshold_mode="abs", patience=1,
                                                              min_lr=[0.01, 0.02])):
        t, f = _opts()
        ts, fs = TL.ReduceLROnPlateau(t, **kw), FL.ReduceLROnPlateau(f, **kw)
        tl, fl = [], []
        for m in metrics:
            ts.step(m)
            fs.step(flow.tensor(m))
            tl.append(ts.get_last_lr())
            fl.append(fs.get_last_lr())
        assert fl == tl


def test_closed_form_step_with_epoch():
    t, f = _opts()
    ts, fs = TL.StepLR(t, step_size=3, gamma=0.5), FL.StepLR(f, step_size=3, gamma=0.5)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ts.step(10)
    fs.step(10)
    assert fs.get_last_lr() == ts.get_last_lr()


def test_state_dict_round_trip_resumes():
    t, f = _opts()
    fs = FL.CosineAnnealingLR(f, T_max=10)
    for _ in range(4):
        fs.step()
    sd = fs.state_dict()
    assert "optimizer" not in sd and sd["last_epoch"] == 4
    t2, f2 = _opts()
    f2.load_state_dict(f.state_dict())
    fs2 = FL.CosineAnnealingLR(f2, T_max=10, last_epoch=sd["last_epoch"])
    fs2.load_state_dict(sd)
    for _ in range(5):
        fs.step()
        fs2.step()
    assert fs2.get_last_lr() == fs.get_last_lr()


def test_errors():
    with pytest.raises(TypeError, match="not a holoflow Optimizer"):
        FL.StepLR(object(), step_size=1)
    t, f = _opts()
    with pytest.raises(KeyError, match="initial_lr"):
        FL.StepLR(f, step_size=1, last_epoch=3)
