"""Functions run on every rank (simulated threads or Gloo workers) by tests/global/test_global_graph.py:
the same MLP trained eagerly on one process and as an nn.Graph of global tensors."""
from __future__ import annotations

import torch

import holoflow as flow
from holoflow.core.sbp import B, S

LAYOUTS = {"dp": dict(x=(S(0),), w1=(B,), w2=(B,)),
           "tp": dict(x=(B,), w1=(S(1),), w2=(S(0),)),
           "2d": dict(x=(S(0), B), w1=(B, S(1)), w2=(B, S(0)))}


def data(steps: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(steps, 8, 6, generator=g), torch.randn(steps, 8, 6, generator=g),
            torch.randn(6, 10, generator=g) * 0.3, torch.randn(10, 6, generator=g) * 0.3)


class MLP(flow.nn.Module):
    def __init__(self, w1, w2):
        super().__init__()
        self.w1, self.w2 = flow.nn.Parameter(w1), flow.nn.Parameter(w2)

    def forward(self, x):
        return flow.relu(x @ self.w1) @ self.w2


def mlp_graph_step(rank: int, mode: str, steps: int, data, opt_kind: str = "sgd", executor: str = "actor"):
    """Trains the MLP ``steps`` steps as a graph under layout ``mode`` (or ``single``: no
    placement); returns the losses, the final weights gathered and the boxing table."""
    x_all, y_all, w1, w2 = data
    place = None if mode == "single" else \
        flow.placement("cpu", [[0, 1], [2, 3]] if mode == "2d" else [0, 1])

    def g(t, key):
        t = flow.from_torch(t.clone())
        if place is not None:   # the whole tensor on every rank, then boxed to the layout
            t = t.to_global(place, (B,) * place.ndim).to_global(sbp=LAYOUTS[mode][key])
        return t
    m = MLP(g(w1, "w1"), g(w2, "w2"))
    opt = flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) if opt_kind == "sgd" else \
        flow.optim.AdamW(m.parameters(), lr=0.01)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.executor = executor

        def build(self, x, y):
            loss = ((self.m(x) - y) ** 2).mean()
            loss.backward()
            return loss
    train = Train()
    losses = []
    for i in range(steps):
        loss = train(g(x_all[i], "x"), g(y_all[i], "x"))
        if place is not None:
            assert loss.is_global and loss.placement == place
            loss = loss.to_global(sbp=(B,) * place.ndim).to_local()
        losses.append(loss.item())

    def whole(p):
        return (p.to_global(sbp=(B,) * place.ndim).to_local() if place is not None else p).to_torch()
    boxing = train.boxing() if place is not None else []
    return losses, whole(m.w1), whole(m.w2), [(b.src, b.dst, b.node.source, b.comm_bytes) for b in boxing]


def inference_counts(rank: int):
    """An inference graph's measured collectives next to the explain table's predictions."""
    place = flow.placement("cpu", [0, 1])
    flow.manual_seed(0)
    x = flow.randn(8, 6, placement=place, sbp=S(0))
    w = flow.randn(6, 4, placement=place, sbp=S(1))

    class Infer(flow.nn.Graph):
        def build(self, x):
            return (x @ w).sum(dim=0)
    graph = Infer()
    graph(x)   # compile
    with flow.comm.count() as c:
        y = graph(x)
    boxing = [(b.src, b.dst, [s.kind for s in b.steps], b.payload_bytes(rank)) for b in graph.boxing()]
    return dict(c.counts), dict(c.bytes), boxing, y.to_global(sbp=B).to_local().to_torch()


def dp_step_collectives(rank: int, bucket_mb: float, steps: int = 2):
    """A data-parallel MLP graph step's measured collectives, its bucket nodes, and the losses."""
    x_all, y_all, w1, w2 = data(steps)
    place = flow.placement("cpu", [0, 1])

    def g(t, sbp):
        return flow.from_torch(t.clone()).to_global(place, B).to_global(sbp=sbp)
    m = MLP(g(w1, B), g(w2, B))
    opt = flow.optim.SGD(m.parameters(), lr=0.1)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.set_allreduce_bucket_mb(bucket_mb)

        def build(self, x, y):
            loss = ((self.m(x) - y) ** 2).mean()
            loss.backward()
            return loss
    train = Train()
    losses, counts = [], {}
    for i in range(steps):
        with flow.comm.count() as c:
            loss = train(g(x_all[i], S(0)), g(y_all[i], S(0)))
        counts = {k: n for k, n in c.counts.items() if k != "meta"}
        losses.append(loss.to_global(sbp=B).to_local().item())
    c = next(reversed(train._compiled.values()))
    buckets = [n for n in c.logical.nodes if n.op == "global_box_bucket"]
    return losses, counts, len(buckets), [(t.stream, [n.op for n in t.nodes]) for t in c.program.tasks]


def square_loss_graph(m, opt, stage: int = 0, scaler=None) -> flow.nn.Graph:
    """An nn.Graph training ``m`` on the mean square of its output with ``opt``: ZeRO ``stage``
    (shards of parameters of >= 64 elements) and a GradScaler when given (the ZeRO tests')."""
    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            if scaler is not None:
                self.set_grad_scaler(scaler)
            if stage:
                self.config.enable_zero(True, stage=stage, shard_min_size=64)

        def build(self, x):
            loss = self.m(x).square().mean()
            loss.backward()
            return loss
    return G()

