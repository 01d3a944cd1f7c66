"""GradScaler against torch.amp.GradScaler("cpu") on the same losses, with inf injected."""
from __future__ import annotations

import math

import pytest
import torch

import holoflow as flow
import holoflow.optim  # noqa: F401  (binds flow.optim)
from holoflow.amp import GradScaler

# per step: the input's extra factor; inf makes every gradient inf, nan makes them nan
SCHEDULE = [1.0, 1.0, math.inf, 1.0, 1.0, 1.0, 1.0, math.nan, 1.0, 1.0, 1.0, 1.0]


def _run(lib, scaler_cls, schedule, unscale_first: bool):
    lib.manual_seed(0) if lib is torch else None
    w0 = torch.linspace(-1, 1, 6).reshape(2, 3)
    w = (lib.tensor(w0.numpy()) if lib is flow else w0.clone()).requires_grad_()
    opt = lib.optim.SGD([w], lr=0.1)
    scaler = scaler_cls("cpu", init_scale=2.0 ** 10, growth_factor=2.0, backoff_factor=0.25, growth_interval=3)
    scales, weights, grads, trackers = [], [], [], []
    for factor in schedule:
        x = lib.ones(2, 3) * factor
        loss = (w * x).sum() * 0.5
        opt.zero_grad()
        scaler.scale(loss).backward()
        if unscale_first:
            scaler.unscale_(opt)
            grads.append(w.grad.detach().clone().numpy())
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(scaler._get_growth_tracker())
        weights.append(w.detach().clone().numpy())
    return scales, weights, grads, trackers, scaler


@pytest.mark.parametrize("unscale_first", [False, True])
def test_scale_sequence_and_skipped_steps_match_torch(unscale_first):
    fs, fw, fg, ft, fscaler = _run(flow, GradScaler, SCHEDULE, unscale_first)
    ts, tw, tg, tt, tscaler = _run(torch, torch.amp.GradScaler, SCHEDULE, unscale_first)
    assert fs == ts
    assert ft == tt
    # the sequence exercises backoff (x0.25) and growth (x2 after 3 clean steps)
    assert fs[2] == 2.0 ** 8 and fs[5] == 2.0 ** 9 and fs[7] == 2.0 ** 7
    for a, b in zip(fw, tw):
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b))
    for a, b in zip(fg, tg):  # unscaled grads, inf/nan included
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), equal_nan=True)
    assert fw[2].tolist() == fw[1].tolist()  # the inf step was skipped
    assert fscaler.state_dict() == tscaler.state_dict()


def test_state_dict_round_trip_and_torch_compat():
    _, _, _, _, tscaler = _run(torch, torch.amp.GradScaler, SCHEDULE[:5], False)
    s = GradScaler("cpu")
    s.load_state_dict(tscaler.state_dict())
    assert s.get_scale() == tscaler.get_scale()
    assert s.state_dict() == tscaler.state_dict()
    with pytest.raises(RuntimeError, match="empty"):
        s.load_state_dict({})


def test_call_order_errors():
    w = flow.ones(3, requires_grad=True)
    opt = flow.optim.SGD([w], lr=0.1)
    scaler = GradScaler("cpu")
    with pytest.raises(RuntimeError, match="scale"):
        scaler.update()
    scaler.scale(w.sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.step(opt)
    scaler.update()
    torch.testing.assert_close(w.detach().to_torch(), torch.full((3,), 0.9))


def test_disabled_is_a_pass_through():
    w = flow.ones(3, requires_grad=True)
    opt = flow.optim.SGD([w], lr=0.1)
    scaler = GradScaler("cpu", enabled=False)
    loss = w.sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    torch.testing.assert_close(w.detach().to_torch(), torch.full((3,), 0.9))


def test_scales_lists_and_new_scale():
    scaler = GradScaler("cpu", init_scale=4.0)
    a, b = scaler.scale([flow.ones(2), flow.ones(1) * 3])
    assert a.tolist() == [4.0, 4.0] and b.tolist() == [12.0]
    scaler.update(new_scale=8.0)
    assert scaler.get_scale() == 8.0
