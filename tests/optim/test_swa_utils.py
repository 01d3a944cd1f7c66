"""``optim.swa_utils`` vs torch's: AveragedModel (default SWA average, EMA through avg_fn and
multi_avg_fn, use_buffers), SWALR's lrs, update_bn's statistics, and the argument errors."""
import numpy as np
import pytest
import torch

import holoflow as flow

RNG = np.random.default_rng(0)
X = RNG.standard_normal((12, 4)).astype(np.float32)
Y = RNG.standard_normal((12, 2)).astype(np.float32)


def _model(lib):
    lib.manual_seed(0)
    return lib.nn.Sequential(lib.nn.Linear(4, 6), lib.nn.BatchNorm1d(6), lib.nn.Tanh(), lib.nn.Linear(6, 2))


def _averaging(lib):
    su = lib.optim.swa_utils
    return {"swa": dict(), "ema-multi": dict(multi_avg_fn=su.get_ema_multi_avg_fn(0.8)),
            "ema": dict(avg_fn=su.get_ema_avg_fn(0.8)), "swa-multi": dict(multi_avg_fn=su.get_swa_multi_avg_fn()),
            "swa-fn": dict(avg_fn=su.get_swa_avg_fn()), "ema-buffers": dict(
                multi_avg_fn=su.get_ema_multi_avg_fn(0.8), use_buffers=True)}


def _run(lib, kind):
    net = _model(lib)
    avg = lib.optim.swa_utils.AveragedModel(net, **_averaging(lib)[kind])
    opt = lib.optim.SGD(net.parameters(), lr=0.1, momentum=0.5)
    sched = lib.optim.swa_utils.SWALR(opt, swa_lr=0.02, anneal_epochs=3, anneal_strategy="linear")
    x, y = lib.tensor(X), lib.tensor(Y)
    lrs = []
    for _ in range(5):
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
        sched.step()
        avg.update_parameters(net)
        lrs.append(opt.param_groups[0]["lr"])
    lib.optim.swa_utils.update_bn([(x[:6], None), (x[6:], None)], avg)
    state = {k: v.detach().numpy().copy() for k, v in avg.state_dict().items()}
    return state, lrs, avg(x).detach().numpy()


@pytest.mark.parametrize("kind", ["swa", "ema-multi", "ema", "swa-multi", "swa-fn", "ema-buffers"])
def test_averaged_model_swalr_and_update_bn_match_torch(kind):
    (ts, tl, to), (fs, fl, fo) = _run(torch, kind), _run(flow, kind)
    assert fs.keys() == ts.keys()
    for k in ts:
        np.testing.assert_allclose(fs[k], ts[k], rtol=1e-6, atol=1e-7, err_msg=k)
    assert fl == tl
    np.testing.assert_allclose(fo, to, rtol=1e-6, atol=1e-6)


def test_swalr_state_dict_round_trip_and_cosine_like_torch():
    res = []
    for lib in (torch, flow):
        w = lib.nn.Parameter(lib.zeros(2))
        opt = lib.optim.SGD([{"params": [w]}, {"params": [lib.nn.Parameter(lib.zeros(1))], "lr": 0.5}], lr=0.1)
        sched = lib.optim.swa_utils.SWALR(opt, swa_lr=[0.01, 0.2], anneal_epochs=4)
        lrs = []
        for i in range(6):
            opt.step()
            sched.step()
            if i == 2:
                sd = sched.state_dict()
                sched = lib.optim.swa_utils.SWALR(opt, swa_lr=[0.01, 0.2], anneal_epochs=4)
                sched.load_state_dict(sd)
            lrs.append([g["lr"] for g in opt.param_groups])
        res.append(lrs)
    np.testing.assert_allclose(res[1], res[0], rtol=1e-12)


@pytest.mark.parametrize("call, exc, match", [
    (lambda lib: lib.optim.swa_utils.get_ema_multi_avg_fn(1.5), ValueError, "Invalid decay value"),
    (lambda lib: lib.optim.swa_utils.AveragedModel(lib.nn.Linear(1, 1), avg_fn=lambda *a: a[0],
                                                   multi_avg_fn=lambda *a: None), AssertionError, "Only one"),
    (lambda lib: lib.optim.swa_utils.SWALR(lib.optim.SGD([lib.nn.Parameter(lib.zeros(1))], lr=0.1), 0.01,
                                           anneal_strategy="exp"), ValueError, "anneal_strategy"),
    (lambda lib: lib.optim.swa_utils.SWALR(lib.optim.SGD([lib.nn.Parameter(lib.zeros(1))], lr=0.1), 0.01,
                                           anneal_epochs=-1), ValueError, "anneal_epochs"),
])
def test_errors_like_torch(call, exc, match):
    for lib in (torch, flow):
        with pytest.raises(exc, match=match):
            call(lib)
