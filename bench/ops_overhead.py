"""Per-op overhead of holoflow vs PyTorch on tiny tensors, where framework time dominates.

    python bench/ops_overhead.py            # the table
    python bench/ops_overhead.py --profile  # + cProfile of holoflow's matmul fwd+bwd loop

Each row times one call (min over repeats of the mean of ``number`` calls, timeit). Each library
runs in its own fresh process (``--one LIB``), the order reversed every other round, and each
row keeps its best over ``--rounds``; the table prints holoflow / torch. One intra-op thread.
Not a timed test: numbers depend on the machine; the ratios are what to watch. Findings are in
bench/README.md.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import timeit
from typing import Callable

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import holoflow as flow  # noqa: E402


def best_us(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Min over ``repeat`` runs of the mean time of one call, in microseconds."""
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def cases(lib) -> dict[str, Callable[[], object]]:
    """The measured snippets, written once for ``lib`` (torch or holoflow)."""
    lib.manual_seed(0)
    a, b = lib.randn(16), lib.randn(16)
    m, n = lib.randn(8, 8), lib.randn(8, 8)
    ga, gb = lib.randn(16, requires_grad=True), lib.randn(16, requires_grad=True)
    gm, gn = lib.randn(8, 8, requires_grad=True), lib.randn(8, 8, requires_grad=True)

    # the ops of the GPT-mini / CNN training steps, at sizes where framework time dominates
    x3 = lib.randn(2, 4, 8, requires_grad=True)
    w, bias = lib.randn(8, 8, requires_grad=True), lib.randn(8, requires_grad=True)
    ln_w, ln_b = lib.randn(8, requires_grad=True), lib.randn(8, requires_grad=True)
    logits, target = lib.randn(8, 10, requires_grad=True), lib.randint(0, 10, (8,))
    F = lib.nn.functional

    def add_fwd_bwd():
        (ga + gb).sum().backward()

    def matmul_fwd_bwd():
        (gm @ gn).sum().backward()

    def linear_fwd_bwd():
        F.linear(x3, w, bias).sum().backward()

    def view_transpose_fwd_bwd():
        x3.view(2, 4, 2, 4).transpose(1, 2).sum().backward()

    def layer_norm_fwd_bwd():
        F.layer_norm(x3, (8,), ln_w, ln_b).sum().backward()

    def cross_entropy_fwd_bwd():
        F.cross_entropy(logits, target).backward()

    return {
        "add 16 (no grad)": lambda: a + b,
        "matmul 8x8 (no grad)": lambda: m @ n,
        "add 16 + sum, fwd+bwd": add_fwd_bwd,
        "matmul 8x8 + sum, fwd+bwd": matmul_fwd_bwd,
        "linear 2x4x8 + sum, fwd+bwd": linear_fwd_bwd,
        "view+transpose + sum, fwd+bwd": view_transpose_fwd_bwd,
        "layer_norm + sum, fwd+bwd": layer_norm_fwd_bwd,
        "cross_entropy 8x10, fwd+bwd": cross_entropy_fwd_bwd,
    }


def one(lib_name: str, number: int, repeat: int) -> dict[str, float]:
    """Microseconds per call of every case, for one library, in this process."""
    torch.set_num_threads(1)
    return {name: best_us(fn, number, repeat) for name, fn in cases(flow if lib_name == "holoflow" else torch).items()}


def table(number: int, repeat: int, rounds: int) -> list[tuple[str, float, float]]:
    """(case, holoflow us, torch us): each library in fresh processes, alternated, best of rounds."""
    best: dict[str, dict[str, float]] = {"holoflow": {}, "torch": {}}
    for r in range(rounds):
        for lib_name in (("holoflow", "torch") if r % 2 == 0 else ("torch", "holoflow")):
            cmd = [sys.executable, os.path.abspath(__file__), "--one", lib_name, "--number", str(number),
                   "--repeat", str(repeat)]
            got = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
            for name, us in got.items():
                best[lib_name][name] = min(best[lib_name].get(name, us), us)
    return [(name, best["holoflow"][name], best["torch"][name]) for name in best["holoflow"]]


def profile(n: int = 3000, top: int = 18) -> None:
    """cProfile of holoflow's matmul forward+backward loop; prints the top functions by own time."""
    fn = cases(flow)["matmul 8x8 + sum, fwd+bwd"]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    pstats.Stats(prof).strip_dirs().sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--number", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one", choices=("holoflow", "torch"), help="time one library here, print JSON")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.number, args.repeat)))
        return
    rows = table(args.number, args.repeat, args.rounds)
    print(f"{'op':<28}{'holoflow us':>13}{'torch us':>11}{'ratio':>8}")
    for name, tf, tt in rows:
        print(f"{name:<28}{tf:>13.1f}{tt:>11.1f}{tf / tt:>8.1f}")
    if args.profile:
        profile()


if __name__ == "__main__":
    main()
