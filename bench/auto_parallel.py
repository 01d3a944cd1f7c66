"""Auto-parallel's cost model against measurement, on 2 launched Gloo ranks.

    python bench/auto_parallel.py [--rounds 5] [--steps 8] [--cases wide narrow]
    python bench/auto_parallel.py --pipeline    # the micro-batch count of 2 pipeline stages

Each case is an MLP (d=256 -> hidden -> d, GELU, squared loss, SGD with momentum) trained as an
nn.Graph of global tensors in three layouts of its parameters: ``dp`` (all broadcast, the batch
split: data parallel), ``tp`` (the first weight split by rows, the second by columns: Megatron's
MLP) and ``auto`` (``config.enable_auto_parallel(calibrate=True)``: the planner measures the
device and the links, then chooses). For every layout the table gives the cost model's predicted
step (``graph/cost_model.predict`` with the calibrated figures, on the compiled graph) next to
the measured one, and says which layout auto chose and whether it is the fastest measured.

All layouts are built in one launched world and measured in alternating blocks of ``--steps``
steps (ranks aligned by a barrier before each block), ``--rounds`` times; a layout's figure is
its best block, a block lasting until its slowest rank ends it. Not a timed test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

D = 256
CASES = {"wide": (8192, 8), "middle": (2048, 64), "narrow": (256, 2048)}   # hidden, global batch
LAYOUTS = ("dp", "tp", "auto")


def _graph(flow, hidden: int, batch: int, layout: str, profile: bool = False):
    from holoflow.core.sbp import B, S
    from holoflow.graph.graph import Graph
    P = flow.placement("cpu", ranks=[0, 1])
    flow.manual_seed(0)
    m = flow.nn.Sequential(flow.nn.Linear(D, hidden), flow.nn.GELU(), flow.nn.Linear(hidden, D))
    m.to_global(placement=P, sbp=[B])
    if layout == "tp":
        for p, nd in ((m[0].weight, S(0)), (m[0].bias, S(0)), (m[2].weight, S(1))):
            moved = p.detach().to_global(sbp=[nd])
            p._data, p._global = moved._data, moved._global
    opt = flow.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    rng = np.random.default_rng(0)
    x = flow.tensor(rng.standard_normal((batch, D)).astype(np.float32)).to_global(placement=P, sbp=[B])
    x = x.to_global(sbp=[S(0)])

    class Train(Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            if layout == "auto":
                self.config.enable_auto_parallel(calibrate=True)
            self.config.enable_profiling(profile)

        def build(self, x):
            loss = self.m(x).square().mean()
            loss.backward()
            return loss
    return Train(), x, m, opt


def child(cases: list[str], steps: int, rounds: int, out: str, profile: bool = False) -> None:
    import holoflow as flow
    from holoflow.distributed import world
    from holoflow.distributed.comm import barrier
    from holoflow.distributed.sharding import nd_str
    from holoflow.graph import auto_parallel, cost_model
    rank = world.rank()
    result = {}
    for case in cases:
        hidden, batch = CASES[case]
        built = {k: _graph(flow, hidden, batch, k, profile) for k in ("auto", "dp", "tp")}   # auto calibrates first
        plan = None
        for k, (g, x, _, _) in built.items():
            g(x)
            if k == "auto":
                plan = g.auto_parallel_plan()
        pred, pred_text = {}, {}
        for k, (g, _, m, opt) in built.items():
            c = next(iter(g._compiled.values()))
            q = cost_model.predict(c.logical, list(m.parameters()), auto_parallel.state_per_param([opt]),
                                   plan.device)
            pred[k] = q.step_s * 1e3
            pred_text[k] = str(q)
        best = {k: float("inf") for k in built}
        for r in range(rounds):
            for k in (LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]):
                g, x, _, _ = built[k]
                barrier((0, 1))
                t0 = time.perf_counter()
                for _ in range(steps):
                    g(x)
                barrier((0, 1))
                best[k] = min(best[k], (time.perf_counter() - t0) / steps * 1e3)
        result[case] = {"predicted": pred, "measured": best, "plan": str(plan), "why": pred_text,
                        "chose": {n: nd_str(a) for n, (b, a) in plan.choices.items()},
                        "profiles": {k: g.profile_table() for k, (g, _, _, _) in built.items()} if profile else {}}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


PIPE_COUNTS = (1, 2, 4, 8)   # micro-batch counts set by hand beside the planner's ("auto")
PIPE_CASES = {"small": (1024, 64), "large": (4096, 256)}   # hidden, batch


def _pipeline(flow, m: int | None, hidden: int, batch: int):
    """Two stages (rank 0, rank 1) of two Linear-GELU layers each (d -> hidden -> d), squared loss,
    SGD with momentum; ``m`` micro-batches set by hand, or None: auto-parallel chooses them
    (calibrated), with 1F1B set by hand either way."""
    from holoflow.core.sbp import B
    from holoflow.graph.graph import Graph
    places = [flow.placement("cpu", ranks=[r]) for r in (0, 1)]
    flow.manual_seed(0)
    stages = [flow.nn.Sequential(flow.nn.Linear(D, hidden), flow.nn.GELU(), flow.nn.Linear(hidden, D), flow.nn.GELU())
              for _ in places]
    for s, place in zip(stages, places):
        s.to_global(placement=place, sbp=[B])
    opt = flow.optim.SGD([p for s in stages for p in s.parameters()], lr=1e-3, momentum=0.9)
    rng = np.random.default_rng(0)
    x = flow.tensor(rng.standard_normal((batch, D)).astype(np.float32)).to_global(placement=places[0], sbp=[B])

    class Pipe(Graph):
        def __init__(self):
            super().__init__()
            self.s0, self.s1 = stages
            self.s0.to(flow.nn.graph.GraphModule).set_stage(0, places[0])
            self.s1.to(flow.nn.graph.GraphModule).set_stage(1, places[1])
            self.config.set_pipeline_schedule("1f1b")
            if m is None:
                self.config.enable_auto_parallel(calibrate=True)
            else:
                self.config.set_gradient_accumulation_steps(m)
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.s1(self.s0(x).to_global(placement=places[1])).square().mean()
            loss.backward()
            return loss
    return Pipe(), x


def _stack(flow, cut: int, auto: bool, hidden: int = 2048, batch: int = 128, blocks: int = 4):
    """A stem, ``blocks`` residual MLP blocks (d -> hidden -> d) and a head on 2 stages, the blocks
    before ``cut`` on the first (each block staged on its own), 4 micro-batches, 1F1B; ``auto``:
    auto-parallel (calibrated) may move the cut (``enable_auto_parallel_stage_cuts``)."""
    from holoflow.core.sbp import B
    from holoflow.graph.graph import Graph
    places = [flow.placement("cpu", ranks=[r]) for r in (0, 1)]

    class Block(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.proj = flow.nn.Linear(D, hidden), flow.nn.Linear(hidden, D)

        def forward(self, x):
            return x + self.proj(flow.nn.functional.gelu(self.fc(x)))
    flow.manual_seed(0)
    stem, head = flow.nn.Linear(D, D), flow.nn.Linear(D, 1)
    stack = flow.nn.Sequential(*[Block() for _ in range(blocks)])
    on = [0 if i < cut else 1 for i in range(blocks)]
    stem.to_global(placement=places[0], sbp=[B])
    head.to_global(placement=places[1], sbp=[B])
    for b, s in zip(stack, on):
        b.to_global(placement=places[s], sbp=[B])
    opt = flow.optim.SGD([*stem.parameters(), *stack.parameters(), *head.parameters()], lr=1e-3, momentum=0.9)
    rng = np.random.default_rng(0)
    x = flow.tensor(rng.standard_normal((batch, D)).astype(np.float32)).to_global(placement=places[0], sbp=[B])

    class Pipe(Graph):
        def __init__(self):
            super().__init__()
            self.stem, self.stack, self.head = stem, stack, head
            self.stem.to(flow.nn.graph.GraphModule).set_stage(0, places[0])
            self.head.to(flow.nn.graph.GraphModule).set_stage(1, places[1])
            for b, s in zip(self.stack, on):
                b.to(flow.nn.graph.GraphModule).set_stage(s, places[s])
            self.config.set_pipeline_schedule("1f1b")
            self.config.set_gradient_accumulation_steps(4)
            if auto:
                self.config.enable_auto_parallel(calibrate=True)
                self.config.enable_auto_parallel_stage_cuts()
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.head(self.stack(self.stem(x))).square().mean()
            loss.backward()
            return loss
    return Pipe(), x


def _timed(built: dict, steps: int, rounds: int) -> dict:
    """Each graph's best block of ``steps`` steps (ms), blocks alternating, ranks aligned."""
    from holoflow.distributed.comm import barrier
    best = {k: float("inf") for k in built}
    for h, y in built.values():   # (compiled before timing)
        h(y)
    for r in range(rounds):
        for k in (list(built) if r % 2 == 0 else list(built)[::-1]):
            h, y = built[k]
            barrier((0, 1))
            t0 = time.perf_counter()
            for _ in range(steps):
                h(y)
            barrier((0, 1))
            best[k] = min(best[k], (time.perf_counter() - t0) / steps * 1e3)
    return best


def child_pipeline(steps: int, rounds: int, out: str) -> None:
    """Predicted (the planner's calibrated figures) against measured steps of the micro-batch
    counts set by hand and of the count auto-parallel chose, per case of ``PIPE_CASES``."""
    import holoflow as flow
    from holoflow.distributed import world
    result = {}
    for case, (hidden, batch) in PIPE_CASES.items():
        built = {"auto": _pipeline(flow, None, hidden, batch)}
        g, x = built["auto"]
        g(x)
        plan = g.auto_parallel_plan()
        built.update({str(k): _pipeline(flow, k, hidden, batch) for k in PIPE_COUNTS})
        pred = {k: h.predict(y, device=plan.device, link=plan.link).step_s * 1e3 for k, (h, y) in built.items()}
        best = _timed(built, steps, rounds)
        result[case] = {"predicted": pred, "measured": best, "plan": str(plan),
                        "chose": plan.choices.get("micro-batches", (1, 1))[1]}
    built = {"user 1 | 3": _stack(flow, 1, False), "auto": _stack(flow, 1, True)}
    built["auto"][0](built["auto"][1])
    plan = built["auto"][0].auto_parallel_plan()
    result["cuts"] = {"predicted": {k: h.predict(y, device=plan.device, link=plan.link).step_s * 1e3
                                    for k, (h, y) in built.items()},
                      "measured": _timed(built, steps, rounds), "plan": str(plan),
                      "chose": str(plan.choices["stage cuts"][1])}
    with open(f"{out}.{world.rank()}", "w") as f:
        json.dump(result, f)


def _on_two_ranks(args: list[str]) -> dict:
    """This script's ``--child`` with ``args`` on 2 Gloo ranks; rank 0's result."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [sys.executable, "-m", "holoflow.distributed.launch", "--nproc_per_node", "2", __file__, "--child",
               *args, "--out", out]
        subprocess.run(cmd, check=True, timeout=1800)
        with open(f"{out}.0") as f:
            return json.load(f)


def main_pipeline(a) -> None:
    t0 = time.perf_counter()
    res = _on_two_ranks(["--pipeline", "--steps", str(a.steps), "--rounds", str(a.rounds)])
    print(f"auto-parallel micro-batches: predicted vs measured step (ms), 2 Gloo ranks as 2 stages (1F1B), "
          f"d={D}, best of {a.rounds} blocks of {a.steps} steps ({time.perf_counter() - t0:.0f} s)")
    print(f"{'case':<6} {'hidden':>6} {'batch':>6}  " + "  ".join(f"{'m=' + str(k):>15}" for k in PIPE_COUNTS)
          + "  auto chose (pred / meas)")
    cuts = res.pop("cuts")
    for case, r in res.items():
        hidden, batch = PIPE_CASES[case]
        cells = "  ".join(f"{r['predicted'][str(k)]:>7.2f}/{r['measured'][str(k)]:<7.2f}" for k in PIPE_COUNTS)
        print(f"{case:<6} {hidden:>6} {batch:>6}  {cells}  m={r['chose']} "
              f"({r['predicted']['auto']:.2f} / {r['measured']['auto']:.2f})")
    print(f"\nstage cuts: a stem, 4 residual MLP blocks (hidden 2048) and a head, batch 128, 4 micro-batches; "
          f"the user's cuts 1 | 3, auto chose {cuts['chose']}")
    for k in cuts["measured"]:
        print(f"  {k:<12} predicted {cuts['predicted'][k]:>8.2f}  measured {cuts['measured'][k]:>8.2f}")
    for case, r in res.items():
        print(f"\n{case}: {r['plan']}")
    print(f"\ncuts: {cuts['plan']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", choices=tuple(CASES), default=list(CASES))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="also time every node (slower steps) and print "
                    "each layout's per-op table of rank 0")
    ap.add_argument("--pipeline", action="store_true", help="instead: 2 pipeline stages, the micro-batch "
                    "counts by hand against the one auto-parallel chose")
    ap.add_argument("--child", action="store_true", help="(inside a launched rank)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.child and a.pipeline:
        child_pipeline(a.steps, a.rounds, a.out)
        return
    if a.child:
        child(a.cases, a.steps, a.rounds, a.out, a.profile)
        return
    if a.pipeline:
        main_pipeline(a)
        return
    t0 = time.perf_counter()
    res = _on_two_ranks(["--cases", *a.cases, "--steps", str(a.steps), "--rounds", str(a.rounds)]
                        + (["--profile"] if a.profile else []))
    print(f"auto-parallel: predicted vs measured step (ms), 2 Gloo ranks, MLP d={D}, best of {a.rounds} "
          f"blocks of {a.steps} steps ({time.perf_counter() - t0:.0f} s)")
    print(f"{'case':<8} {'hidden':>6} {'batch':>6}  " + "  ".join(f"{k + ' pred':>9} {k + ' meas':>9}" for k in LAYOUTS)
          + "  fastest measured  auto chose (W1 b1 W2 b2)")
    for case, r in res.items():
        hidden, batch = CASES[case]
        fastest = min(("dp", "tp"), key=lambda k: r["measured"][k])
        kind = " ".join(f"{v}" for v in r["chose"].values())
        cells = "  ".join(f"{r['predicted'][k]:>9.3f} {r['measured'][k]:>9.3f}" for k in LAYOUTS)
        print(f"{case:<8} {hidden:>6} {batch:>6}  {cells}  {fastest:<16}  {kind}")
    for case, r in res.items():
        print(f"\n{case}: {r['plan']}")
        for k, text in r["why"].items():
            print(f"  predicted {k:<4}: {text}")
        for k, table in r["profiles"].items():
            print(f"\n{case}, {k} (rank 0, every node timed):\n{table}")


if __name__ == "__main__":
    main()
