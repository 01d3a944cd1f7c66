"""Elementwise fusion: fewer nodes, identical numbers; the fallback when torch.compile is gone."""
import logging

import torch

import holoflow as flow
from holoflow.graph.graph import Graph as NNGraph
from holoflow.graph.ir import IRGraph, Node, Value, check
from holoflow.graph.passes import fuse_elementwise as fe


class _MLP(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = flow.nn.Linear(16, 32), flow.nn.Linear(32, 16)
        self.b = flow.nn.Parameter(flow.zeros(32))

    def forward(self, x):
        h = flow.nn.functional.gelu(self.l1(x) * 0.5 + self.b)
        y = self.l2(h) + x
        return (y * y).mean()


def _train(fuse: bool, mode: str = "off", steps: int = 3):
    flow.manual_seed(0)
    m = _MLP()
    opt = flow.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

    class G(NNGraph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.allow_fuse_elementwise(fuse)
            self.config.fuse_elementwise_compile = mode

        def build(self, x):
            loss = self.m(x)
            loss.backward()
            return loss

    g = G()
    losses = [g(flow.randn(8, 16)).item() for _ in range(steps)]
    return losses, [p._data.clone() for p in m.parameters()], next(iter(g._compiled.values())).ir


def test_mlp_training_fewer_nodes_same_numbers():
    l0, p0, ir0 = _train(False)
    l1, p1, ir1 = _train(True)
    fused = [n for n in ir1.nodes if n.op == "fused_elementwise"]
    assert fused and len(ir1.nodes) < len(ir0.nodes)
    assert any("bw" in n.tags for n in fused)  # backward regions fuse too
    assert l0 == l1
    for a, b in zip(p0, p1):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def val(*shape):
    return Value(tuple(shape), torch.float32)


def test_regions_keep_shared_values_and_outputs_outside():
    x = val(4)
    a, b, c, d, e = val(4), val(4), val(4), val(4), val(4)
    nodes = (Node("exp", (x,), {}, (a,)),
             Node("mul", (a, 2.0), {}, (b,)),    # a read twice: a is a region output
             Node("add", (a, b), {"alpha": 1}, (c,)),
             Node("sin", (c,), {}, (d,)),
             Node("cos", (d,), {}, (e,)))        # d is a graph output: stays outside
    g = check(IRGraph((x,), (), nodes, (d, e)))
    h = check(fe.fuse_elementwise(g, type("C", (), {"fuse_elementwise_compile": "off"})()))
    assert [n.op for n in h.nodes] == ["exp", "fused_elementwise", "cos"]
    assert h.nodes[1].outputs == (d,) and set(h.nodes[1].inputs) == {a}
    env = {x: torch.randn(4)}
    for n in h.nodes:
        env[n.outputs[0]] = n.fn()(*(env[i] if isinstance(i, Value) else i for i in n.inputs), **n.attrs)
    xs = env[x]
    want = torch.sin(torch.exp(xs) + torch.exp(xs) * 2.0)
    torch.testing.assert_close(env[d], want, rtol=0, atol=0)


def test_equal_regions_share_one_kernel_entry():
    x, y = val(4), val(4)
    a1, b1, a2, b2 = val(4), val(4), val(4), val(4)
    nodes = (Node("exp", (x,), {}, (a1,)), Node("sin", (a1,), {}, (b1,)),
             Node("exp", (y,), {}, (a2,)), Node("sin", (a2,), {}, (b2,)))
    h = fe.fuse_elementwise(IRGraph((x, y), (), nodes, (b1, b2)), None)
    assert len(h.nodes) == 2 and h.nodes[0].kernel.entry is h.nodes[1].kernel.entry


def test_fallback_when_inductor_fails(monkeypatch, caplog):
    def unavailable(fn, args, options=None):
        raise RuntimeError("Inductor is not available in this build")
    monkeypatch.setattr(fe, "inductor", unavailable)
    monkeypatch.setattr(fe, "_CACHE", {})
    monkeypatch.setattr(fe, "_WARNED", set())
    l0, p0, _ = _train(False)
    with caplog.at_level(logging.WARNING, logger="holoflow.graph"):
        l1, p1, ir1 = _train(True, mode="sync")
    msgs = [r.message for r in caplog.records if "Inductor cannot compile" in r.message]
    assert len(msgs) == 1 and "not available" in msgs[0]   # logged once for all regions
    assert any(n.op == "fused_elementwise" for n in ir1.nodes)
    assert l0 == l1
    for a, b in zip(p0, p1):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_compiled_region_matches_python_sequence():
    l0, p0, _ = _train(False, steps=2)
    l1, p1, ir1 = _train(True, mode="sync", steps=2)
    assert all(n.kernel.entry.compiled is not None for n in ir1.nodes if n.op == "fused_elementwise")
    torch.testing.assert_close(torch.tensor(l1), torch.tensor(l0), rtol=1e-5, atol=1e-6)
    for a, b in zip(p0, p1):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
