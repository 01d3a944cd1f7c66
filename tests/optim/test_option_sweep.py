"""Every optimizer with its options, and every LR scheduler with its options, against torch:
parameters after each step (float64, two parameter groups where asked), the state_dict's groups
and state keys, and the learning rates and momenta a scheduler sets step by step."""
from __future__ import annotations

import pytest
import torch

import holoflow as flow

OPTIMIZERS = [
    ("SGD", {"lr": 0.1}), ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.1, "momentum": 0.5, "dampening": 0.3, "maximize": True}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "groups": True}),
    ("Adam", {"lr": 0.01}), ("Adam", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.01, "betas": (0.5, 0.9), "eps": 1e-3, "maximize": True}), ("Adam", {"lr": 0.01, "foreach": False}),
    ("Adam", {"lr": 0.01, "groups": True}),
    ("AdamW", {"lr": 0.01}), ("AdamW", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.5}),
    ("AdamW", {"lr": 0.01, "fused": False, "maximize": True}),
    ("RMSprop", {"lr": 0.01}), ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.9, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.5, "maximize": True}),
    ("Adagrad", {"lr": 0.1}), ("Adagrad", {"lr": 0.1, "lr_decay": 0.1, "weight_decay": 0.1, "initial_accumulator_value": 0.5}),
    ("Adagrad", {"lr": 0.1, "maximize": True}),
    ("Adadelta", {"lr": 1.0}), ("Adadelta", {"lr": 0.5, "rho": 0.5, "weight_decay": 0.1, "maximize": True}),
    ("Adamax", {"lr": 0.01}), ("Adamax", {"lr": 0.01, "weight_decay": 0.1, "maximize": True}),
    ("NAdam", {"lr": 0.01}), ("NAdam", {"lr": 0.01, "momentum_decay": 0.01, "weight_decay": 0.1}),
    ("NAdam", {"lr": 0.01, "decoupled_weight_decay": True, "weight_decay": 0.1}),
    ("RAdam", {"lr": 0.01}), ("RAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("ASGD", {"lr": 0.01}), ("ASGD", {"lr": 0.01, "lambd": 0.01, "alpha": 0.5, "t0": 2, "weight_decay": 0.1}),
    ("Rprop", {"lr": 0.01}), ("Rprop", {"lr": 0.01, "etas": (0.3, 1.5), "step_sizes": (1e-4, 0.1), "maximize": True}),
    # (few iterations: this problem is chaotic under L-BFGS, torch against itself perturbed by 1e-13
    # ends 2.6 apart after 40)
    ("LBFGS", {"lr": 0.5, "max_iter": 5}),
    ("LBFGS", {"lr": 0.5, "history_size": 3, "max_iter": 5, "line_search_fn": "strong_wolfe"}),
]


def _train(lib, name: str, options: dict, steps: int = 5):
    w = lib.nn.Parameter(lib.tensor([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]], dtype=lib.float64))
    b = lib.nn.Parameter(lib.tensor([0.1, -0.2], dtype=lib.float64))
    x = lib.tensor([[1.0, 2.0, -1.0], [0.5, -0.5, 3.0], [2.0, 1.0, 0.0]], dtype=lib.float64)
    options = dict(options)
    groups = [{"params": [w]}, {"params": [b], "lr": options["lr"] * 0.5}] if options.pop("groups", False) else [w, b]
    opt = getattr(lib.optim, name)(groups, **options)

    def closure():
        opt.zero_grad()
        loss = ((x @ w.T + b).tanh() ** 2).sum() + (w ** 4).sum() * 0.01
        loss.backward()
        return loss
    history = []
    for _ in range(steps):
        if name == "LBFGS":
            opt.step(closure)
        else:
            closure()
            opt.step()
        history.append((w.detach().clone(), b.detach().clone()))
    return history, opt.state_dict()


@pytest.mark.parametrize("name,options", OPTIMIZERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPTIMIZERS)])
def test_optimizer_steps_and_state_match_torch(name, options):
    want, want_state = _train(torch, name, options)
    got, got_state = _train(flow, name, options)
    for step, ((tw, tb), (fw, fb)) in enumerate(zip(want, got)):
        torch.testing.assert_close(fw.to_torch(), tw, rtol=1e-7, atol=1e-9, msg=lambda m: f"step {step}: {m}")
        torch.testing.assert_close(fb.to_torch(), tb, rtol=1e-7, atol=1e-9, msg=lambda m: f"step {step}: {m}")
    assert got_state["param_groups"] == want_state["param_groups"]
    for pid, state in want_state["state"].items():
        assert sorted(got_state["state"][pid]) == sorted(state)


def _lr_sched(lib):
    return lib.optim.lr_scheduler


SCHEDULERS = {
    "StepLR": lambda lib, o: _lr_sched(lib).StepLR(o, 3, gamma=0.5),
    "MultiStepLR": lambda lib, o: _lr_sched(lib).MultiStepLR(o, [2, 5, 5, 9], gamma=0.3),
    "ConstantLR": lambda lib, o: _lr_sched(lib).ConstantLR(o, factor=0.2, total_iters=4),
    "LinearLR": lambda lib, o: _lr_sched(lib).LinearLR(o, 0.1, 0.9, 6),
    "ExponentialLR": lambda lib, o: _lr_sched(lib).ExponentialLR(o, 0.8),
    "PolynomialLR": lambda lib, o: _lr_sched(lib).PolynomialLR(o, total_iters=8, power=2.0),
    "CosineAnnealingLR": lambda lib, o: _lr_sched(lib).CosineAnnealingLR(o, T_max=5, eta_min=0.001),
    "CosineAnnealingWarmRestarts": lambda lib, o: _lr_sched(lib).CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2,
                                                                                             eta_min=0.01),
    "CyclicLR-triangular2": lambda lib, o: _lr_sched(lib).CyclicLR(o, 0.01, 0.1, step_size_up=2, mode="triangular2"),
    "CyclicLR-exp_range": lambda lib, o: _lr_sched(lib).CyclicLR(o, 0.01, 0.1, step_size_up=3, step_size_down=2,
                                                                 mode="exp_range", gamma=0.9),
    "OneCycleLR-cos": lambda lib, o: _lr_sched(lib).OneCycleLR(o, max_lr=[0.5, 0.2], total_steps=13),
    "OneCycleLR-linear-three-phase": lambda lib, o: _lr_sched(lib).OneCycleLR(
        o, max_lr=0.5, total_steps=13, anneal_strategy="linear", three_phase=True, pct_start=0.4),
    "LambdaLR": lambda lib, o: _lr_sched(lib).LambdaLR(o, [lambda s: 0.9 ** s, lambda s: 1 / (s + 1)]),
    "MultiplicativeLR": lambda lib, o: _lr_sched(lib).MultiplicativeLR(o, lambda s: 0.95),
    "SequentialLR": lambda lib, o: _lr_sched(lib).SequentialLR(
        o, [_lr_sched(lib).LinearLR(o, 0.1, 1.0, 3), _lr_sched(lib).ExponentialLR(o, 0.9)], milestones=[3]),
    "ChainedScheduler": lambda lib, o: _lr_sched(lib).ChainedScheduler(
        [_lr_sched(lib).ConstantLR(o, 0.5, 4), _lr_sched(lib).ExponentialLR(o, 0.9)]),
}
for _mode, _threshold in (("min", "rel"), ("max", "abs"), ("min", "abs")):
    SCHEDULERS[f"ReduceLROnPlateau-{_mode}-{_threshold}"] = (
        lambda lib, o, m=_mode, t=_threshold: _lr_sched(lib).ReduceLROnPlateau(
            o, mode=m, factor=0.5, patience=1, threshold=0.1, threshold_mode=t, cooldown=1, min_lr=[0.01, 0.001]))


def _schedule(lib, make, steps: int = 12) -> list:
    opt = lib.optim.SGD([{"params": [lib.nn.Parameter(lib.zeros(2))]},
                         {"params": [lib.nn.Parameter(lib.zeros(1))], "lr": 0.05}], lr=0.1, momentum=0.9)
    sched = make(lib, opt)
    out = []
    for s in range(steps):
        opt.step()
        if isinstance(sched, lib.optim.lr_scheduler.ReduceLROnPlateau):
            sched.step(1.0 / (1 + s % 4))
        else:
            sched.step()
        out.append([round(g["lr"], 12) for g in opt.param_groups] + [round(g["momentum"], 12) for g in opt.param_groups])
    return out


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_learning_rates_and_momenta_match_torch(name):
    assert _schedule(flow, SCHEDULERS[name]) == _schedule(torch, SCHEDULERS[name])
