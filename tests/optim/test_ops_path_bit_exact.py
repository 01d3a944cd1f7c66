"""The optimizers' holoflow-ops path (``foreach=False``, global tensors, nn.Graph) gives torch's
single-tensor numbers bit for bit, as the foreach path does: its lerp/addcmul/addcdiv are the ops on
torch's kernels (composites of add and mul/div differed in the last bit: Adam with amsgrad,
Adagrad, centered RMSprop, ...)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.distributed import world

RNG = np.random.default_rng(5)
INIT = RNG.standard_normal((4, 6)).astype(np.float32)
GRADS = [RNG.standard_normal((4, 6)).astype(np.float32) for _ in range(5)]
CASES = [("Adam", {"amsgrad": True}), ("AdamW", {"weight_decay": 0.3}), ("Adagrad", {"lr_decay": 0.1}),
         ("RMSprop", {"centered": True, "momentum": 0.9}), ("RMSprop", {"weight_decay": 0.1, "alpha": 0.5}),
         ("NAdam", {"weight_decay": 0.1}), ("Adamax", {}), ("RAdam", {"decoupled_weight_decay": True,
                                                                      "weight_decay": 0.1}),
         ("Adadelta", {"rho": 0.5}), ("ASGD", {"t0": 2}), ("Rprop", {}), ("SGD", {"momentum": 0.9,
                                                                                  "nesterov": True})]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(CASES)]


def _torch(name, kw):
    p = torch.nn.Parameter(torch.tensor(INIT))
    opt = getattr(torch.optim, name)([p], lr=0.05, foreach=False, **kw)
    for g in GRADS:
        p.grad = torch.tensor(g)
        opt.step()
    return p.detach().numpy()


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_eager_ops_path_equals_torch(name, kw):
    p = flow.nn.Parameter(flow.tensor(INIT.copy()))
    opt = getattr(flow.optim, name)([p], lr=0.05, foreach=False, **kw)
    for g in GRADS:
        p.grad = flow.tensor(g.copy())
        opt.step()
    np.testing.assert_array_equal(p.detach().numpy(), _torch(name, kw))


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_graph_update_equals_torch(name, kw):
    p = flow.nn.Parameter(flow.tensor(INIT.copy()))
    opt = getattr(flow.optim, name)([p], lr=0.05, **kw)

    class Step(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(opt)

        def build(self, g):
            (p * g).sum().backward()   # p's gradient is g
            return g

    step = Step()
    for g in GRADS:
        step(flow.tensor(g.copy()))
    np.testing.assert_array_equal(p.detach().numpy(), _torch(name, kw))


@pytest.mark.parametrize("name,kw", CASES[:6], ids=IDS[:6])
def test_global_split_update_equals_torch(name, kw):
    """A row-split parameter on 2 simulated ranks: each rank's shard steps with holoflow ops."""
    def run(rank):
        placement = flow.placement("cpu", ranks=[0, 1])
        split = lambda a: flow.tensor(a.copy()).to_global(placement, flow.sbp.broadcast).to_global(
            sbp=flow.sbp.split(0))
        p = flow.nn.Parameter(split(INIT))
        opt = getattr(flow.optim, name)([p], lr=0.05, **kw)
        for g in GRADS:
            p.grad = split(g)
            opt.step()
        return p.detach().to_global(sbp=flow.sbp.broadcast).to_local().numpy()

    for got in world.simulate(2, run):
        np.testing.assert_array_equal(got, _torch(name, kw))
