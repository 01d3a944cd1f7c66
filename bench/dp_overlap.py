"""Data parallelism on 2 Gloo ranks against its no-communication limit: torch DDP, holoflow eager
DDP and a holoflow nn.Graph of global tensors (bucketed all-reduces issued as backward produces
them, waited for just before the update).

    python bench/dp_overlap.py                 # each framework's limit and DP, paired in one world
    python bench/dp_overlap.py --separate      # every variant in its own launched world
    python bench/dp_overlap.py --only flow-graph-limit flow-graph-dp --bucket-mb 1
    python bench/dp_overlap.py --explain       # the graph's boxing nodes: predicted vs measured time
    python bench/dp_overlap.py --allreduce     # one gradient bucket's all-reduce: Gloo vs holoflow's transport
    python bench/dp_overlap.py --zero3         # ZeRO-3 graph: all-gathers issued one ahead vs where they stand

GPT of holoflow.examples.gpt (4 layers, d=128, seq 64, global batch 32: 16 per rank), AdamW.
For each framework, ``limit`` is the same 2 processes each training its half batch with no
synchronisation, and ``dp`` the synchronised run; the figure is limit / dp step time (1.0 =
communication fully hidden).

Paired (default): one launched world per framework builds both models and alternates blocks of
``--steps`` limit steps and ``--steps`` DP steps (ranks aligned by a barrier before each block),
``--rounds`` times; each variant's figure is its best block, a block lasting until its slowest
rank ends it (the world has trained the global batch only then; without synchronisation the
ranks of a limit block drift apart by their own speeds, which on a shared host differ by a few
percent from launch to launch). Load from other processes then hits
both variants alike, which separate launches (``--separate``: one launch per variant, best of
``--rounds``) cannot promise on a shared machine.

Buckets: on a host whose cores all run the ranks' compute (2 ranks of one intra-op thread on 2
cores) the graph's gradients go in ``--bucket-mb`` buckets with no small first/last one
(passes/bucket_grads.spare_core: Gloo reduces on the CPU, so overlap has no core to run on and
each extra collective costs CPU); ``HOLOFLOW_DP_OVERLAP=1`` forces DDP's overlapping buckets, to
compare. torchrun (the launcher) sets one intra-op thread per rank.

All-reduces between the ranks of one host go through shared memory (distributed/shm_comm.py:
0.4-0.8 ms for the 3.3 MB bucket against Gloo's 2-6 ms on the 2-core box); holoflow's variants
use it, torch DDP uses Gloo. ``HOLOFLOW_SHM_ALLREDUCE=0`` puts holoflow on Gloo too, to compare;
the last line says which transport holoflow's all-reduces took.

``--zero3``: parameters, gradients and optimizer state sharded (ZeRO-3), each against the same
limit: torch FSDP2 (``fully_shard`` on each block, then the model: a block's parameters gathered
together, the next block's prefetched) and holoflow's ZeRO-3 global graph (parameters kept as row
shards, a block's gathered in one collective one block ahead in forward and again in backward,
gradients reduce-scattered in buckets), and, for comparison, that graph with
``config.gather_ahead = False`` (each parameter gathered alone where it stands), and holoflow's
eager ``fully_shard`` (torch's FSDP2 API: the next block's all-gather issued when a block's
forward or backward begins, its reduce-scatter left running while the next block's backward
computes) and, for comparison, the same with empty prefetch lists (each gather where it is used).

``--explain``: the DP graph profiled (every node timed), the links calibrated
(graph/global_graph.calibrate), and each boxing node's predicted time from the cost model next
to its measured time per step: the caller's time in it (for a collective issued and waited for
later, the issue plus the wait: what the compute in between did not hide). A measured collective
also waits for the slower rank. Not a timed test.
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

VARIANTS = ["torch-limit", "torch-ddp", "flow-eager-limit", "flow-eager-ddp", "flow-graph-limit", "flow-graph-dp",
            "torch-fsdp", "flow-graph-zero3", "flow-graph-zero3-inplace", "flow-eager-fsdp",
            "flow-eager-fsdp-noprefetch"]
PAIRS = (("torch DDP", "torch-limit", "torch-ddp"), ("holoflow eager", "flow-eager-limit", "flow-eager-ddp"),
         ("holoflow graph", "flow-graph-limit", "flow-graph-dp"))
ZERO3_PAIRS = (("torch FSDP", "torch-limit", "torch-fsdp"), ("holoflow ZeRO-3", "flow-graph-limit", "flow-graph-zero3"),
               ("holoflow, in place", "flow-graph-limit", "flow-graph-zero3-inplace"),
               ("holoflow eager FSDP2", "flow-eager-limit", "flow-eager-fsdp"),
               ("eager, no prefetch", "flow-eager-limit", "flow-eager-fsdp-noprefetch"))


def _cfg(gpt):
    return gpt.Config(n_layer=4, n_embd=128, n_head=4, block_size=64, batch_size=16)


def _batch(corpus, cfg, rank: int, step: int):
    data = corpus.encode(corpus.load_text(200_000))
    rng = np.random.default_rng(1000 * step + rank)
    return corpus.get_batch(data, cfg.block_size, cfg.batch_size, rng)


def make_step(variant: str, cfg, bucket_mb: float = 25.0, profile: bool = False):
    """``step(xb, yb)``: one training step of ``variant`` on this launched rank."""
    import torch
    from holoflow.examples import gpt
    if variant.startswith("torch"):
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = gpt.make_model(torch, cfg)
        if variant == "torch-ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        if variant == "torch-fsdp":   # FSDP2: each block a unit (its parameters gathered together), then the rest
            from torch.distributed.fsdp import fully_shard
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(xb, yb):
            _, loss = model(torch.from_numpy(xb), torch.from_numpy(yb))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step
    import holoflow as flow
    from holoflow.core.sbp import B, S
    flow.env.init()
    flow.manual_seed(0)
    model = gpt.make_model(flow, cfg)
    if variant == "flow-eager-ddp":
        model = flow.nn.parallel.DistributedDataParallel(model)
    if variant.startswith("flow-eager-fsdp"):   # holoflow's FSDP2, as torch-fsdp: each block a unit, then the rest
        from holoflow.dtensor.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        if variant == "flow-eager-fsdp-noprefetch":   # each gather where it is used
            for unit in [*model.blocks, model]:
                unit.set_modules_to_forward_prefetch([])
                unit.set_modules_to_backward_prefetch([])
    place = flow.placement("cpu", [0, 1])
    dp = variant.startswith(("flow-graph-dp", "flow-graph-zero3"))
    if dp:
        model.to_global(place, B)
    opt = flow.optim.AdamW(model.parameters(), lr=1e-3)
    if not variant.startswith("flow-graph"):
        def step(xb, yb):
            _, loss = model(flow.from_numpy(xb), flow.from_numpy(yb))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            self.config.set_allreduce_bucket_mb(bucket_mb)
            self.config.enable_profiling(profile)
            # the same computation in both: a global graph keeps its traced values (no pointwise
            # recomputation, graph/passes/recompute.py), so the limit's graph keeps them too
            self.config.recompute_pointwise = False
            if variant.startswith("flow-graph-zero3"):   # parameters kept as row shards, gathered per use
                self.config.enable_zero(True, stage=3)
                self.config.gather_ahead = variant == "flow-graph-zero3"

        def build(self, x, y):
            if dp:
                with flow.utils.global_view.global_mode(True, placement=place, sbp=B):
                    _, loss = self.model(x, y)
            else:
                _, loss = self.model(x, y)
            loss.backward()
            return loss
    graph = Train()

    def step(xb, yb):
        x, y = flow.from_numpy(xb), flow.from_numpy(yb)
        if dp:   # each rank's half batch is its shard of the global batch
            x, y = x.to_global(place, S(0), check_meta=False), y.to_global(place, S(0), check_meta=False)
        graph(x, y)
    step.graph = graph
    return step


def run_variant(variant: str, steps: int, warmup: int, bucket_mb: float = 25.0) -> dict:
    """One launched rank's mean step time (s) after warm-up."""
    from holoflow.examples import corpus, gpt
    cfg = _cfg(gpt)
    rank = int(os.environ.get("RANK", "0"))
    batches = [_batch(corpus, cfg, rank, s) for s in range(warmup + steps)]
    step = make_step(variant, cfg, bucket_mb)
    for xb, yb in batches[:warmup]:
        step(xb, yb)
    _barrier(variant)
    t0 = time.perf_counter()
    for xb, yb in batches[warmup:]:
        step(xb, yb)
    return {variant: (time.perf_counter() - t0) / steps}


def run_explain(steps: int, warmup: int, bucket_mb: float) -> dict:
    """The DP graph's boxing nodes, predicted (calibrated cost model) and measured ms per step."""
    from holoflow.examples import corpus, gpt
    from holoflow.graph.global_graph import (GLOBAL_BOX, GLOBAL_BOX_BUCKET, GLOBAL_BOX_ISSUE, GLOBAL_BOX_WAIT,
                                             boxing_points, calibrate)
    cfg = _cfg(gpt)
    rank = int(os.environ.get("RANK", "0"))
    batches = [_batch(corpus, cfg, rank, s) for s in range(warmup + steps)]
    step = make_step("flow-graph-dp", cfg, bucket_mb, profile=True)
    for xb, yb in batches:
        step(xb, yb)
    c = next(reversed(step.graph._compiled.values()))
    kinds = (GLOBAL_BOX.name, GLOBAL_BOX_BUCKET.name)
    logical = [n for n in c.logical.nodes if n.op in kinds]
    # a collective runs as one node, or as an issue and a wait (graph/global_graph.issue_collectives):
    # its measured time is the issue's plus the wait's (the part the caller waited)
    ran, waits = [], {}
    for n, s in zip(c.program.nodes, c.program.prof):
        if n.op == GLOBAL_BOX_ISSUE.name:
            waits[n.outputs[0]] = len(ran)
        if n.op in (*kinds, GLOBAL_BOX_ISSUE.name):
            ran.append(s)
        elif n.op == GLOBAL_BOX_WAIT.name:
            ran[waits[n.inputs[0]]] += s
    waited = sum(s for n, s in zip(c.program.nodes, c.program.prof) if n.op == GLOBAL_BOX_WAIT.name)
    link = calibrate(logical[0].attrs["place"])
    rows = []
    for n, s in zip(logical, ran):
        pts = boxing_points(type("One", (), {"nodes": [n]})())
        rows.append((n.source, "+".join(dict.fromkeys(st.kind for p in pts for st in p.steps)) or "local",
                     len(pts), sum(p.comm_bytes for p in pts), sum(link.seconds(p) for p in pts),
                     s / max(c.iterations, 1)))
    return {"link": str(link), "rows": rows, "tasks": [f"{t.name}({len(t.nodes)})" for t in c.program.tasks],
            "timeline": _timeline(c.executor.timeline.acts(), range(warmup, warmup + steps)),
            "waited": 1e3 * waited / max(c.iterations, 1)}


def _timeline(acts: list, iterations: range) -> dict:
    """Per step (mean over ``iterations``, ms): wall time from the first act to the last, the time
    the caller thread spent in acts (compute and update tasks, waits for collectives included), and
    the caller's idle time between acts."""
    walls, busy = [], []
    for i in iterations:
        mine = [a for a in acts if a.iteration == i and a.stream not in ("source",)]
        if not mine:
            continue
        walls.append(max(a.end for a in mine) - min(a.start for a in mine))
        busy.append(sum(a.end - a.start for a in mine))
    mean = lambda xs: 1e3 * sum(xs) / max(len(xs), 1)   # noqa: E731
    return {"wall": mean(walls), "compute": mean(busy), "idle": mean(walls) - mean(busy)}


def _barrier(variant: str) -> None:
    if variant.startswith("torch"):
        import torch.distributed as dist
        dist.barrier()
    else:
        from holoflow.distributed import comm
        comm.barrier()


def run_pair(limit: str, dp: str, steps: int, warmup: int, rounds: int, bucket_mb: float = 25.0) -> dict:
    """Both variants in this world, alternating blocks of ``steps`` steps; each one's best block mean."""
    from holoflow.examples import corpus, gpt
    cfg = _cfg(gpt)
    rank = int(os.environ.get("RANK", "0"))
    batches = [_batch(corpus, cfg, rank, s) for s in range(warmup + steps)]
    fns = {v: make_step(v, cfg, bucket_mb) for v in (limit, dp)}
    blocks: dict = {v: [] for v in fns}
    for step in fns.values():
        for xb, yb in batches[:warmup]:
            step(xb, yb)
    for _ in range(rounds):
        for v, step in fns.items():
            _barrier(dp)
            t0 = time.perf_counter()
            for xb, yb in batches[warmup:]:
                step(xb, yb)
            blocks[v].append((time.perf_counter() - t0) / steps)
    out: dict = {"blocks": blocks}
    if not dp.startswith("torch"):
        from holoflow.distributed import shm_comm
        out["transport"] = "shared memory" if any(t for _, t in shm_comm._TRANSPORTS.values()) else "gloo"
    return out


def world_best(per_rank: list[dict]) -> dict:
    """Each variant's best block over the rounds, a block lasting until its slowest rank ends it:
    the world has trained its global batch only then (a DP block's ranks end together anyway; the
    ranks of a limit block drift apart by their own speeds)."""
    variants = per_rank[0]["blocks"]
    world = {v: [max(r["blocks"][v][i] for r in per_rank) for i in range(len(variants[v]))] for v in variants}
    best = {v: min(ts) for v, ts in world.items()}
    lim, dp = variants   # the pair, limit first: the median over rounds of each round's adjacent blocks' ratio
    best["round_ratio"] = float(np.median([a / b for a, b in zip(world[lim], world[dp])]))
    if "transport" in per_rank[0]:
        best["transport"] = per_rank[0]["transport"]
    return best


def run_allreduce(mb: float, reps: int, rounds: int) -> dict:
    """Milliseconds per all-reduce of ``mb`` MB of float32 on this world: torch.distributed on Gloo
    and holoflow's comm.all_reduce (shared memory between ranks of one host), alternating blocks of
    ``reps``; per transport the median and the minimum over all blocks."""
    import torch
    import torch.distributed as dist
    from holoflow.distributed import comm, comm_track, env, shm_comm
    env.init()
    x = torch.randn(int(mb * 1e6 / 4))
    ref = x.clone()
    dist.all_reduce(ref)
    got = comm.all_reduce(x.clone())
    assert torch.equal(ref, got)

    def flow_ar(t):
        with comm_track.planned():   # as inside a compiled graph: no per-call fingerprint exchange
            comm.all_reduce(t)
    times: dict = {"gloo": [], "holoflow": []}
    for _ in range(rounds):
        for name, fn in (("gloo", dist.all_reduce), ("holoflow", flow_ar)):
            dist.barrier()
            for _ in range(reps):
                t = x.clone()
                t0 = time.perf_counter()
                fn(t)
                times[name].append(time.perf_counter() - t0)
    out = {k: (float(np.median(v)), min(v)) for k, v in times.items()}
    out["transport"] = "shared memory" if any(t for _, t in shm_comm._TRANSPORTS.values()) else "gloo"
    return out


def launch(args: list[str]) -> list[dict]:
    """Runs this script on 2 launched ranks; every rank's result, in rank order."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "t.json")
        cmd = [sys.executable, "-m", "holoflow.distributed.launch", "--nproc_per_node", "2", __file__,
               *args, "--out", out]
        subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
        got = []
        for r in range(2):
            with open(f"{out}.{r}") as f:
                got.append(json.load(f))
        return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", choices=VARIANTS, help="(inside a launched rank) run this variant")
    ap.add_argument("--pair", nargs=2, choices=VARIANTS, help="(inside a launched rank) run this pair")
    ap.add_argument("--separate", action="store_true", help="one launch per variant, not paired")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="the graph's gradient bucket size")
    ap.add_argument("--only", nargs="+", choices=VARIANTS, help="run these variants only")
    ap.add_argument("--explain", action="store_true", help="the graph's boxing nodes: predicted vs measured")
    ap.add_argument("--allreduce", action="store_true", help="time one bucket's all-reduce: Gloo vs holoflow's")
    ap.add_argument("--mb", type=float, default=3.3, help="--allreduce: MB of float32")
    ap.add_argument("--zero3", action="store_true", help="ZeRO-3 graph: all-gathers ahead vs in place, paired")
    ap.add_argument("--out")
    a = ap.parse_args()
    common = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--bucket-mb", str(a.bucket_mb)]
    if os.environ.get("RANK") is not None and a.explain:   # inside a launched rank
        t = run_explain(a.steps, a.warmup, a.bucket_mb)
    elif os.environ.get("RANK") is not None and a.allreduce:
        t = run_allreduce(a.mb, 50, a.rounds)
    elif a.variant or a.pair:
        t = (run_variant(a.variant, a.steps, a.warmup, a.bucket_mb) if a.variant
             else run_pair(*a.pair, a.steps, a.warmup, a.rounds, a.bucket_mb))
    if os.environ.get("RANK") is not None:
        if a.out:
            with open(f"{a.out}.{os.environ['RANK']}", "w") as f:
                json.dump(t, f)
        return
    if a.explain:
        got = launch(["--explain", *common])[0]
        print(f"holoflow graph DP, boxing nodes per step (links: {got['link']}); measured: the caller's time in "
              f"the node (issue + wait for an issued one: only what backward did not hide), waiting for the other "
              f"rank included")
        print(f"{'line':<28} {'collectives':<24} {'members':>7} {'MB/rank':>8} {'predicted ms':>13} "
              f"{'measured ms':>12}")
        for src, kinds, m, nbytes, pred, meas in got["rows"]:
            print(f"{src:<28} {kinds:<24} {m:>7} {nbytes / 1e6:8.3f} {pred * 1e3:13.3f} {meas * 1e3:12.3f}")
        tl = got["timeline"]
        print(f"tasks in program order: {' '.join(got['tasks'])}")
        print(f"rank 0 per step (profiled: every node timed): wall {tl['wall']:.1f} ms, caller thread in acts "
              f"{tl['compute']:.1f} ms of which {got['waited']:.1f} ms waiting for collectives (global_box_wait), "
              f"idle between acts {tl['idle']:.1f} ms")
        return
    if a.allreduce:
        got = launch(["--allreduce", "--mb", str(a.mb), "--rounds", str(a.rounds)])[0]
        print(f"all-reduce of {a.mb:g} MB float32 on 2 ranks ({a.rounds} blocks of 50 each, alternating): "
              f"holoflow's transport: {got['transport']}")
        for k in ("gloo", "holoflow"):
            print(f"  {k:<9} median {got[k][0] * 1e3:6.2f} ms   min {got[k][1] * 1e3:6.2f} ms")
        return
    pairs = ZERO3_PAIRS if a.zero3 else PAIRS
    variants = a.only or list(dict.fromkeys(v for _, lim, dp in pairs for v in (lim, dp)))
    best: dict = {v: float("inf") for v in VARIANTS}
    per_pair: dict = {}   # pair name -> (limit s, synchronised s, median of the rounds' ratios or None)
    if a.separate:
        for r in range(a.rounds):
            for v in variants:
                best[v] = min(best[v], max(r[v] for r in launch(["--variant", v, *common])))
                print(f"round {r}: {v:<24} {best[v] * 1e3:8.1f} ms/step", flush=True)
        per_pair = {name: (best[lim], best[dp], None) for name, lim, dp in pairs if lim in variants and dp in variants}
    else:
        for name, lim, dp in pairs:
            if lim in variants and dp in variants:
                got = world_best(launch(["--pair", lim, dp, "--rounds", str(a.rounds), *common]))
                per_pair[name] = (got[lim], got[dp], got["round_ratio"])
                best["transport"] = got.get("transport", best.get("transport"))
                print(f"{name}: limit {got[lim] * 1e3:.1f} ms, {dp} {got[dp] * 1e3:.1f} ms", flush=True)
    what = "sharded ms" if a.zero3 else "dp ms"
    print(f"\n{'framework':<20} {'limit ms':>9} {what:>10} {'limit/' + what.split()[0]:>13}"
          f"   ({'paired' if not a.separate else 'separate launches'}, best of {a.rounds})")
    for name, (lim_s, dp_s, ratio) in per_pair.items():
        per_round = f"   median of the rounds' ratios {ratio:.2f}" if ratio is not None else ""
        print(f"{name:<20} {lim_s * 1e3:9.1f} {dp_s * 1e3:10.1f} {lim_s / dp_s:13.2f}{per_round}")
    if best.get("transport"):
        print(f"holoflow's all-reduces: {best['transport']}")


if __name__ == "__main__":
    main()
