"""The auto-parallel planner chooses the micro-batch count of a graph with pipeline stages the user
placed (``set_stage``) and no count set: a variable of its descent with the schedule, predicted by
``predict_pipeline``, kept at the user's 1 where micro-batches would not train as the whole batch
(batch norm in training, a summed loss, an output that is no row of the batch). A planned count
trains as the unplanned graph (m=1) does, and returns the same outputs in the same shapes, on
simulated ranks and on a real Gloo world."""
import numpy as np
import pytest

import holoflow as flow
from holoflow.core.sbp import B
from holoflow.distributed import world
from holoflow.graph.cost_model import DeviceModel

D, H, N = 16, 64, 32


def _graph(auto: bool = True, *, n: int = N, loss: str = "mean", bn: bool = False, out: str = "rows",
           m: int | None = None, memory=None, drop: bool = False):
    """Two stages on ranks 0 and 1 (Linear-ReLU-Linear each), a squared-error loss (``loss``: its
    mean or sum; ``"ce"``: cross-entropy of the sign of ``y``), returning the loss and the predictions (``out="slice"``: their first 4 rows);
    SGD with momentum; 1F1B set by hand (the plan varies only the micro-batches and layouts).
    ``m``: the user's count; ``memory``: ``enable_auto_memory``'s (mode, limit); ``drop``: a
    dropout in the first stage."""
    p0, p1 = flow.placement("cpu", ranks=[0]), flow.placement("cpu", ranks=[1])
    flow.manual_seed(0)
    s0 = flow.nn.Sequential(flow.nn.Linear(D, H), flow.nn.BatchNorm1d(H) if bn else flow.nn.ReLU(),
                            flow.nn.Dropout(0.1) if drop else flow.nn.Identity(), flow.nn.Linear(H, D))
    s1 = flow.nn.Sequential(flow.nn.Linear(D, H), flow.nn.ReLU(), flow.nn.Linear(H, 2))
    s0.to_global(placement=p0, sbp=[B])
    s1.to_global(placement=p1, sbp=[B])

    class Pipe(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.s0, self.s1 = s0, s1
            self.s0.to(flow.nn.graph.GraphModule).set_stage(0, p0)
            self.s1.to(flow.nn.graph.GraphModule).set_stage(1, p1)
            self.config.set_pipeline_schedule("1f1b")
            if m is not None:
                self.config.set_gradient_accumulation_steps(m)
            if auto:
                self.config.enable_auto_parallel()
            if memory is not None:
                self.config.enable_auto_memory(memory[0], limit=memory[1])
            self.add_optimizer(flow.optim.SGD([*s0.parameters(), *s1.parameters()], lr=0.1, momentum=0.9))

        def build(self, x, y):
            pred = self.s1(self.s0(x).to_global(placement=p1))
            err = (pred - y).square()
            total = err.mean() if loss == "mean" else err.sum() if loss == "sum" else \
                flow.nn.functional.cross_entropy(pred, (y[:, 0] > 0).long())
            total.backward()
            return total, (pred if out == "rows" else pred[:4])

    flow.manual_seed(1)
    x = flow.randn(n, D).to_global(placement=p0, sbp=[B])
    y = flow.randn(n, 1).to_global(placement=p1, sbp=[B])
    return Pipe(), (x, y), (s0, s1)


def _train(rank: int, auto: bool = True, steps: int = 2, **kw) -> tuple:
    """``steps`` steps: the plan (None unplanned), each step's outputs (shape, value on the rank
    holding them) and this rank's parameters after."""
    g, feeds, stages = _graph(auto, **kw)
    outs = []
    for _ in range(steps):
        outs.append([(tuple(t.shape), t.to_local().detach().numpy().copy() if rank == 1 else None)
                     for t in g(*feeds)])
    params = [p.to_local().detach().numpy().copy() for p in stages[rank].parameters()]
    return (g.auto_parallel_plan() if auto else None), outs, params


def _gloo_train(rank: int, auto: bool) -> tuple:
    plan, outs, params = _train(rank, auto)
    return (str(plan.choices.get("micro-batches")) if plan is not None else None), outs, params


def _same_training(got: list, want: list) -> None:
    """Per rank: outputs of the same shapes and values, parameters equal (float tolerance)."""
    for (_, outs_a, params_a), (_, outs_b, params_b) in zip(got, want):
        for step_a, step_b in zip(outs_a, outs_b):
            for (shape_a, va), (shape_b, vb) in zip(step_a, step_b):
                assert shape_a == shape_b
                if va is not None:
                    np.testing.assert_allclose(va, vb, rtol=1e-5, atol=1e-6)
        for a, b in zip(params_a, params_b):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_planned_micro_batch_count_trains_as_the_whole_batch():
    planned = world.simulate(2, lambda r: _train(r))
    plain = world.simulate(2, lambda r: _train(r, auto=False))
    plan = planned[0][0]
    assert len({str(p.choices) for p, _, _ in planned}) == 1   # one plan on every rank
    before, after = plan.choices["micro-batches"]
    assert before == 1 and after in (2, 4, 8)   # (the bubble of 2 stages shrinks with m)
    assert plan.chosen.step_s < plan.start.step_s
    assert "micro-batches" in str(plan) and f"1 -> {after}" in str(plan)
    _same_training(planned, plain)
    # the loss comes back as the whole batch's mean (shape ()), the predictions as 32 rows
    assert [s for s, _ in planned[1][1][0]] == [(), (N, 2)]


def test_graph_predict_includes_the_chosen_count():
    """graph.predict plans first; its figure is the chosen count's, as predicted with that count
    set by hand, and each count the planner could take is predicted no faster."""
    dev = DeviceModel.default("cpu")

    def run(rank):
        g, feeds, _ = _graph()
        q = g.predict(*feeds, device=dev)
        m = g.auto_parallel_plan().choices["micro-batches"][1]
        by_hand = {k: _graph(False, m=k)[0].predict(*_graph(False, m=k)[1], device=dev).step_s for k in (1, 2, 4, 8)}
        return m, q.step_s, by_hand

    for m, step_s, by_hand in world.simulate(2, run):
        assert step_s == pytest.approx(by_hand[m], rel=1e-9)
        assert by_hand[m] == min(by_hand.values())


def test_a_memory_limit_decides_the_count():
    """More micro-batches hold fewer rows' activations at once (1F1B: at most 2 in flight): a limit
    below one batch's memory forces a count within it; least memory takes the largest count."""
    dev = DeviceModel.default("cpu")

    def memory(m: int) -> int:
        return world.simulate(2, lambda r: _graph(False, m=m)[0].predict(*_graph(False, m=m)[1], device=dev))[0]
    mem = {k: memory(k).memory_bytes for k in (1, 2, 8)}
    assert mem[1] > mem[2] > mem[8]
    limit = (mem[1] + mem[2]) // 2
    limited = world.simulate(2, lambda r: _train(r, memory=("AdaptiveMemory", limit)))
    plan = limited[0][0]
    assert plan.choices["micro-batches"][1] >= 2 and plan.chosen.memory_bytes <= limit
    least = world.simulate(2, lambda r: _train(r, memory=("HeavyMemoryDown", None)))
    assert least[0][0].choices["micro-batches"][1] == 8
    _same_training(least, world.simulate(2, lambda r: _train(r, auto=False)))


@pytest.mark.parametrize("kw, why", [
    (dict(bn=True), "'batch_norm'"),           # batch statistics couple the rows
    (dict(loss="sum"), "a sum over the batch"),   # each micro-batch's sum would be scaled by 1/m
    (dict(loss="ce"), "from 'div'"),   # the targets' sum over the count of those not ignored
    (dict(out="slice"), "output 1"),           # the first 4 rows of a micro-batch are not the batch's
    (dict(drop=True), "'dropout'"),             # each micro-batch would draw its own mask
    (dict(n=11), "splits every input evenly"),   # no count from 2 to 8 divides 11 rows
])
def test_micro_batches_that_would_change_the_result_are_refused(kw, why):
    planned = world.simulate(2, lambda r: _train(r, steps=1, **kw))
    plan = planned[0][0]
    assert "micro-batches" not in plan.choices
    assert why in plan.kept["micro-batches"] and why in str(plan)
    _same_training(planned, world.simulate(2, lambda r: _train(r, auto=False, steps=1, **kw)))


def test_a_count_the_user_set_is_kept():
    planned = world.simulate(2, lambda r: _train(r, steps=1, m=1))
    assert "micro-batches" not in planned[0][0].choices and "micro-batches" not in planned[0][0].kept
    assert [s for s, _ in planned[1][1][0]] == [(), (N, 2)]


def _then_odd_batch(rank: int, auto: bool) -> tuple:
    """A step on the planning batch, then one on 31 rows (a last, smaller batch)."""
    g, feeds, stages = _graph(auto)
    g(*feeds)
    flow.manual_seed(3)
    x = flow.randn(31, D).to_global(placement=feeds[0].placement, sbp=[B])
    y = flow.randn(31, 1).to_global(placement=feeds[1].placement, sbp=[B])
    outs = [(tuple(t.shape), t.to_local().detach().numpy().copy() if rank == 1 else None) for t in g(x, y)]
    params = [p.to_local().detach().numpy().copy() for p in stages[rank].parameters()]
    return (g.auto_parallel_plan() if auto else None), [outs], params


def test_a_batch_the_planned_count_does_not_split_runs_as_one_micro_batch():
    """31 rows after planning on 32: the user's program (one micro-batch) took it; so does the
    planned graph, instead of refusing a batch that is no multiple of its count."""
    planned = world.simulate(2, lambda r: _then_odd_batch(r, True))
    assert planned[0][0].choices["micro-batches"][1] > 1
    _same_training(planned, world.simulate(2, lambda r: _then_odd_batch(r, False)))
    assert [s for s, _ in planned[1][1][0]] == [(), (31, 2)]


def test_a_planned_count_trains_as_the_whole_batch_on_two_gloo_ranks(world2):
    planned = world2.run(_gloo_train, True, timeout=300)
    plain = world2.run(_gloo_train, False, timeout=300)
    assert planned[0][0] == planned[1][0] and planned[0][0] != "None" and not planned[0][0].startswith("(1, 1)")
    _same_training(planned, plain)
