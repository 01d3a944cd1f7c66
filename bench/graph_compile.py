"""nn.Graph with ``config.enable_compile()`` (each task's generated function through
Inductor, graph/compile_tasks.py) vs the plain nn.Graph, torch eager and torch.compile, on the CPU
training steps of bench/graph.py (GPT-mini, the small CNN), each variant in its own fresh process,
alternated round by round, best of rounds.

    flock /tmp/bench.lock python bench/graph_compile.py [--rounds 3] [--steps 20] [--cases gpt cnn]
    python bench/graph_compile.py --one cnn graph-compile      # one variant here: a JSON line

Variants: ``graph`` (nn.Graph, actor runtime, as lowered today), ``graph-compile`` (the same with
``config.enable_compile()``), ``graph-fused`` and ``graph-compile-fused`` (those two plus OneFlow's
fusion switches ``allow_fuse_model_update_ops`` and ``allow_fuse_add_to_output``: the optimizer
update as one fused kernel, torch's ``_fused_adamw_`` on the CPU too), ``torch-eager``,
``torch-compile`` (bench/graph.py's). ``first_s`` is
the first call: trace, passes, lowering and, compiled, the Inductor compilation of every task.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import graph as base  # noqa: E402  (bench/graph.py: the cases, timing, alternation)

VARIANTS = ("graph", "graph-compile", "graph-fused", "graph-compile-fused", "torch-eager", "torch-compile")


def one(case: str, variant: str, steps: int, repeat: int) -> dict:
    if variant.startswith("torch"):
        return base.one(case, variant, steps, repeat)
    import holoflow as flow
    m, opt, batch, loss_fn = {"gpt": base.gpt_case, "cnn": base.cnn_case}[case](flow)

    g = base.train_graph(m, opt, loss_fn)
    g.config.enable_compile("compile" in variant)
    if variant.endswith("fused"):
        g.config.allow_fuse_model_update_ops(True)
        g.config.allow_fuse_add_to_output(True)
    t0 = time.perf_counter()
    g(*batch)
    r: dict = {"case": case, "variant": variant, "first_s": time.perf_counter() - t0}
    c = next(iter(g._compiled.values()))
    r["tasks"] = {s.name: getattr(c.lowered.compiled.get(s.name), "state", "plain") for s in c.lowered.plan.tasks}
    r["ms"] = base.timeit(lambda: g(*batch), steps, repeat) * 1e3
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=2, metavar=("CASE", "VARIANT"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", nargs="+", choices=list(base.CASES), default=list(base.CASES))
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one(*a.one, a.steps, a.repeat)))
        return
    me = os.path.abspath(__file__)
    for case in a.cases:
        jobs = {v: [sys.executable, me, "--one", case, v, "--steps", str(a.steps), "--repeat", str(a.repeat)]
                for v in a.variants}
        res = base.alternate(jobs, a.rounds)
        ms = {v: r["ms"] for v, r in res.items() if "ms" in r}
        print(f"== {base.CASES[case]} (best of {a.rounds} rounds, fresh process each)")
        for v, r in res.items():
            if "ms" in r:
                extra = f"  first call {r['first_s']:.1f} s" if "first_s" in r else ""
                print(f"  {v:<14} {r['ms']:8.2f} ms/step{extra}  {r.get('tasks', '')}")
        for a_, b_, target in (("graph-compile", "torch-compile", "target <= 1.0 on the CNN"),
                               ("graph-compile", "torch-eager", "target <= 0.6 on GPT-mini"),
                               ("graph-compile-fused", "torch-compile", "with OneFlow's fusion switches"),
                               ("graph-compile-fused", "torch-eager", "with OneFlow's fusion switches"),
                               ("graph-fused", "torch-eager", "fusion switches, no Inductor"),
                               ("graph-compile", "graph", "what compiling the tasks buys")):
            if a_ in ms and b_ in ms:
                print(f"  {a_} / {b_} = {ms[a_] / ms[b_]:.3f}  ({target})")


if __name__ == "__main__":
    main()
