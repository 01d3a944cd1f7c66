"""Memory plan: frees at last use, in-place reuse only where no live value shares the buffer,
and a planned peak that counts in-place outputs as no new memory."""
import torch

import holoflow as flow
from holoflow.graph.graph import Graph as NNGraph
from holoflow.graph.ir import IRGraph, Node, Value, check
from holoflow.graph.passes.memory_plan import last_uses, memory_plan, peak_bytes


def val(*shape, dtype=torch.float32, name=""):
    return Value(tuple(shape), dtype, name=name)


def run(g: IRGraph, feeds: dict) -> list:
    """The reference interpreter, deleting values as the plan says (as lowering does)."""
    env = dict(feeds)
    env.update({v: t for v, t in g.state})
    for n in g.nodes:
        out = n.fn()(*(env[x] if isinstance(x, Value) else x for x in n.inputs), **n.attrs)
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out or ())
        env.update(zip(n.outputs, outs))
        for v in (g.frees or {}).get(id(n), ()):
            del env[v]
    return [env[o] for o in g.outputs]


def inplace_ops(g: IRGraph) -> list:
    return [n.op for n in g.nodes if "inplace" in n.tags]


def test_chain_runs_in_place_and_lowers_peak():
    x = val(64, 64, name="x")
    a, b, c, d = val(64, 64), val(64, 64), val(64, 64), val(64, 64)
    nodes = (Node("exp", (x,), {}, (a,)),
             Node("mul", (a, 2), {}, (b,)),
             Node("add", (b, 1), {"alpha": 1}, (c,)),
             Node("sin", (c,), {}, (d,)))
    g = check(IRGraph((x,), (), nodes, (d,)))
    h = check(memory_plan(g))
    assert inplace_ops(h) == ["mul", "add", "sin"]  # exp reads the feed: never in place
    plain = g.with_(frees=last_uses(g))
    assert peak_bytes(h, h.frees) == 64 * 64 * 4 < peak_bytes(plain, plain.frees) == 2 * 64 * 64 * 4
    xs = torch.randn(64, 64)
    feed = xs.clone()
    torch.testing.assert_close(run(h, {x: feed})[0], torch.sin(torch.exp(xs) * 2 + 1), rtol=0, atol=0)
    assert torch.equal(feed, xs)  # the feed is untouched


def test_viewed_input_is_not_reused():
    x = val(4, 4, name="x")
    a, t, b, c = val(4, 4), val(4, 4), val(4, 4), val(4, 4)
    # a dies at mul, but its view t is read later: writing into a would change t
    nodes = (Node("exp", (x,), {}, (a,)),
             Node("permute", (a,), {"dims": (1, 0)}, (t,)),
             Node("mul", (a, 2), {}, (b,)),
             Node("add", (b, t), {"alpha": 1}, (c,)))
    g = check(IRGraph((x,), (), nodes, (c,)))
    h = check(memory_plan(g))
    assert "mul" not in inplace_ops(h)
    assert inplace_ops(h) == ["add"]  # b is private; t is another buffer's view, only read
    xs = torch.randn(4, 4)
    torch.testing.assert_close(run(h, {x: xs})[0], torch.exp(xs) * 2 + torch.exp(xs).T, rtol=0, atol=0)


def test_input_read_through_a_view_at_the_same_node_is_not_reused():
    x = val(4, 4, name="x")
    a, t, b = val(4, 4), val(4, 4), val(4, 4)
    nodes = (Node("exp", (x,), {}, (a,)),
             Node("permute", (a,), {"dims": (1, 0)}, (t,)),
             Node("add", (a, t), {"alpha": 1}, (b,)))      # a.add_(a.T) would be wrong
    g = check(IRGraph((x,), (), nodes, (b,)))
    h = check(memory_plan(g))
    assert inplace_ops(h) == []
    xs = torch.randn(4, 4)
    torch.testing.assert_close(run(h, {x: xs})[0], torch.exp(xs) + torch.exp(xs).T, rtol=0, atol=0)


def test_outputs_state_dtype_changes_and_odd_signatures_stay_out_of_place():
    x, w = val(3, name="x"), val(3, name="w")
    a, b, c, d, e, f = val(3), val(3), val(3), val(3, dtype=torch.bool), val(3), val(3)
    nodes = (Node("exp", (x,), {}, (a,)),
             Node("mul", (a, w), {}, (b,)),             # a is a graph output
             Node("mul", (w, 3.0), {}, (c,)),           # w is state
             Node("gt", (c, 0.0), {}, (d,)),            # bool result from a float input
             Node("exp", (b,), {}, (e,)),               # in place: b is private and dies here
             Node("atan2", (e, 2.0), {}, (f,)))         # atan2_ rejects a scalar: probed, kept
    g = check(IRGraph((x,), ((w, torch.full((3,), 2.0)),), nodes, (a, d, f)))
    h = check(memory_plan(g))
    assert inplace_ops(h) == ["exp"] and h.nodes[4].op == "exp" and "inplace" in h.nodes[4].tags
    xs = torch.randn(3)
    got = run(h, {x: xs})
    torch.testing.assert_close(got[2], torch.atan2(torch.exp(torch.exp(xs) * 2), torch.tensor(2.0)))
    torch.testing.assert_close(got[0], torch.exp(xs))


def test_disabled_by_config():
    class Cfg:
        inplace_reuse = False
    x, a, b = val(2, name="x"), val(2), val(2)
    g = IRGraph((x,), (), (Node("exp", (x,), {}, (a,)), Node("exp", (a,), {}, (b,))), (b,))
    assert inplace_ops(memory_plan(g, Cfg())) == [] and inplace_ops(memory_plan(g)) == ["exp"]


class _MLP(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = flow.nn.Linear(16, 4), flow.nn.Linear(4, 16)

    def forward(self, x):
        h = flow.nn.functional.gelu(self.l1(x))
        y = self.l2(h) * 0.5 + x
        return (flow.exp(y * 0.5 + 1.0) * 2.0).sum()


def _train(inplace: bool, steps: int = 3):
    flow.manual_seed(0)
    m = _MLP()
    opt = flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    class G(NNGraph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.inplace_reuse = inplace

        def build(self, x):
            loss = self.m(x)
            loss.backward()
            return loss

    g = G()
    losses = [g(flow.randn(256, 16)).item() for _ in range(steps)]
    return losses, [p._data.clone() for p in m.parameters()], next(iter(g._compiled.values()))


def test_training_graph_same_numbers_lower_peak():
    l_on, p_on, c_on = _train(True)
    l_off, p_off, c_off = _train(False)
    assert l_on == l_off
    for a, b in zip(p_on, p_off):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert inplace_ops(c_on.ir) and not inplace_ops(c_off.ir)
    assert c_on.peak_bytes < c_off.peak_bytes
