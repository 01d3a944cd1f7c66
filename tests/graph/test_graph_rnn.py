"""Recurrent layers trained inside nn.Graph (local and data-parallel global graphs) equal eager
training: the unused final states' gradients are zeros the trace records (core/autograd.py
``_zeros_for``), and initial states of a global input are created global."""
import numpy as np
import pytest

import holoflow as flow
from holoflow.core.sbp import B, S
from holoflow.distributed import world
from holoflow.graph import Graph

X = np.random.default_rng(0).standard_normal((4, 5, 8)).astype(np.float32)


def _make(kind: str):
    """The model with weights from numpy (simulated ranks are threads sharing torch's RNG)."""
    rnn = getattr(flow.nn, kind)(8, 16, num_layers=2, batch_first=True, bidirectional=kind == "GRU")
    head = flow.nn.Linear(16 * (2 if kind == "GRU" else 1), 1)
    rng = np.random.default_rng(1)
    for m in (rnn, head):
        m.load_state_dict({k: flow.tensor(rng.uniform(-0.25, 0.25, tuple(v.shape)).astype(np.float32))
                           for k, v in m.state_dict().items()})
    return rnn, head


def _eager(kind: str, steps: int = 3):
    rnn, head = _make(kind)
    opt = flow.optim.SGD(list(rnn.parameters()) + list(head.parameters()), lr=0.1)
    x, losses = flow.tensor(X), []
    for _ in range(steps):
        opt.zero_grad()
        loss = head(rnn(x)[0]).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().numpy().copy() for p in rnn.parameters()]


def _graph(kind: str, place=None, steps: int = 3):
    rnn, head = _make(kind)
    x = flow.tensor(X)
    if place is not None:
        rnn.to_global(placement=place, sbp=[B])
        head.to_global(placement=place, sbp=[B])
        x = x.to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)])
    opt = flow.optim.SGD(list(rnn.parameters()) + list(head.parameters()), lr=0.1)

    class Train(Graph):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = rnn, head
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.head(self.rnn(x)[0]).square().mean()
            loss.backward()
            return loss
    g = Train()
    if place is None:
        return [g(x).item() for _ in range(steps)], [p.detach().numpy().copy() for p in rnn.parameters()]
    losses = [g(x).to_global(sbp=[B]).to_local().item() for _ in range(steps)]
    return losses, [p.detach().to_global(sbp=[B]).to_local().numpy().copy() for p in rnn.parameters()]


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_a_recurrent_model_trains_in_a_graph_as_in_eager(kind):
    want_l, want_p = _eager(kind)
    got_l, got_p = _graph(kind)
    np.testing.assert_allclose(got_l, want_l, rtol=1e-5)
    for a, b in zip(got_p, want_p):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_data_parallel_lstm_graph_trains_as_one_process():
    want_l, want_p = _eager("LSTM")
    results = world.simulate(2, lambda r: _graph("LSTM", flow.placement("cpu", ranks=[0, 1])), timeout=120)
    for got_l, got_p in results:
        np.testing.assert_allclose(got_l, want_l, rtol=1e-5)
        for a, b in zip(got_p, want_p):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
