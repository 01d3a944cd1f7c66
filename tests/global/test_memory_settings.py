"""Memory settings of global graphs: activation checkpointing lowers a data-parallel graph's
planned peak (the schedule pass keeps each recomputation where the backward reads it), and with
a memory limit the auto-parallel planner chooses ZeRO's stage and recomputation itself where the
user set neither (graph/auto_parallel.py ``memory_settings``). On 2 simulated ranks; every plan
trains as one process eager."""
import itertools
import re

import numpy as np
import pytest

import holoflow as flow
from holoflow.core.sbp import B, S
from holoflow.distributed import world
from test_auto_parallel import _train_eagerly, _train_graph

D, HIDDEN, BATCH, BLOCKS = 15, 255, 512, 4   # odd widths: no parameter splits evenly over 2 ranks
BLOCK_PATHS = {f"m.{i}" for i in range(BLOCKS)}


class _Block(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = flow.nn.LayerNorm(D)
        self.fc = flow.nn.Linear(D, HIDDEN)
        self.proj = flow.nn.Linear(HIDDEN, D)

    def forward(self, x):
        return x + self.proj(flow.nn.functional.gelu(self.fc(self.ln(x))))


def _model():
    flow.manual_seed(0)
    m = flow.nn.Sequential(*[_Block() for _ in range(BLOCKS)])
    return m, flow.randn(BATCH, D), flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def _eager(steps: int = 2):
    m, x, opt = _model()
    losses = _train_eagerly(m, opt, x, steps)
    return losses, {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def _graph(configure, auto: bool):
    """The model data parallel on 2 ranks (batch rows split) as a training graph."""
    m, x, opt = _model()
    place = flow.placement("cpu", ranks=[0, 1])
    m.to_global(placement=place, sbp=[B])
    g = _train_graph(m, opt, auto)
    configure(g.config)
    return g, x.to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)]), m


def _train(g, x, m, steps: int = 2):
    losses = [g(x).to_global(sbp=[B]).to_local().item() for _ in range(steps)]
    return losses, {k: v.to_global(sbp=[B]).to_local().numpy().copy() for k, v in m.state_dict().items()}


def _check_equal_to_eager(runs):
    want_l, want_p = _eager()
    for losses, params in runs:
        np.testing.assert_allclose(losses, want_l, rtol=1e-5, atol=1e-7)
        for k in want_p:
            np.testing.assert_allclose(params[k], want_p[k], rtol=1e-5, atol=1e-6)


CHECKPOINTED = {"off": set(), "half": {f"m.{i}" for i in range(BLOCKS // 2)}, "all": BLOCK_PATHS}


def _settings(zero, ckpt):
    def configure(cfg):
        if zero is not None:
            cfg.enable_zero(True, stage=zero)
        if ckpt:
            cfg.checkpointed_scopes = set(CHECKPOINTED[ckpt] if isinstance(ckpt, str) else BLOCK_PATHS)
    return configure


@pytest.mark.parametrize("zero", [None, 2])
def test_checkpointed_blocks_lower_a_data_parallel_graphs_planned_peak(zero):
    """The schedule pass (collectives early) took every node a gradient bucket's all-reduce needs
    as early as its inputs allowed, recomputations included: each block's recomputed activations
    came right after the forward, all alive at once, and checkpointing saved nothing. Kept where
    the backward reads them, 4 checkpointed blocks hold one block's activations instead of 4.
    Under ZeRO-2 (weights' gradients reduce-scattered one by one, the biases' in the last bucket)
    each bias gradient's reduction waited for the earlier reduce-scatters' cones, holding its
    (rows x width) input to the end: a reduction now runs as soon as it can."""
    def run(rank):
        out = []
        for ckpt in (False, True):
            g, x, m = _graph(_settings(zero, ckpt), auto=False)
            out.append((g.predict(x).memory_bytes, _train(g, x, m)))
        return out
    runs = world.simulate(2, run, timeout=300)
    activation = (BATCH // 2) * HIDDEN * 4   # one (rows per rank, HIDDEN) float32 tensor
    for (plain, plain_run), (ckpt, ckpt_run) in runs:
        assert plain - ckpt >= 2 * (BLOCKS - 2) * activation, (plain, ckpt)
        _check_equal_to_eager([plain_run, ckpt_run])


def test_under_a_memory_limit_the_planner_chooses_zero_and_recomputation():
    """No parameter splits over the ranks (odd widths), so only ZeRO's stage and recomputing the
    blocks (none, the first half, all) can meet a limit below data parallelism's memory. Each setting's prediction comes from
    ``graph.predict`` of a graph configured by hand; under a limit the planner takes the fastest
    combination that fits (every combination is one move), reports it, keeps it in the config,
    and trains as one process. Without a limit it changes no setting."""
    combos = list(itertools.product([None, 1, 2, 3], CHECKPOINTED))

    def run(rank):
        by_hand = {}
        for zero, ckpt in combos:
            g, x, _ = _graph(_settings(zero, ckpt), auto=False)
            q = g.predict(x)
            by_hand[(zero, ckpt)] = (q.step_s, q.memory_bytes)
        free, x, m = _graph(lambda cfg: None, auto=True)
        free(x)
        out = {"by_hand": by_hand, "free": free.auto_parallel_plan().choices}
        plain = by_hand[(None, "off")][1]
        for name, limit in (("below data parallel", plain - 1),
                            ("least", min(mem for _, mem in by_hand.values()))):
            g, x, m = _graph(lambda cfg, limit=limit: cfg.enable_auto_memory(limit=limit), auto=True)
            trained = _train(g, x, m)
            plan = g.auto_parallel_plan()
            zero = g.config.zero.stage if g.config.zero is not None else None
            ckpt = next(k for k, v in CHECKPOINTED.items() if v == set(g.config.checkpointed_scopes))
            out[name] = (limit, plan, (zero, ckpt), trained, g.explain())
        return out
    runs = world.simulate(2, run, timeout=300)
    for got in runs:
        by_hand = got["by_hand"]
        assert not any(k in got["free"] for k in ("ZeRO", "activation checkpointing")), got["free"]
        chosen_kinds = set()
        for name in ("below data parallel", "least"):
            limit, plan, chosen, trained, text = got[name]
            fits = {c: f for c, f in by_hand.items() if f[1] <= limit}
            assert fits and chosen == min(fits, key=lambda c: fits[c][0]), (name, chosen, by_hand)
            assert plan.chosen.memory_bytes <= limit < plan.start.memory_bytes
            assert plan.chosen.memory_bytes == by_hand[chosen][1]   # the planner's figure is graph.predict's
            assert str(plan) in text and "(changed)" in str(plan)
            zero_after, ckpt_after = plan.choices["ZeRO"][1], plan.choices["activation checkpointing"][1]
            assert (zero_after.stage if zero_after is not None else None, ckpt_after) == \
                (chosen[0], frozenset(CHECKPOINTED[chosen[1]]))
            assert re.search(r"ZeRO +off -> " + ("off" if chosen[0] is None else f"stage {chosen[0]}"), str(plan))
            chosen_kinds.update(k for k, on in zip(("zero", "ckpt"), chosen) if on not in (None, "off"))
            _check_equal_to_eager([trained])
        assert chosen_kinds == {"zero", "ckpt"}, chosen_kinds   # both settings took part
