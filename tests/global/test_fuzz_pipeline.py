"""Differential fuzzing of pipelined nn.Graph training: random stacks of blocks (linear +
activation, layer norm, residual MLPs, a skip connection carried across a stage boundary as a
second stage input) cut into 2 or 3 stages, each on its own ranks (with data parallelism inside
the stages on 4 ranks), random micro-batch counts, schedules (1F1B, GPipe, ZB-H1), optimizers,
gradient clipping, ZeRO and activation checkpointing; every configuration must train exactly as
single-process full-batch eager training of the same model (parameters after the steps, and the
mean of each step's per-micro-batch losses). ``_describe(seed)`` lists a failing seed's program.

CI runs 8 programs and the seeds that found bugs; HOLOFLOW_FUZZ_SEEDS=N runs N (a longer local
hunt), from HOLOFLOW_FUZZ_FIRST on."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.sbp import B, S

# Found: 1 (checkpointing recomputed the move set_stage makes of a staged module's inputs),
# 20246 (auto-parallel under ZeRO-1: each stage's ranks costed only their own stage's update
# all-gathers, planned apart and traced different programs)
FOUND = (1, 20246)
_FIRST = int(os.environ.get("HOLOFLOW_FUZZ_FIRST", 0))
SEEDS = sorted(set(range(_FIRST, _FIRST + int(os.environ.get("HOLOFLOW_FUZZ_SEEDS", 8)))) | set(FOUND))
D_IN, D_OUT, BATCH, STEPS = 6, 3, 8, 2
BLOCKS = ("linear_tanh", "linear_gelu", "layer_norm", "residual_mlp", "linear")


def _program(seed: int) -> dict:
    """The random configuration of ``seed``: stage widths and blocks, and the graph's switches."""
    rng = np.random.default_rng(seed)
    p = int(rng.choice([2, 2, 3]))
    dp = 2 if p == 2 and rng.random() < 0.4 else 1
    widths = [int(rng.integers(4, 9)) for _ in range(p)]
    stages = [[str(rng.choice(BLOCKS)) for _ in range(int(rng.integers(1, 3)))] for _ in range(p)]
    return {
        "p": p, "dp": dp, "widths": widths, "stages": stages,
        "skip": bool(rng.random() < 0.4),                  # stage 0's input carried to the last stage
        "m": int(rng.choice([1, 2, 4])),
        "schedule": str(rng.choice(["1f1b", "gpipe", "zb-h1"])),
        "opt": str(rng.choice(["sgd", "adamw", "adam"])),
        "clip": str(rng.choice(["none", "none", "whole", "per_stage"])),
        "zero": int(rng.choice([0, 0, 1, 2])) if dp > 1 else 0,
        "ckpt": [bool(rng.random() < 0.25) for _ in range(p)],
        "move": str(rng.choice(["explicit", "implicit"])),
        "loss": str(rng.choice(["cross_entropy", "mse"])),
        "lr": float(rng.choice([0.05, 0.1])),
        # (drawn last: the seeds above keep their programs)
        "sched": bool(rng.random() < 0.3),                 # an LR scheduler stepped by the graph
        "out": bool(rng.random() < 0.4),                   # build() also returns the output
        "bn": bool(rng.random() < 0.5),                    # batch norm in stage 0 (one micro-batch only:
                                                           # its statistics are the batch's)
        "auto": bool(rng.random() < 0.3),                  # auto-parallel: each stage's layouts and
    }                                                      # the schedule planned (the drawn one unused)


def _describe(seed: int) -> str:
    return "\n".join(f"{k}: {v}" for k, v in _program(seed).items())


class Block(flow.nn.Module):
    def __init__(self, kind: str, d_in: int, d_out: int):
        super().__init__()
        self.kind = kind
        if kind == "layer_norm":
            self.norm = flow.nn.LayerNorm(d_in)
            self.fc = flow.nn.Linear(d_in, d_out)
        elif kind == "residual_mlp":
            self.up = flow.nn.Linear(d_in, 2 * d_in)
            self.down = flow.nn.Linear(2 * d_in, d_in)
            self.fc = flow.nn.Linear(d_in, d_out)
        else:
            self.fc = flow.nn.Linear(d_in, d_out)

    def forward(self, x):
        F = flow.nn.functional
        if self.kind == "layer_norm":
            return self.fc(self.norm(x))
        if self.kind == "residual_mlp":
            return self.fc(x + self.down(F.gelu(self.up(x))))
        y = self.fc(x)
        return y.tanh() if self.kind == "linear_tanh" else F.gelu(y) if self.kind == "linear_gelu" else y


class Stage(flow.nn.Module):
    """One stage's blocks; the last stage also reads the skip input (projected) when there is one."""

    def __init__(self, kinds: list, d_in: int, d_out: int, skip: bool, bn: bool = False):
        super().__init__()
        dims = [d_in] + [d_out] * len(kinds)
        self.blocks = flow.nn.ModuleList([Block(k, a, b) for k, a, b in zip(kinds, dims, dims[1:])])
        self.skip = flow.nn.Linear(D_IN, d_out, bias=False) if skip else None
        self.bn = flow.nn.BatchNorm1d(d_in, momentum=0.3) if bn else None

    def forward(self, h, x=None):
        if self.bn is not None:
            h = self.bn(h)
        for b in self.blocks:
            h = b(h)
        return h + self.skip(x) if self.skip is not None else h


class Net(flow.nn.Module):
    def __init__(self, prog: dict):
        super().__init__()
        dims = [D_IN] + prog["widths"][:-1] + [D_OUT]
        last = prog["p"] - 1
        bn = prog["bn"] and prog["m"] == 1
        self.stages = flow.nn.ModuleList([Stage(k, a, b, prog["skip"] and i == last, bn and i == 0)
                                          for i, (k, a, b) in enumerate(zip(prog["stages"], dims, dims[1:]))])
        self.places, self.sbp, self.explicit = None, None, True

    def forward(self, x):
        h, last = x, len(self.stages) - 1
        for i, stage in enumerate(self.stages):
            if self.places is not None and i and self.explicit:
                h = h.to_global(placement=self.places[i], sbp=self.sbp)
            if i == last and stage.skip is not None:
                skip = x.to_global(placement=self.places[i], sbp=self.sbp) \
                    if self.places is not None and self.explicit else x
                h = stage(h, skip)
            else:
                h = stage(h)
        return h


def _data(step: int) -> tuple:
    """(x, class labels, regression targets) of a step, in the default dtype."""
    g = torch.Generator().manual_seed(100 + step)
    dt = torch.get_default_dtype()   # (float32 draws, upcast in a float64 run: the same values)
    return torch.randn(BATCH, D_IN, generator=g).to(dt), torch.randint(0, D_OUT, (BATCH,), generator=g), \
        torch.randn(BATCH, D_OUT, generator=g).to(dt)


def _loss(prog: dict, out, y, target):
    F = flow.nn.functional
    return F.cross_entropy(out, y) if prog["loss"] == "cross_entropy" else F.mse_loss(out, target)


def _optimizer(prog: dict, params) -> tuple:
    if prog["opt"] == "sgd":
        opt = flow.optim.SGD(params, lr=prog["lr"], momentum=0.9)
    else:
        opt = (flow.optim.AdamW if prog["opt"] == "adamw" else flow.optim.Adam)(params, lr=prog["lr"] / 10)
    return opt, flow.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if prog["sched"] else None


def _clip(prog: dict, net: Net) -> None:
    if prog["clip"] == "whole":
        flow.nn.utils.clip_grad_norm_(net.parameters(), 0.3)
    elif prog["clip"] == "per_stage":
        for stage in net.stages:
            flow.nn.utils.clip_grad_norm_(stage.parameters(), 0.3)


def _init(prog: dict, seed: int) -> dict:
    flow.manual_seed(seed)
    return {k: v.detach().numpy().copy() for k, v in Net(prog).state_dict().items()}


def _reference(prog: dict, init: dict) -> tuple:
    net = Net(prog)
    net.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
    opt, sched = _optimizer(prog, net.parameters())
    losses, outs = [], []
    for s in range(STEPS):
        x, y, t = (flow.tensor(a) for a in _data(s))
        out = net(x)
        loss = _loss(prog, out, y, t)
        opt.zero_grad()
        loss.backward()
        _clip(prog, net)
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
        outs.append(out.detach().numpy().copy())
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}, losses, outs


def _pipelined(rank: int, prog: dict, init: dict) -> tuple:
    p, dp = prog["p"], prog["dp"]
    places = [flow.placement("cpu", ranks=list(range(i * dp, (i + 1) * dp))) for i in range(p)]
    sbp = [S(0)] if dp > 1 else [B]
    net = Net(prog)
    net.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
    for stage, place in zip(net.stages, places):
        stage.to_global(placement=place, sbp=[B])
    net.places, net.sbp, net.explicit = places, sbp, prog["move"] == "explicit"
    opt, sched = _optimizer(prog, net.parameters())

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = net
            for i, (stage, place) in enumerate(zip(self.net.stages, places)):
                stage.to(flow.nn.graph.GraphModule).set_stage(i, place)
                if prog["ckpt"][i]:
                    stage.to(flow.nn.graph.GraphModule).activation_checkpointing = True
            self.config.set_gradient_accumulation_steps(prog["m"])
            if prog["auto"]:
                self.config.enable_auto_parallel()
            else:
                self.config.set_pipeline_schedule(prog["schedule"])
            if prog["zero"]:
                self.config.enable_zero(True, stage=prog["zero"], shard_min_size=1)
            self.add_optimizer(opt, lr_sch=sched)

        def build(self, x, y, t):
            out = self.net(x)
            loss = _loss(prog, out, y, t)
            loss.backward()
            _clip(prog, self.net)
            return (loss, out.detach()) if prog["out"] else loss

    g = G()
    losses, outs = [], []
    last = places[-1]
    for s in range(STEPS):
        x, y, t = _data(s)
        # (every rank holds the whole batch: broadcast, then split, so the logical batch is it)
        whole = lambda a, place: flow.tensor(a).to_global(placement=place, sbp=[B]).to_global(sbp=sbp)
        loss = g(whole(x, places[0]), whole(y, last), whole(t, last))
        if prog["out"]:
            loss, out = loss
            full = out.to_global(placement=last, sbp=[B])
            if rank in last.flat_ranks:
                outs.append(full.to_local().numpy().copy())
        if rank in last.flat_ranks:
            # per micro-batch losses; with data parallelism each rank holds a partial sum
            losses.append(loss.to_global(placement=last, sbp=[B]).to_local().numpy().copy()
                          if dp == 1 else loss.to_local().numpy().copy())
    params = {}
    for k, v in net.state_dict().items():
        place = places[int(k.split(".")[1])]
        params[k] = v.to_global(placement=place, sbp=[B]).to_local().numpy().copy() \
            if rank in place.flat_ranks else None
    return params, losses, outs


def _compare(seed: int, tol: tuple) -> None:
    """The pipelined graph's parameters, outputs and losses against full-batch eager, within
    ``tol`` = (rtol, atol, loss rtol, loss atol)."""
    rtol, atol, loss_rtol, loss_atol = tol
    prog = _program(seed)
    init = _init(prog, seed)
    want, want_losses, want_outs = _reference(prog, init)
    n = prog["p"] * prog["dp"]
    results = world.simulate(n, lambda r: _pipelined(r, prog, init))
    where = f"seed {seed}:\n{_describe(seed)}"
    for params, _, outs in results:
        for k, v in params.items():
            if v is not None:
                np.testing.assert_allclose(v, want[k], rtol=rtol, atol=atol, err_msg=f"{k}, {where}")
        for got, ref in zip(outs, want_outs):   # (the last stage's ranks: every micro-batch's rows)
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=f"output, {where}")
    last = results[-prog["dp"]:]
    if prog["dp"] == 1:
        got = [float(np.mean(v)) for v in last[0][1]]
    else:   # the stage's ranks' partial sums add up to the micro-batch losses
        got = [float(np.mean(sum(np.asarray(r[1][s]) for r in last))) for s in range(STEPS)]
    np.testing.assert_allclose(got, want_losses, rtol=loss_rtol, atol=loss_atol, err_msg=f"losses, {where}")


def _check(seed: int) -> None:
    """float32 within a tolerance; where that fails, the same program in float64 must agree to
    1e-9: float32 sums over micro-batches in another order than the full batch's, and Adam turns
    a near-zero gradient's last bits into a visible step (seed 6312: 1.6e-4 on one weight in float32,
    5e-17 in float64), which is rounding, not a wrong pipeline."""
    try:
        _compare(seed, (2e-4, 2e-5, 2e-5, 1e-6))
    except AssertionError as in_float32:
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            _compare(seed, (1e-9, 1e-11, 1e-9, 1e-11))
        except AssertionError as in_float64:
            raise in_float64 from in_float32
        finally:
            torch.set_default_dtype(before)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_pipelines_train_as_full_batch_eager(seed):
    _check(seed)


def test_float32_rounding_is_told_from_a_wrong_pipeline():
    """Seed 6312 (Adam, 2 micro-batches): one weight 1.6e-4 off in float32, equal in float64. The
    float64 run is what passes it; a wrong pipeline fails both."""
    with pytest.raises(AssertionError):
        _compare(6312, (2e-4, 2e-5, 2e-5, 1e-6))
    _check(6312)
