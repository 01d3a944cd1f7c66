"""Gradient accumulation, OneFlow's semantics: m micro-batches, each its own forward and backward
with the loss scaled by 1/m, one update; outputs packed per micro-batch. The reference is eager
code doing exactly that (``(loss / m).backward()`` per chunk), checked bit for bit where the
kernels are the same."""
import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow import nn
from holoflow.amp import GradScaler
from holoflow.core.errors import HoloflowError
from holoflow.graph.graph import Graph
from holoflow.graph.passes.grad_acc import piece_sizes


def mlp(dropout=0.0, bn=False):
    flow.manual_seed(0)
    layers = [nn.Linear(16, 32)] + ([nn.BatchNorm1d(32)] if bn else []) + [nn.Tanh()]
    layers += ([nn.Dropout(dropout)] if dropout else []) + [nn.Linear(32, 4)]
    m = nn.Sequential(*layers)
    return m, flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def mse_mean(out, y):
    return ((out - y) ** 2).mean()


def mse_sum(out, y):
    return ((out - y) ** 2).sum()


class Train(Graph):
    def __init__(self, m, opt, n, loss_fn=mse_mean, scaler=None):
        super().__init__()
        self.model, self.loss_fn = m, loss_fn
        self.add_optimizer(opt)
        self.config.set_gradient_accumulation_steps(n)
        if scaler is not None:
            self.set_grad_scaler(scaler)

    def build(self, x, y):
        out = self.model(x)
        loss = self.loss_fn(out, y)
        loss.backward()
        return loss, out


def eager_step(m, opt, x, y, n, loss_fn=mse_mean, scaler=None):
    """One step as OneFlow's gradient accumulation means it: per micro-batch losses and outputs."""
    opt.zero_grad(set_to_none=True)
    losses, outs = [], []
    for xc, yc in zip(x.chunk(n, 0), y.chunk(n, 0)):
        out = m(xc)
        loss = loss_fn(out, yc)
        lo = loss / n
        (scaler.scale(lo) if scaler is not None else lo).backward()
        losses.append(loss.detach())
        outs.append(out.detach())
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    return flow.stack(losses), flow.cat(outs)


def check_same(pairs, exact=True):
    for a, b in pairs:
        if exact:
            assert torch.equal(a._data, b._data)
        else:
            torch.testing.assert_close(a._data, b._data, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss_fn", [mse_mean, mse_sum], ids=["mean", "sum"])
@pytest.mark.parametrize("n", [2, 4])
def test_equals_eager_micro_batches(loss_fn, n):
    flow.manual_seed(1)
    x, y = flow.randn(8, 16), flow.randn(8, 4)
    m1, o1 = mlp()
    g = Train(m1, o1, n, loss_fn)
    m2, o2 = mlp()
    for _ in range(3):
        loss_g, out_g = g(x, y)
        loss_e, out_e = eager_step(m2, o2, x, y, n, loss_fn)
        assert tuple(loss_g.shape) == (n,) and tuple(out_g.shape) == (8, 4)
        check_same([(loss_g, loss_e), (out_g, out_e)])
    check_same(zip(m1.parameters(), m2.parameters()))
    check_same(zip(o1.state_dict()["state"][0].values(), o2.state_dict()["state"][0].values()))


def test_sum_loss_gradient_is_scaled_by_one_over_m():
    """OneFlow scales the loss by 1/m: a sum loss's step is 1/m of the full-batch sum's (the
    graph used to give the full-batch sum's gradient, m times larger)."""
    flow.manual_seed(1)
    x, y = flow.randn(8, 16), flow.randn(8, 4)
    m1, _ = mlp()
    o1 = flow.optim.SGD(m1.parameters(), lr=0.01)
    before = [p._data.clone() for p in m1.parameters()]
    Train(m1, o1, 4, mse_sum)(x, y)
    m2, _ = mlp()
    mse_sum(m2(x), y).backward()
    for p0, p1, q in zip(before, m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p1._data, p0 - 0.01 * q.grad._data / 4, rtol=1e-5, atol=1e-6)


def test_batchnorm_statistics_per_micro_batch():
    """Each micro-batch normalises with its own statistics and moves the running statistics once
    (m momentum updates per step, num_batches_tracked += m), as eager micro-batches do."""
    flow.manual_seed(1)
    x, y = flow.randn(8, 16), flow.randn(8, 4)
    m1, o1 = mlp(bn=True)
    g = Train(m1, o1, 4)
    m2, o2 = mlp(bn=True)
    for _ in range(2):
        loss_g, out_g = g(x, y)
        loss_e, out_e = eager_step(m2, o2, x, y, 4)
        check_same([(loss_g, loss_e), (out_g, out_e)], exact=False)
    for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
        torch.testing.assert_close(a._data, b._data, rtol=1e-5, atol=1e-6, msg=k)
    assert m1[1].num_batches_tracked.item() == 8


def test_dropout_draws_fresh_per_micro_batch_in_eager_order():
    flow.manual_seed(1)
    x, y = flow.randn(8, 16), flow.randn(8, 4)
    m1, o1 = mlp(dropout=0.5)
    g = Train(m1, o1, 4)
    m2, o2 = mlp(dropout=0.5)
    flow.manual_seed(7)
    loss_g, out_g = g(x, y)
    flow.manual_seed(7)
    loss_e, out_e = eager_step(m2, o2, x, y, 4)
    # eager draws a fresh mask per micro-batch: one mask reused (or drawn in another order) differs
    check_same([(loss_g, loss_e), (out_g, out_e)], exact=False)
    check_same(zip(m1.parameters(), m2.parameters()), exact=False)


def test_grad_scaler_with_accumulation():
    flow.manual_seed(1)
    x, y = flow.randn(8, 16), flow.randn(8, 4)
    m1, o1 = mlp()
    g = Train(m1, o1, 2, mse_sum, scaler=GradScaler("cpu", init_scale=2.0 ** 127, growth_interval=100))
    m2, o2 = mlp()
    s2 = GradScaler("cpu", init_scale=2.0 ** 127, growth_interval=100)   # overflows first: a skipped step
    for _ in range(3):
        loss_g, _ = g(x, y)
        loss_e, _ = eager_step(m2, o2, x, y, 2, mse_sum, scaler=s2)
        check_same([(loss_g, loss_e)], exact=False)
        assert g._grad_scaler.get_scale() == s2.get_scale()
    assert s2.get_scale() < 2.0 ** 127
    check_same(zip(m1.parameters(), m2.parameters()), exact=False)


def test_oneflow_documented_case():
    """OneFlow's own test (test_graph_grad_acc): Linear(3, 8), SGD momentum, 4 micro-batches of 2
    rows, a sum loss; the graph returns the flattened output and one loss per micro-batch, and
    its weights equal eager's with ``loss * 0.25`` per micro-batch."""
    x = flow.tensor(np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32))

    def make():
        lin = nn.Linear(3, 8)
        nn.init.constant_(lin.weight, 2.068758)
        nn.init.constant_(lin.bias, 1.23)
        return lin, flow.optim.SGD(lin.parameters(), lr=0.01, momentum=0.9)
    lin_e, sgd_e = make()
    eager_losses, eager_w, eager_b = [], [], []
    for i in range(12):
        out = lin_e(x[(i % 4) * 2:(i % 4) * 2 + 2]) + 1
        out = out.reshape(-1).sum()
        (out * 0.25).backward()
        if (i + 1) % 4 == 0:
            sgd_e.step()
            sgd_e.zero_grad()
            eager_w.append(lin_e.weight._data.clone())
            eager_b.append(lin_e.bias._data.clone())
        eager_losses.append(out.item())
    lin_g, sgd_g = make()

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.linear = lin_g
            self.add_optimizer(sgd_g)
            self.config.set_gradient_accumulation_steps(4)

        def build(self, x):
            out = (self.linear(x) + 1).reshape(-1)
            loss = out.sum()
            loss.backward()
            return out, loss
    g = G()
    for i in range(3):
        out, loss = g(x)
        assert tuple(out.shape) == (64,) and tuple(loss.shape) == (4,)
        torch.testing.assert_close(lin_g.weight._data, eager_w[i])
        torch.testing.assert_close(lin_g.bias._data, eager_b[i])   # its gradient is data-free
        assert loss.tolist() == pytest.approx(eager_losses[4 * i:4 * i + 4], rel=1e-6)


def test_indivisible_batch_names_the_input():
    m, o = mlp()
    g = Train(m, o, 4)
    with pytest.raises(HoloflowError, match=r"input 0 has shape \(6, 16\).*multiple of 4"):
        g(flow.randn(6, 16), flow.randn(6, 4))


def test_the_step_is_one_plan_with_per_micro_batch_nodes():
    flow.manual_seed(1)
    m, o = mlp()
    g = Train(m, o, 4)
    g(flow.randn(8, 16), flow.randn(8, 4))
    ir = next(iter(g._compiled.values())).ir
    lin = [n for n in ir.nodes if n.op == "linear"]
    assert len(lin) == 8 and all(n.outputs[0].shape[0] == 2 for n in lin)   # 2 layers x 4 micro-batches
    assert len([n for n in ir.nodes if n.op == "linear_grad_weight"]) == 8


def test_piece_sizes():
    assert piece_sizes(8, 4) == (2, 2, 2, 2)
    assert piece_sizes(7, 3) == (3, 2, 2)


def test_an_input_build_never_reads_is_split_too():
    """An input nothing in build() reads: its split still gets a source line (the pass failed the
    IR check after it: 'node 0 (split) has no source line'), and training matches eager."""
    def make():
        flow.manual_seed(0)
        m = nn.Linear(4, 2)
        return m, flow.optim.SGD(m.parameters(), lr=0.1)
    m1, o1 = make()

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = m1
            self.add_optimizer(o1)
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x, unused):
            loss = self.m(x).square().mean()
            loss.backward()
            return loss
    x = flow.tensor(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    got = G()(x, flow.zeros(4, 3))
    m2, o2 = make()
    want = []
    for xc in x.chunk(2, 0):
        loss = m2(xc).square().mean()
        (loss / 2).backward()
        want.append(loss.item())
    o2.step()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    for p, q in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p._data, q._data)


def test_an_input_returned_as_it_is_is_packed():
    """build() returning one of its inputs unchanged: the pack of its micro-batches gets a source
    line (the pass failed the IR check after it: 'node 7 (cat) has no source line')."""
    flow.manual_seed(0)
    m = nn.Linear(4, 2)

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(flow.optim.SGD(m.parameters(), lr=0.1))
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x):
            loss = self.m(x).square().mean()
            loss.backward()
            return loss, x
    x = flow.tensor(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    _, out = G()(x)
    torch.testing.assert_close(out._data, x._data)
