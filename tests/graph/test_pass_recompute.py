"""Memory passes for the graph's planned peak: pointwise recomputation (passes/recompute.py),
memory-aware scheduling and gelu_backward in place (passes/memory_plan.py). Each keeps the
numbers bit for bit (against the graph without it and against eager) and lowers the peak."""
import numpy as np
import torch

import holoflow as flow
from holoflow.examples import gpt
from holoflow.graph.graph import Graph
from holoflow.graph.ir import IRGraph, Node, Value, check
from holoflow.graph.passes.memory_plan import last_uses, memory_plan, peak_bytes, schedule
from holoflow.graph.passes.recompute import TAG, candidates, with_copies


def val(*shape, name=""):
    return Value(tuple(shape), torch.float32, name=name)


def run(g: IRGraph, feeds: dict) -> list:
    env = dict(feeds)
    for n in g.nodes:
        out = n.fn()(*(env[x] if isinstance(x, Value) else x for x in n.inputs), **n.attrs)
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out or ())
        env.update(zip(n.outputs, outs))
        for v in (g.frees or {}).get(id(n), ()):
            del env[v]
    return [env[o] for o in g.outputs]


def test_schedule_runs_a_freeing_node_first_and_keeps_values():
    x = val(64, 64, name="x")
    h, u, s, o = val(64, 64), val(64, 64), val(), val(64, 64)
    nodes = (Node("exp", (x,), {}, (h,)),
             Node("mul", (x, 2), {}, (u,)),          # allocates while h is still live
             Node("sum", (h,), {"dim": None, "keepdim": False, "dtype": None}, (s,)),  # frees h
             Node("add", (u, s), {"alpha": 1}, (o,)))
    g = check(IRGraph((x,), (), nodes, (o,)))
    assert [n.op for n in schedule(g).nodes] == ["exp", "sum", "mul", "add"]
    plain = g.with_(frees=last_uses(g))
    h2 = check(memory_plan(g))
    assert peak_bytes(h2, h2.frees) < peak_bytes(plain, plain.frees)
    xs = torch.randn(64, 64)
    torch.testing.assert_close(run(h2, {x: xs})[0], xs * 2 + torch.exp(xs).sum(), rtol=0, atol=0)


def test_schedule_keeps_random_nodes_in_order():
    x = val(64, name="x")
    a, ma, b, mb, s, o = val(64), val(64), val(64), val(64), val(), val(64)
    drop = {"p": 0.5, "training": True, "generator": None}
    nodes = (Node("dropout", (x,), drop, (a, ma)),
             Node("dropout", (x,), drop, (b, mb)),
             Node("sum", (a,), {"dim": None, "keepdim": False, "dtype": None}, (s,)),
             Node("add", (b, s), {"alpha": 1}, (o,)))
    order = [n for n in schedule(check(IRGraph((x,), (), nodes, (o,)))).nodes if n.op == "dropout"]
    assert order == [nodes[0], nodes[1]]


def test_recompute_copies_a_pointwise_value_into_the_backward():
    x = val(32, 16, name="x")
    y, dy, dx, dw = val(32, 16), val(32, 16), val(32, 16), val(32, 16)
    nodes = (Node("gelu", (x,), {"approximate": "none"}, (y,)),
             Node("exp", (x,), {}, (dy,), tags=frozenset({"bw"})),
             Node("gelu_backward", (dy, x), {"approximate": "none"}, (dx,), tags=frozenset({"bw"})),
             Node("mul", (y, dx), {}, (dw,), tags=frozenset({"bw"})))
    g = check(IRGraph((x,), (), nodes, (dw,)))
    assert candidates(g) == {y}
    r = check(with_copies(g, candidates(g)))
    copies = [n for n in r.nodes if TAG in n.tags]
    assert [n.op for n in copies] == ["gelu"] and r.nodes[-1].inputs[0] is copies[0].outputs[0]
    xs = torch.randn(32, 16)
    want = torch.nn.functional.gelu(xs) * torch.ops.aten.gelu_backward(torch.exp(xs), xs)
    for h in (g, r):
        h = memory_plan(h)
        torch.testing.assert_close(run(h, {x: xs.clone()})[0], want, rtol=0, atol=0)


class Train(Graph):
    def __init__(self, m, opt, **cfg):
        super().__init__()
        self.model = m
        self.add_optimizer(opt)
        for k, v in cfg.items():
            setattr(self.config, k, v)

    def build(self, x, y):
        loss = self.model(x, y)[1]
        loss.backward()
        return loss


def _gpt(lib):
    lib.manual_seed(0)
    m = gpt.build(lib)(17, 8, 2, 16, 2)
    rng = np.random.default_rng(0)
    x, y = (lib.tensor(rng.integers(0, 17, (4, 8))) for _ in range(2))
    return m, lib.optim.AdamW(m.parameters(), lr=1e-2), x, y


def test_gpt_graph_same_numbers_lower_peak():
    runs = {}
    for on in (False, True):
        m, opt, x, y = _gpt(flow)
        g = Train(m, opt, recompute_pointwise=on)
        losses = [g(x, y).item() for _ in range(3)]
        c = next(iter(g._compiled.values()))
        runs[on] = (losses, [p.detach().to_torch().clone() for p in m.parameters()], c)
    (l0, p0, c0), (l1, p1, c1) = runs[False], runs[True]
    assert l0 == l1 and all(torch.equal(a, b) for a, b in zip(p0, p1))
    assert any(n.op == "gelu" and TAG in n.tags for n in c1.ir.nodes)
    assert not any(TAG in n.tags for n in c0.ir.nodes)
    assert any(n.op == "gelu_backward" and "inplace" in n.tags for n in c1.ir.nodes)
    assert c1.peak_bytes < c0.peak_bytes
    tm, topt, tx, ty = _gpt(torch)
    for want in l1:
        topt.zero_grad()
        loss = tm(tx, ty)[1]
        loss.backward()
        topt.step()
        assert abs(loss.item() - want) < 1e-5
