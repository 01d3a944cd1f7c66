"""TaskSpec.priority: a task with priority < 0 acts only when its worker has no other message
waiting (the zero-bubble pipeline's weight gradients, graph/pipeline_run.py); priority 0 is FIFO."""
import threading
import time

import pytest

from holoflow.runtime import Plan, Runtime, TaskSpec


def _order(low_priority: int, m: int = 5) -> list:
    order, lock = [], threading.Lock()

    def task(tag, delay):
        def fn(x):
            time.sleep(delay)
            with lock:
                order.append(f"{tag}{int(x)}")
            return (x,)
        return fn
    plan = Plan((TaskSpec("hi", "w", task("h", 0.01), ("x",), ("y",), register_num=m),
                 TaskSpec("lo", "w", task("l", 0.0), ("x",), ("z",), register_num=m, priority=low_priority)),
                inputs=("x",), outputs=("y", "z"), input_register_num=m)
    rt = Runtime(plan)
    try:
        got = rt.run([{"x": float(k)} for k in range(m)])
    finally:
        rt.close()
    assert [(d["y"], d["z"]) for d in got] == [(float(k), float(k)) for k in range(m)]   # values unchanged
    return order


def test_a_yielding_task_acts_only_when_its_worker_has_nothing_else_waiting():
    # every feed arrives while "hi" runs its first act: "lo" waits until all of "hi" is done
    assert _order(-1) == [f"h{k}" for k in range(5)] + [f"l{k}" for k in range(5)]


def test_priority_zero_is_first_come_first_served():
    order = _order(0)
    assert order.index("l0") < order.index("h4")


@pytest.mark.parametrize("priority", [-1, 0])
def test_a_yielding_task_still_runs_every_iteration(priority):
    assert sorted(_order(priority)) == sorted([f"h{k}" for k in range(5)] + [f"l{k}" for k in range(5)])
