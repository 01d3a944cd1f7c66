"""Pipeline schedules of nn.Graph (graph/pipeline.py), measured from the actor runtime's trace.

    python bench/pipeline.py                      # p=2 (m=4, 8) and p=4 (m=8): 1F1B, GPipe, ZB-H1
    python bench/pipeline.py --kernel matmul      # real compute instead of timed kernels
    python bench/pipeline.py --trace pipe         # also each schedule's merged Perfetto trace
    python bench/pipeline.py --world gloo --stage gpt --kernel none --gpt-d 256 --gpt-t 64 \
        --gpt-seqs 6 --configs 2:8,2:4            # GPT blocks' own compute on real Gloo ranks

Stages: ``--stage linear`` (default) is a Linear(16, 16) (parameters and gradients, so the
optimizer and the gradient accumulation run) and a synthetic kernel taking ``--ms`` in forward and
``--ms`` each for the input and the weight gradient (F = B = W, the zero-bubble paper's case).
With ``--kernel sleep`` (default) the kernel waits (no CPU), so the figures are the schedule's own
on any machine; ``--kernel matmul`` multiplies ``--d`` x ``--d`` matrices. ``--stage gpt`` is a
GPT block (examples/gpt.py) of width ``--gpt-d``, sequence ``--gpt-t``, ``--gpt-seqs`` sequences
per micro-batch; with ``--kernel none`` the block's own compute is all the stage's time (F, B and
W then differ: attention's backward is all input gradient).

Worlds: ``--world sim`` (default) runs the ranks as threads of this process (they share the GIL
and the cores: fine for sleep kernels, noisy for real compute); ``--world gloo`` launches a fresh
world of p processes (holoflow.distributed.launch, one per stage, one intra-op thread each) per
run, so every variant runs in its own process set. Each rank returns its recorded acts; their
times are perf_counter seconds, CLOCK_MONOTONIC on Linux, one time base for the processes of one
machine (as ``graph.write_trace`` assumes when it merges ranks; a negative move latency would
show clocks that are not). Variants are alternated round by round; each is its best of
``--rounds`` (other load only adds idle time).

Figures per schedule: the bubble per stage — the idle fraction of its compute lane over each
step's makespan (first forward anywhere to last backward or weight gradient anywhere), averaged
over the steps after the first (`runtime.timeline.bubble_fractions`); each stage's mean F, B and W
durations (`timeline.phase_durations`; 1F1B and GPipe run W inside B); the ideal bubble for those
durations — the schedule's dependency structure simulated event by event
(`pipeline_run.ideal_bubbles`: each stage runs the order the runtime keeps, an act starts when
its stage is free and its input has arrived), not the F = B = W formula ((p-1)/(m+p-1) for
1F1B, (p-1)/(3m+p-1) for ZB-H1, which it reproduces for equal durations); the same with the
run's median move latency (from a stage's act to the act it let start on the next stage, where
that one waited); and a replay — each step simulated with its acts' own durations and that
latency — so that what is left between replay and measured is the runtime's. Then each
schedule's worst-stage bubble against 1F1B's, measured and ideal (on one set of durations: the
run's, 1F1B running B + W as one act). Minor page faults per step of each stage's process
(``faults``; with simulated ranks the one process's, over each rank's steps): gradient-sized tensors allocated
afresh every step show up there. Memory: the most micro-batches a stage held between F
and B, the peak activation bytes it kept (ZB-H1: with the inputs of its waiting weight
gradients, printed separately). Not a timed test.

``zb-h1-mem`` is ``set_pipeline_schedule("zb-h1", memory="1f1b")``: a stage defers only the
weight gradients whose inputs fit in one micro-batch's activations, chosen by the work the plan
estimates from shapes (the deferred share of that work is printed, and its ideal also computed on
ZB-H1's durations with that share). On ``--stage gpt`` with a timed kernel the timed op's weight
gradient holds all the time but looks cheap (an elementwise op), so that row is a worst case; the
real split is measured with the blocks' own compute (``--kernel none``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, SRC)

import torch  # noqa: E402

import holoflow as flow  # noqa: E402
from holoflow.core.dispatch import apply  # noqa: E402
from holoflow.core.sbp import B  # noqa: E402
from holoflow.distributed import world  # noqa: E402
from holoflow.ops.family import binary, unary  # noqa: E402
from holoflow.graph.pipeline_run import ideal_bubbles  # noqa: E402
from holoflow.runtime.timeline import bubble_fractions, phase_durations, write_merged  # noqa: E402

KERNEL = {"kind": "sleep", "d": 512}
STAGE = {"kind": "linear"}      # --stage: "linear" (Linear(16, 16)) or "gpt" (a GPT block, d=32, T=16)
GPT = {"d": 32, "T": 16, "seqs": 2}   # --gpt-d, --gpt-t, --gpt-seqs
SCHEDULES = ("1f1b", "gpipe", "zb-h1", "zb-h1-mem")
LAST: dict = {}   # the last run's compiled plan (a launched rank closes its runtime before exiting)
PREDICT = {"on": False}   # --predict: graph.predict's step (calibrated kernels) before the first call


def _work(x: torch.Tensor, ms: float = 0.0) -> torch.Tensor:
    if x.device.type != "meta" and ms > 0:
        if KERNEL["kind"] == "sleep":
            time.sleep(ms / 1000)
        else:   # about ms of matmuls
            a = torch.ones(KERNEL["d"], KERNEL["d"])
            t_end = time.perf_counter() + ms / 1000
            while time.perf_counter() < t_end:
                a = a @ a * 1e-3
    return x.clone()


WORK = unary("bench_pipeline_work", _work)


def _scale_grad(ctx, dy):
    # backward = an input gradient and a weight gradient, each as long as the forward
    a, b = ctx.inputs
    return apply(WORK, dy * b, ms=ctx.ms), apply(WORK, (dy * a).sum(0), ms=ctx.ms)


SCALE = binary("bench_pipeline_scale", lambda a, b, ms=0.0: _work(a, ms) * b, _scale_grad, "inputs")


class Stage(flow.nn.Module):
    """A Linear(16, 16) and a synthetic op: forward ``ms``; backward ``ms`` for the input gradient
    and ``ms`` for the weight gradient (so F = B_input = W, as the zero-bubble paper assumes)."""

    def __init__(self, ms: float):
        super().__init__()
        self.fc, self.ms = flow.nn.Linear(16, 16), ms
        self.w = flow.nn.Parameter(flow.ones(16))

    def forward(self, x):
        return apply(SCALE, self.fc(x), self.w, ms=self.ms)


class GPTStage(flow.nn.Module):
    """A GPT block (examples/gpt.py: layer norms, causal attention through SDPA, MLP) and the
    timed op on its flattened output: a realistic ratio of activations to weight-gradient inputs."""

    def __init__(self, ms: float):
        super().__init__()
        from holoflow.examples import gpt
        self.block = gpt.build(flow)(17, GPT["T"], 1, GPT["d"], max(2, GPT["d"] // 64)).blocks[0]
        self.w, self.ms = flow.nn.Parameter(flow.ones(GPT["d"])), ms

    def forward(self, x):
        h = self.block(x)
        if KERNEL["kind"] == "none":   # the block's own compute only
            return h
        return apply(SCALE, h.reshape(-1, GPT["d"]), self.w, ms=self.ms).reshape(h.shape)


def run_rank(rank: int, p: int, m: int, schedule: str, ms: float, steps: int, batch: int,
             trace: str | None) -> dict:
    """This rank's share of ``steps`` training steps: its recorded acts (absolute perf_counter
    seconds), memory record and plan facts (stage, ZB-H1's delay and deferred share of W)."""
    places = [flow.placement("cpu", ranks=[s]) for s in range(p)]
    flow.manual_seed(0)
    make = GPTStage if STAGE["kind"] == "gpt" else Stage
    stages = [make(ms) for _ in range(p)]
    for st, pl in zip(stages, places):
        st.to_global(placement=pl, sbp=[B])
    seq = flow.nn.Sequential(*stages)
    opt = flow.optim.SGD(seq.parameters(), lr=0.01)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.seq = seq
            for i, pl in enumerate(places):
                self.seq[i].to(flow.nn.graph.GraphModule).set_stage(i, pl)
            self.config.set_gradient_accumulation_steps(m)
            if schedule == "zb-h1-mem":
                self.config.set_pipeline_schedule("zb-h1", memory="1f1b")
            else:
                self.config.set_pipeline_schedule(schedule)
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.seq(x).square().mean()
            loss.backward()
            return loss

    g = G()
    shape = (GPT["seqs"] * m, GPT["T"], GPT["d"]) if STAGE["kind"] == "gpt" else (batch, 16)
    x = flow.tensor(torch.randn(*shape)).to_global(placement=places[0], sbp=[B])
    predicted = None
    if PREDICT["on"]:   # before anything ran: each node's kernel timed on example inputs (a collective)
        from holoflow.graph.cost_model import DeviceModel
        q = g.predict(x, device=DeviceModel.calibrate(torch.device("cpu"), tuple(range(p))))
        predicted = {"step_s": q.step_s, "bubble_s": q.bubble_s, "memory_bytes": q.memory_bytes}
    g(x)   # compiles; its step is dropped
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    for _ in range(steps - 1):
        g(x)
    step_s = (time.perf_counter() - t0) / max(steps - 1, 1)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    c = next(iter(g._compiled.values()))
    if trace:
        g.write_trace(trace)
    LAST["compiled"] = c
    return {"acts": c.acts(), "mem": dict(c.mem), "stage": c.stage, "zb_delay": c.zb_delay,
            "zb_w_share": c.zb_w_share, "faults": faults / max(steps - 1, 1), "step_s": step_s,
            "predicted": predicted}


def _summarize(res: list[dict], p: int) -> dict:
    """Per stage (one rank each): bubble and mean F / B / W durations from the acts of the steps
    after the first (which compiles and warms up), memory, plan facts; and the smallest gap from
    a stage's forward of a micro-batch to the next stage's (the move's latency at least; negative
    would mean the ranks' clocks are not on one time base)."""
    by_stage = sorted(res, key=lambda r: r["stage"])
    acts = [a for r in by_stage for a in r["acts"] if a["step"] >= 1]
    bubbles, durs = bubble_fractions(acts), phase_durations(acts)
    hops = _waited_hops(acts)
    comp = [a for a in acts if a["lane"] == "compute" and a["phase"] in ("F", "B", "W")]
    steps = {a["step"]: {} for a in comp}
    for a in comp:   # each step's acts by (kind, stage, micro-batch): their measured durations
        steps[a["step"]][(a["phase"], a["stage"], a["mb"])] = a["end"] - a["start"]
    ranks = [r["acts"][0]["rank"] if r["acts"] else r["stage"] for r in by_stage]
    return {"bubble": [bubbles[r] for r in ranks], "dur": [durs[r] for r in ranks],
            "mem": [r["mem"] for r in by_stage], "delay": [r["zb_delay"] for r in by_stage],
            "share": [r["zb_w_share"] for r in by_stage], "faults": [r["faults"] for r in by_stage],
            "hop": statistics.median(hops) if hops else 0.0,
            "hops": hops, "acts": acts, "steps": list(steps.values()),
            "step_s": max(r["step_s"] for r in by_stage), "predicted": by_stage[0]["predicted"]}


def _waited_hops(acts: list[dict]) -> list[float]:
    """The move latency as the schedule sees it: for each compute act that waited for another
    stage (a forward for the previous stage's forward of its micro-batch, a backward for the next
    stage's backward; its stage was idle when that one ended), the time from that act's end to
    this act's start — the send and receive acts, the transfer and the wake-ups in between. A
    negative one would mean the ranks' clocks are not on one time base."""
    comp = [a for a in acts if a["lane"] == "compute" and a["phase"] in ("F", "B", "W")]
    done = {(a["phase"], a["stage"], a["step"], a["mb"]): a for a in comp}
    out = []
    for st in {a["stage"] for a in comp}:
        mine = sorted((a for a in comp if a["stage"] == st), key=lambda a: a["start"])
        for prev, a in zip(mine, mine[1:]):
            up = st - 1 if a["phase"] == "F" else st + 1 if a["phase"] == "B" else None
            dep = done.get((a["phase"], up, a["step"], a["mb"]))
            if dep is not None and dep["end"] > prev["end"]:
                out.append(a["start"] - dep["end"])
    return out


def measure_sim(p: int, m: int, schedule: str, ms: float, steps: int, batch: int, trace: str | None = None) -> dict:
    """One run on simulated ranks (threads of this process)."""
    res = world.simulate(p, lambda r: run_rank(r, p, m, schedule, ms, steps, batch, trace), timeout=600)
    return _summarize(res, p)


def measure_gloo(p: int, m: int, schedule: str, args: argparse.Namespace) -> dict:
    """One run on ``p`` Gloo ranks: a fresh world of ``p`` processes (holoflow.distributed.launch),
    one per stage, each with one intra-op thread; each rank writes its acts, the parent merges
    them (perf_counter is CLOCK_MONOTONIC on Linux: one time base for the processes of a machine)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rank")
        cmd = [sys.executable, "-m", "holoflow.distributed.launch", "--nproc_per_node", str(p), __file__,
               "--rank-run", schedule, "--configs", f"{p}:{m}", "--out", out, *_child_args(args)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join([SRC, env.get("PYTHONPATH", "")])
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"bench/pipeline.py: the Gloo world failed ({schedule}, p={p}, m={m}):\n"
                               f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        res = []
        for r in range(p):
            with open(f"{out}.{r}") as f:
                res.append(json.load(f))
    return _summarize(res, p)


def _child_args(a: argparse.Namespace) -> list[str]:
    return [*(["--predict"] if a.predict else []), "--kernel", a.kernel, "--ms", str(a.ms), "--matmul-d", str(a.d),
            "--steps", str(a.steps),
            "--stage", a.stage, "--gpt-d", str(a.gpt_d), "--gpt-t", str(a.gpt_t), "--gpt-seqs", str(a.gpt_seqs)]


def _rank_main(a: argparse.Namespace) -> None:
    """Inside a launched rank: one run, this rank's record written to ``--out``.RANK."""
    torch.set_num_threads(1)
    flow.env.init()
    rank = flow.env.get_rank()
    p, m = (int(v) for v in a.configs.split(",")[0].split(":"))
    rec = run_rank(rank, p, m, a.rank_run, a.ms, a.steps, 8 * m, None)
    with open(f"{a.out}.{rank}", "w") as f:
        json.dump(rec, f)
    from holoflow.distributed import comm
    comm.barrier()                   # both ranks done with their sends and receives
    LAST.pop("compiled").close()     # the runtime's stream threads joined before the process group goes
    flow.env.shutdown()


def ideals(schedule: str, m: int, dur: list[dict], delay: list, share: list | None = None,
           latency: float = 0.0) -> list[float]:
    """Each stage's ideal bubble of ``schedule`` for per-stage mean durations ``dur`` (dicts F, B,
    W): `pipeline_run.ideal_bubbles`, the event simulation of the order the runtime keeps
    (``latency``: added to every move between stages).
    ``share`` (capped ZB-H1 on durations measured uncapped): the part of each stage's W that
    waits; the rest runs with B."""
    if share is not None:
        dur = [{"F": d["F"], "B": d["B"] + (1 - sh) * d["W"], "W": sh * d["W"]} for d, sh in zip(dur, share)]
    sched = "zb-h1" if schedule.startswith("zb-h1") else schedule
    return ideal_bubbles(sched, m, dur, delay if sched == "zb-h1" and None not in delay else None, latency)


def _replay(schedule: str, m: int, r: dict) -> list[float]:
    """Each stage's bubble with every act taking its own measured duration (not the mean) and
    the run's median move latency, averaged over the steps: what is left between this and the
    measured bubble is the runtime's (acts not started as soon as their inputs were there)."""
    sched = "zb-h1" if schedule.startswith("zb-h1") else schedule
    delay = r["delay"] if sched == "zb-h1" and None not in r["delay"] else None
    runs = [ideal_bubbles(sched, m, r["dur"], delay, r["hop"], per_act) for per_act in r["steps"]]
    return [sum(b) / len(b) for b in zip(*runs)]


def _ms(dur: list[dict]) -> str:
    return " ".join("/".join(f"{1e3 * d[k]:.1f}" for k in "FBW") for d in dur)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", choices=["sleep", "matmul", "none"], default="sleep",
                    help="none (with --stage gpt): no timed op, the GPT block's own compute")
    ap.add_argument("--ms", type=float, default=10.0, help="forward ms per stage per micro-batch (backward 2x)")
    ap.add_argument("--d", "--matmul-d", type=int, default=256, help="matmul size for --kernel matmul")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="runs per config; the best is printed")
    ap.add_argument("--configs", default="2:4,2:8,4:8", help="p:m pairs")
    ap.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated, of " + ", ".join(SCHEDULES))
    ap.add_argument("--world", choices=["sim", "gloo"], default="sim",
                    help="sim: simulated ranks (threads of one process); gloo: one process per stage, "
                         "a fresh world per run")
    ap.add_argument("--trace", default=None)
    ap.add_argument("--stage", choices=["linear", "gpt"], default="linear",
                    help="linear: Linear(16, 16) + timed op; gpt: a GPT block (d=32, T=16) + timed op")
    ap.add_argument("--gpt-d", type=int, default=32, help="model width of the GPT block stages")
    ap.add_argument("--gpt-t", type=int, default=16, help="sequence length of the GPT block stages")
    ap.add_argument("--gpt-seqs", type=int, default=2, help="sequences per micro-batch of the GPT block stages")
    ap.add_argument("--predict", action="store_true", help="also graph.predict's step before the first call "
                    "(each node's kernel timed on example inputs), printed next to the measured step")
    ap.add_argument("--rank-run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    KERNEL.update(kind=args.kernel, d=args.d)
    STAGE.update(kind=args.stage)
    GPT.update(d=args.gpt_d, T=args.gpt_t, seqs=args.gpt_seqs)
    PREDICT.update(on=args.predict)
    if args.kernel == "none" and args.stage != "gpt":
        ap.error("--kernel none needs --stage gpt (the linear stage has no compute of its own)")
    if args.rank_run:
        _rank_main(args)
        return
    schedules = args.schedules.split(",")
    if "1f1b" not in schedules or any(s not in SCHEDULES for s in schedules):
        ap.error(f"--schedules: 1f1b (the reference) and any of {', '.join(SCHEDULES)}")
    schedules = [s for s in SCHEDULES if s in schedules]
    torch.set_num_threads(1)
    what = (f"{args.kernel} kernels, {args.ms} ms forward / {2 * args.ms} ms backward" if args.kernel != "none"
            else "the blocks' own compute")
    stage = (f"GPT blocks d={args.gpt_d} T={args.gpt_t}, {args.gpt_seqs} sequences per micro-batch"
             if args.stage == "gpt" else "Linear(16, 16) + timed op")
    where = ("Gloo ranks (one process per stage, 1 thread each, a fresh world per run)" if args.world == "gloo"
             else "simulated ranks (threads of one process)")
    print(f"pipeline bench: {stage}; {what} per stage and micro-batch; {args.steps} steps (first dropped); "
          f"{where}; variants alternated, best of {args.rounds} rounds; load average {_load()}")
    ok = True
    configs = [tuple(int(v) for v in c.split(":")) for c in args.configs.split(",")]
    for p, m in configs:
        runs: dict[str, list] = {s: [] for s in schedules}
        for _ in range(args.rounds):
            for schedule in schedules:   # alternated: load hits every variant alike
                runs[schedule].append(measure_gloo(p, m, schedule, args) if args.world == "gloo" else
                                      measure_sim(p, m, schedule, args.ms, args.steps, 8 * m))
        best = {s: min(rs, key=lambda x: max(x["bubble"])) for s, rs in runs.items()}   # load only adds idle
        print(f"\np={p} m={m}  (F/B/W: mean ms per micro-batch of each stage, from the trace; ideal: the "
              f"schedule simulated with those durations; + moves: and the run's median move latency; replay: "
              f"each step simulated with its acts' own durations and that latency, averaged)")
        w = max(18, 6 * p + 1)   # a column of p fractions
        print(f"  {'schedule':<10} {'bubble per stage':<{w}} {'ideal':<{w}} {'ideal + moves':<{w}} {'replay':<{w}}"
              f"{'F/B/W ms per stage':<28} {'move ms':<8} {'faults':<14} {'in flight':<10} peak activation bytes")
        for s, r in best.items():
            ideal = r["ideal"] = ideals(s, m, r["dur"], r["delay"])
            r["ideal_lat"] = ideals(s, m, r["dur"], r["delay"], latency=r["hop"])
            r["replay"] = _replay(s, m, r)
            flight = [mm["peak_in_flight"] for mm in r["mem"]]
            bound = [m if s == "gpipe" else min(m, p - st) for st in range(p)]
            ok &= all(f <= b for f, b in zip(flight, bound))
            print(f"  {s:<10} {_fr(r['bubble']):<{w}} {_fr(ideal):<{w}} {_fr(r['ideal_lat']):<{w}} "
                  f"{_fr(r['replay']):<{w}}{_ms(r['dur']):<28} {1e3 * r['hop']:<8.2f} {_faults(r['faults']):<14} "
                  f"{str(flight):<10} {[mm['peak_bytes'] for mm in r['mem']]}")
            if r["predicted"] is not None:
                q = r["predicted"]
                print(f"  {'':<10} step: predicted {1e3 * q['step_s']:.2f} ms (bubble {1e3 * q['bubble_s']:.2f}), "
                      f"measured {1e3 * r['step_s']:.2f} ms: {q['step_s'] / r['step_s']:.2f}x")
            if min(r["hops"], default=0.0) < 0:
                print(f"  WARNING: a stage started before its input's producer ended ({min(r['hops']):.6f} s): "
                      f"the ranks' clocks are not on one time base")
        ref = best["1f1b"]
        for s in ("gpipe", "zb-h1", "zb-h1-mem"):
            if s not in best:
                continue
            r = best[s]
            measured = max(r["bubble"]) / max(ref["bubble"])
            # the ideal ratio on one set of durations: this run's F, B, W (1F1B runs B + W as one
            # act); for the capped ZB-H1 also on ZB-H1's durations with the plan's deferred share
            own = max(r["ideal"]) / max(ideals("1f1b", m, r["dur"], r["delay"]))
            lat = max(r["ideal_lat"]) / max(ideals("1f1b", m, r["dur"], r["delay"], latency=r["hop"]))
            line = (f"  {s} / 1F1B worst bubble: measured {measured:.2f}x, ideal for its F/B/W {own:.2f}x "
                    f"(+ moves {lat:.2f}x)")
            if s == "zb-h1":
                line += f" (F = B = W formula (m+p-1)/(3m+p-1) = {(m + p - 1) / (3 * m + p - 1):.2f}x)"
            if s == "zb-h1-mem" and "zb-h1" in best:
                z = best["zb-h1"]
                capped = (max(ideals(s, m, z["dur"], r["delay"], r["share"]))
                          / max(ideals("1f1b", m, z["dur"], z["delay"])))
                line += (f", on ZB-H1's F/B/W with the plan's deferred share of W "
                         f"{' '.join(f'{sh:.3f}' for sh in r['share'])}: {capped:.2f}x")
            if s.startswith("zb-h1"):
                wb = [mm["peak_w_bytes"] for mm in r["mem"]]
                peak = max(mm["peak_bytes"] for mm in r["mem"]) / max(mm["peak_bytes"] for mm in ref["mem"])
                line += f"; peak bytes {peak:.2f}x 1F1B's, of which waiting W inputs {wb}"
            print(line)
        if args.trace:   # each schedule's best run of this config, one merged trace of its ranks
            for s, r in best.items():
                write_merged(f"{args.trace}.p{p}m{m}.{s}.json", r["acts"])
    if args.trace:
        print(f"traces written to {args.trace}.p<p>m<m>.<schedule>.json: open them at https://ui.perfetto.dev")
    print(f"load average after: {_load()}")
    print("in-flight bounds kept (1F1B, ZB-H1: p - stage; GPipe: m)" if ok else "SOME IN-FLIGHT BOUNDS EXCEEDED")


def _faults(xs: list[float]) -> str:
    return " ".join(f"{x:.0f}" for x in xs)


def _fr(xs: list[float]) -> str:
    return " ".join(f"{x:.3f}" for x in xs)


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


if __name__ == "__main__":
    main()
