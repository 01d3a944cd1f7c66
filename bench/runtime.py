"""Per-act overhead of the actor runtime vs the sequential executor, on a chain of trivial tasks,
and its per-call overhead on the lowered GPT-mini plan's shape.

    python bench/runtime.py [--tasks 8] [--iters 2000] [--repeat 3] [--rounds 3]
    python bench/runtime.py --one ROW          # one row in this process: a RESULT json line
    python bench/runtime.py --json             # every row in this process: one JSON line

Each chain task is ``lambda v: (v,)``, so the time is all framework: the executor's loop for the
sequential reference; messages, slot counters and thread hand-offs for the actor runtime. Rows:
every actor on the caller's thread (``threads=CALLER``, what the graph lowering uses on a CPU
device), all tasks on one stream thread (messages stay on one thread; the source/sink on another),
tasks alternating over two streams (every message crosses threads), and the caller-thread chain
with tracing on. The ``gpt plan`` rows run the tasks and regsts of the lowered GPT-mini training
step (bench/graph.py's; a compute task of ~30 values, the update task) with trivial functions, one
feed per call as ``nn.Graph`` does: the runtime's cost per training step, in us per call.

The table runs each row in its own fresh process, the order reversed every other round, and keeps
each row's best of ``--rounds`` (bench/graph.py's ``alternate``); ``--json`` measures every row in
one process (bench/run_all.py runs it once per round). Not a timed test: the ratios are what to watch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from holoflow.runtime import CALLER, SOURCE_STREAM, Plan, Runtime, SequentialExecutor, TaskSpec  # noqa: E402

CHAIN_ROWS = ("sequential executor", "actors, caller thread", "actors, 1 stream thread", "actors, 2 stream threads",
              "actors, caller thread, trace")
CALL_ROWS = ("gpt plan, sequential executor", "gpt plan, actors, caller thread")


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


def per_call_us(make, plan: Plan, feed: dict, iters: int, repeat: int) -> float:
    """Best of ``repeat`` means over ``iters`` calls of one iteration each, in microseconds per call."""
    best = float("inf")
    with make(plan) as ex:
        ex.run([feed] * 10)
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(iters):
                ex.run([feed])
            best = min(best, time.perf_counter() - t0)
    return best / iters * 1e6


def on_caller(plan: Plan) -> Runtime:
    """Every stream (the source's too) on the caller's thread."""
    return Runtime(plan, threads={s: CALLER for s in (SOURCE_STREAM, *(t.stream for t in plan.tasks))})


def gpt_plan() -> tuple[Plan, dict]:
    """The lowered GPT-mini training plan (bench/graph.py's case) with every task fn replaced by one
    returning constants of the right arity, and a feed for it."""
    import holoflow as flow
    from graph import gpt_case, train_graph
    m, opt, batch, loss_fn = gpt_case(flow)

    g = train_graph(m, opt, loss_fn)
    g(*batch)
    c = next(iter(g._compiled.values()))
    plan = c.lowered.plan
    tasks = [TaskSpec(t.name, t.stream, _const(len(t.produces)), t.consumes, t.produces, t.register_num)
             for t in plan.tasks]
    return Plan(tasks, inputs=plan.inputs, outputs=plan.outputs, initial=plan.initial,
                input_register_num=plan.input_register_num), {r: 0 for r in plan.inputs}


def _const(n: int):
    out = tuple(range(n))
    return lambda *_: out


def measure(row: str, tasks: int, iters: int, repeat: int) -> float:
    """One row: us per act (chain rows) or us per call (gpt plan rows)."""
    if row in CALL_ROWS:
        plan, feed = gpt_plan()
        make = SequentialExecutor if row.endswith("sequential executor") else on_caller
        return per_call_us(make, plan, feed, max(iters // 2, 100), repeat)
    one, two = chain(tasks, ("compute",)), chain(tasks, ("compute", "comm"))
    make, plan = {
        "sequential executor": (SequentialExecutor, one),
        "actors, caller thread": (on_caller, one),
        "actors, 1 stream thread": (Runtime, one),
        "actors, 2 stream threads": (Runtime, two),
        "actors, caller thread, trace":
            (lambda p: Runtime(p, trace=True, threads={s: CALLER for s in (SOURCE_STREAM, "compute")}), one),
    }[row]
    return per_act_us(make, plan, iters, repeat)


def table(best: dict[str, float]) -> None:
    seq = best.get("sequential executor")
    print(f"{'chain executor':<34} {'us/act':>8} {'x sequential':>13} {'overhead us/act':>16}")
    for row in CHAIN_ROWS:
        if row in best and seq:
            print(f"{row:<34} {best[row]:>8.2f} {best[row] / seq:>13.1f} {best[row] - seq:>16.2f}")
    seq = best.get(CALL_ROWS[0])
    if seq:
        print(f"{'GPT-mini plan, trivial fns':<34} {'us/call':>8} {'x sequential':>13} {'overhead us/call':>16}")
        for row in CALL_ROWS:
            if row in best:
                print(f"{row:<34} {best[row]:>8.2f} {best[row] / seq:>13.1f} {best[row] - seq:>16.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="fresh-process rounds per row (the table)")
    ap.add_argument("--rows", nargs="+", choices=CHAIN_ROWS + CALL_ROWS, default=list(CHAIN_ROWS + CALL_ROWS))
    ap.add_argument("--one", metavar="ROW", choices=CHAIN_ROWS + CALL_ROWS, help="measure one row in this process")
    ap.add_argument("--json", action="store_true", help="every row in this process: one JSON line of us/act "
                    "(chain rows) and us/call (gpt plan rows)")
    a = ap.parse_args()
    if a.one:
        us = measure(a.one, a.tasks, a.iters, a.repeat)
        print("RESULT " + json.dumps({"row": a.one, "us": us}))
        return
    if a.json:
        got = {row: measure(row, a.tasks, a.iters, a.repeat) for row in a.rows}
        print(json.dumps({"tasks": a.tasks, "iters": a.iters,
                          "us_per_act": {r: us for r, us in got.items() if r in CHAIN_ROWS},
                          "us_per_call": {r: us for r, us in got.items() if r in CALL_ROWS}}))
        return
    from graph import alternate
    jobs = {row: [sys.executable, os.path.abspath(__file__), "--one", row, "--tasks", str(a.tasks),
                  "--iters", str(a.iters), "--repeat", str(a.repeat)] for row in a.rows}
    res = alternate(jobs, a.rounds, log=lambda s: print(s, flush=True), key="us")
    print(f"chain of {a.tasks} trivial tasks, {a.iters} iterations (source and sink acts not counted as tasks); "
          f"best of {a.rounds} fresh-process rounds")
    table({row: r["us"] for row, r in res.items() if "us" in r})


if __name__ == "__main__":
    main()
