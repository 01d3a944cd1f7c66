"""Activation checkpointing: same numbers, lower planned peak, random draws saved not redone."""
import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow import nn
from holoflow.core.errors import HoloflowError
from holoflow.graph.graph import Graph
from holoflow.graph.ir import IRGraph as IR
from holoflow.graph.ir import Node, Value, check
from holoflow.graph.passes.checkpointing import (RECOMPUTE, checkpointing, flagged_paths, region_of,
                                                  set_activation_checkpointing)
from holoflow.graph.passes.memory_plan import peak_bytes


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(flow.tanh(x))))


class Net(nn.Module):
    def __init__(self, d=16, n=3):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return (x * x).mean()


class Train(Graph):
    def __init__(self, m, opt):
        super().__init__()
        self.model = m
        self.add_optimizer(opt)

    def build(self, x):
        loss = self.model(x)
        loss.backward()
        return loss


def train(checkpoint: bool, steps: int = 3):
    flow.manual_seed(0)
    m = Net()
    g = Train(m, flow.optim.SGD(m.parameters(), lr=0.1))
    g.config.recompute_pointwise = False   # checkpointing's own saving (passes/recompute.py is separate)
    if checkpoint:
        for b in m.blocks:
            set_activation_checkpointing(g, b)
    x = flow.randn(32, 16, generator=None)
    losses = [g(x).item() for _ in range(steps)]
    ir = next(iter(g._compiled.values())).ir
    return losses, [p.detach().numpy().copy() for p in m.parameters()], ir


def test_same_numbers_and_lower_peak():
    l0, p0, ir0 = train(False)
    l1, p1, ir1 = train(True)
    assert l0 == l1
    assert all(np.array_equal(a, b) for a, b in zip(p0, p1))
    recomputed = [n for n in ir1.nodes if RECOMPUTE in n.tags]
    assert recomputed and not any(RECOMPUTE in n.tags for n in ir0.nodes)
    # each of 3 blocks recomputes tanh, fc1, gelu (its output is saved: read outside the block)
    assert sorted(n.op for n in recomputed) == sorted(["tanh", "linear", "gelu"] * 3)
    before, after = peak_bytes(ir0, ir0.frees), peak_bytes(ir1, ir1.frees)
    assert after < 0.8 * before, (before, after)


def test_recompute_sits_before_first_backward_use_and_reads_boundary_inputs():
    _, _, ir = train(True, steps=1)
    pos = {v: i for i, n in enumerate(ir.nodes) for v in n.outputs}
    feeds = set(ir.feeds)
    scopes = {f"model.blocks.{i}" for i in range(3)}
    for i, n in enumerate(ir.nodes):
        if RECOMPUTE in n.tags:
            users = [j for j, m in enumerate(ir.nodes) if any(v in m.inputs for v in n.outputs)]
            assert users and all(j > i and "bw" in ir.nodes[j].tags for j in users)
            for v in n.value_inputs():  # reads boundary inputs (feeds, state, other blocks) or copies
                if v in feeds or v in dict(ir.state):
                    continue
                p = ir.nodes[pos[v]]
                assert RECOMPUTE in p.tags or region_of(p, scopes) != region_of(n.with_(tags=frozenset()), scopes)


def _ir_with_dropout():
    x, h, d, mask, y, gy, gx = (Value((4,), torch.float32) for _ in range(7))
    mask = Value((4,), torch.bool)
    nodes = (Node("exp", (x,), {}, (h,), scope="m/m.blk"),
             Node("dropout", (h,), {"p": 0.5, "training": True, "generator": None}, (d, mask), scope="m/m.blk"),
             Node("mul", (d, h), {}, (y,), scope="m/m.blk"),
             Node("exp", (y,), {}, (gy,)),  # stands for the seed gradient
             Node("mul", (gy, d), {}, (gx,), tags=frozenset({"bw"})),
             Node("mul", (gx, h), {}, (Value((4,), torch.float32),), tags=frozenset({"bw"})))
    return check(IR((x,), (), nodes, (y, nodes[-1].outputs[0])))


def test_random_outputs_stay_saved():
    g = _ir_with_dropout()

    class C:
        checkpointed_scopes = {"m.blk"}
    h = check(checkpointing(g, C()))
    rec = [n for n in h.nodes if RECOMPUTE in n.tags]
    assert [n.op for n in rec] == ["exp"]                     # h recomputed; dropout not redrawn
    bw = [n for n in h.nodes if "bw" in n.tags and RECOMPUTE not in n.tags]
    assert bw[0].inputs[1] is g.nodes[1].outputs[0]          # the saved dropout output
    assert bw[1].inputs[1] is rec[0].outputs[0]
    assert h.nodes.index(rec[0]) == h.nodes.index(bw[1]) - 1  # just before its first backward use

    class Off:
        checkpointed_scopes = {"m.other"}
    assert checkpointing(g, Off()) is g


def test_set_and_flag_api():
    flow.manual_seed(0)
    m = Net(8, 2)
    g = Train(m, flow.optim.SGD(m.parameters(), lr=0.1))
    assert set_activation_checkpointing(g, m.blocks[1]) == "model.blocks.1"
    assert set_activation_checkpointing(g, "model.blocks.0") == "model.blocks.0"
    assert g.config.checkpointed_scopes == {"model.blocks.0", "model.blocks.1"}
    set_activation_checkpointing(g, m.blocks[0], False)
    assert g.config.checkpointed_scopes == {"model.blocks.1"}
    with pytest.raises(HoloflowError, match="no module at path 'model.nope'"):
        set_activation_checkpointing(g, "model.nope")
    with pytest.raises(HoloflowError, match="not a module of this graph"):
        set_activation_checkpointing(g, nn.Linear(2, 2))
    m.blocks[0].activation_checkpointing = True
    assert flagged_paths(g) == {"model.blocks.0"}
