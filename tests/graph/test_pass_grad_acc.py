"""Gradient accumulation: n micro-batches give the full-batch step (loss, outputs, parameters)."""
import pytest
import torch

import holoflow as flow
from holoflow import nn
from holoflow.core.errors import HoloflowError
from holoflow.graph.graph import Graph
from holoflow.graph.passes.grad_acc import piece_sizes


def make():
    flow.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    return m, flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


class Train(Graph):
    def __init__(self, m, opt, n):
        super().__init__()
        self.model = m
        self.add_optimizer(opt)
        self.config.set_gradient_accumulation_steps(n)

    def build(self, x, y):
        out = self.model(x)
        loss = ((out - y) ** 2).mean()
        loss.backward()
        return loss, out


def test_matches_full_batch_eager():
    flow.manual_seed(1)
    x, y = flow.randn(8, 16), flow.randn(8, 4)
    m1, o1 = make()
    g = Train(m1, o1, 4)
    got = [g(x, y) for _ in range(3)]
    m2, o2 = make()
    for loss_g, out_g in got:
        out = m2(x)
        loss = ((out - y) ** 2).mean()
        o2.zero_grad()
        loss.backward()
        o2.step()
        assert tuple(loss_g.shape) == () and tuple(out_g.shape) == (8, 4)
        torch.testing.assert_close(loss_g._data, loss._data, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(out_g._data, out._data, rtol=1e-6, atol=1e-6)
    for p, q in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p._data, q._data, rtol=1e-6, atol=1e-6)
    ir = next(iter(g._compiled.values())).ir
    lin = [n for n in ir.nodes if n.op == "linear"]
    assert len(lin) == 8 and all(n.outputs[0].shape[0] == 2 for n in lin)   # 2 layers x 4 micro-batches
    wgrads = [n for n in ir.nodes if n.op in ("einsum", "linear_grad_weight")
              and n.outputs[0].shape in ((32, 16), (16, 32))]
    assert len(wgrads) == 4                                                  # backward per micro-batch too


def test_indivisible_batch_names_the_feed():
    m, o = make()
    g = Train(m, o, 4)
    with pytest.raises(HoloflowError, match=r"input0 has shape \(6, 16\).*multiple of 4"):
        g(flow.randn(6, 16), flow.randn(6, 4))


def test_piece_sizes():
    assert piece_sizes(8, 4) == (2, 2, 2, 2)
    assert piece_sizes(7, 3) == (3, 2, 2)
