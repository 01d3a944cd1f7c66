"""The ideal bubble of a pipeline schedule for given per-stage F / B / W durations
(``pipeline_run.simulate_schedule`` / ``ideal_bubbles``, bench/pipeline.py's reference), against
closed forms and hand-simulated cases; and the per-phase durations read from a trace
(``timeline.phase_durations``)."""
import pytest

from holoflow.graph.pipeline_run import act_order, ideal_bubbles, simulate_schedule, zb_h1_order
from holoflow.runtime.timeline import bubble_fractions, phase_durations

CASES = [(2, 1), (2, 4), (2, 8), (3, 6), (4, 8), (4, 16), (8, 16)]


@pytest.mark.parametrize("p,m", CASES)
def test_equal_durations_give_the_closed_forms(p, m):
    dur = [{"F": 1.0, "B": 1.0, "W": 1.0}] * p
    for sched in ("1f1b", "gpipe"):
        assert ideal_bubbles(sched, m, dur) == pytest.approx([(p - 1) / (m + p - 1)] * p)
    if m >= p:   # the closed form's steady state (one micro-batch: stage 0's W cannot overlap anything)
        assert ideal_bubbles("zb-h1", m, dur) == pytest.approx([(p - 1) / (3 * m + p - 1)] * p)


@pytest.mark.parametrize("p,m", [c for c in CASES if c[1] >= c[0]])
def test_first_stage_with_its_whole_backward_as_w_keeps_zb_h1s_bubble(p, m):
    """As the runtime runs it: stage 0 sends no input gradient, its B hands W everything (B = 0,
    W = B + W)."""
    dur = [{"F": 1.0, "B": 0.0, "W": 2.0}] + [{"F": 1.0, "B": 1.0, "W": 1.0}] * (p - 1)
    assert ideal_bubbles("zb-h1", m, dur) == pytest.approx([(p - 1) / (3 * m + p - 1)] * p)


@pytest.mark.parametrize("p,m", CASES)
@pytest.mark.parametrize("f,b", [(1.0, 2.0), (2.0, 3.0), (1.0, 0.5)])
def test_no_weight_gradient_work_makes_zb_h1_1f1b(p, m, f, b):
    dur = [{"F": f, "B": b, "W": 0.0}] * p
    assert ideal_bubbles("zb-h1", m, dur) == pytest.approx(ideal_bubbles("1f1b", m, dur))
    assert ideal_bubbles("1f1b", m, dur) == pytest.approx([(p - 1) / (m + p - 1)] * p)


def test_1f1b_runs_w_inside_the_backward():
    dur_split = [{"F": 1.0, "B": 1.5, "W": 0.5}] * 3
    dur_fused = [{"F": 1.0, "B": 2.0, "W": 0.0}] * 3
    assert ideal_bubbles("1f1b", 6, dur_split) == pytest.approx(ideal_bubbles("1f1b", 6, dur_fused))


def test_unequal_stages_by_hand():
    """p = 2, m = 1: stage 0 F [0, 1], stage 1 F [1, 3] B [3, 6], stage 0 B [6, 7]."""
    dur = [{"F": 1.0, "B": 1.0}, {"F": 2.0, "B": 3.0}]
    span, bubbles = simulate_schedule([act_order(2, 1), act_order(1, 1)], dur)
    assert span == pytest.approx(7.0)
    assert bubbles == pytest.approx([5 / 7, 2 / 7])
    assert ideal_bubbles("1f1b", 1, dur) == pytest.approx([5 / 7, 2 / 7])


def test_two_stage_1f1b_by_hand_with_unequal_f_and_b():
    """p = 2, m = 2, F = 1, B = 2: stage 0 F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9]; stage 1 F0 [1,2]
    B0 [2,4] F1 [4,5] B1 [5,7]: span 9, 6 busy on each stage."""
    span, bubbles = simulate_schedule([act_order(2, 2), act_order(1, 2)], [{"F": 1.0, "B": 2.0}] * 2)
    assert span == pytest.approx(9.0)
    assert bubbles == pytest.approx([1 / 3, 1 / 3])


def test_move_latency_is_added_to_each_move_between_stages():
    """p = 2, m = 1, F = B = 1, latency 0.5: stage 1 F [1.5, 2.5] B [2.5, 3.5], stage 0 B [4, 5]."""
    dur = [{"F": 1.0, "B": 1.0}] * 2
    span, bubbles = simulate_schedule([act_order(2, 1), act_order(1, 1)], dur, latency=0.5)
    assert span == pytest.approx(5.0)
    assert bubbles == pytest.approx([0.6, 0.6])


def test_fewer_waiting_weight_gradients_lie_between_zb_h1_and_1f1b():
    p, m = 4, 8
    dur = [{"F": 1.0, "B": 1.0, "W": 1.0}] * p
    full, none = ideal_bubbles("zb-h1", m, dur), ideal_bubbles("zb-h1", m, dur, delays=[0] * p)
    one_f_one_b = ideal_bubbles("1f1b", m, dur)
    assert max(full) < max(none) <= max(one_f_one_b) + 1e-9


def test_real_compute_ratio_is_not_a_third():
    """A GPT-block-like stage: W is a third of the backward (attention's backward is all B), and
    stage 0 runs its whole backward as W: ZB-H1's ideal is about half of 1F1B's, not a third."""
    p, m = 2, 8
    dur = [{"F": 7.0, "B": 0.0, "W": 14.5}, {"F": 7.0, "B": 7.5, "W": 6.5}]
    ratio = max(ideal_bubbles("zb-h1", m, dur)) / max(ideal_bubbles("1f1b", m, dur))
    assert 0.45 < ratio < 0.6
    assert ratio > (m + p - 1) / (3 * m + p - 1) + 0.1


def test_a_deadlocking_order_is_an_error():
    with pytest.raises(ValueError, match="deadlock"):
        simulate_schedule([[("B", 0), ("F", 0)]], [{"F": 1.0, "B": 1.0}])
    with pytest.raises(ValueError, match="unknown schedule"):
        ideal_bubbles("interleaved", 4, [{"F": 1.0, "B": 1.0}] * 2)


def _acts_of(orders, dur, latency=0.0):
    """The acts the simulation implies, as the runtime's trace records them (one rank per stage)."""
    p = len(orders)
    done, free, pos, acts = {}, [0.0] * p, [0] * p, []
    while any(pos[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, k = orders[s][pos[s]]
                dep = ((done.get(("F", s - 1, k)) if s else 0.0) if kind == "F" else
                       (done.get(("B", s + 1, k)) if s < p - 1 else done.get(("F", s, k))) if kind == "B" else
                       done.get(("B", s, k)))
                if dep is None:
                    break
                hop = latency if (kind == "F" and s) or (kind == "B" and s < p - 1) else 0.0
                start = max(free[s], dep + hop)
                free[s] = done[(kind, s, k)] = start + dur[s][kind]
                acts.append({"task": kind, "lane": "compute", "phase": kind, "mb": k, "step": 0,
                             "start": start, "end": free[s], "rank": s, "stage": s})
                pos[s] += 1
    return acts


def test_the_trace_readers_agree_with_the_simulation():
    p, m = 3, 5
    dur = [{"F": 1.0, "B": 0.0, "W": 2.5}, {"F": 1.2, "B": 1.1, "W": 0.7}, {"F": 0.9, "B": 1.4, "W": 0.6}]
    orders = zb_h1_order(p, m)
    acts = _acts_of(orders, dur, latency=0.1)
    got = phase_durations(acts)
    for s in range(p):
        assert got[s] == pytest.approx(dur[s])
    measured = bubble_fractions(acts)
    assert [measured[s] for s in range(p)] == pytest.approx(ideal_bubbles("zb-h1", m, dur, latency=0.1))


def test_phase_durations_means_per_rank_and_ignores_other_lanes():
    acts = [{"task": "fwd", "lane": "compute", "phase": "F", "mb": 0, "step": 1, "start": 0.0, "end": 1.0, "rank": 0},
            {"task": "fwd", "lane": "compute", "phase": "F", "mb": 1, "step": 1, "start": 1.0, "end": 4.0, "rank": 0},
            {"task": "bwd", "lane": "compute", "phase": "B", "mb": 0, "step": 1, "start": 4.0, "end": 6.0, "rank": 0},
            {"task": "send", "lane": "comm.send_F", "phase": "F", "mb": 0, "step": 1, "start": 1.0, "end": 9.0,
             "rank": 0}]
    assert phase_durations(acts) == {0: {"F": 2.0, "B": 2.0, "W": 0.0}}


def test_replay_with_each_acts_own_duration():
    """``per_act`` overrides one act: p = 2, m = 1, stage 1's B takes 3 instead of 1: stage 0 F
    [0, 1], stage 1 F [1, 2] B [2, 5], stage 0 B [5, 6]."""
    dur = [{"F": 1.0, "B": 1.0}] * 2
    orders = [act_order(2, 1), act_order(1, 1)]
    span, bubbles = simulate_schedule(orders, dur, per_act={("B", 1, 0): 3.0})
    assert span == pytest.approx(6.0)
    assert bubbles == pytest.approx([4 / 6, 2 / 6])
    assert ideal_bubbles("1f1b", 1, dur, per_act={("B", 1, 0): 3.0}) == pytest.approx(bubbles)
    acts = _acts_of(zb_h1_order(2, 4), [{"F": 1.0, "B": 1.0, "W": 1.0}] * 2)
    same = {(a["phase"], a["stage"], a["mb"]): a["end"] - a["start"] for a in acts}
    assert ideal_bubbles("zb-h1", 4, [{"F": 1.0, "B": 1.0, "W": 1.0}] * 2, per_act=same) == \
        pytest.approx(ideal_bubbles("zb-h1", 4, [{"F": 1.0, "B": 1.0, "W": 1.0}] * 2))
