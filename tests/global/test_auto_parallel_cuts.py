"""``config.enable_auto_parallel_stage_cuts()``: the auto-parallel planner moves where the pipeline
stages' cuts fall in a stack of blocks the user staged block by block (which contiguous blocks each
stage holds; the modules before and after the stack stay), by the predicted step; the moved
blocks' parameters go to their new stage's placement before the first compile. The planned
graph trains as the user's cuts do (stages change where a block runs, not what it computes), on
simulated ranks and on a real Gloo world."""
import numpy as np
import pytest

import holoflow as flow
from holoflow.core.sbp import B, S
from holoflow.distributed import world
from holoflow.graph.cost_model import DeviceModel

D, N, L = 16, 16, 4


class _Block(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = flow.nn.Linear(D, 4 * D)
        self.proj = flow.nn.Linear(4 * D, D)

    def forward(self, x):
        return x + self.proj(flow.nn.functional.relu(self.fc(x)))


class _Net(flow.nn.Module):
    """A stem, ``L`` blocks and a head."""

    def __init__(self):
        super().__init__()
        self.stem = flow.nn.Linear(D, D)
        self.blocks = flow.nn.Sequential(*[_Block() for _ in range(L)])
        self.head = flow.nn.Linear(D, 1)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def _graph(cut: int = 1, auto: bool = True, cuts: bool = True, whole: bool = False, dp: bool = False):
    """The net on 2 stages (ranks 0, 1): the stem and blocks before ``cut`` on stage 0, the rest and
    the head on stage 1, each block staged on its own (``whole``: the stack staged as a whole
    instead, every block on stage 1); 4 micro-batches, 1F1B, SGD with momentum. ``dp``: stages of 2
    ranks each (0-1, 2-3), the batch split inside them, every parameter's layout a variable too."""
    places = [flow.placement("cpu", ranks=[0, 1]), flow.placement("cpu", ranks=[2, 3])] if dp else \
        [flow.placement("cpu", ranks=[0]), flow.placement("cpu", ranks=[1])]
    flow.manual_seed(0)
    net = _Net()

    def stage(i: int) -> int:
        return 1 if whole or i >= cut else 0
    net.stem.to_global(placement=places[0], sbp=[B])
    net.head.to_global(placement=places[1], sbp=[B])
    for i, b in enumerate(net.blocks):
        b.to_global(placement=places[stage(i)], sbp=[B])

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = net
            self.net.stem.to(flow.nn.graph.GraphModule).set_stage(0, places[0])
            self.net.head.to(flow.nn.graph.GraphModule).set_stage(1, places[1])
            if whole:
                self.net.blocks.to(flow.nn.graph.GraphModule).set_stage(1, places[1])
            else:
                for i, b in enumerate(self.net.blocks):
                    b.to(flow.nn.graph.GraphModule).set_stage(stage(i), places[stage(i)])
            self.config.set_pipeline_schedule("1f1b")
            self.config.set_gradient_accumulation_steps(4)
            if auto:
                self.config.enable_auto_parallel()
                if cuts:
                    self.config.enable_auto_parallel_stage_cuts()
            self.add_optimizer(flow.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))

        def build(self, x, y):
            loss = (self.net(x) - y).square().mean()
            loss.backward()
            return loss

    flow.manual_seed(1)
    x = flow.randn(N, D).to_global(placement=places[0], sbp=[B])
    y = flow.randn(N, 1).to_global(placement=places[1], sbp=[B])
    if dp:
        x, y = x.to_global(sbp=[S(0)]), y.to_global(sbp=[S(0)])
    return Train(), (x, y), net


def _train(rank: int, steps: int = 2, **kw) -> tuple:
    """The plan (None unplanned), the losses, and the parameters this rank holds after ``steps``
    steps (name -> value)."""
    g, feeds, net = _graph(**kw)
    losses = []
    for _ in range(steps):
        loss = g(*feeds)
        losses.append(loss.to_global(sbp=[B]).to_local().numpy().copy() if rank in loss.placement.ranks else None)
    held = {k: v.to_global(sbp=[B]).to_local().detach().numpy().copy() for k, v in net.state_dict().items()
            if rank in v.placement.ranks}
    return (g.auto_parallel_plan() if kw.get("auto", True) else None), losses, held


def _gloo_train(rank: int, auto: bool) -> tuple:
    plan, losses, held = _train(rank, auto=auto)
    return (str(plan.choices["stage cuts"][1]) if plan is not None else None), losses, held


def _same_training(got: list, want: list) -> None:
    """The same losses, and every parameter (wherever each run holds it) of the same value."""
    for (_, la, _), (_, lb, _) in zip(got, want):
        for a, b in zip(la, lb):
            if a is not None:
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    a = {k: v for _, _, held in got for k, v in held.items()}
    b = {k: v for _, _, held in want for k, v in held.items()}
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_unbalanced_cuts_move_to_the_predicted_fastest_and_train_alike():
    """One block on stage 0, three on stage 1: the plan moves the cut to 2 | 2 (the stages' work
    even), predicted faster; each rank then holds the blocks of its new stage, and the training is
    the user's cuts' training."""
    planned = world.simulate(2, lambda r: _train(r))
    plan = planned[0][0]
    assert len({str(p.choices) for p, _, _ in planned}) == 1
    before, after = plan.choices["stage cuts"]
    assert tuple(before) == (1,) and tuple(after) == (2,)
    assert "blocks 0 | 1-3 -> blocks 0-1 | 2-3" in str(plan)
    assert plan.chosen.step_s < plan.start.step_s
    assert {k.split(".")[1] for k in planned[0][2] if k.startswith("blocks")} == {"0", "1"}
    assert {k.split(".")[1] for k in planned[1][2] if k.startswith("blocks")} == {"2", "3"}
    _same_training(planned, world.simulate(2, lambda r: _train(r, auto=False)))


def test_the_chosen_cuts_are_the_fastest_predicted_by_hand():
    dev = DeviceModel.default("cpu")

    def run(rank):
        g, feeds, _ = _graph(cut=1)
        q = g.predict(*feeds, device=dev)
        by_hand = {}
        for c in range(1, L):
            h, hfeeds, _ = _graph(cut=c, auto=False)
            by_hand[c] = h.predict(*hfeeds, device=dev).step_s
        return tuple(g.auto_parallel_plan().choices["stage cuts"][1]), q.step_s, by_hand

    for (cut,), step_s, by_hand in world.simulate(2, run):
        assert step_s == pytest.approx(by_hand[cut], rel=1e-9)
        assert by_hand[cut] == min(by_hand.values()), by_hand


def test_the_users_cuts_are_kept_without_the_switch_or_a_stack_staged_block_by_block():
    off = world.simulate(2, lambda r: _train(r, steps=1, cuts=False))
    assert "stage cuts" not in off[0][0].choices and "stage cuts" not in off[0][0].kept
    whole = world.simulate(2, lambda r: _train(r, steps=1, whole=True))
    assert "stage cuts" not in whole[0][0].choices
    assert "has a stage set on each of its blocks" in whole[0][0].kept["stage cuts"]
    _same_training(whole, world.simulate(2, lambda r: _train(r, steps=1, whole=True, auto=False)))


def test_cuts_move_with_the_layouts_of_stages_of_two_ranks():
    """PP 2 x DP 2: each block's parameters' layouts and the cuts are variables of one descent
    (a trace under other cuts lays the moved blocks out on the new stage's mesh in the layout the
    trace tries); the plan trains as the user's cuts, unplanned."""
    planned = world.simulate(4, lambda r: _train(r, dp=True))
    plan = planned[0][0]
    assert len({str(p.choices) for p, _, _ in planned}) == 1
    assert tuple(plan.choices["stage cuts"][1]) == (2,)
    _same_training(planned, world.simulate(4, lambda r: _train(r, dp=True, auto=False)))


def _stepped_first(rank: int, auto: bool) -> tuple:
    """_train after an eager optimizer step: momentum state on each parameter's placement."""
    g, feeds, net = _graph(auto=auto)
    for p in net.parameters():
        p.grad = flow.ones_like(p) * 1e-3
    g._optimizers[0][0].step()
    for p in net.parameters():
        p.grad = None
    losses = []
    for _ in range(2):
        loss = g(*feeds)
        losses.append(loss.to_local().numpy().copy() if rank == 1 else None)
    held = {k: v.to_local().detach().numpy().copy() for k, v in net.state_dict().items() if rank in v.placement.ranks}
    return None, losses, held


def test_optimizer_state_moves_with_its_block():
    """State that exists when the cuts move (an eager step before the graph's first call) goes to the
    block's new stage with its parameters: the graph's update of a moved block reads it there."""
    _same_training(world.simulate(2, lambda r: _stepped_first(r, True)),
                   world.simulate(2, lambda r: _stepped_first(r, False)))


def test_planned_cuts_train_as_the_users_on_two_gloo_ranks(world2):
    planned = world2.run(_gloo_train, True, timeout=300)
    assert planned[0][0] == planned[1][0] == "blocks 0-1 | 2-3"
    _same_training(planned, world2.run(_gloo_train, False, timeout=300))
