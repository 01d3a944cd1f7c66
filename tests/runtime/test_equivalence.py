"""The actor runtime computes exactly what the sequential executor computes, bit for bit."""
import pytest
import torch

from holoflow.runtime import Plan, Runtime, SequentialExecutor, TaskSpec

from runtime.plans import random_feeds, random_plan

SEEDS = range(12)


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for i, (p, q) in enumerate(zip(a, b)):
        assert p.keys() == q.keys()
        for k in p:
            assert torch.equal(p[k], q[k]), f"iteration {i}, regst {k!r} differs"


def test_random_plans_cover_the_interesting_shapes():
    plans = [random_plan(s) for s in SEEDS]
    assert any(len({t.stream for t in p.tasks}) == 3 for p in plans)
    assert any(len(p.consumers(r)) >= 2 for p in plans for r in p.producers)    # multi-consumer regsts
    assert any(p.needs_tick(t) for p in plans for t in p.tasks)                  # state-only / no-input tasks
    assert any(t.register_num == 1 for p in plans for t in p.tasks)


@pytest.mark.parametrize("seed", SEEDS)
def test_runtime_matches_sequential_executor(seed):
    plan = random_plan(seed)
    feeds = random_feeds(plan, 7, seed)
    ex = SequentialExecutor(plan)
    expected = ex.run(feeds)
    with Runtime(plan, timeout=30) as rt:
        got = rt.run(feeds[:3]) + rt.run(iter(feeds[3:]))        # state carries across runs
        assert rt.iteration == 7
        assert rt.state.keys() == ex.state.keys()
        for k in ex.state:
            assert torch.equal(rt.state[k], ex.state[k])
    assert_same(expected, got)


def test_runtime_called_one_iteration_at_a_time():
    plan = random_plan(3)
    feeds = random_feeds(plan, 4, 3)
    ex = SequentialExecutor(plan)
    with Runtime(plan) as rt:
        assert_same([ex(f) for f in feeds], [rt(f) for f in feeds])


def test_an_output_of_state_is_the_value_produced_in_that_iteration():
    plan = Plan([TaskSpec("count", "compute", lambda w, x: (w + x,), ("w", "x"), ("w",), register_num=2),
                 TaskSpec("show", "comm", lambda w: (w * 10,), ("w",), ("seen",))],
                inputs=("x",), outputs=("w", "seen"), initial={"w": 0})
    feeds = [{"x": 1}, {"x": 2}, {"x": 3}]
    expected = [{"w": 1, "seen": 0}, {"w": 3, "seen": 10}, {"w": 6, "seen": 30}]
    assert SequentialExecutor(plan).run(feeds) == expected
    with Runtime(plan) as rt:
        assert rt.run(feeds) == expected
        assert rt.state == {"w": 6}


def test_leaving_a_stream_early_finishes_the_fed_iterations():
    plan = random_plan(5)
    feeds = random_feeds(plan, 30, 5)
    with Runtime(plan) as rt:
        for i, _ in enumerate(rt.stream(feeds)):
            if i == 1:
                break
        fed = rt.iteration
        assert 2 <= fed <= rt.window + 2
        ex = SequentialExecutor(plan)
        ex.run(feeds[:fed])
        for k in ex.state:
            assert torch.equal(rt.state[k], ex.state[k])
        assert_same(ex.run(feeds[fed:fed + 3]), rt.run(feeds[fed:fed + 3]))
