"""Add-to-output fusion: matmul/linear + residual -> addmm/baddbmm, same numbers, fewer nodes."""
import torch

import holoflow as flow
from holoflow.graph.graph import Graph as NNGraph
from holoflow.graph.ir import IRGraph, Node, Value, check
from holoflow.graph.passes.fuse_add_to_output import fuse_add_to_output


def val(*shape, name=""):
    return Value(tuple(shape), torch.float32, name=name)


def run(g: IRGraph, feeds: dict) -> list:
    env = dict(feeds)
    for n in g.nodes:
        out = n.fn()(*(env[x] if isinstance(x, Value) else x for x in n.inputs), **n.attrs)
        env[n.outputs[0]] = out
    return [env[o] for o in g.outputs]


def _check_case(nodes, feeds, outputs, fused_op):
    g = check(IRGraph(tuple(feeds), (), nodes, outputs))
    h = check(fuse_add_to_output(g))
    assert [n.op for n in h.nodes] == [fused_op] and len(h.nodes) == len(nodes) - 1
    ts = {v: torch.randn(v.shape, dtype=torch.float64).float() for v in feeds}
    for want, got in zip(run(g, ts), run(h, ts)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_matmul_2d_both_operand_orders_and_alpha():
    a, b, r, o, s = val(5, 3), val(3, 4), val(5, 4), val(5, 4), val(5, 4)
    _check_case((Node("matmul", (a, b), {}, (o,)), Node("add", (o, r), {"alpha": 2.0}, (s,))),
                (a, b, r), (s,), "fused_matmul_add")
    o2, s2 = val(5, 4), val(5, 4)
    _check_case((Node("matmul", (a, b), {}, (o2,)), Node("add", (r, o2), {"alpha": -0.5}, (s2,))),
                (a, b, r), (s2,), "fused_matmul_add")


def test_batched_matmul_and_linear():
    a, b, r, o, s = val(2, 5, 3), val(2, 3, 4), val(2, 5, 4), val(2, 5, 4), val(2, 5, 4)
    _check_case((Node("matmul", (a, b), {}, (o,)), Node("add", (o, r), {"alpha": 1}, (s,))),
                (a, b, r), (s,), "fused_matmul_add")
    x, w, bias, r3, o3, s3 = val(2, 5, 3), val(4, 3), val(4), val(2, 5, 4), val(2, 5, 4), val(2, 5, 4)
    _check_case((Node("linear", (x, w, bias), {}, (o3,)), Node("add", (o3, r3), {"alpha": 1}, (s3,))),
                (x, w, bias, r3), (s3,), "fused_linear_add")
    o4, s4 = val(2, 5, 4), val(2, 5, 4)
    _check_case((Node("linear", (x, w, None), {}, (o4,)), Node("add", (r3, o4), {"alpha": 1}, (s4,))),
                (x, w, r3), (s4,), "fused_linear_add")


def test_not_fused_when_output_is_shared_or_broadcast():
    a, b, r, o, s, t = val(5, 3), val(3, 4), val(5, 4), val(5, 4), val(5, 4), val(5, 4)
    shared = (Node("matmul", (a, b), {}, (o,)), Node("add", (o, r), {"alpha": 1}, (s,)),
              Node("exp", (o,), {}, (t,)))
    g = IRGraph((a, b, r), (), shared, (s, t))
    assert fuse_add_to_output(g) is g
    row, s2, o2 = val(4), val(5, 4), val(5, 4)  # broadcast residual: not the output's shape
    g = IRGraph((a, b, row), (), (Node("matmul", (a, b), {}, (o2,)), Node("add", (o2, row), {"alpha": 1}, (s2,))), (s2,))
    assert fuse_add_to_output(g) is g


class _Res(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = flow.nn.Linear(16, 16), flow.nn.Linear(16, 16)

    def forward(self, x):
        h = flow.relu(self.l1(x)) + x
        return (self.l2(h) + h).square().mean()


def _train(fuse: bool, steps: int = 3):
    flow.manual_seed(0)
    m = _Res()
    opt = flow.optim.SGD(m.parameters(), lr=0.05)

    class G(NNGraph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.allow_fuse_add_to_output(fuse)

        def build(self, x):
            loss = self.m(x)
            loss.backward()
            return loss

    g = G()
    losses = [g(flow.randn(8, 16)).item() for _ in range(steps)]
    return losses, [p._data.clone() for p in m.parameters()], next(iter(g._compiled.values())).ir


def test_residual_mlp_training_same_numbers_fewer_nodes():
    l0, p0, ir0 = _train(False)
    l1, p1, ir1 = _train(True)
    assert sum(n.op == "fused_linear_add" for n in ir1.nodes) == 1  # l2 + h; relu(l1) + x is not
    assert len(ir1.nodes) == len(ir0.nodes) - 1
    torch.testing.assert_close(torch.tensor(l1), torch.tensor(l0), rtol=1e-6, atol=1e-6)
    for a, b in zip(p0, p1):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
