"""Streaming: stages overlap across iterations as far as the slots allow, and no further."""
import time

import pytest

from holoflow.runtime import SOURCE, Runtime

from runtime.plans import chain

N = 10
S = 0.012


def acts_of(rt: Runtime) -> dict[str, dict[int, tuple[float, float]]]:
    by: dict[str, dict[int, tuple[float, float]]] = {}
    for a in rt.timeline.acts():
        by.setdefault(a.actor, {})[a.iteration] = (a.start, a.end)
    return by


def run_chain(register_num: int, sleeps, **kw):
    plan = chain(register_num, sleeps, **kw)
    with Runtime(plan, trace=True, timeout=30) as rt:
        t0 = time.perf_counter()
        outs = rt.run({"x": i} for i in range(N))
        wall = time.perf_counter() - t0
        assert [o[plan.outputs[0]] for o in outs] == list(range(N))
        return acts_of(rt), wall


def max_in_flight(producer: dict, consumer: dict) -> int:
    """Most pieces a producer had written that its consumer had not finished with, at any moment
    (a consumer returns its slot when its act ends)."""
    events = sorted([(e, 1) for _, e in producer.values()] + [(e, -1) for _, e in consumer.values()])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_two_slots_let_stage_k_run_iteration_i_while_stage_k1_runs_i_minus_1():
    acts, wall2 = run_chain(2, (S, S, S))
    overlapped = 0
    for k in range(2):
        up, down = acts[f"stage{k}"], acts[f"stage{k + 1}"]
        for i in range(1, N):
            (s0, e0), (s1, e1) = up[i], down[i - 1]
            overlapped += min(e0, e1) - max(s0, s1) > S / 2
    assert overlapped >= N           # of 2 * (N - 1) adjacent pairs, most run concurrently
    _, wall1 = run_chain(1, (S, S, S))
    assert wall1 > 1.25 * wall2, (wall1, wall2)


def test_one_slot_never_overlaps_adjacent_stages():
    acts, _ = run_chain(1, (S, S, S))
    for k in range(2):
        up, down = acts[f"stage{k}"], acts[f"stage{k + 1}"]
        for i in range(1, N):
            assert up[i][0] >= down[i - 1][1]     # stage k starts i only after k+1 returned i-1's slot


def test_tasks_on_one_stream_run_one_at_a_time():
    acts, _ = run_chain(2, (S / 4,) * 3, same_stream=True)
    spans = sorted(v for k in ("stage0", "stage1", "stage2") for v in acts[k].values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


@pytest.mark.parametrize("register_num", [1, 2, 3])
def test_back_pressure_bounds_a_fast_producer_by_its_slots(register_num):
    acts, _ = run_chain(register_num, (0.0, S))       # stage0 is instant, stage1 slow
    assert max_in_flight(acts["stage0"], acts["stage1"]) == register_num
    for i in range(register_num, N):                   # never more than register_num ahead
        assert acts["stage0"][i][0] >= acts["stage1"][i - register_num][1]


@pytest.mark.parametrize("input_register_num", [1, 2, 3])
def test_source_runs_at_most_input_register_num_iterations_ahead(input_register_num):
    acts, _ = run_chain(1, (S,), input_register_num=input_register_num)
    src, first = acts[SOURCE], acts["stage0"]
    assert max_in_flight(src, first) == input_register_num
    for i in range(input_register_num, N):
        assert src[i][0] >= first[i - input_register_num][1]
