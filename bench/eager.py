"""Eager training-step time, holoflow / torch, on the example models (same code, import swap).

    python bench/eager.py                   # each library in its own fresh process, alternated
    python bench/eager.py --in-process      # both in this process (a diagnostic: order effects)
    python bench/eager.py --fused           # AdamW(fused=True) in both libraries
    python bench/eager.py --compile         # the model through lib.compile in both (Inductor)
    python bench/eager.py --profile         # + cProfile of holoflow's GPT step (top by own time)

Models: the GPT of holoflow.examples.gpt at 2 layers, d=64, seq 32, batch 8 (AdamW, grad
clipping, ``loss.item()``: ``gpt.train_step``), and the digits ResNet of holoflow.examples.cnn
(width 16, batch 64, AdamW). The parent runs ``--one CASE LIB`` children ``--rounds`` times,
reversing the order every other round, and keeps each one's best; a child reports the min over
``--repeat`` of the mean of ``--number`` steps after 3 warm-up steps. One intra-op thread by
default (``--threads``) so shared machines give steadier numbers. Not a timed test. Findings
are in bench/README.md.

Each child also reports its minor page faults per timed step (``getrusage``): a step whose heap
glibc trims at the end and re-faults at the start pays them in time. glibc's trim threshold is
dynamic (twice the largest mmapped chunk freed so far), so it depends on the process's history:
torch's ``Optimizer.__init__`` imports ``torch._dynamo``, whose imports resize Python's table of
interned strings once more than a holoflow process ever does (a 1.9 MB block freed: trim
threshold 3.8 MB instead of 1.9 MB). ``--verbose`` prints every child's figures.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import timeit
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import holoflow as flow  # noqa: E402
import holoflow.nn  # noqa: E402,F401
import holoflow.optim  # noqa: E402,F401
from holoflow.examples import cnn, corpus, gpt  # noqa: E402


FUSED = {"fused": False}   # --fused: AdamW(fused=True) in both libraries
COMPILE = {"on": False}    # --compile: the model through torch.compile / holoflow.compile


def _compiled(lib, model):
    return lib.compile(model) if COMPILE["on"] else model


def _fuse(lib, opt):
    if not FUSED["fused"]:
        return opt
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in opt.param_groups]
    return lib.optim.AdamW(groups, lr=opt.defaults["lr"], betas=opt.defaults["betas"], fused=True)


def gpt_step(lib) -> Callable[[], float]:
    cfg = gpt.Config(n_layer=2, n_embd=64, n_head=4, block_size=32, batch_size=8)
    model = gpt.make_model(lib, cfg)
    opt = _fuse(lib, gpt.make_optimizer(lib, model, cfg))
    rng = np.random.default_rng(0)
    data = corpus.encode(corpus.load_text(50_000))
    xb, yb = corpus.get_batch(data, cfg.block_size, cfg.batch_size, rng)
    x, y = lib.from_numpy(xb), lib.from_numpy(yb)
    step_model = _compiled(lib, model)
    return lambda: gpt.train_step(lib, step_model, opt, x, y, 1e-3, cfg)


def cnn_step(lib) -> Callable[[], float]:
    cfg = cnn.Config(width=16)
    model = cnn.make_model(lib, cfg)
    opt = _fuse(lib, lib.optim.AdamW(model.parameters(), lr=1e-3))
    rng = np.random.default_rng(0)
    x = lib.from_numpy(rng.random((64, 1, 8, 8), dtype=np.float32))
    y = lib.from_numpy(rng.integers(0, 10, 64))
    step_model = _compiled(lib, model)
    return lambda: cnn.train_step(lib, step_model, opt, x, y)


def best_ms(fn: Callable[[], object], number: int, repeat: int) -> tuple[float, float]:
    """(best ms per step, minor page faults per timed step)."""
    for _ in range(3):
        fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = timeit.repeat(fn, number=number, repeat=repeat)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return min(times) / number * 1e3, faults / (number * repeat)


def profile_step(make: Callable, steps: int = 30, top: int = 20) -> None:
    fn = make(flow)
    fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        fn()
    prof.disable()
    pstats.Stats(prof).strip_dirs().sort_stats("tottime").print_stats(top)


CASES = {"gpt": ("GPT-mini 2x64, seq 32, batch 8", gpt_step), "cnn": ("digits ResNet w16, batch 64", cnn_step)}


def one(case: str, lib_name: str, number: int, repeat: int) -> tuple[float, float]:
    """(ms per step, minor page faults per step) of one library in this process."""
    return best_ms(CASES[case][1](flow if lib_name == "holoflow" else torch), number, repeat)


def fresh(case: str, lib_name: str, args) -> tuple[float, float]:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", case, lib_name, "--number", str(args.number),
           "--repeat", str(args.repeat), "--threads", str(args.threads)] + (["--fused"] if args.fused else []) \
        + (["--compile"] if args.compile else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return got["ms"], got["minflt"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--number", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fused", action="store_true")
    ap.add_argument("--compile", action="store_true", help="the model through lib.compile (Inductor) in both")
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "LIB"))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="print every child's ms and faults per step")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    FUSED["fused"] = args.fused
    COMPILE["on"] = args.compile
    if args.one:
        ms, faults = one(args.one[0], args.one[1], args.number, args.repeat)
        print(json.dumps({"ms": ms, "minflt": faults}))
        return
    print(f"{'training step':<34}{'holoflow ms':>12}{'torch ms':>10}{'ratio':>8}"
          f"{'faults/step holoflow':>22}{'torch':>8}")
    for case, (name, _) in CASES.items():
        faults: dict[str, list[float]] = {"holoflow": [], "torch": []}
        if args.in_process:
            (tf, ff), (tt, ft) = one(case, "holoflow", args.number, args.repeat), one(case, "torch", args.number,
                                                                                       args.repeat)
            faults["holoflow"].append(ff)
            faults["torch"].append(ft)
        else:
            best = {"holoflow": float("inf"), "torch": float("inf")}
            for k in range(args.rounds):
                got = {}
                for lib_name in (("holoflow", "torch") if k % 2 == 0 else ("torch", "holoflow")):
                    got[lib_name] = fresh(case, lib_name, args)
                    best[lib_name] = min(best[lib_name], got[lib_name][0])
                    faults[lib_name].append(got[lib_name][1])
                if args.verbose:
                    (hm, hf), (tm, tf_) = got["holoflow"], got["torch"]
                    print(f"  {case} round {k}: holoflow {hm:.2f} ms ({hf:.0f} faults/step), torch {tm:.2f} ms "
                          f"({tf_:.0f}), ratio {hm / tm:.2f}")
            tf, tt = best["holoflow"], best["torch"]

        def span(xs: list[float]) -> str:
            return f"{min(xs):.0f}" if max(xs) - min(xs) < 1 else f"{min(xs):.0f}-{max(xs):.0f}"
        print(f"{name:<34}{tf:>12.2f}{tt:>10.2f}{tf / tt:>8.2f}{span(faults['holoflow']):>22}"
              f"{span(faults['torch']):>8}")
    if args.profile:
        profile_step(gpt_step)


if __name__ == "__main__":
    main()
