"""Pipeline parallelism in nn.Graph (graph/pipeline.py): stages x micro-batches train exactly like
single-process full-batch training; 1F1B / GPipe in-flight bounds come from register counts; the
merged trace; errors at compile time."""
import json

import numpy as np
import pytest

import holoflow as flow
from holoflow.core.errors import HoloflowError
from holoflow.core.sbp import B
from holoflow.distributed import world

import pipeline_fns as F

INIT = F.init_state()


def _rel(got: dict, want: dict) -> float:
    return max(float(np.abs(v - want[k]).max() / max(np.abs(want[k]).max(), 1e-12))
               for k, v in got.items() if v is not None)


def _check(results, want, want_losses, dp: int = 1):
    for params, losses, _mem, stage in results:
        assert _rel(params, want) < 1e-5
        if stage == 1:
            # per micro-batch losses (OneFlow's pack): their mean is the full-batch loss; with
            # DP the stage's ranks each hold a partial sum
            if dp == 1:
                np.testing.assert_allclose([float(np.mean(v)) for v in losses], want_losses, rtol=1e-5)


@pytest.mark.parametrize("spelling,schedule", [("to", "1f1b"), ("config", "gpipe"), ("stage_id", "zb-h1")])
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_two_stages_four_micro_batches_equal_full_batch(spelling, schedule, opt):
    want, want_losses = F.reference(steps=3, opt=opt)
    res = world.simulate(2, lambda r: F.pipelined(r, INIT, steps=3, m=4, spelling=spelling, opt=opt,
                                                  schedule=schedule))
    _check(res, want, want_losses)
    assert [r[3] for r in res] == [0, 1]
    assert all(len(v) == 4 for v in res[1][1])   # one loss per micro-batch


def test_inputs_of_a_staged_module_move_to_its_placement():
    """OneFlow: set_stage moves a staged module's inputs; no explicit to_global needed."""
    want, want_losses = F.reference(steps=2)
    _check(world.simulate(2, lambda r: F.pipelined(r, INIT, steps=2, explicit_move=False)), want, want_losses)


@pytest.mark.parametrize("schedule,m,bound", [("1f1b", 4, (2, 1)), ("1f1b", 8, (2, 1)), ("gpipe", 4, (4, None))])
def test_in_flight_micro_batches_are_bounded_by_register_counts(schedule, m, bound):
    want, want_losses = F.reference(steps=2, batch=16)
    res = world.simulate(2, lambda r: F.pipelined(r, INIT, steps=2, m=m, schedule=schedule))
    _check(res, want, want_losses)
    s0, s1 = res[0][2], res[1][2]
    assert s0["peak_in_flight"] == bound[0], s0          # stage 0 of 2: p - 0 = 2 under 1F1B, m under GPipe
    if bound[1] is not None:
        assert s1["peak_in_flight"] == bound[1], s1      # the last stage alternates F, B
    assert s0["in_flight"] == s1["in_flight"] == 0


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_gradient_sums_reuse_one_buffer_across_steps_and_equal_full_batch(schedule, opt, monkeypatch):
    """The update actor sums each step's micro-batch gradients into the tensors of the previous
    step (no fresh gradient-sized tensor per step); ZB-H1's deferred weight gradients reach it
    already summed and are taken as they are (no second copy). 4 steps of SGD with momentum /
    AdamW still equal single-process full-batch training: no step reads another's gradients."""
    from holoflow.graph import pipeline_run
    handed: dict = {}   # per update actor: the sums handed to the update program, per step (kept alive)
    made: list = []     # what the weight-gradient actors handed on (their step sums)
    acc, wgrad = pipeline_run._acc_fn, pipeline_run._wgrad_fn

    def spy_acc(entry, m, n_sum, *args):
        key = object()

        def entry_spy(*vals):
            handed.setdefault(key, []).append(vals[:n_sum])
            return entry(*vals)
        return acc(entry_spy, m, n_sum, *args)

    def spy_wgrad(*args):
        fn = wgrad(*args)

        def run(*a):
            out = fn(*a)
            made.extend(o for o in out if o is not None)
            return out
        return run
    monkeypatch.setattr(pipeline_run, "_acc_fn", spy_acc)
    monkeypatch.setattr(pipeline_run, "_wgrad_fn", spy_wgrad)
    want, want_losses = F.reference(steps=4, opt=opt)
    res = world.simulate(2, lambda r: F.pipelined(r, INIT, steps=4, m=4, opt=opt, schedule=schedule))
    _check(res, want, want_losses)
    assert len(handed) == 2   # one update actor per stage
    n_owned = 0
    for steps in handed.values():
        assert len(steps) == 4 and len(steps[0]) >= 2
        for i, first in enumerate(steps[0]):
            from_w = [any(s[i] is t for t in made) for s in steps]
            if all(from_w):        # a deferred weight gradient's sum: the producer's own tensor
                n_owned += 1
            else:                  # summed here: the same tensor every step
                assert not any(from_w) and all(s[i] is first for s in steps)
    assert (n_owned > 0) == (schedule == "zb-h1")


def test_pp2_x_dp2_on_four_ranks_equals_full_batch():
    want, want_losses = F.reference(steps=3)
    res = world.simulate(4, lambda r: F.pipelined(r, INIT, steps=3, m=2, dp=2))
    _check(res, want, want_losses, dp=2)
    assert [r[3] for r in res] == [0, 0, 1, 1]
    # the two DP ranks of the last stage hold partial losses whose sum is the micro-batch loss
    sums = np.asarray(res[2][1]) + np.asarray(res[3][1])
    np.testing.assert_allclose(sums.mean(axis=1), want_losses, rtol=1e-5)


def test_gradient_accumulation_on_a_global_graph_without_stages():
    """m micro-batches of a data-parallel global graph: loss scaled by 1/m, one update per step."""
    want, want_losses = F.reference(steps=2)

    def run(rank):
        p = flow.placement("cpu", ranks=[0, 1])
        net = F.Net(init=INIT)
        net.to_global(placement=p, sbp=[B])
        o = F._opt("sgd", net.parameters(), 0.1)

        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.net = net
                self.config.set_gradient_accumulation_steps(4)
                self.add_optimizer(o)

            def build(self, x, y):
                loss = flow.nn.functional.cross_entropy(self.net(x), y)
                loss.backward()
                return loss
        g = G()
        losses = []
        for s in range(2):
            x, y = F.data(16, s)
            loss = g(flow.tensor(x).to_global(placement=p, sbp=[flow.sbp.split(0)]),
                     flow.tensor(y).to_global(placement=p, sbp=[flow.sbp.split(0)]))
            losses.append(loss.to_global(sbp=[B]).to_local().numpy())
        return {k: v.to_local().numpy() for k, v in net.state_dict().items()}, losses
    for params, losses in world.simulate(2, run):
        assert _rel(params, want) < 1e-5
        assert all(np.asarray(v).shape == (4,) for v in losses)
        np.testing.assert_allclose([np.mean(v) for v in losses], want_losses, rtol=1e-5)


def test_write_trace_merges_every_rank(tmp_path):
    path = str(tmp_path / "pipe.json")
    world.simulate(2, lambda r: F.pipelined(r, INIT, steps=2, m=4, trace=path))
    ev = json.load(open(path))["traceEvents"]
    rows = {e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    assert rows == {"stage 0 · rank 0", "stage 1 · rank 1"}
    lanes = {(e["pid"], e["args"]["name"]) for e in ev if e.get("name") == "thread_name"}
    assert (0, "compute") in lanes and (1, "compute") in lanes
    assert any(name.startswith("comm.") for _, name in lanes)
    acts = [e for e in ev if e.get("ph") == "X"]
    assert {e["args"]["micro_batch"] for e in acts} == {0, 1, 2, 3}
    assert {e["args"]["step"] for e in acts} == {0, 1}
    fwd0 = [e for e in acts if e["pid"] == 0 and e["name"].startswith("F ")]
    assert [e["name"] for e in fwd0[:4]] == ["F mb0", "F mb1", "F mb2", "F mb3"]


# -- errors ----------------------------------------------------------------------------------------------

def _graph_of(net, p0, p1, stage0=0, stage1=1):
    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = net
            self.net.s0.config.set_stage(stage0, p0)
            self.net.s1.config.set_stage(stage1, p1)
            self.config.set_gradient_accumulation_steps(2)
            self.add_optimizer(flow.optim.SGD(net.parameters(), lr=0.1))

        def build(self, x, y):
            loss = flow.nn.functional.cross_entropy(self.net(x), y)
            loss.backward()
            return loss
    return G()


def _inputs(p0, p1):
    x, y = F.data(8)
    return flow.tensor(x).to_global(placement=p0, sbp=[B]), flow.tensor(y).to_global(placement=p1, sbp=[B])


def test_crossing_a_stage_boundary_without_a_move_names_both_placements_and_the_line():
    def run(rank):
        p0, p1 = flow.placement("cpu", ranks=[0]), flow.placement("cpu", ranks=[1])
        net = F.Net(p0=p0, p1=p1, sbp=[B], explicit_move=False, init=INIT)

        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.net = net
                self.add_optimizer(flow.optim.SGD(net.parameters(), lr=0.1))

            def build(self, x, y):
                loss = flow.nn.functional.cross_entropy(self.net(x), y)
                loss.backward()
                return loss
        with pytest.raises(HoloflowError) as e:
            G()(*_inputs(p0, p1))
        return str(e.value)
    for msg in world.simulate(2, run):
        assert "ranks=[0]" in msg and "ranks=[1]" in msg and "pipeline_fns.py:" in msg, msg


def test_a_module_on_two_stages_raises_at_compile_time():
    def run(rank):
        p0, p1 = flow.placement("cpu", ranks=[0]), flow.placement("cpu", ranks=[1])
        net = F.Net(p0=p0, p1=p1, sbp=[B], init=INIT)
        g = _graph_of(net, p0, p1)
        g.net.s0.fc.config.set_stage(1, p1)     # inside stage 0's module
        with pytest.raises(HoloflowError, match="one stage|one pipeline stage"):
            g(*_inputs(p0, p1))
        return True
    assert all(world.simulate(2, run))


def test_a_cycle_between_stages_raises_at_compile_time():
    def run(rank):
        p0, p1 = flow.placement("cpu", ranks=[0]), flow.placement("cpu", ranks=[1])
        net = F.Net(p0=p0, p1=p1, sbp=[B], init=INIT)
        g = _graph_of(net, p0, p1, stage0=1, stage1=0)   # forward data would flow from stage 1 to 0
        with pytest.raises(HoloflowError, match="impossible stage assignment") as e:
            g(*_inputs(p0, p1))
        assert "pipeline_fns.py:" in str(e.value)
        return True
    assert all(world.simulate(2, run))


def test_bad_stage_settings_raise():
    m = flow.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="stage_id"):
        m.to(flow.nn.graph.GraphModule).set_stage(-1)
    with pytest.raises(TypeError, match="placement"):
        m.to(flow.nn.graph.GraphModule).set_stage(0, placement=[0])
    with pytest.raises(ValueError, match="1f1b"):
        flow.nn.Graph().config.set_pipeline_schedule("zigzag")


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_gpt_pp2_x_dp2_on_four_simulated_ranks_equals_full_batch(schedule):
    """GPT (embeddings + block 0 on ranks [0, 1], block 1 + head on [2, 3]), S(0) batches, 2 micro-batches."""
    want, want_losses = F.gpt_reference(3)
    init = F.gpt_init()
    res = world.simulate(4, lambda r: F.gpt_pipelined(r, init, 3, 2, 2, schedule=schedule))
    for params, _ in res:
        assert _rel(params, want) < 1e-5
    for _, losses in res[2:]:
        np.testing.assert_allclose([float(np.mean(v)) for v in losses], want_losses, rtol=1e-5)


@pytest.mark.parametrize("amp,ckpt", [(True, False), (False, True), (True, True)])
def test_amp_and_activation_checkpointing_in_stages_equal_the_local_graph(amp, ckpt):
    want = F.reference_graph(steps=2, amp=amp, ckpt=ckpt)
    res = world.simulate(2, lambda r: F.pipelined(r, INIT, steps=2, amp=amp, ckpt=ckpt))
    for params, *_ in res:
        assert _rel(params, want) < 1e-5
    if ckpt:   # stage 1 recomputes its forward in backward: it keeps fewer activation bytes
        plain = world.simulate(2, lambda r: F.pipelined(r, INIT, steps=1, amp=amp))
        assert res[1][2]["peak_bytes"] < plain[1][2]["peak_bytes"], (res[1][2], plain[1][2])


def test_a_checkpointed_stage_keeps_the_inputs_set_stage_moved_onto_it():
    """A staged module's inputs moved by ``set_stage`` (no explicit to_global) are its boundary
    inputs: checkpointing recomputed the move too, a forward move during the backward, refused as
    a cycle between stages (pipeline fuzzer, seed 1)."""
    want = F.reference_graph(steps=2, ckpt=True)
    res = world.simulate(2, lambda r: F.pipelined(r, INIT, steps=2, ckpt=True, explicit_move=False))
    for params, *_ in res:
        assert _rel(params, want) < 1e-5


def test_a_rank_on_no_stage_runs_the_same_program_and_holds_nothing():
    want, want_losses = F.reference(steps=2)
    res = world.simulate(3, lambda r: F.pipelined(r, INIT, steps=2))
    assert [r[3] for r in res] == [0, 1, None]
    _check(res[:2], want, want_losses)
    assert res[2][1] == [] and all(v is None for v in res[2][0].values())


def test_moves_between_placements_without_set_stage_make_stages_by_placement():
    """A global graph whose build moves a tensor to another placement is pipelined with one stage
    per placement (in order of use), with or without micro-batches."""
    for m in (1, 4):
        want, want_losses = F.reference(steps=2)
        res = world.simulate(2, lambda r: F.pipelined(r, INIT, steps=2, m=m, spelling="none"))
        _check(res, want, want_losses)
        assert [r[3] for r in res] == [0, 1]


def _jittered_recv(monkeypatch):
    """Received tensors arrive after a random delay (per call): ranks of one stage see their
    backward and forward acts become ready in different orders."""
    import random
    import time

    from holoflow.graph import pipeline_run
    real, rng = pipeline_run.p2p_recv, random.Random(0)

    def slow(*a, **k):
        time.sleep(rng.random() * 0.004)
        return real(*a, **k)
    monkeypatch.setattr(pipeline_run, "p2p_recv", slow)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_pp2_x_tp2_megatron_split_on_four_ranks_equals_full_batch(schedule, monkeypatch):
    """Column/row split Linears inside each stage: all-reduces in forward and backward acts of
    stages with 2 ranks; those acts run in the schedule's one order on both ranks of a stage."""
    from holoflow.graph.pipeline_run import stage_order
    _jittered_recv(monkeypatch)
    init = F.tp_init()
    want, want_losses = F.tp_reference(init, steps=3)
    m = 4
    res = world.simulate(4, lambda r: F.tp_pipelined(r, init, 3, m, schedule))
    assert [r[3] for r in res] == [0, 0, 1, 1]
    for params, _losses, order, stage in res:
        assert _rel(params, want) < 1e-5
        seq = stage_order(schedule, stage, 2, m, wgrad=any(k == "W" for k, _ in order))
        assert order == seq * 3, (stage, order)
    # the loss is a partial sum on each TP rank of the last stage (logits of a row-split Linear)
    sums = np.asarray(res[2][1]) + np.asarray(res[3][1])
    np.testing.assert_allclose(sums.mean(axis=1), want_losses, rtol=1e-5)


def test_act_order_is_1f1b_and_gpipe():
    assert act_order_names(2, 4) == "F0 F1 B0 F2 B1 F3 B2 B3"
    assert act_order_names(1, 3, True) == "F0 B0 W0 F1 B1 W1 F2 B2 W2"
    assert act_order_names(4, 4) == "F0 F1 F2 F3 B0 B1 B2 B3"


def act_order_names(w, m, wgrad=False):
    from holoflow.graph.pipeline_run import act_order
    return " ".join(f"{k}{i}" for k, i in act_order(w, m, wgrad))


@pytest.mark.parametrize("dp", [1, 2])
def test_boxing_and_explain_list_stage_moves_with_the_bytes_sent(dp, monkeypatch):
    """graph.boxing() lists each move between stages (send/recv) with the bytes a sending rank
    sends per step; they equal the bytes the ranks' sends measured."""
    import threading

    from holoflow.graph import pipeline_run
    from holoflow.graph.pipeline import StageMove
    sent: dict = {}
    lock, real = threading.Lock(), pipeline_run.p2p_send

    def counting(comm, t, src, dst, channel):
        with lock:
            sent[(src, channel)] = sent.get((src, channel), 0) + t.numel() * t.element_size()
        return real(comm, t, src, dst, channel)
    monkeypatch.setattr(pipeline_run, "p2p_send", counting)
    graphs: list = []
    world.simulate(2 * dp, lambda r: F.pipelined(r, INIT, steps=1, m=4, dp=dp, keep=graphs))
    moves = [p for p in graphs[0].boxing() if isinstance(p, StageMove)]
    assert sorted((mv.phase, mv.src_stage, mv.dst_stage) for mv in moves) == [("B", 1, 0), ("F", 0, 1)]
    for mv in moves:
        src_rank = dp * mv.src_stage      # the first rank of the sending stage
        got = sum(b for (r, _ch), b in sent.items() if r == src_rank)
        assert mv.comm_bytes == got, (mv, sent)
    text = graphs[0].explain()
    assert "2 stage move(s)" in text and "stage 0 -> 1" in text and "stage 1 -> 0" in text
