"""The zero-bubble schedule (``zb-h1``): weight gradients split off the backward (norm weight and
bias gradients included) and deferred; the act order is ZB-H1's (its bubble a third of 1F1B's
for F = B = W) with 1F1B's micro-batches in flight; training equals single-process full-batch
training on simulated ranks and on Gloo."""
import numpy as np
import pytest

import holoflow as flow

from holoflow.distributed import world
from holoflow.graph.pipeline_run import zb_h1_order

import pipeline_fns as F
from test_pipeline_stages import INIT, _check, _jittered_recv, _rel


def _unit_time_bubble(order: list, p: int) -> float:
    """Idle fraction of a step when every act takes one unit (stage 0: B none, W two), acts start
    as soon as their stage is free and their input is there."""
    dur = [{"F": 1, "B": 0 if s == 0 else 1, "W": 2 if s == 0 else 1} for s in range(p)]
    f_done, b_done, end = {}, {}, {}
    pos, free = [0] * p, [0] * p
    while any(pos[s] < len(order[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if pos[s] == len(order[s]):
                continue
            kind, k = order[s][pos[s]]
            dep = (f_done.get((s - 1, k), None) if s > 0 else 0) if kind == "F" else \
                (b_done.get((s + 1, k)) if s < p - 1 else f_done.get((s, k))) if kind == "B" else b_done.get((s, k))
            if dep is None:
                continue
            t = max(free[s], dep) + dur[s][kind]
            free[s] = t
            (f_done if kind == "F" else b_done if kind == "B" else end)[(s, k)] = t
            pos[s] += 1
            moved = True
        assert moved, "the order deadlocks"
    return 1 - sum(sum(d.values()) for d in dur) * len(order[0]) / 3 / p / max(free)


@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (2, 8), (3, 6), (4, 5), (4, 8), (4, 16), (8, 16)])
def test_zb_h1_order_has_a_third_of_1f1b_bubble_with_1f1b_memory(p, m):
    order = zb_h1_order(p, m)
    ideal = (p - 1) / (3 * m + p - 1)
    assert _unit_time_bubble(order, p) == pytest.approx(ideal)
    assert ideal <= 0.43 * (p - 1) / (m + p - 1) or m < 2 * p
    for s, acts in enumerate(order):
        assert sorted(acts) == sorted((k, i) for k in "FBW" for i in range(m))
        n = {"F": 0, "B": 0, "W": 0}
        for kind, i in acts:
            assert i == n[kind]   # each kind in micro-batch order
            n[kind] += 1
            assert n["F"] - n["B"] <= min(m, p - s)   # 1F1B's window between F and B
            assert n["F"] - n["W"] <= p               # 1F1B's first stage's count, on every stage
            assert n["B"] - n["W"] <= s + 1           # W deferred at most s + 1
            assert n["B"] <= n["F"] and n["W"] <= n["B"]


def test_zb_h1_defers_norm_and_bias_weight_gradients_and_equals_full_batch(monkeypatch):
    """LayerNorm backward is split: the backward computes only its input gradient, the deferred
    weight-gradient task its weight and bias gradients (and every Linear's weight and bias)."""
    _jittered_recv(monkeypatch)
    init = F.ln_init()
    want = F.ln_reference(init)
    res = world.simulate(2, lambda r: F.ln_pipelined(r, init))
    for stage, (params, src, order, mem) in enumerate(res):
        assert _rel(params, want) < 1e-5
        assert "def wgrad(" in src
        bwd = src.split("def bwd(")[1].split("\ndef ")[0] if "def bwd(" in src else ""
        wgrad = src.split("def wgrad(")[1].split("\ndef ")[0]
        for op in ("linear_grad_weight", "sum_to_size"):
            assert op not in bwd and op in wgrad
        assert "layer_norm_backward" in wgrad
        if stage == 1:   # its backward computes the gradient it sends, norm input gradient included
            assert "layer_norm_backward" in bwd and "linear_grad_input" in bwd
        else:            # the first stage sends nothing: its whole backward is deferrable
            assert bwd == ""
        assert order == zb_h1_order(2, 4)[stage] * 2, (stage, order)
        assert mem["peak_in_flight"] <= 2 - stage and mem["peak_w_waiting"] <= stage + 1


@pytest.mark.parametrize("m", [2, 4, 8])
def test_zb_h1_equals_full_batch_and_keeps_1f1b_in_flight(m):
    want, want_losses = F.reference(steps=2)
    res = world.simulate(2, lambda r: F.pipelined(r, INIT, steps=2, m=m, schedule="zb-h1"))
    _check(res, want, want_losses)
    for _params, _losses, mem, stage in res:
        assert mem["peak_in_flight"] <= min(m, 2 - stage) and 1 <= mem["peak_w_waiting"] <= stage + 1
        assert mem["w_waiting"] == 0 and mem["in_flight"] == 0


def test_zb_h1_on_gloo_equals_full_batch(world2):
    init = F.ln_init()
    want = F.ln_reference(init, steps=3)
    res = world2.run(F.ln_pipelined, init, 3, 4, "zb-h1", timeout=240)
    for stage, (params, _src, order, _mem) in enumerate(res):
        assert _rel(params, want) < 1e-5
        assert order == zb_h1_order(2, 4)[stage] * 3
    want, want_losses = F.reference(steps=3)
    res = world2.run(F.pipelined, INIT, 3, 4, 0.1, 16, 1, "zb-h1", timeout=240)
    for params, *_ in res:
        assert _rel(params, want) < 1e-5
    np.testing.assert_allclose([float(np.mean(v)) for v in res[1][1]], want_losses, rtol=1e-5)


def _chain(places=None, init=None):
    import holoflow as flow
    from holoflow.core.sbp import B
    flow.manual_seed(0)
    net = flow.nn.Sequential(*[flow.nn.Sequential(flow.nn.Linear(F.D_IN if i == 0 else F.D_H, F.D_H),
                                                  flow.nn.LayerNorm(F.D_H), flow.nn.Tanh()) for i in range(3)],
                             flow.nn.Linear(F.D_H, F.D_OUT))
    if init is not None:
        net.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
    if places is not None:
        for part, pl in zip(net, places):
            part.to_global(placement=pl, sbp=[B])
    return net


def _chain_run(rank, init, schedule, m, steps=2):
    places = [flow.placement("cpu", ranks=[s]) for s in range(4)]
    net = _chain(places, init)
    c, _ = F.train_staged(net, flow.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                          [(net[s], s, pl) for s, pl in enumerate(places)], m, schedule, places[0], places[3],
                          steps, 16)
    order = F.compute_order(c)
    return {k: (v.to_local().numpy().copy() if rank == int(k.split(".")[0]) else None)
            for k, v in net.state_dict().items()}, order


@pytest.mark.parametrize("m", [2, 8])
def test_zb_h1_four_stages_equal_full_batch(m, monkeypatch):
    import holoflow as flow
    _jittered_recv(monkeypatch)
    init = {k: v.detach().numpy().copy() for k, v in _chain().state_dict().items()}
    net = _chain(init=init)
    o = flow.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for s in range(2):
        x, y = F.data(16, s)
        loss = flow.nn.functional.cross_entropy(net(flow.tensor(x)), flow.tensor(y))
        o.zero_grad()
        loss.backward()
        o.step()
    want = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    res = world.simulate(4, lambda r: _chain_run(r, init, "zb-h1", m))
    for stage, (params, order) in enumerate(res):
        assert _rel(params, want) < 1e-5
        assert order == zb_h1_order(4, m)[stage] * 2


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16)])
@pytest.mark.parametrize("ratio", [1.0, 1.22, 2.0])
def test_zb_h1_under_1f1b_memory_defers_fewer_weight_gradients(p, m, ratio):
    """``set_pipeline_schedule("zb-h1", memory="1f1b")``: stage s lets d = floor(s * act / w)
    weight gradients wait, so (p - s) * act + d * w <= p * act (1F1B's first stage); the bubble
    stays between ZB-H1's and 1F1B's, and equals ZB-H1's when w <= act."""
    from holoflow.graph.pipeline_run import zb_delay
    act, w = 1000, int(1000 * ratio)
    delays = [zb_delay(s, act, w) for s in range(p)]
    assert all((p - s) * act + d * w <= p * act for s, d in enumerate(delays))
    order = zb_h1_order(p, m, delays)
    bubble = _unit_time_bubble(order, p)
    ideal, one_f_one_b = (p - 1) / (3 * m + p - 1), (p - 1) / (m + p - 1)
    assert ideal - 1e-9 <= bubble <= one_f_one_b + 1e-9
    if ratio <= 1:
        assert bubble == pytest.approx(ideal)
    for s, acts in enumerate(order):
        n = {"F": 0, "B": 0, "W": 0}
        for kind, _ in acts:
            n[kind] += 1
            assert n["F"] - n["B"] <= min(m, p - s)
            assert n["B"] - n["W"] <= delays[s] + 1      # momentarily one more, right after its B


def test_zb_h1_under_1f1b_memory_trains_like_full_batch_within_1f1b_peak():
    init = F.ln_init()
    want = F.ln_reference(init)
    capped = world.simulate(2, lambda r: F.ln_pipelined(r, init, memory="1f1b"))
    base = world.simulate(2, lambda r: F.ln_pipelined(r, init, schedule="1f1b"))
    for params, *_ in capped:
        assert _rel(params, want) < 1e-5
    peak_capped = max(mem["peak_bytes"] for *_, mem in capped)
    peak_1f1b = max(mem["peak_bytes"] for *_, mem in base)
    w_bytes = max(mem["peak_w_bytes"] for *_, mem in capped)
    # within 1F1B's peak, but for the one micro-batch a stage's B has just handed its W (stage 0
    # runs W right after B: momentarily both its activations and W's inputs)
    assert peak_capped <= peak_1f1b + w_bytes


def test_pipeline_memory_option_is_checked():
    g = flow.nn.Graph()
    with pytest.raises(ValueError, match=r"memory=.*only with 'zb-h1'"):
        g.config.set_pipeline_schedule("1f1b", memory="1f1b")
    with pytest.raises(ValueError, match=r"takes None or '1f1b'"):
        g.config.set_pipeline_schedule("zb-h1", memory="half")


def test_zb_h1_under_1f1b_memory_defers_part_of_the_weight_gradients_of_gpt_stages():
    """GPT blocks (fused attention keeps no scores): a micro-batch's weight-gradient inputs (each
    Linear's input and output gradient) outweigh its forward-to-backward activations, so deferring
    all of them would hold more than 1F1B. Under ``memory="1f1b"`` the last stage defers the
    weight gradients that fit in one micro-batch's activations (still a delay of one micro-batch,
    ZB-H1's), runs the rest with the input gradients, and trains like full-batch training."""
    init = F.gpt_init()
    want, _ = F.gpt_reference(steps=2)
    runs = {}
    for name, kw in (("zb", {}), ("capped", {"memory": "1f1b"})):
        def rank(r, kw=kw):
            plan: dict = {}
            params, _ = F.gpt_pipelined(r, init, steps=2, m=4, dp=1, schedule="zb-h1", plan=plan, **kw)
            return params, plan
        runs[name] = world.simulate(2, rank)
    for params, _ in runs["capped"]:
        assert _rel({k: v for k, v in params.items() if v is not None},
                    {k: want[k] for k, v in params.items() if v is not None}) < 1e-5
    last = {name: next(plan for _, plan in res if plan["stage"] == 1) for name, res in runs.items()}
    act, held = last["zb"]["zb_bytes"]
    assert held > act, (act, held)                  # the whole W would not fit: the cap binds
    act_c, held_c = last["capped"]["zb_bytes"]
    assert act_c == act and 0 < held_c <= act       # a part of W waits, within one micro-batch's activations
    assert last["capped"]["zb_delay"] == 1          # ... for ZB-H1's full delay on stage 1
    # the share of W's estimated work that still waits: all of it uncapped, most of it capped
    assert last["zb"]["zb_w_share"] == 1.0
    assert 0.5 < last["capped"]["zb_w_share"] < 1.0
    assert last["capped"]["mem"]["peak_w_bytes"] <= 2 * held_c


def test_split_weight_grads_within_keeps_the_budget_and_the_most_work():
    """The deferred part reads at most the budget; a weight gradient whose inputs are already held
    (a bias gradient reading the same output gradient as its weight's) costs nothing more; the
    partition is the full split's, some of it moved into the first part."""
    import torch

    from holoflow.graph.ir import Node, Value
    from holoflow.graph.passes.stages import _held, split_weight_grads, split_weight_grads_within

    def val(*shape):
        return Value(shape, torch.float32, torch.device("cpu"))
    T = 16
    w1, x1, dy1, dx1, gw1, gb1 = val(32, 8), val(T, 8), val(T, 32), val(T, 8), val(32, 8), val(32)
    x2, dy2, gw2, gb2 = val(T, 2), val(T, 2), val(2, 2), val(2)
    nodes = [Node("linear_grad_input", (dy1, w1), {}, (dx1,)),
             Node("linear_grad_weight", (dy2, x2), {}, (gw2,)),      # little work per byte held
             Node("sum_to_size", (dy2,), {"size": (2,)}, (gb2,)),
             Node("linear_grad_weight", (dy1, x1), {}, (gw1,)),      # much work per byte held
             Node("sum_to_size", (dy1,), {"size": (32,)}, (gb1,))]
    state = {w1}
    first, later = split_weight_grads(nodes, {dx1})
    assert [n.outputs[0] for n in later] == [gw2, gb2, gw1, gb1]
    budget = x1.nbytes + dy1.nbytes + 8      # layer 1's W inputs fit, nothing of layer 2's
    assert _held(later, state) > budget
    first_c, later_c = split_weight_grads_within(nodes, {dx1}, budget, state)
    assert [n.outputs[0] for n in later_c] == [gw1, gb1]             # the bias gradient came for free
    assert [n.outputs[0] for n in first_c] == [dx1, gw2, gb2]
    assert _held(later_c, state) <= budget
    assert split_weight_grads_within(nodes, {dx1}, 10 ** 9, state)[1] == later   # no cap: all of W waits
    assert split_weight_grads_within(nodes, {dx1}, 0, state)[1] == []            # no room: none does
