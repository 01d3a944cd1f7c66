"""Workers: streams mapped onto shared threads or onto the caller's thread compute exactly what the
sequential executor computes, start no thread they do not need, and fail and stall as loudly."""
import threading
import time

import pytest
import torch

from holoflow.runtime import CALLER, SOURCE_STREAM, Plan, Runtime, RuntimeStall, SequentialExecutor, TaskError, TaskSpec

from runtime.plans import STREAMS, chain, random_feeds, random_plan
from runtime.test_equivalence import assert_same

ALL = (SOURCE_STREAM, *STREAMS)
MAPPINGS = {
    "all on the caller": {s: CALLER for s in ALL},
    "one shared thread": {s: "w" for s in ALL},
    "tasks on the caller, source on its thread": {s: CALLER for s in STREAMS},
    "compute on the caller, the rest on threads": {"compute": CALLER, SOURCE_STREAM: CALLER},
    "two shared threads": {"compute": "a", "comm": "b", "h2d": "a", SOURCE_STREAM: "b"},
}


def restrict(mapping: dict, plan: Plan) -> dict:
    used = {SOURCE_STREAM, *(t.stream for t in plan.tasks)}
    return {s: w for s, w in mapping.items() if s in used}


def stream_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("holoflow-stream-")]


@pytest.mark.parametrize("mapping", MAPPINGS, ids=list(MAPPINGS))
@pytest.mark.parametrize("seed", range(8))
def test_any_mapping_of_streams_to_workers_matches_the_sequential_executor(seed, mapping):
    plan = random_plan(seed)
    feeds = random_feeds(plan, 7, seed)
    ex = SequentialExecutor(plan)
    expected = ex.run(feeds)
    with Runtime(plan, timeout=30, threads=restrict(MAPPINGS[mapping], plan)) as rt:
        got = rt.run(feeds[:3]) + [rt(f) for f in feeds[3:5]] + rt.run(iter(feeds[5:]))
        for k in ex.state:
            assert torch.equal(rt.state[k], ex.state[k])
    assert_same(expected, got)


def test_on_the_caller_every_act_runs_on_the_callers_thread_and_no_thread_starts():
    seen = set()

    def fn(v):
        seen.add(threading.get_ident())
        return (v + 1,)
    plan = Plan([TaskSpec("a", "compute", fn, ("x",), ("y",)), TaskSpec("b", "update", fn, ("y",), ("z",))],
                inputs=("x",), outputs=("z",))
    before = threading.active_count()
    with Runtime(plan, threads={s: CALLER for s in ("compute", "update", SOURCE_STREAM)}) as rt:
        assert threading.active_count() == before and stream_threads() == []
        assert rt.run({"x": i} for i in range(5)) == [{"z": i + 2} for i in range(5)]
    assert seen == {threading.get_ident()}


def test_streams_sharing_a_worker_share_one_thread():
    names = set()

    def fn(v):
        names.add(threading.current_thread().name)
        return (v,)
    plan = Plan([TaskSpec("a", "compute", fn, ("x",), ("y",)), TaskSpec("b", "comm", fn, ("y",), ("z",))],
                inputs=("x",), outputs=("z",))
    with Runtime(plan, threads={"compute": "dev", "comm": "dev"}) as rt:
        assert sorted(stream_threads()) == ["holoflow-stream-dev", "holoflow-stream-source"]
        rt.run({"x": i} for i in range(4))
    assert names == {"holoflow-stream-dev"}


def test_on_start_runs_once_on_each_worker_thread():
    started = []
    with Runtime(chain(1, (0.0, 0.0)), threads={"s0": "w", "s1": "w"},
                 on_start=lambda: started.append(threading.current_thread().name)) as rt:
        rt.run({"x": i} for i in range(3))
    assert sorted(started) == ["holoflow-stream-source", "holoflow-stream-w"]


def test_a_failure_on_the_callers_thread_is_a_task_error_and_closes():
    def bad(v):
        if v == 2:
            raise ValueError("bad value 2")
        return (v,)
    plan = Plan([TaskSpec("ok", "compute", lambda v: (v,), ("x",), ("a",), register_num=2),
                 TaskSpec("step", "comm", bad, ("a",), ("b",), source="train.py:7")], inputs=("x",), outputs=("b",))
    rt = Runtime(plan, threads={"compute": CALLER, "comm": CALLER, SOURCE_STREAM: CALLER})
    with pytest.raises(TaskError, match=r"(?s)task 'step' on stream 'comm' failed at iteration 2.*train.py:7"):
        rt.run({"x": i} for i in range(6))
    with pytest.raises(RuntimeError, match="closed after a failure"):
        rt.run([{"x": 0}])


def test_a_stall_with_a_thread_stream_and_caller_streams_is_reported():
    plan = Plan([TaskSpec("fast", "compute", lambda x: (x,), ("x",), ("y",)),
                 TaskSpec("sleepy", "comm", lambda y: (time.sleep(1.5), (y,))[1], ("y",), ("z",))],
                inputs=("x",), outputs=("z",))
    rt = Runtime(plan, timeout=0.3, threads={"compute": CALLER, SOURCE_STREAM: CALLER})
    with pytest.raises(RuntimeStall, match=r"sleepy \(stream 'comm', acted 0\): running iteration 0"):
        rt.run([{"x": 1}, {"x": 2}])
    assert stream_threads() == []


def test_leaving_early_on_the_caller_finishes_the_fed_iterations():
    plan = random_plan(5)
    feeds = random_feeds(plan, 30, 5)
    threads = restrict(MAPPINGS["all on the caller"], plan)
    with Runtime(plan, threads=threads) as rt:
        for i, _ in enumerate(rt.stream(feeds)):
            if i == 1:
                break
        ex = SequentialExecutor(plan)
        ex.run(feeds[:rt.iteration])
        for k in ex.state:
            assert torch.equal(rt.state[k], ex.state[k])


@pytest.mark.parametrize("threads, message", [
    ({"nope": CALLER}, r"\['nope'\] name no stream of the plan"),
    ({"s0": ""}, "worker names must be non-empty strings"),
    ({"s0": 3}, "worker names must be non-empty strings"),
])
def test_bad_thread_mappings_are_rejected(threads, message):
    with pytest.raises(ValueError, match=message):
        Runtime(chain(1, (0.0,)), threads=threads)
