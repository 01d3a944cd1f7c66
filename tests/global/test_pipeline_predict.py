"""``graph.predict`` of pipeline stages (graph/cost_model.predict_pipeline): each stage's
micro-batch forward / backward (ZB-H1: weight gradients apart) under the cost model, in the
schedule's act order, then the once-per-step update; traced and passed, never run. Checked
against properties of the schedules that hold whatever the figures: a steady state that grows
linearly with micro-batches, GPipe's and 1F1B's equal spans, ZB-H1's smaller bubble, and the
activations GPipe holds for every micro-batch in flight."""
import pytest

import holoflow as flow
from holoflow.core.sbp import B, S
from holoflow.distributed import world
from holoflow.graph.cost_model import DeviceModel
from holoflow.graph.global_graph import LinkModel

D, MICRO = 64, 8   # features; rows per micro-batch (the batch grows with the micro-batches)


def _block():
    return flow.nn.Sequential(flow.nn.Linear(D, D), flow.nn.ReLU(), flow.nn.Linear(D, D), flow.nn.ReLU())


def _pipeline(m: int, schedule: str, dp: int = 1, run: bool = False, zero: int = 0):
    """Two stages of two layers each on ``dp`` ranks apiece (``zero``: that ZeRO stage); the
    step's prediction, and with ``run`` the parameters' values after the prediction and after
    one real step."""
    p0 = flow.placement("cpu", ranks=list(range(dp)))
    p1 = flow.placement("cpu", ranks=list(range(dp, 2 * dp)))
    flow.manual_seed(0)
    s0, s1 = _block(), _block()
    s0.to_global(placement=p0, sbp=[B])
    s1.to_global(placement=p1, sbp=[B])
    opt = flow.optim.SGD([*s0.parameters(), *s1.parameters()], lr=0.1)

    class Pipe(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.s0, self.s1 = s0, s1
            self.s0.to(flow.nn.graph.GraphModule).set_stage(0, p0)
            self.s1.to(flow.nn.graph.GraphModule).set_stage(1, p1)
            self.config.set_gradient_accumulation_steps(m)
            self.config.set_pipeline_schedule(schedule)
            if zero:
                self.config.enable_zero(True, stage=zero, shard_min_size=1)
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.s1(self.s0(x).to_global(placement=p1)).square().mean()
            loss.backward()
            return loss
    g = Pipe()
    x = flow.randn(MICRO * m * dp, D).to_global(placement=p0, sbp=[B]).to_global(sbp=[S(0) if dp > 1 else B])
    mine = [p for p in (*s0.parameters(), *s1.parameters()) if flow.env.get_rank() in p.placement.ranks]

    def values():
        return [p.to_local().detach().numpy().copy() for p in mine]
    before = values()
    q = g.predict(x, device=DeviceModel(1e9, 1e9), link=LinkModel(0.0, 1e9))
    if not run:
        return q
    predicted = values()
    g(x)
    return q, before, predicted, values()


def _predict(m: int, schedule: str, dp: int = 1):
    return world.simulate(2 * dp, lambda r: _pipeline(m, schedule, dp), timeout=120)[0]


def test_one_f_one_b_and_gpipe_grow_linearly_and_agree_zb_h1_waits_less():
    steps = {(s, m): _predict(m, s) for s in ("1f1b", "gpipe", "zb-h1") for m in (2, 4, 8)}
    for s in ("1f1b", "gpipe", "zb-h1"):
        two, four, eight = (steps[(s, m)].step_s for m in (2, 4, 8))
        # past the warm-up every further micro-batch adds the slowest stage's forward + backward
        assert eight - four == pytest.approx(2 * (four - two), rel=1e-9), s
    for m in (2, 4, 8):
        one, gp, zb = steps[("1f1b", m)], steps[("gpipe", m)], steps[("zb-h1", m)]
        assert one.step_s == pytest.approx(gp.step_s, rel=1e-12)     # the same span, acts fused F / B+W
        assert one.bubble_s > 0 and zb.bubble_s < one.bubble_s and zb.step_s < one.step_s
        assert one.compute_s == zb.compute_s                         # the same work, reordered
    # 1F1B's first stage holds p = 2 micro-batches in flight whatever m; GPipe's holds all m: from 4
    # to 8 micro-batches it holds 4 more micro-batches' forward-to-backward activations, each a
    # whole number (2 to 4) of the stage's 8 x 64 float tensors
    assert steps[("1f1b", 8)].memory_bytes == steps[("1f1b", 4)].memory_bytes
    grown = steps[("gpipe", 8)].memory_bytes - steps[("gpipe", 4)].memory_bytes
    tensor = MICRO * D * 4
    assert grown % (4 * tensor) == 0 and 2 <= grown // (4 * tensor) <= 4, grown


def test_data_parallel_stages_reduce_gradients_once_per_step():
    """Two ranks per stage: each stage's gradients are all-reduced in the update (once per
    step, not per micro-batch): the collectives do not grow with the micro-batches."""
    two, four = _predict(2, "1f1b", dp=2), _predict(4, "1f1b", dp=2)
    assert two.collectives == four.collectives > 0
    assert four.comm_s > two.comm_s     # the moves between stages: one per micro-batch


@pytest.mark.parametrize("zero", [1, 2])
def test_every_rank_predicts_every_stage_alike_under_zero(zero):
    """Each rank predicts all stages, the others' updates too: under ZeRO 1/2 a stage's update
    all-gathers its parameters' rows, and a rank outside that stage counted none of them (its own
    share of the update), so the ranks of the two stages predicted different steps — and
    auto-parallel, planning from those figures, chose different layouts on them (the pipeline
    fuzzer's seed 20246: "the pipeline's ranks traced different programs")."""
    figures = world.simulate(4, lambda r: _pipeline(2, "1f1b", dp=2, zero=zero), timeout=120)
    assert len({(q.compute_s, q.comm_s, q.collectives, q.memory_bytes, q.bubble_s) for q in figures}) == 1, figures
    assert figures[0].collectives > _predict(2, "1f1b", dp=2).collectives   # the rows' all-gathers counted


def test_predicting_a_pipeline_runs_nothing():
    """The prediction leaves every parameter as it was; the step it predicted then changes them."""
    for q, before, predicted, stepped in world.simulate(2, lambda r: _pipeline(2, "1f1b", run=True), timeout=120):
        assert q.step_s > 0 and len(before) == 4
        assert all((a == b).all() for a, b in zip(before, predicted))
        assert not any((a == b).all() for a, b in zip(before, stepped))
