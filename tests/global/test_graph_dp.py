"""Data-parallel global graphs: gradient buckets in backward order (the first one small, as DDP's)
issued where their last gradient is produced and waited for just before the update reads them,
so they are reduced while backward goes on; training equals single-process training."""
import threading

import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.distributed.boxing import plan as box_plan
from holoflow.graph.passes import bucket_grads
from holoflow.graph.passes.bucket_grads import FIRST_BUCKET_BYTES, spare_core
from holoflow.sbp import B, S

D = 256   # a D x D float32 weight is 1/4 MiB


def _train(rank: int | None, bucket_mb: float, steps: int = 2, n_layers: int = 6):
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(D, D, generator=g) / D ** 0.5 for _ in range(n_layers)]
    xs = [torch.randn(8, D, generator=g) for _ in range(steps)]
    place = flow.placement("cpu", [0, 1])
    layers = []
    for w in ws:
        lin = flow.nn.Linear(D, D, bias=False)
        with flow.no_grad():
            lin.weight.copy_(flow.from_torch(w))
        layers += [lin, flow.nn.Tanh()]
    model = flow.nn.Sequential(*layers)
    if rank is not None:
        model.to_global(place, B)
    opt = flow.optim.SGD(model.parameters(), lr=0.5)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            self.config.set_allreduce_bucket_mb(bucket_mb)

        def build(self, x):
            loss = (self.model(x) ** 2).mean()
            loss.backward()
            return loss
    train = Train()
    losses = []
    for x in xs:
        x = flow.from_torch(x)
        if rank is not None:
            x = x.to_global(place, B).to_global(sbp=S(0))
        losses.append(train(x).to_global(sbp=B).to_local().item() if rank is not None else train(x).item())
    if rank is None:
        return losses, [lin.weight.to_torch() for lin in model[::2]], None
    c = next(reversed(train._compiled.values()))
    nodes = list(c.logical.nodes)
    buckets = [n for n in nodes if n.op == "global_box_bucket"]
    # per task: its stream and its nodes' ops (a bucket: an issue of several gradients)
    tasks = [(t.stream, ["bucket_issue" if n.op == "global_box_issue" and len(n.inputs) > 1 else n.op
                         for n in t.nodes]) for t in c.program.tasks]
    weights = [lin.weight.to_global(sbp=B).to_local().to_torch() for lin in model[::2]]
    return losses, weights, ([sum(v.nbytes for v in b.inputs) for b in buckets], tasks)


def test_first_bucket_is_small_and_reduced_while_backward_goes_on():
    want_losses, want_w, _ = _train(None, 25.0)
    for losses, weights, (sizes, tasks) in world.simulate(2, lambda r: _train(r, 25.0)):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
        for w, ww in zip(weights, want_w):
            torch.testing.assert_close(w, ww, rtol=1e-5, atol=1e-6)
        # 6 gradients of 1/4 MiB in backward order: the first bucket takes 4 (1 MiB), the next the rest
        assert sizes == [FIRST_BUCKET_BYTES, 2 * D * D * 4], sizes
        # one compute task issues both buckets with backward compute between them, and waits for
        # them after the rest of backward, just before the update task reads the gradients
        assert [stream for stream, _ in tasks] == ["compute", "update"], tasks
        ops = tasks[0][1]
        at = [i for i, op in enumerate(ops) if op == "bucket_issue"]
        waits = [i for i, op in enumerate(ops) if op == "global_box_wait"]
        assert len(at) == 2 and "linear_grad_weight" in ops[at[0] + 1:at[1]], ops
        assert waits[-2:] == [len(ops) - 2, len(ops) - 1] and waits[-2] > at[1], ops


def test_last_bucket_is_small_too_and_training_still_equals_single_process():
    want_losses, want_w, _ = _train(None, 25.0, n_layers=10)
    for losses, weights, (sizes, _tasks) in world.simulate(2, lambda r: _train(r, 25.0, n_layers=10)):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
        for w, ww in zip(weights, want_w):
            torch.testing.assert_close(w, ww, rtol=1e-5, atol=1e-6)
        # 10 gradients of 1/4 MiB: 1 MiB first, the 4 produced last (1 MiB) alone, the 2 between
        assert sizes == [FIRST_BUCKET_BYTES, 2 * D * D * 4, FIRST_BUCKET_BYTES], sizes


def test_bucket_size_caps_every_bucket():
    for *_, (sizes, _tasks) in world.simulate(2, lambda r: _train(r, 0.5)):
        assert sizes == [2 * D * D * 4] * 3, sizes


def _host(monkeypatch, cores: int, local: int, threads: int) -> None:
    """This host as ``cores`` cores running ``local`` launched ranks of ``threads`` intra-op threads."""
    monkeypatch.delenv("HOLOFLOW_DP_OVERLAP", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    monkeypatch.setattr(bucket_grads.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(bucket_grads.torch, "get_num_threads", lambda: threads)


def test_spare_core_counts_the_hosts_ranks_and_their_threads(monkeypatch):
    place = flow.placement("cpu", [0, 1])
    _host(monkeypatch, 2, 2, 1)
    assert not spare_core(place)
    _host(monkeypatch, 4, 2, 2)
    assert not spare_core(place)
    _host(monkeypatch, 5, 2, 2)
    assert spare_core(place)
    _host(monkeypatch, 2, 2, 1)
    monkeypatch.setenv("HOLOFLOW_DP_OVERLAP", "1")
    assert spare_core(place)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")   # simulated ranks (one process): DDP's buckets
    monkeypatch.delenv("HOLOFLOW_DP_OVERLAP")
    assert spare_core(place)


def test_without_a_spare_core_buckets_are_the_cap_each_and_training_still_equals_single_process(monkeypatch):
    want_losses, want_w, _ = _train(None, 25.0, n_layers=10)
    _host(monkeypatch, 2, 2, 1)   # 2 ranks of one thread on 2 cores: nothing to overlap with
    for losses, weights, (sizes, _tasks) in world.simulate(2, lambda r: _train(r, 25.0, n_layers=10)):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
        for w, ww in zip(weights, want_w):
            torch.testing.assert_close(w, ww, rtol=1e-5, atol=1e-6)
        # 10 gradients of 1/4 MiB under a 25 MB cap: one collective, no small first or last bucket
        assert sizes == [10 * D * D * 4], sizes
    for *_, (sizes, _tasks) in world.simulate(2, lambda r: _train(r, 0.5, n_layers=10)):
        assert sizes == [2 * D * D * 4] * 5, sizes   # the cap still caps
    monkeypatch.setenv("HOLOFLOW_DP_OVERLAP", "1")
    for *_, (sizes, _tasks) in world.simulate(2, lambda r: _train(r, 25.0, n_layers=10)):
        assert sizes == [FIRST_BUCKET_BYTES, 2 * D * D * 4, FIRST_BUCKET_BYTES], sizes


def _plan_tasks(rank: int):
    """A cross-entropy DP graph on 2 ranks: (stream, input names, output names) per task, and
    the losses."""
    with _BUILD:
        flow.manual_seed(0)
        model = flow.nn.Sequential(flow.nn.Embedding(11, 64), flow.nn.Linear(64, 64), flow.nn.Tanh(),
                                   flow.nn.Linear(64, 64), flow.nn.Tanh(), flow.nn.Linear(64, 11))
    place = flow.placement("cpu", [0, 1])
    model.to_global(place, B)
    opt = flow.optim.SGD(model.parameters(), lr=0.1)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            self.config.set_allreduce_bucket_mb(0.01)

        def build(self, x, y):
            loss = flow.nn.functional.cross_entropy(self.model(x).reshape(-1, 11), y.reshape(-1))
            loss.backward()
            return loss
    train = Train()
    g = torch.Generator().manual_seed(3)
    x, y = (flow.from_torch(torch.randint(0, 11, (8, 4), generator=g)).to_global(place, B).to_global(sbp=S(0))
            for _ in range(2))
    train(x, y)
    c = next(reversed(train._compiled.values()))
    logical = [n.op for n in c.logical.nodes if n.op in ("global_box", "global_box_bucket")
               and any(s.kind != "reshard" for s in box_plan(n.attrs["src"], n.attrs["dst"], (2,)))]
    return [(t.stream, [n.op for n in t.nodes], t.token) for t in c.program.tasks], logical


_BUILD = threading.Lock()   # simulated ranks share torch's RNG: build their models one at a time


def test_collectives_are_issued_first_in_program_order_from_one_thread():
    for tasks, logical in world.simulate(2, _plan_tasks):
        # one compute task (the caller's thread) issues every collective, then the update
        assert [t[0] for t in tasks] == ["compute", "update"], tasks
        ops = tasks[0][1]
        issues = [i for i, op in enumerate(ops) if op == "global_box_issue"]
        waits = [i for i, op in enumerate(ops) if op == "global_box_wait"]
        assert len(issues) == len(waits) == len(logical) >= 3, (ops, logical)  # the denominator, 2+ buckets
        # the loss denominator's all-reduce is issued first, after a few nodes on the targets, and
        # waited for before the forward ends; the buckets are waited for after backward
        assert issues[0] <= 4 and waits[0] < issues[1], ops
        assert waits[1:] == list(range(len(ops) - len(waits) + 1, len(ops))), ops
        # a task issuing collectives waits for the previous step's update (the next step's after ours)
        assert tasks[0][2], tasks


def _gloo_steps(rank: int):
    """On a Gloo world: a DP graph's losses, and per step after the first, the collectives it ran
    and the per-call fingerprint exchanges among them."""
    from holoflow.distributed import comm_track
    place = flow.placement("cpu", [0, 1])
    g = torch.Generator().manual_seed(0)
    model = flow.nn.Sequential(flow.nn.Linear(D, D), flow.nn.Tanh(), flow.nn.Linear(D, 4))
    with flow.no_grad():
        for p in model.parameters():
            p.copy_(flow.from_torch(torch.randn(tuple(p.shape), generator=g) * 0.1))
    model.to_global(place, B)
    opt = flow.optim.SGD(model.parameters(), lr=0.1)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = flow.nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            return loss
    train = Train()
    losses, calls = [], []
    exchanges = []
    launch = comm_track._launch_fingerprint

    def counted(*a, **k):
        exchanges.append(a[0].kind)
        return launch(*a, **k)
    for step in range(3):
        x = flow.from_torch(torch.randn(8, D, generator=g)).to_global(place, B).to_global(sbp=S(0))
        y = flow.from_torch(torch.randint(0, 4, (8,), generator=g)).to_global(place, B).to_global(sbp=S(0))
        seq = sum(comm_track._SEQ.values())
        comm_track._launch_fingerprint, exchanges[:] = counted, []
        try:
            with flow.comm.count() as c:
                loss = train(x, y)
        finally:
            comm_track._launch_fingerprint = launch
        if step:
            calls.append((sum(comm_track._SEQ.values()) - seq, not exchanges, c.counts.get("all_reduce")))
        losses.append(loss.to_global(sbp=B).to_local().item())
    return losses, calls


def test_a_plans_collectives_skip_the_per_call_fingerprint_on_gloo(world2):
    got = world2.run(_gloo_steps)
    assert got[0][0] == got[1][0]
    for _losses, calls in got:
        for n, unverified, all_reduces in calls:
            # the loss's all-reduce(s) and the gradient bucket: tracked, counted, not fingerprinted
            assert n == all_reduces >= 2 and unverified, calls


def _tied_gpt(rank: int | None):
    """GPT with its embedding tied to the head: one parameter, two gradient contributions."""
    import numpy as np
    from holoflow.examples import gpt
    m = gpt.build(flow)(128, 16, 2, 32, 4)
    g = torch.Generator().manual_seed(0)   # simulated ranks share holoflow's RNG: weights from a generator
    with flow.no_grad():
        for p in m.parameters():
            p.copy_(flow.from_torch(torch.randn(tuple(p.shape), generator=g) * 0.1))
    place = flow.placement("cpu", [0, 1])
    if rank is not None:
        m.to_global(place, B)
    opt = flow.optim.SGD(m.parameters(), lr=0.5)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)

        def build(self, x, y):
            with flow.utils.global_view.global_mode(rank is not None, placement=place, sbp=B):
                _, loss = self.m(x, y)
            loss.backward()
            return loss
    rng = np.random.default_rng(0)
    x, y = (flow.tensor(rng.integers(0, 128, (4, 16))) for _ in range(2))
    if rank is not None:
        x, y = (t.to_global(place, B).to_global(sbp=S(0)) for t in (x, y))
    t = Train()
    losses = [t(x, y) for _ in range(2)]
    losses = [v.to_global(sbp=B).to_local().item() if rank is not None else v.item() for v in losses]
    wte = m.tok.weight
    w = wte.to_global(sbp=B).to_local().to_torch() if rank is not None else wte.to_torch()
    if rank is None:
        return losses, w, None
    nodes = list(next(reversed(t._compiled.values())).logical.nodes)
    reduced = sum(sum(v.nbytes for v in n.inputs) for n in nodes if n.op == "global_box_bucket")
    return losses, w, (reduced, sum(p.numel() * 4 for p in m.parameters()))


def test_tied_weight_gradient_reduced_once():
    """The embedding tied to the head gets two gradient contributions: summed first (as torch's
    AccumulateGrad does), then all-reduced once; every parameter's bytes go through the buckets once."""
    want_losses, want_w, _ = _tied_gpt(None)
    for losses, w, (reduced, param_bytes) in world.simulate(2, _tied_gpt):
        assert reduced == param_bytes, (reduced, param_bytes)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(w, want_w, rtol=1e-5, atol=1e-6)
