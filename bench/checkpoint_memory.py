"""Activation checkpointing's memory in data-parallel training, per rank: torch DDP with
``torch.utils.checkpoint`` on each block against holoflow's global ``nn.Graph`` (data parallel,
the same blocks in ``config.checkpointed_scopes``; also under ZeRO-2).

    python bench/checkpoint_memory.py                      # 4 pre-norm MLP blocks, 2 Gloo ranks
    python bench/checkpoint_memory.py --rounds 3 --batch 16384

Each variant runs in its own fresh processes (torch's under ``torchrun``, holoflow's under its
launcher), the variants alternated, the best of the rounds kept. Per rank it reports the growth
of the peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs`` after two warm-up
steps: the graph's compile, lazy state) over one training step, glibc's mmap threshold fixed so
freed blocks leave the resident set, and the step's wall time; holoflow's row also shows the
cost model's planned per-rank memory (``graph.predict``). Linux only (``/proc``). Not a timed test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

WORKER = r'''
import json, os, sys, time
lib, out, ckpt, blocks, width, hidden, batch = (sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]),
                                                int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))


def rss_kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))


if lib == "torch":
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.checkpoint import checkpoint
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    barrier = dist.barrier
else:
    import holoflow as torch
    from holoflow import nn
    from holoflow.distributed import comm
    torch.env.init()
    rank, world = torch.env.get_rank(), torch.env.get_world_size()
    barrier = comm.barrier


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.fc = nn.Linear(width, hidden)
        self.proj = nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.proj(nn.functional.gelu(self.fc(self.ln(x))))


torch.manual_seed(0)
model = nn.Sequential(*[Block() for _ in range(blocks)])
x = torch.randn(batch, width)
if lib == "torch":
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    mine = x.chunk(world)[rank]

    def forward(x):
        if not ckpt:
            return ddp(x)
        h = x   # (each block checkpointed inside DDP's forward: the module's own blocks)
        for blk in ddp.module:
            h = checkpoint(blk, h, use_reentrant=False)
        return h

    def step():
        opt.zero_grad()
        forward(mine).square().mean().backward()
        opt.step()
    planned = float("nan")
else:
    from holoflow.sbp import broadcast, split
    P = torch.placement("cpu", list(range(world)))
    model.to_global(placement=P, sbp=broadcast)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    xs = x.to_global(placement=P, sbp=broadcast).to_global(sbp=split(0))

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            if ckpt:
                self.config.checkpointed_scopes = {f"model.{i}" for i in range(blocks)}
            if lib == "holoflow-zero2":
                self.config.enable_zero(True, stage=2, shard_min_size=1)

        def build(self, x):
            loss = self.model(x).square().mean()
            loss.backward()
            return loss
    g = Train()

    def step():
        g(xs)
    planned = None

step()
step()   # warm-up: a graph's compile, the optimizer's state, the allocator's first blocks
if planned is None:
    planned = g.predict(xs).memory_bytes / 2 ** 20
barrier()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")   # resets VmHWM to the current resident set
base = rss_kib("VmRSS")
t0 = time.perf_counter()
step()
seconds = time.perf_counter() - t0
peak = rss_kib("VmHWM")
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"peak_mib": (peak - base) / 1024, "ms": seconds * 1e3, "planned_mib": planned}, f)
barrier()
'''

LIBS = ("torch", "holoflow", "holoflow-zero2")


def run(lib: str, ckpt: bool, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        launcher = "torch.distributed.run" if lib == "torch" else "holoflow.distributed.launch"
        # a fixed mmap threshold: glibc maps every block over 128 KiB and unmaps it when freed, so
        # the resident set follows live tensors (its default raises the threshold after a free)
        env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072",
                   PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
        cmd = [sys.executable, "-m", launcher, "--nproc_per_node", str(args.ranks), script, lib, tmp,
               "1" if ckpt else "0", str(args.blocks), str(args.width), str(args.hidden), str(args.batch)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{lib} failed:\n{proc.stderr[-3000:]}")
        per_rank = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(args.ranks)]
    return {"peak_mib": max(p["peak_mib"] for p in per_rank), "ms": max(p["ms"] for p in per_rank),
            "planned_mib": max(p["planned_mib"] for p in per_rank)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    variants = [(lib, ckpt) for ckpt in (False, True) for lib in LIBS]
    best: dict = {}
    for r in range(args.rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            got = run(*v, args)
            old = best.get(v)
            best[v] = got if old is None else {k: min(old[k], got[k]) for k in got}
    act = args.batch // args.ranks * args.hidden * 4 / 2 ** 20
    print(f"{args.blocks} pre-norm MLP blocks ({args.width} -> {args.hidden} -> {args.width}), batch {args.batch} "
          f"split over {args.ranks} Gloo ranks (one hidden activation: {act:.0f} MiB per rank); "
          f"best of {args.rounds} rounds")
    print("| variant | checkpointing | peak growth MiB per rank | planned MiB per rank | step ms |")
    print("| --- | --- | ---: | ---: | ---: |")
    for (lib, ckpt), got in best.items():
        name = {"torch": "torch DDP", "holoflow": "holoflow nn.Graph DP",
                "holoflow-zero2": "holoflow nn.Graph ZeRO-2"}[lib]
        planned = "" if got["planned_mib"] != got["planned_mib"] else f"{got['planned_mib']:.1f}"
        print(f"| {name} | {'on' if ckpt else 'off'} | {got['peak_mib']:.1f} | {planned} | {got['ms']:.1f} |")


if __name__ == "__main__":
    main()
