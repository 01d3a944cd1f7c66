"""AMP as an IR pass: matmuls in bf16, losses in fp32, fp32 gradients into the update; the
losses and parameters track eager training under ``flow.autocast('cpu', bf16)``."""
import numpy as np
import torch

import holoflow as flow
from holoflow import nn
from holoflow.amp import autocast
from holoflow.graph.graph import Graph
from holoflow.graph.ir import IRGraph as IR
from holoflow.graph.ir import Node, Value, check
from holoflow.graph.passes.amp import amp

BF16 = torch.bfloat16


def make():
    flow.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))
    return m, flow.optim.SGD(m.parameters(), lr=0.5)


class Train(Graph):
    def __init__(self, m, opt, use_amp=True):
        super().__init__()
        self.model = m
        self.add_optimizer(opt)
        self.config.enable_amp(use_amp, dtype=flow.bfloat16)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def data():
    flow.manual_seed(1)
    return flow.randn(8, 16), flow.softmax(flow.randn(8, 5), dim=1)  # probability targets


def test_matches_eager_autocast():
    x, y = data()
    m1, o1 = make()
    init = [p.detach().numpy().copy() for p in m1.parameters()]
    g = Train(m1, o1)
    graph_losses = [g(x, y) for _ in range(4)]
    m2, o2 = make()
    eager_losses = []
    for _ in range(4):
        with autocast("cpu", dtype=flow.bfloat16):
            loss = nn.functional.cross_entropy(m2(x), y)
        o2.zero_grad()
        loss.backward()
        o2.step()
        eager_losses.append(loss)
    for a, b in zip(graph_losses, eager_losses):
        assert a.dtype == b.dtype == flow.float32
        torch.testing.assert_close(a._data, b._data, rtol=2e-2, atol=2e-2)
    for p, q, p0 in zip(m1.parameters(), m2.parameters(), init):
        assert p.dtype == flow.float32
        assert not torch.equal(p._data, torch.from_numpy(p0))  # updated
        torch.testing.assert_close(p._data, q._data, rtol=2e-2, atol=2e-2)
    assert graph_losses[-1].item() < graph_losses[0].item()


def test_ir_dtypes():
    x, y = data()
    m, o = make()
    g = Train(m, o)
    g(x, y)
    ir = next(iter(g._compiled.values())).ir
    mm = [n for n in ir.nodes if n.op in ("linear", "einsum", "linear_grad_input", "linear_grad_weight")]
    assert len(mm) == 5 and all(v.dtype == BF16 for n in mm for v in n.inputs if isinstance(v, Value))
    assert all(n.outputs[0].dtype == BF16 for n in mm)
    ce = next(n for n in ir.nodes if n.op == "cross_entropy")
    assert ce.inputs[0].dtype == torch.float32
    update = next(n for n in ir.nodes if n.effect)
    assert len(update.inputs) == 4 and all(v.dtype == torch.float32 for v in update.inputs)
    assert any(n.op == "cast" and n.attrs["dtype"] == BF16 for n in ir.nodes)
    # off: no casts at all
    m, o = make()
    g = Train(m, o, use_amp=False)
    g(x, y)
    assert not any(n.op == "cast" for n in next(iter(g._compiled.values())).ir.nodes)


class Cfg:
    amp = True
    amp_dtype = flow.bfloat16


def test_promote_keep_float64_and_update_writeback():
    x, w = Value((2, 3), torch.float32, name="x"), Value((3, 3), torch.float32, name="w")
    h, c, e = Value((2, 3), torch.float32), Value((4, 3), torch.float32), Value((2, 3), torch.float32)
    state = torch.zeros(2, 3)
    nodes = (Node("matmul", (x, w), {}, (h,)),
             Node("cat", (h, x), {"dim": 0}, (c,)),        # bf16 + f32 -> promoted to f32
             Node("exp", (h,), {}, (e,)))
    g = check(IR((x,), ((w, torch.eye(3)),), nodes, (c, e), ((state, e),)))
    h2 = check(amp(g, Cfg()))
    ops = [n.op for n in h2.nodes]
    assert ops.count("cast") == 4 and ops[-1] == "cast"       # x, w -> bf16; h -> f32 for cat; e -> f32 for state
    mm = next(n for n in h2.nodes if n.op == "matmul")
    cat = next(n for n in h2.nodes if n.op == "cat")
    assert mm.outputs[0].dtype == BF16 and mm.outputs[0] is not h
    assert [v.dtype for v in cat.inputs] == [torch.float32, torch.float32] and cat.inputs[1] is x
    assert h2.outputs[1].dtype == BF16 and h2.updates[0][1].dtype == torch.float32
    x64, y64 = Value((3, 3), torch.float64), Value((3, 3), torch.float64)
    g64 = check(IR((x64,), (), (Node("matmul", (x64, x64), {}, (y64,)),), (y64,)))
    assert amp(g64, Cfg()).nodes == g64.nodes                  # float64 is never lowered


class _Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).float().pow(2).mean()


def test_attention_backward_runs_in_the_amp_dtype_with_its_logsumexp_in_float32():
    """The attention backward reads the forward's low-precision q, k, v (as eager autocast's saved
    tensors are), not the float32 values before the casts, and keeps the float32 logsumexp; the
    gradients equal eager autocast's."""
    flow.manual_seed(0)
    m1 = _Attn()
    m2 = _Attn()
    m2.load_state_dict(m1.state_dict())
    x = flow.randn(2, 6, 16)

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = m1
            self.add_optimizer(flow.optim.SGD(m1.parameters(), lr=1.0))
            self.config.enable_amp(True, dtype=flow.bfloat16)

        def build(self, x):
            loss = self.m(x)
            loss.backward()
            return loss
    g = G()
    g(x)
    ir = next(iter(g._compiled.values())).ir
    (bwd,) = [n for n in ir.nodes if n.op == "scaled_dot_product_attention_fused_backward"]
    assert [v.dtype for v in bwd.inputs[1:6]] == [BF16, BF16, BF16, BF16, torch.float32]
    w0 = m2.qkv.weight.to_torch().clone()
    opt = flow.optim.SGD(m2.parameters(), lr=1.0)
    with autocast("cpu", dtype=flow.bfloat16):
        loss = m2(x)
    loss.backward()
    opt.step()
    assert (m1.qkv.weight.to_torch() - w0).abs().max() > 1e-3      # the step moved the weights
    torch.testing.assert_close(m1.qkv.weight.to_torch(), m2.qkv.weight.to_torch(), rtol=0, atol=1e-6)


def test_explicit_conversions_in_build_keep_their_dtype_under_amp():
    """``y.float()`` of a value that is float32 when traced but bfloat16 after the AMP rewrite is
    float32, as eager autocast gives it (the trace records the request; it was dropped), and a
    conversion that changes the dtype (``.double()``) runs through the rewrite (it crashed on
    the ``to`` node's device)."""
    m = nn.Linear(4, 3)

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.config.enable_amp(True)

        def build(self, x):
            y = self.m(x)
            return y.float(), y, (y.double() * 2).sum()
    x = flow.randn(2, 4)
    got = G()(x)
    with autocast("cpu", dtype=flow.bfloat16):
        y = m(x)
        want = (y.float(), y, (y.double() * 2).sum())
    assert [t.dtype for t in got] == [t.dtype for t in want] == [flow.float32, flow.bfloat16, flow.float64]
    for a, b in zip(got, want):
        torch.testing.assert_close(a._data, b._data)


def test_layer_norm_after_log_softmax_of_a_lowered_matmul_trains_like_eager_autocast():
    """CPU: layer_norm of a bf16 activation returns bf16 statistics where the meta kernel (the
    IR's dtypes) says float32; the backward, cast back to its traced float32, met them and the
    kernel refused at run time ('expected scalar type Float but found BFloat16')."""
    x = flow.tensor(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))

    def make():
        flow.manual_seed(0)
        m = nn.Linear(8, 8, bias=False)
        return m, flow.optim.SGD(m.parameters(), lr=0.1)

    def loss_fn(m, x):
        s = nn.functional.log_softmax(m(x), dim=0)
        return nn.functional.layer_norm(s, (8,)).sin().mean()
    m1, o1 = make()

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = m1
            self.add_optimizer(o1)
            self.config.enable_amp(True, dtype=flow.bfloat16)

        def build(self, x):
            loss = loss_fn(self.m, x)
            loss.backward()
            return loss
    g = G()
    m2, o2 = make()
    for _ in range(2):
        got = g(x)
        o2.zero_grad()
        with flow.autocast("cpu", dtype=flow.bfloat16):
            want = loss_fn(m2, x)
        want.backward()
        o2.step()
        torch.testing.assert_close(got._data.float(), want._data.float(), rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(m1.weight._data, m2.weight._data, rtol=3e-2, atol=3e-2)
