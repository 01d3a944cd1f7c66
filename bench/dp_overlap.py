"""Data parallelism on 2 Gloo ranks against its no-communication limit: torch DDP, holoflow eager
DDP and a holoflow nn.Graph of global tensors (bucketed all-reduces on the comm stream).

    python bench/dp_overlap.py                 # every variant, each in its own launched world
    python bench/dp_overlap.py --rounds 3 --steps 12

GPT of holoflow.examples.gpt (4 layers, d=128, seq 64, global batch 32: 16 per rank), AdamW.
For each framework, ``limit`` is the same 2 processes each training its half batch with no
synchronisation, and ``dp`` the synchronised run; the figure is limit / dp step time (1.0 =
communication fully hidden). Variants run one launch each, alternating, best of ``--rounds``.
Not a timed test.
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

VARIANTS = ["torch-limit", "torch-ddp", "flow-eager-limit", "flow-eager-ddp", "flow-graph-limit", "flow-graph-dp"]


def _cfg(gpt):
    return gpt.Config(n_layer=4, n_embd=128, n_head=4, block_size=64, batch_size=16)


def _batch(corpus, cfg, rank: int, step: int):
    data = corpus.encode(corpus.load_text(200_000))
    rng = np.random.default_rng(1000 * step + rank)
    return corpus.get_batch(data, cfg.block_size, cfg.batch_size, rng)


def run_variant(variant: str, steps: int, warmup: int, bucket_mb: float = 25.0) -> float:
    """One launched rank's mean step time (s) after warm-up."""
    import torch
    from holoflow.examples import corpus, gpt
    cfg = _cfg(gpt)
    rank = int(os.environ.get("RANK", "0"))
    batches = [_batch(corpus, cfg, rank, s) for s in range(warmup + steps)]
    if variant.startswith("torch"):
        import torch.distributed as dist
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = gpt.make_model(torch, cfg)
        if variant == "torch-ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(xb, yb):
            _, loss = model(torch.from_numpy(xb), torch.from_numpy(yb))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    else:
        import holoflow as flow
        from holoflow.core.sbp import B, S
        flow.env.init()
        flow.manual_seed(0)
        model = gpt.make_model(flow, cfg)
        if variant == "flow-eager-ddp":
            model = flow.nn.parallel.DistributedDataParallel(model)
        place = flow.placement("cpu", [0, 1])
        if variant == "flow-graph-dp":
            model.to_global(place, B)
        opt = flow.optim.AdamW(model.parameters(), lr=1e-3)
        if variant.startswith("flow-graph"):
            dp = variant == "flow-graph-dp"

            class Train(flow.nn.Graph):
                def __init__(self):
                    super().__init__()
                    self.model = model
                    self.add_optimizer(opt)
                    self.config.set_allreduce_bucket_mb(bucket_mb)

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
        else:
            def step(xb, yb):
                _, loss = model(flow.from_numpy(xb), flow.from_numpy(yb))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    for xb, yb in batches[:warmup]:
        step(xb, yb)
    t0 = time.perf_counter()
    for xb, yb in batches[warmup:]:
        step(xb, yb)
    return (time.perf_counter() - t0) / steps


def launch(variant: str, steps: int, warmup: int, bucket_mb: float = 25.0) -> float:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "t.json")
        cmd = [sys.executable, "-m", "holoflow.distributed.launch", "--nproc_per_node", "2", __file__,
               "--variant", variant, "--steps", str(steps), "--warmup", str(warmup), "--out", out,
               "--bucket-mb", str(bucket_mb)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=900)
        with open(out) as f:
            return json.load(f)["step_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", choices=VARIANTS)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="the graph's gradient bucket size")
    ap.add_argument("--only", nargs="+", choices=VARIANTS, help="run these variants only")
    a = ap.parse_args()
    if a.variant:   # inside a launched rank
        t = run_variant(a.variant, a.steps, a.warmup, a.bucket_mb)
        if int(os.environ.get("RANK", "0")) == 0 and a.out:
            with open(a.out, "w") as f:
                json.dump({"step_s": t}, f)
        return
    variants = a.only or VARIANTS
    best = {v: float("inf") for v in VARIANTS}
    for r in range(a.rounds):
        for v in variants:
            best[v] = min(best[v], launch(v, a.steps, a.warmup, a.bucket_mb))
            print(f"round {r}: {v:<18} {best[v] * 1e3:8.1f} ms/step", flush=True)
    print(f"\n{'framework':<16} {'limit ms':>9} {'dp ms':>9} {'limit/dp':>9}")
    for name, lim, dp in (("torch DDP", "torch-limit", "torch-ddp"), ("holoflow eager", "flow-eager-limit",
                          "flow-eager-ddp"), ("holoflow graph", "flow-graph-limit", "flow-graph-dp")):
        if lim not in variants or dp not in variants:
            continue
        print(f"{name:<16} {best[lim] * 1e3:9.1f} {best[dp] * 1e3:9.1f} {best[lim] / best[dp]:9.2f}")


if __name__ == "__main__":
    main()
