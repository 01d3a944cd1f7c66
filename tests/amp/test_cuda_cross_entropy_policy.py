"""CUDA autocast's cross_entropy, checked on the CPU by giving the CPU the CUDA policy: torch's CUDA
list has no cross_entropy, which reaches ``log_softmax(x, dtype=float32)`` and ``nll_loss``; so the
low-precision logits are read as they are (no float32 copy), the loss is float32, and the logits'
gradient comes back in their dtype. Eager and nn.Graph alike."""
import pytest
import torch
import torch.nn.functional as TF

import holoflow as flow
from holoflow import nn
from holoflow.amp import policy
from holoflow.graph.graph import Graph

BF16 = torch.bfloat16


@pytest.fixture
def cuda_policy(monkeypatch):
    monkeypatch.setitem(policy.POLICIES, "cpu", policy.POLICIES["cuda"])


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(12, 16, generator=g), torch.randint(0, 7, (12,), generator=g)


def _reference(w, b, x, t):
    """torch's CUDA autocast computation, spelled out on the CPU: a bf16 linear, then
    nll_loss(log_softmax(logits, dtype=float32))."""
    w, b = w.clone().requires_grad_(), b.clone().requires_grad_()
    z = TF.linear(x.to(BF16), w.to(BF16), b.to(BF16))
    loss = TF.nll_loss(torch.log_softmax(z, 1, dtype=torch.float32), t)
    loss.backward()
    return loss, w.grad, b.grad


def test_eager_reads_the_low_precision_logits(cuda_policy):
    x, t = _data()
    flow.manual_seed(0)
    lin = nn.Linear(16, 7)
    want, gw, gb = _reference(lin.weight.to_torch().detach(), lin.bias.to_torch().detach(), x, t)
    with flow.autocast("cpu", dtype=flow.bfloat16):
        logits = lin(flow.from_torch(x))
        loss = nn.functional.cross_entropy(logits, flow.from_torch(t))
    assert logits.dtype == flow.bfloat16 and loss.dtype == flow.float32
    node = loss.grad_fn
    assert node.op.name == "cross_entropy_log_softmax" and node.attrs["dtype"] == torch.float32
    assert node.edges[0][0] is logits.grad_fn          # no cast between the logits and the loss
    loss.backward()
    torch.testing.assert_close(loss.to_torch(), want, rtol=0, atol=0)
    torch.testing.assert_close(lin.weight.grad.to_torch(), gw, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lin.bias.grad.to_torch(), gb, rtol=1e-6, atol=1e-6)


def test_graph_reads_the_low_precision_logits(cuda_policy):
    x, t = _data()
    flow.manual_seed(0)
    lin = nn.Linear(16, 7)
    w0, b0 = lin.weight.to_torch().detach().clone(), lin.bias.to_torch().detach().clone()
    want, gw, gb = _reference(w0, b0, x, t)

    class Train(Graph):
        def __init__(self):
            super().__init__()
            self.lin = lin
            self.add_optimizer(flow.optim.SGD(lin.parameters(), lr=1.0))
            self.config.enable_amp(True, dtype=flow.bfloat16)

        def build(self, x, t):
            loss = nn.functional.cross_entropy(self.lin(x), t)
            loss.backward()
            return loss
    g = Train()
    loss = g(flow.from_torch(x), flow.from_torch(t))
    ir = next(iter(g._compiled.values())).ir
    (fwd,) = [n for n in ir.nodes if n.op == "cross_entropy"]
    (bwd,) = [n for n in ir.nodes if n.op == "cross_entropy_backward"]
    assert fwd.inputs[0].dtype == BF16 and fwd.attrs["dtype"] == torch.float32
    assert fwd.outputs[0].dtype == torch.float32
    assert bwd.inputs[1].dtype == BF16 and bwd.attrs["dtype"] == torch.float32 and bwd.outputs[0].dtype == BF16
    assert not [n for n in ir.nodes if n.op == "cast" and n.inputs[0] is fwd.inputs[0]]   # no float32 copy
    torch.testing.assert_close(loss.to_torch(), want, rtol=0, atol=0)
    torch.testing.assert_close(lin.weight.to_torch(), w0 - gw, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lin.bias.to_torch(), b0 - gb, rtol=1e-6, atol=1e-6)
