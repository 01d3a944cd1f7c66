"""FSDP2 (``fully_shard``) peak memory per rank, holoflow (its mock of torch) against torch, with
the blocks resharded after forward (torch's default) or kept.

    python bench/fsdp_memory.py                 # 8 Linear(1024, 1024) blocks, 2 Gloo ranks
    python bench/fsdp_memory.py --rounds 3 --width 2048

One PyTorch script (the worker below) runs under ``torchrun`` and under holoflow's launcher with
``mock_torch``; every variant in its own fresh processes, the variants alternated, the best of the
rounds kept. Per rank it reports the growth of the peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs`` after setup) over one training step (forward, backward, SGD step) after a
warm-up step (glibc's mmap threshold fixed, so freed blocks leave the resident set), and the step's
wall time. The parameters' own bytes: ``blocks * width**2 * 4``,
half of it per rank as shards. Linux only (``/proc``). Not a timed test.
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
lib, out, reshard, blocks, width = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), int(sys.argv[5])
if lib == "holoflow":
    from holoflow import mock_torch
    mock_torch.enable()
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width, bias=False), nn.ReLU()) for _ in range(blocks)])
for block in model:
    fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, width)


def step():
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def rss_kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))


step()   # warm-up: lazy initialisation, the optimizer's state, the allocator's first blocks
dist.barrier()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")   # resets VmHWM to the current resident set
base = rss_kib("VmRSS")
t0 = time.perf_counter()
step()
seconds = time.perf_counter() - t0
peak = rss_kib("VmHWM")
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"peak_mib": (peak - base) / 1024, "ms": seconds * 1e3}, f)
dist.destroy_process_group()
'''


def run(lib: str, reshard: bool, blocks: int, width: int, ranks: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        launcher = "holoflow.distributed.launch" if lib == "holoflow" else "torch.distributed.run"
        # a fixed mmap threshold: glibc maps every block over 128 KiB and unmaps it when freed, so the
        # resident set follows live tensors (its default raises the threshold after the first free)
        env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072",
                   PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
        cmd = [sys.executable, "-m", launcher, "--nproc_per_node", str(ranks), script, lib, tmp,
               "1" if reshard else "0", str(blocks), str(width)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{lib} failed:\n{proc.stderr[-3000:]}")
        per_rank = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(ranks)]
    return {"peak_mib": max(p["peak_mib"] for p in per_rank), "ms": max(p["ms"] for p in per_rank)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    variants = [(lib, reshard) for reshard in (True, False) for lib in ("torch", "holoflow")]
    best: dict = {}
    for _ in range(args.rounds):
        for v in variants:
            got = run(*v, args.blocks, args.width, args.ranks)
            old = best.get(v)
            best[v] = got if old is None else {k: min(old[k], got[k]) for k in got}
    param_mib = args.blocks * args.width ** 2 * 4 / 2 ** 20
    print(f"{args.blocks} blocks of Linear({args.width}, {args.width}), {args.ranks} Gloo ranks: parameters "
          f"{param_mib:.0f} MiB ({param_mib / args.ranks:.0f} MiB of shards per rank); best of {args.rounds} rounds")
    print("| reshard_after_forward | torch peak growth MiB | holoflow peak growth MiB | torch ms | holoflow ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for reshard in (True, False):
        t, h = best[("torch", reshard)], best[("holoflow", reshard)]
        print(f"| {reshard} | {t['peak_mib']:.1f} | {h['peak_mib']:.1f} | {t['ms']:.1f} | {h['ms']:.1f} |")


if __name__ == "__main__":
    main()
