"""Ops whose backward is torch's own vjp (ops/torch_vjp.py: embedding bags, cdist, grid_sample,
inverses, ...) trained inside nn.Graph equal eager training. Their backward kernel returns a tuple
of the differentiable inputs' gradients even when there is one: the program unpacks it (a node
tagged ``seq1``); it used to hand the tuple on, and the update failed."""
import numpy as np
import pytest

import holoflow as flow
from holoflow.graph import Graph

F = flow.nn.functional
RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 4)).astype(np.float32) * 0.3 + np.eye(4, dtype=np.float32) * 2
EMB = RNG.standard_normal((10, 4)).astype(np.float32)
IDX, OFF = np.array([1, 2, 3, 4, 7]), np.array([0, 2])
PTS = RNG.standard_normal((3, 4)).astype(np.float32)
GRID = (RNG.random((1, 3, 3, 2)).astype(np.float32) * 2 - 1)

CASES = {   # each: a loss of one trained parameter through one vjp op (one differentiable input)
    "embedding_bag": lambda p: F.embedding_bag(flow.tensor(IDX), p["emb"], flow.tensor(OFF), mode="sum").square().sum(),
    "linalg_inv": lambda p: flow.linalg.inv(p["w"]).square().sum(),
    "linalg_det": lambda p: flow.linalg.det(p["w"]).square(),
    "cdist": lambda p: flow.cdist(p["w"], flow.tensor(PTS)).sum(),
    "grid_sample": lambda p: F.grid_sample(p["w"].view(1, 1, 4, 4), flow.tensor(GRID),
                                           align_corners=False).square().sum(),
}


def _params():
    return {"w": flow.nn.Parameter(flow.tensor(W)), "emb": flow.nn.Parameter(flow.tensor(EMB))}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_vjp_op_trains_in_a_graph_as_in_eager(case):
    loss_of = CASES[case]
    eager, graph = _params(), _params()
    opt_e = flow.optim.SGD(list(eager.values()), lr=0.05)
    opt_g = flow.optim.SGD(list(graph.values()), lr=0.05)

    class Train(Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(opt_g)

        def build(self):
            loss = loss_of(graph)
            loss.backward()
            return loss
    g = Train()
    for _ in range(3):
        opt_e.zero_grad()
        want = loss_of(eager)
        want.backward()
        opt_e.step()
        got = g()
        np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5)
    for k in eager:
        np.testing.assert_allclose(graph[k].detach().numpy(), eager[k].detach().numpy(), rtol=1e-5, atol=1e-6)
