"""nn.Graph of global tensors: traced on logical shapes, boxing as IR nodes, one plan per rank.
Training under DP, Megatron TP and a 2-D mesh equals single-process training; the explain table's
predicted bytes equal what flow.comm.count measures."""
import pytest
import torch

import holoflow as flow
from holoflow.core.sbp import B, P, S
from holoflow.distributed import world

import graph_fns

DATA = graph_fns.data()


def _close(got, want):
    losses, w1, w2, _ = got
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(want[0]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w1, want[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w2, want[2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("executor", ["actor", "sequential"])
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
@pytest.mark.parametrize("mode,n", [("dp", 2), ("tp", 2), ("2d", 4)])
def test_training_on_simulated_ranks_equals_single_process(mode, n, opt, executor):
    want = graph_fns.mlp_graph_step(0, "single", 3, DATA, opt)
    for got in world.simulate(n, lambda r: graph_fns.mlp_graph_step(r, mode, 3, DATA, opt, executor)):
        _close(got, want)


def test_data_parallel_gradients_are_all_reduced_where_the_loss_is_written():
    got = world.simulate(2, lambda r: graph_fns.mlp_graph_step(r, "dp", 1, DATA))[0]
    boxing = got[3]
    reduces = [(src, dst) for src, dst, _, _ in boxing if src == (P,)]
    assert reduces == [((P,), (B,)), ((P,), (B,))]         # one per weight, in backward
    assert all(line.startswith("graph_fns.py:") for _, _, line, _ in boxing)


def test_gloo_worlds_train_like_single_process(world2, world4):
    for opt in ("sgd", "adamw"):
        want = graph_fns.mlp_graph_step(0, "single", 3, DATA, opt)
        for world_, mode in ((world2, "dp"), (world2, "tp"), (world4, "2d")):
            for got in world_.run(graph_fns.mlp_graph_step, mode, 3, DATA, opt):
                _close(got, want)


def test_predicted_collectives_and_bytes_equal_measured_on_gloo(world2):
    for rank, (counts, predicted_counts, predicted_bytes, measured_bytes) in enumerate(world2.run(_predicted_and_measured)):
        assert counts == predicted_counts and counts, (rank, counts, predicted_counts)
        assert predicted_bytes == measured_bytes > 0, (rank, predicted_bytes, measured_bytes)


def _predicted_and_measured(rank: int):
    counts, measured, boxing, _ = graph_fns.inference_counts(rank)
    kinds = [k for _, _, steps, _ in boxing for k in steps]
    predicted_counts = {k: kinds.count(k) for k in set(kinds)}
    return ({k: n for k, n in counts.items() if k != "meta"}, predicted_counts,
            sum(pb for *_, pb in boxing), sum(v for k, v in measured.items() if k != "meta"))


def test_inference_values_equal_eager_and_explain_names_the_line():
    def run(rank):
        place = flow.placement("cpu", [0, 1])
        flow.manual_seed(0)
        x = flow.randn(8, 6, placement=place, sbp=S(0))
        w = flow.randn(6, 4, placement=place, sbp=S(1))

        class Infer(flow.nn.Graph):
            def build(self, x):
                return (x @ w).softmax(dim=-1).sum(dim=0)
        g = Infer()
        y = g(x)
        eager = (x @ w).softmax(dim=-1).sum(dim=0)
        torch.testing.assert_close(y.to_global(sbp=B).to_local().to_torch(), eager.to_global(sbp=B).to_local().to_torch())
        return g.explain()
    text = world.simulate(2, run)[0]
    assert "boxing node(s)" in text and "test_global_graph.py:" in text


def test_another_sbp_compiles_another_plan_and_mixing_local_raises():
    def run(rank):
        place = flow.placement("cpu", [0, 1])
        w = flow.ones(4, 4, placement=place, sbp=B)

        class G(flow.nn.Graph):
            def build(self, x):
                return x @ w
        g = G()
        a = g(flow.ones(6, 4, placement=place, sbp=S(0)))
        b = g(flow.ones(6, 4, placement=place, sbp=B))
        assert a.sbp == (S(0),) and b.sbp == (B,) and len(g._compiled) == 2

        class Mixed(flow.nn.Graph):
            def build(self, x):
                return x + flow.ones(6, 4)
        with pytest.raises(Exception, match=r"add at test_global_graph.py:\d+ mixes a local tensor, a tensor of "
                                            r"shape \(6, 4\), with global tensors"):
            Mixed()(flow.ones(6, 4, placement=place, sbp=S(0)))
    world.simulate(2, run)


def test_inputs_on_another_placement_or_local_raise_naming_the_input_and_the_line():
    def run(rank):
        place = flow.placement("cpu", [0, 1])
        lin = flow.nn.Linear(4, 4).to_global(place, B)

        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.lin = lin

            def build(self, x):
                return self.lin(x)
        g = G()
        g(flow.ones(6, 4, placement=place, sbp=S(0)))
        other = flow.placement("cpu", [1, 0])
        with pytest.raises(Exception, match=r"at test_global_graph.py:\d+ mixes placements: graph input input0 "
                                            r"\(shape \(6, 4\)\) on .*ranks=\[1, 0\].* and lin.weight"):
            g(flow.ones(6, 4, placement=other, sbp=S(0)))
        with pytest.raises(Exception, match=r"at test_global_graph.py:\d+ mixes a local tensor, graph input "
                                            r"input0 \(shape \(6, 4\)\), with global tensors"):
            g(flow.ones(6, 4))
        y = g(flow.ones(6, 4, placement=place, sbp=B))   # another SBP: another plan, not an error
        return tuple(y.sbp), len(g._compiled)
    for sbp, plans in world.simulate(2, run):
        assert sbp == (B,) and plans == 2


def test_global_mode_makes_creation_ops_global_in_eager_and_in_graphs():
    from holoflow.utils.global_view import global_mode

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        with global_mode(True, placement=place, sbp=B):
            a, z, r = flow.arange(6), flow.zeros(4, 2), flow.tensor([1.0, 2.0])
            with global_mode(False):
                local = flow.ones(3)
        assert a.is_global and a.sbp == (B,) and tuple(a.shape) == (6,) and z.is_global and r.is_global
        assert not local.is_global and not flow.ones(2).is_global
        with global_mode(True, placement=place, sbp=S(0)):
            s = flow.arange(6)
        assert s.sbp == (S(0),) and s.to_local().tolist() == [[0, 1, 2], [3, 4, 5]][rank]
        x = flow.randn(4, 6, placement=place, sbp=S(0))

        class G(flow.nn.Graph):
            def build(self, x):
                with global_mode(True, placement=place, sbp=B):
                    pos = flow.arange(6)
                    mask = flow.ones(4, 6).tril()
                return x * pos * mask
        y = G()(x)
        want = x.to_global(sbp=B).to_local().to_torch() * torch.arange(6) * torch.ones(4, 6).tril()
        torch.testing.assert_close(y.to_global(sbp=B).to_local().to_torch(), want)
    world.simulate(2, run)


XS = [torch.randn(8, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]


def _seeded(make):
    """A model whose weights were drawn once, here: simulated ranks are threads sharing torch's
    default generator, so drawing inside them would interleave."""
    flow.manual_seed(0)
    init = {k: v.detach().clone() for k, v in make().state_dict().items()}

    def build():
        m = make()
        m.load_state_dict(init)
        return m
    return build


_MLP = _seeded(lambda: flow.nn.Sequential(flow.nn.Linear(8, 16), flow.nn.GELU(), flow.nn.Linear(16, 8),
                                          flow.nn.LayerNorm(8)))
_ZERO_MLP = _seeded(lambda: flow.nn.Sequential(flow.nn.Linear(16, 64), flow.nn.GELU(), flow.nn.Linear(64, 16)))


def _mlp_graph(place, amp=False, ckpt=False, acc=1):
    m = _MLP()
    if place is not None:
        m.to_global(place, B)
    opt = flow.optim.AdamW(m.parameters(), lr=0.01)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.enable_amp(amp)
            if acc > 1:
                self.config.set_gradient_accumulation_steps(acc)
            if ckpt:
                self.graph_module(self.m[0]).activation_checkpointing = True

        def build(self, x):
            loss = self.m(x).square().mean()
            loss.backward()
            return loss
    return G()


def _losses(place, **kw):
    g = _mlp_graph(place, **kw)
    out = []
    for x in XS:
        x = flow.from_torch(x.clone())
        if place is not None:
            x = x.to_global(place, B).to_global(sbp=S(0))
        loss = g(x)
        out.append((loss.to_global(sbp=B).to_local() if place is not None else loss).tolist())
    return out


@pytest.mark.parametrize("kw,tol", [(dict(amp=True), 1e-4), (dict(ckpt=True), 1e-6), (dict(amp=True, ckpt=True), 1e-4)])
def test_amp_and_checkpointing_work_on_global_graphs(kw, tol):
    want = _losses(None, **kw)
    place = flow.placement("cpu", [0, 1])
    for got in world.simulate(2, lambda r: _losses(place, **kw)):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=tol, atol=tol)


def test_gradient_accumulation_on_a_global_graph_equals_the_local_graph():
    """OneFlow's semantics on global graphs (graph/pipeline.py) and local ones (passes/grad_acc.py):
    one loss per micro-batch, one update per step. A global input splits into micro-batches on
    each rank's shard (micro-batch k holds every rank's k-th chunk: rows 0-1 and 4-5 of 8 on 2
    ranks) and a local one along the whole batch (rows 0-3), so the per-micro-batch losses group
    rows differently; their mean, and the update, are the same."""
    want = [sum(step) / 2 for step in _losses(None, acc=2)]
    place = flow.placement("cpu", [0, 1])

    def run(rank):
        g, out = _mlp_graph(place, acc=2), []
        for x in XS:
            loss = g(flow.from_torch(x.clone()).to_global(place, B).to_global(sbp=S(0)))
            per_micro_batch = loss.to_global(sbp=B).to_local()
            assert tuple(per_micro_batch.shape) == (2,)
            out.append(per_micro_batch.mean().item())
        return out
    for got in world.simulate(2, run):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_ranks_that_trace_different_programs_fail_on_every_rank_naming_them():
    def run(rank):
        place = flow.placement("cpu", [0, 1])
        w = flow.ones(4, 4, placement=place, sbp=B)

        class G(flow.nn.Graph):
            def build(self, x):
                y = x @ w
                return y.relu() if rank == 0 else y.sigmoid()   # a rank-dependent branch
        with pytest.raises(Exception, match=r"traced different programs .*ranks \[0\].*ranks \[1\]"):
            G()(flow.ones(6, 4, placement=place, sbp=S(0)))
    world.simulate(2, run)


def _zero_run(place, stage, opt_kind):
    m = _ZERO_MLP()
    if place is not None:
        m.to_global(place, B)
    opt = flow.optim.AdamW(m.parameters(), lr=0.01) if opt_kind == "adamw" else \
        flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    g = graph_fns.square_loss_graph(m, opt, stage)
    losses = []
    for i in range(3):
        x = flow.from_torch(torch.randn(8, 16, generator=torch.Generator().manual_seed(i)))
        if place is not None:
            x = x.to_global(place, B).to_global(sbp=S(0))
        loss = g(x)
        losses.append((loss.to_global(sbp=B).to_local() if place is not None else loss).item())
    whole = [(p.to_global(sbp=B).to_local() if place is not None else p).detach().to_torch() for p in m.parameters()]
    from holoflow.graph.zero import state_bytes
    boxes = [(b.src, b.dst) for b in g.boxing()] if place is not None else []
    return losses, whole, state_bytes(opt), boxes


@pytest.mark.parametrize("opt_kind", ["adamw", "sgd"])
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_shards_state_and_gradients_and_trains_like_single_process(stage, opt_kind):
    want_losses, want_params, full_state, _ = _zero_run(None, 0, opt_kind)
    place = flow.placement("cpu", [0, 1])
    for losses, params, state, boxes in world.simulate(2, lambda r: _zero_run(place, stage, opt_kind)):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-7)
        for got, want in zip(params, want_params):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        # the three params of >= 64 elements keep half their per-element state (AdamW: two fp32
        # moments, SGD: one momentum buffer); the 16-element bias and step counters stay whole
        per_elem = 8 if opt_kind == "adamw" else 4
        assert state == full_state - per_elem * (16 * 64 + 64 + 64 * 16) // 2, (state, full_state)
        reduce_scatters = [b for b in boxes if b == ((P,), (S(0),))]
        assert len(reduce_scatters) == (3 if stage == 2 else 0)


def test_gradient_all_reduces_are_bucketed_issued_in_backward_and_waited_for_before_the_update(world2):
    bucketed = world2.run(graph_fns.dp_step_collectives, 25.0)
    alone = world2.run(graph_fns.dp_step_collectives, 0.0)
    want = graph_fns.mlp_graph_step(0, "single", 2, graph_fns.data(2))[0]
    for (losses, counts, n_buckets, tasks), (losses0, counts0, n0, _) in zip(bucketed, alone):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.tensor(losses0), torch.tensor(want), rtol=1e-5, atol=1e-6)
        # two weights: one bucket (one all-reduce) instead of two
        assert n_buckets == 1 and counts["all_reduce"] == 1, counts
        assert n0 == 0 and counts0["all_reduce"] == 2, counts0
        # the bucket is issued by the compute task when backward made it and waited for at the task's
        # end, where the update reads it: one thread issues every collective
        (s0, ops), (s1, _) = tasks
        assert (s0, s1) == ("compute", "update") and ops.count("global_box_issue") == ops.count("global_box_wait")
        assert ops.index("global_box_issue") < ops.index("global_box_wait") == len(ops) - 1, ops


@pytest.mark.parametrize("kind", ["layer_norm", "batch_norm", "group_norm"])
def test_norm_on_a_global_graph_input_equals_single_process(kind):
    """A norm reading the (batch-split) input directly: no input gradient, aten's None."""
    make = _seeded(lambda: flow.nn.Sequential({"layer_norm": lambda: flow.nn.LayerNorm(8),
                                               "batch_norm": lambda: flow.nn.BatchNorm1d(8),
                                               "group_norm": lambda: flow.nn.GroupNorm(2, 8)}[kind](),
                                              flow.nn.Linear(8, 4)))

    def train(place):
        m = make()
        if place is not None:
            m.to_global(place, B)
        opt = flow.optim.SGD(m.parameters(), lr=0.1)

        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.m = m
                self.add_optimizer(opt)

            def build(self, x):
                loss = self.m(x).square().mean()
                loss.backward()
                return loss
        g, out = G(), []
        for x in XS[:2]:
            x = flow.from_torch(x.clone())
            if place is not None:
                x = x.to_global(place, B).to_global(sbp=S(0))
            loss = g(x)
            out.append((loss.to_global(sbp=B).to_local() if place is not None else loss).item())
        return out
    want = train(None)
    for got in world.simulate(2, lambda r: train(flow.placement("cpu", [0, 1]))):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)


flow.manual_seed(0)   # (drawn here: simulated ranks are threads sharing torch's default generator)
INIT = {k: v.detach().clone() for k, v in flow.nn.Linear(4, 4, bias=False).state_dict().items()}


def _sgd_linear_run(place, sbp, x, outputs, acc: int = 1, fuse: bool = False) -> tuple:
    """One SGD step (lr 1) of a graph training ``Linear(4, 4)`` (INIT, laid out as ``sbp``) on
    ``sum(lin(x))``, returning ``outputs(loss, lin)``: those outputs and the parameter, whole.
    ``fuse``: the fused model update."""
    lin = flow.nn.Linear(4, 4, bias=False)
    lin.load_state_dict(INIT)
    lin.to_global(place, sbp)
    opt = flow.optim.SGD(lin.parameters(), lr=1.0)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = lin
            self.add_optimizer(opt)
            if acc > 1:
                self.config.set_gradient_accumulation_steps(acc)
            self.config.allow_fuse_model_update_ops(fuse)

        def build(self, x):
            loss = lin(x).sum()
            loss.backward()
            return outputs(loss, lin)

    whole = (B,) * place.ndim
    outs = G()(x)
    return [o.to_global(sbp=whole).to_local().to_torch() for o in outs], \
        lin.weight.to_global(sbp=whole).to_local().to_torch()


@pytest.mark.parametrize("fuse", [False, True], ids=["", "fused_update"])
@pytest.mark.parametrize("mesh,sbp,n", [([0, 1], (S(0),), 2), ([0, 1], (B,), 2), ([[0, 1], [2, 3]], (S(0), B), 4)],
                         ids=["S0", "B", "2x2"])
def test_an_output_that_is_a_view_of_a_parameter_reads_it_after_the_step(mesh, sbp, n, fuse):
    """``return w[0:], w[:, 1:3], w`` from a training graph: eager's views (and a local graph's,
    which alias the parameter's storage) show the parameter after the optimizer's step. A view of
    a split parameter that had to be boxed was the copy made in forward, before the step (global
    graph fuzzer, seed 5 on a 2x2 mesh). (The fuzzer's seed 1135 keeps the case where the fused
    update's task ran after the outputs were read: here the update's task comes first.)"""
    def run(r):
        place = flow.placement("cpu", mesh)
        x = flow.ones(2, 4).to_global(placement=place, sbp=(B,) * place.ndim)
        return _sgd_linear_run(place, sbp, x, lambda loss, lin: (lin.weight[0:], lin.weight[:, 1:3], lin.weight),
                               fuse=fuse)
    w0 = INIT["weight"].to_torch()
    for (a, b, c), live in world.simulate(n, run):
        assert not torch.equal(live, w0)   # (the step moved it: else this tests nothing)
        torch.testing.assert_close(a, live)
        torch.testing.assert_close(b, live[:, 1:3])
        torch.testing.assert_close(c, live)


@pytest.mark.parametrize("mesh,sbp,n", [([0, 1], (B,), 2), ([0, 1], (S(0),), 2), ([0, 1], (S(1),), 2),
                                        ([[0, 1], [2, 3]], (S(1), S(0)), 4)], ids=["B", "S0", "S1", "2x2"])
def test_an_output_a_view_op_copied_from_a_parameter_holds_its_forward_values(mesh, sbp, n):
    """``return w.t().reshape(-1)`` (and ``w[:, 1:3].reshape(-1)``, ``w.t().flatten()``): the
    reshape copies in torch (no view flattens a transposed tensor), so the output holds the values
    forward read; the global graph took any chain of view ops from a parameter for a view and
    re-derived it from the parameter after the step (global graph fuzz seed 5590, both meshes).
    A true view (``w.t()``, ``w.reshape(-1)``) still shows the step."""
    def run(r):
        place = flow.placement("cpu", mesh)
        x = flow.ones(2, 4).to_global(placement=place, sbp=(B,) * place.ndim)
        return _sgd_linear_run(place, sbp, x, lambda loss, lin: (
            lin.weight.t().reshape(-1), lin.weight[:, 1:3].reshape(-1), lin.weight.t().flatten(), lin.weight.t(),
            lin.weight.reshape(-1)))
    w0 = INIT["weight"].to_torch()
    for (copied, sliced, flat, view, flat_view), live in world.simulate(n, run):
        assert not torch.equal(live, w0)   # (the step moved it: else this tests nothing)
        torch.testing.assert_close(copied, w0.t().reshape(-1))
        torch.testing.assert_close(sliced, w0[:, 1:3].reshape(-1))
        torch.testing.assert_close(flat, w0.t().flatten())
        torch.testing.assert_close(view, live.t())
        torch.testing.assert_close(flat_view, live.reshape(-1))


@pytest.mark.parametrize("sbp", [B, S(0)], ids=["B", "S0"])
def test_a_parameter_returned_under_gradient_accumulation_is_read_after_the_step(sbp):
    """``return loss, self.w`` from a global graph accumulating 2 micro-batches: the parameter is
    no micro-batch's value; it is read after the step, whole, as without accumulation (the plan
    had no task producing it: a PlanError; global graph fuzzer, seed 1065)."""
    def run(r):
        place = flow.placement("cpu", [0, 1])
        x = flow.ones(4, 4).to_global(placement=place, sbp=S(0))
        return _sgd_linear_run(place, sbp, x, lambda loss, lin: (loss, lin.weight), acc=2)
    w0 = INIT["weight"].to_torch()
    for (loss, w), live in world.simulate(2, run):
        assert tuple(loss.shape) == (2,)   # (one loss per micro-batch)
        torch.testing.assert_close(w, live)
        # (x: each rank's ones(4, 4) shard of an (8, 4) batch: d sum(x @ w.T) / dw = 8 per element,
        # each micro-batch's loss scaled by 1/2; lr 1)
        torch.testing.assert_close(live, w0 - 4.0)


@pytest.mark.parametrize("sbp", [B, S(0), S(1)], ids=["B", "S0", "S1"])
def test_a_reshape_that_copies_a_boxed_view_does_not_follow_later_writes(sbp):
    """``x.unsqueeze(-1).expand(...).reshape(-1)`` copies in torch (no view flattens an expanded
    tensor); in a global graph the reshape ran on a boxed copy and its output was made a view of
    the expanded tensor, so a later ``x.relu_()`` reached it (global graph fuzz seed 4053)."""
    def f(lib, w):
        p = w.sin()
        e = p.unsqueeze(-1).expand(8, 8, 2)
        flat, rows = e.reshape(-1), e[:, :, 0].reshape(-1)   # a copy; a view of p (it stays one)
        p.relu_()
        return e.sum(), flat.sum(), rows.sum()
    x = torch.arange(64.0).reshape(8, 8).sub(30).div(10)
    want = [t.item() for t in f(torch, x.clone())]

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        w = flow.from_torch(x.clone()).to_global(placement=place, sbp=[B]).to_global(sbp=[sbp])

        class G(flow.nn.Graph):
            def build(self):
                return f(flow, w)
        return [o.to_global(sbp=[B]).to_local().item() for o in G()()]
    for got in world.simulate(2, run):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
