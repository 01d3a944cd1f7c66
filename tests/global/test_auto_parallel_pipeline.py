"""The auto-parallel planner on graphs with micro-batches: pipeline stages the user placed
(``set_stage``), each stage's parameters laid out on its own ranks and the schedule chosen by
the same cost model (``cost_model.predict_pipeline``), and gradient accumulation on one placement
(both were refused: "auto-parallel plans cover one placement"). On 4 and 2 simulated ranks; every
plan trains as single-process full-batch eager."""
import numpy as np
import pytest

import holoflow as flow
from holoflow.core.sbp import B, S
from holoflow.distributed import world
from holoflow.graph import auto_parallel
from holoflow.graph.cost_model import DeviceModel

D, HIDDEN, BATCH, M = 16, 64, 32, 4
STAGES = [[0, 1], [2, 3]]   # two stages of two ranks each


class _Block(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = flow.nn.Linear(D, HIDDEN)
        self.proj = flow.nn.Linear(HIDDEN, D)

    def forward(self, x):
        return x + self.proj(flow.nn.functional.gelu(self.fc(x)))


class _Net(flow.nn.Module):
    """Two stages of two blocks; the second ends in a head of 4 classes."""

    def __init__(self):
        super().__init__()
        self.stages = flow.nn.ModuleList([flow.nn.Sequential(_Block(), _Block()),
                                          flow.nn.Sequential(_Block(), _Block(), flow.nn.Linear(D, 4))])

    def forward(self, x):
        return self.stages[1](self.stages[0](x))


def _data():
    flow.manual_seed(1)
    return flow.randn(BATCH, D), flow.randint(0, 4, (BATCH,))


def _init():
    flow.manual_seed(0)
    return {k: v.detach().numpy().copy() for k, v in _Net().state_dict().items()}


def _eager(init: dict, steps: int = 2) -> tuple:
    net = _Net()
    net.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
    opt = flow.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = _data()
    losses = []
    for _ in range(steps):
        loss = flow.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


def _staged(init: dict, configure, auto: bool = True, layouts: dict | None = None):
    """The net's stages on STAGES's ranks (parameters broadcast there, or as ``layouts`` says:
    the plan's names), batch rows split inside each stage, M micro-batches; ``configure(config)``
    before the first call."""
    places = [flow.placement("cpu", ranks=r) for r in STAGES]
    net = _Net()
    net.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
    for i, (stage, place) in enumerate(zip(net.stages, places)):
        stage.to_global(placement=place, sbp=lambda name, t, i=i: list((layouts or {}).get(f"net.stages.{i}.{name}", [B])))
    x, y = _data()
    feeds = (x.to_global(placement=places[0], sbp=[B]).to_global(sbp=[S(0)]),
             y.to_global(placement=places[1], sbp=[B]).to_global(sbp=[S(0)]))
    return _Train(net, places, auto, configure), feeds, net, places


class _Train(flow.nn.Graph):
    """Cross-entropy training of ``net`` (SGD with momentum) in M micro-batches, its stages on
    ``places`` (none: one placement, gradient accumulation); ``configure(config)`` last."""

    def __init__(self, net, places: list, auto: bool, configure):
        super().__init__()
        self.net = net
        for i, (stage, place) in enumerate(zip(self.net.stages, places)):
            stage.to(flow.nn.graph.GraphModule).set_stage(i, place)
        self.config.set_gradient_accumulation_steps(M)
        if auto:
            self.config.enable_auto_parallel()
        configure(self.config)
        self.add_optimizer(flow.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))

    def build(self, x, y):
        loss = flow.nn.functional.cross_entropy(self.net(x), y)
        loss.backward()
        return loss


def _schedule(name: str):
    """A configure() setting the schedule ``name`` of ``auto_parallel.SCHEDULES`` by hand."""
    schedule, memory = auto_parallel.SCHEDULES[name]
    return lambda c: c.set_pipeline_schedule(schedule, memory=memory)


def _state(net, places) -> dict:
    out = {}
    for k, v in net.state_dict().items():
        place = places[int(k.split(".")[1])]
        whole = v.to_global(placement=place, sbp=[B])
        out[k] = whole.to_local().numpy().copy() if world.rank() in place.flat_ranks else None
    return out


def _trained(init: dict, configure, steps: int = 2) -> tuple:
    g, feeds, net, places = _staged(init, configure)
    for _ in range(steps):
        g(*feeds)
    return g.auto_parallel_plan(), _state(net, places)


def _check_trains_as_eager(results, init: dict) -> None:
    _, want = _eager(init)
    for _, params in results:
        for k, v in params.items():
            if v is not None:
                np.testing.assert_allclose(v, want[k], rtol=2e-4, atol=2e-5, err_msg=k)


def test_each_stage_is_planned_on_its_ranks_and_trains_as_eager():
    init = _init()
    results = world.simulate(4, lambda r: _trained(init, lambda c: None), timeout=600)
    _check_trains_as_eager(results, init)
    plans = [p for p, _ in results]
    assert len({str(p.choices) for p in plans}) == 1   # every rank derived the same plan
    plan = plans[0]
    assert plan.evaluated > 10 and "pipeline schedule" in plan.choices
    # every parameter was a variable, on its own stage's mesh (candidates of 2 ranks: B, S(0), S(1))
    weights = [k for k in plan.choices if k.endswith("fc.weight")]
    assert len(weights) == 4
    assert plan.chosen.step_s <= plan.start.step_s


def test_the_chosen_schedule_and_layouts_are_the_fastest_predicted_by_hand():
    """Each schedule configured by hand on the layouts the planner chose, predicted by
    graph.predict: the planner's schedule is the fastest of them."""
    init = _init()
    dev = DeviceModel.default("cpu")

    def run(rank):
        g, feeds, net, places = _staged(init, lambda c: None)
        plan_pred = g.predict(*feeds, device=dev)
        plan = g.auto_parallel_plan()
        layouts = {k: after for k, (before, after) in plan.choices.items() if k.startswith("net.")}
        by_hand = {}
        for name in auto_parallel.SCHEDULES:
            h, hfeeds, _, _ = _staged(init, _schedule(name), auto=False, layouts=layouts)
            by_hand[name] = h.predict(*hfeeds, device=dev).step_s
        return plan.choices["pipeline schedule"][1], plan_pred.step_s, by_hand

    for chosen, step_s, by_hand in world.simulate(4, run, timeout=600):
        assert step_s == pytest.approx(by_hand[chosen], rel=1e-6)
        assert by_hand[chosen] <= min(by_hand.values()) * (1 + 1e-9), by_hand


def test_a_memory_limit_rules_out_the_schedules_that_hold_more():
    """GPipe holds every micro-batch's activations, 1F1B at most the stages' count: with a limit
    between the two, the plan fits it (GPipe is never chosen) and still trains as eager."""
    init = _init()
    dev = DeviceModel.default("cpu")

    def memory_of(name: str):
        def run(rank):
            h, feeds, _, _ = _staged(init, _schedule(name), auto=False)
            return h.predict(*feeds, device=dev).memory_bytes
        return world.simulate(4, run, timeout=600)[0]

    gpipe, one_f = memory_of("gpipe"), memory_of("1f1b")
    assert gpipe > one_f
    limit = (gpipe + one_f) // 2

    def limited(c):
        c.enable_auto_memory("AdaptiveMemory", limit=limit)
    results = world.simulate(4, lambda r: _trained(init, limited), timeout=600)
    _check_trains_as_eager(results, init)
    plan = results[0][0]
    assert plan.choices["pipeline schedule"][1] != "gpipe"
    assert plan.chosen.memory_bytes <= limit


def test_a_schedule_the_user_set_is_kept():
    init = _init()
    results = world.simulate(4, lambda r: _trained(init, lambda c: c.set_pipeline_schedule("gpipe")), timeout=600)
    _check_trains_as_eager(results, init)
    assert "pipeline schedule" not in results[0][0].choices


def test_gradient_accumulation_on_one_placement_is_planned():
    """Data parallel with micro-batches (gradient accumulation on global tensors) and
    auto-parallel: planned with the micro-batch graph's prediction, trains as eager."""
    init = _init()

    def run(rank):
        place = flow.placement("cpu", ranks=[0, 1])
        net = _Net()
        net.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
        net.to_global(placement=place, sbp=[B])
        x, y = _data()
        g = _Train(net, [], True, lambda c: None)
        feeds = [t.to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)]) for t in (x, y)]
        for _ in range(2):
            g(*feeds)
        return g.auto_parallel_plan(), {k: v.to_global(sbp=[B]).to_local().numpy().copy()
                                        for k, v in net.state_dict().items()}

    results = world.simulate(2, run, timeout=600)
    _check_trains_as_eager(results, init)
    assert "pipeline schedule" not in results[0][0].choices   # (one stage: no schedule to choose)


def test_a_calibrated_plan_is_one_plan_on_every_rank():
    """calibrate=True measures the links of all the stages' ranks as one model and each
    candidate's compute as the slowest rank's: every rank derives the same plan."""
    init = _init()
    results = world.simulate(4, lambda r: _trained(init, lambda c: c.enable_auto_parallel(calibrate=True)),
                             timeout=600)
    _check_trains_as_eager(results, init)
    plans = [p for p, _ in results]
    assert all(p.device.calibrated and p.link.calibrated for p in plans)
    assert len({str(p.choices) for p in plans}) == 1 and len({p.chosen.step_s for p in plans}) == 1


def _gloo_planned(rank: int, init: dict) -> tuple:
    """_trained on a Gloo rank (calibrated), the plan's choices and predicted step as plain values."""
    plan, params = _trained(init, lambda c: c.enable_auto_parallel(calibrate=True))
    return {k: str(v) for k, v in plan.choices.items()}, plan.chosen.step_s, params


def test_a_pipeline_is_planned_on_four_gloo_ranks(world4):
    """The calibrated plan on real processes (2 stages x 2 ranks): one plan on every rank, and it
    trains as single-process eager."""
    init = _init()
    results = world4.run(_gloo_planned, init, timeout=300)
    assert len({str(c) for c, _, _ in results}) == 1 and len({s for _, s, _ in results}) == 1
    _check_trains_as_eager([(None, params) for _, _, params in results], init)
