"""Per-act overhead of the actor runtime vs the sequential executor, on a chain of trivial tasks.

    python bench/runtime.py [--tasks 8] [--iters 2000] [--repeat 3]

Each task is ``lambda v: (v,)``, so the time is all framework: the executor's loop for the
sequential reference; messages, slot counters and thread hand-offs for the actor runtime. Rows:
every actor on the caller's thread (``threads=CALLER``, what the graph lowering uses on a CPU
device), all tasks on one stream thread (messages stay on one thread; the source/sink on another),
tasks alternating over two streams (every message crosses threads), and the caller-thread chain
with tracing on. ``--json`` prints one JSON line (for bench/run_all.py). Not a timed test: the
ratios are what to watch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from holoflow.runtime import CALLER, SOURCE_STREAM, Plan, Runtime, SequentialExecutor, TaskSpec  # noqa: E402


def chain(n: int, streams: tuple[str, ...], register_num: int = 2) -> Plan:
    """x -> t0 -> t1 -> ... -> t{n-1}, task k on ``streams[k % len(streams)]``."""
    tasks, prev = [], "x"
    for k in range(n):
        tasks.append(TaskSpec(f"t{k}", streams[k % len(streams)], lambda v: (v,), (prev,), (f"r{k}",),
                              register_num=register_num))
        prev = f"r{k}"
    return Plan(tasks, inputs=("x",), outputs=(prev,))


def per_act_us(make, plan: Plan, iters: int, repeat: int) -> float:
    """Best of ``repeat`` runs of ``iters`` iterations, in microseconds per task act."""
    best = float("inf")
    feeds = [{"x": i} for i in range(iters)]
    with make(plan) as ex:
        ex.run(feeds[:10])
        for _ in range(repeat):
            t0 = time.perf_counter()
            ex.run(feeds)
            best = min(best, time.perf_counter() - t0)
    return best / (iters * len(plan.tasks)) * 1e6


def on_caller(plan: Plan) -> Runtime:
    """Every stream (the source's too) on the caller's thread."""
    return Runtime(plan, threads={s: CALLER for s in (SOURCE_STREAM, *(t.stream for t in plan.tasks))})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON line of us/act per row")
    a = ap.parse_args()
    one, two = chain(a.tasks, ("compute",)), chain(a.tasks, ("compute", "comm"))
    seq = per_act_us(SequentialExecutor, one, a.iters, a.repeat)
    rows = [("sequential executor", seq),
            ("actors, caller thread", per_act_us(on_caller, one, a.iters, a.repeat)),
            ("actors, 1 stream thread", per_act_us(Runtime, one, a.iters, a.repeat)),
            ("actors, 2 stream threads", per_act_us(Runtime, two, a.iters, a.repeat)),
            ("actors, caller thread, trace",
             per_act_us(lambda p: Runtime(p, trace=True, threads={s: CALLER for s in (SOURCE_STREAM, "compute")}),
                        one, a.iters, a.repeat))]
    if a.json:
        print(json.dumps({"tasks": a.tasks, "iters": a.iters, "us_per_act": dict(rows)}))
        return
    print(f"chain of {a.tasks} trivial tasks, {a.iters} iterations (source and sink acts not counted as tasks)")
    print(f"{'executor':<30} {'us/act':>8} {'x sequential':>13}")
    for name, us in rows:
        print(f"{name:<30} {us:>8.2f} {us / seq:>13.1f}")


if __name__ == "__main__":
    main()
