"""CUDA autocast's cross_entropy, checked on the CPU by giving the CPU the CUDA policy: torch's CUDA
list has no cross_entropy, whose decomposition reaches ``log_softmax(x, 1, dtype=x.dtype)`` (an
explicit dtype: left alone) and ``nll_loss`` (float32 list); so the log-probs stay in the logits'
dtype, the loss is float32 (holoflow reads just the targets' log-probs, torch copies them all), and
the logits' gradient comes back in their dtype. Eager and nn.Graph alike, with ignored targets."""
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
    t = torch.randint(0, 7, (12,), generator=g)
    t[3] = t[8] = -100                    # ignored targets
    return torch.randn(12, 16, generator=g), t


def _reference(w, b, x, t):
    """torch's CUDA autocast computation, spelled out on the CPU: a bf16 linear, then
    nll_loss(log_softmax(logits, 1, dtype=bf16).float()) (the float32 copy autocast makes)."""
    w, b = w.clone().requires_grad_(), b.clone().requires_grad_()
    z = TF.linear(x.to(BF16), w.to(BF16), b.to(BF16))
    loss = TF.nll_loss(torch.log_softmax(z, 1, dtype=z.dtype).float(), t)
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
    assert fwd.outputs[0].dtype == torch.float32 and fwd.outputs[0].shape == ()
    assert bwd.inputs[1].dtype == BF16 and bwd.attrs["dtype"] == torch.float32 and bwd.outputs[0].dtype == BF16
    assert not [n for n in ir.nodes if n.op == "cast" and n.inputs[0] is fwd.inputs[0]]   # no float32 copy
    torch.testing.assert_close(loss.to_torch(), want, rtol=0, atol=0)
    torch.testing.assert_close(lin.weight.to_torch(), w0 - gw, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lin.bias.to_torch(), b0 - gb, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("form", ["2d", "weighted", "nd", "ignore0"])
def test_wide_loss_kernels_match_torchs_decomposition(cuda_policy, low, reduction, form):
    """The cross_entropy op with ``dtype=float32`` (the graph's op) and the eager op, against
    torch's nll_loss(log_softmax(z, 1, dtype=z.dtype).float(), t, w): values and logits' grads."""
    from holoflow.core.dispatch import apply
    from holoflow.ops.loss import CROSS_ENTROPY
    g = torch.Generator().manual_seed(1)
    shape = (6, 5, 3) if form == "nd" else (9, 5)
    z = (torch.randn(shape, generator=g) * 3).to(low)
    t = torch.randint(0, 5, shape[:1] + shape[2:], generator=g)
    ignore = 0 if form == "ignore0" else -100
    t.view(-1)[1] = ignore
    w = torch.rand(5, generator=g) + 0.5 if form == "weighted" else None
    zr = z.clone().requires_grad_()
    want = TF.nll_loss(torch.log_softmax(zr, 1, dtype=low).float(), t, w, ignore_index=ignore, reduction=reduction)
    dy = torch.rand(want.shape, generator=g) + 0.5
    (want * dy).sum().backward()
    for op in ("graph op", "eager"):
        x = flow.from_torch(z).requires_grad_()
        if op == "graph op":
            got = apply(CROSS_ENTROPY, x, flow.from_torch(t), None if w is None else flow.from_torch(w),
                        ignore_index=ignore, reduction=reduction, label_smoothing=0.0, dtype=torch.float32)
        else:
            with flow.autocast("cpu", dtype=flow.bfloat16):   # the CUDA policy: dtype=float32 attr
                got = nn.functional.cross_entropy(x, flow.from_torch(t), None if w is None else flow.from_torch(w),
                                                  ignore_index=ignore, reduction=reduction)
        assert got.dtype == flow.float32
        (got * flow.from_torch(dy)).sum().backward()
        torch.testing.assert_close(got.to_torch(), want.detach(), rtol=1e-6, atol=1e-6)
        assert x.grad.dtype == x.dtype
        torch.testing.assert_close(x.grad.to_torch(), zr.grad, rtol=0, atol=0)


def test_wide_loss_all_targets_ignored_is_nan(cuda_policy):
    z = torch.randn(4, 3).to(BF16)
    t = torch.full((4,), -100)
    want = TF.nll_loss(torch.log_softmax(z, 1, dtype=BF16).float(), t)
    with flow.autocast("cpu", dtype=flow.bfloat16):
        got = nn.functional.cross_entropy(flow.from_torch(z), flow.from_torch(t))
    assert torch.isnan(want) and torch.isnan(got.to_torch())
