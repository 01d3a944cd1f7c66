"""Boxing vs the raw torch.distributed collective on the same bytes, and global-op eager overhead.

    python -m holoflow.distributed.launch --nproc_per_node 2 bench/boxing.py
    python bench/boxing.py            # starts the 2-rank launcher itself
    python bench/boxing.py --fingerprint-only   # just the cost of the collective fingerprints

For each boxing kind and logical size (float32, 64 KB .. 16 MB) rank 0 prints the median time
of ``x.to_global(sbp=dst)`` (holoflow, sequence tracking on — the default — and off), the median
of the raw torch collective that moves the same bytes (each rank's shard is half the tensor) and
raw / holoflow (1.0 = no overhead; the target is >= 0.9 from 1 MB). Iterations interleave
holoflow and raw so load from other jobs hits both alike. Then the eager overhead of a global op
vs the same op on the local shards. Findings are in bench/README-boxing.md.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import holoflow as flow  # noqa: E402
from holoflow.core.sbp import B, P, S  # noqa: E402
from holoflow.distributed import comm_check, comm_track  # noqa: E402
from holoflow.distributed.global_tensor import make_global  # noqa: E402

SIZES_KB = (64, 256, 1024, 4096, 16384)
COLS = 256  # a (rows, 256) float32 tensor: rows = bytes / 1 KB


def _iters(nbytes: int) -> int:
    return max(5, min(60, (32 << 20) // max(nbytes, 1)))


def _timed(fn: Callable[[], object]) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _median_pair(a: Callable[[], object], b: Callable[[], object], c: Callable[[], object] | None,
                 n: int) -> tuple[float, ...]:
    """Medians (s) of ``a``, ``b`` (and ``c``), interleaved, after one warm-up each."""
    fns = [f for f in (a, b, c) if f is not None]
    for f in fns:
        _timed(f)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(n):
        for i, f in enumerate(fns):
            times[i].append(_timed(f))
    return tuple(statistics.median(t) for t in times)


def _global(local: torch.Tensor, place, nd: tuple, shape) -> flow.Tensor:
    return make_global(flow.from_torch(local), place, nd, shape)


def _cases(rows: int, rank: int, place):
    """(name, holoflow fn, raw fn) for each boxing kind on a (rows, COLS) logical tensor."""
    shape = (rows, COLS)
    half = torch.randn(rows // 2, COLS)
    full = torch.randn(rows, COLS)
    s0, s1 = _global(half, place, (S(0),), shape), _global(torch.randn(rows, COLS // 2), place, (S(1),), shape)
    p, b = _global(full, place, (P,), shape), _global(full, place, (B,), shape)
    a2a_in = torch.randn(rows // 2, COLS)
    # raw outputs are allocated per call, as boxing's are; all_reduce stays in place (boxing
    # clones its input first, which the "raw" column does not pay)
    return [
        ("S(0)->B all_gather", lambda: s0.to_global(sbp=B),
         lambda: dist.all_gather_into_tensor(torch.empty(rows, COLS), half)),
        ("P->B all_reduce", lambda: p.to_global(sbp=B), lambda: dist.all_reduce(full)),
        ("P->S(0) reduce_scatter", lambda: p.to_global(sbp=S(0)),
         lambda: dist.reduce_scatter_tensor(torch.empty(rows // 2, COLS), full)),
        ("S(0)->S(1) all_to_all", lambda: s0.to_global(sbp=S(1)),
         lambda: dist.all_to_all_single(torch.empty(rows // 2, COLS), a2a_in)),
        ("S(1)->S(0) all_to_all", lambda: s1.to_global(sbp=S(0)),
         lambda: dist.all_to_all_single(torch.empty(rows // 2, COLS), a2a_in)),
        ("B->S(0) slice", lambda: b.to_global(sbp=S(0)), lambda: full.narrow(0, rank * (rows // 2), rows // 2)),
        ("B->P zero", lambda: b.to_global(sbp=P), lambda: full if rank == 0 else torch.zeros_like(full)),
    ]


def bench_boxing(rank: int) -> list[tuple]:
    place = flow.placement("cpu", [0, 1])
    rows_out = []
    for kb in SIZES_KB:
        rows = kb  # COLS * 4 bytes = 1 KB per row
        for name, hf, raw in _cases(rows, rank, place):
            def hf_untracked(hf=hf):
                comm_track.set_tracking(False)
                try:
                    return hf()
                finally:
                    comm_track.set_tracking(True)
            with flow.no_grad():
                t_hf, t_raw, t_nt = _median_pair(hf, raw, hf_untracked, _iters(kb << 10))
            rows_out.append((name, kb, t_hf, t_nt, t_raw))
    return rows_out


def _spread(ts: list[float]) -> float:
    """Half the interquartile range: the run-to-run noise of a timing."""
    q = statistics.quantiles(ts, n=4)
    return (q[2] - q[0]) / 2


def bench_fingerprint(rank: int) -> tuple[list[tuple], tuple[float, float]]:
    """The cost of the collective fingerprints (distributed/comm_check.py) at 1, 4 and 16 MB.

    Returns rows (collective, MB, on ms, off ms, overhead ms, noise ms) and the latency of the
    exchange alone vs one raw Gloo all-gather of the same bytes (ms). On and off calls alternate
    (which goes first alternates too), so load from other jobs hits both alike; the overhead is
    the median of the paired differences (on - off of neighbouring calls), the noise half the
    IQR of the off times (the collective's own run-to-run spread).
    """
    from holoflow.distributed import comm
    place = flow.placement("cpu", [0, 1])
    rows = []
    for mb in (1, 4, 16):
        n = mb << 18  # float32 elements
        full = torch.randn(n)
        s0 = _global(torch.randn(n // 2 // COLS, COLS), place, (S(0),), (n // COLS, COLS))
        for name, fn in (("all_reduce (comm)", lambda: comm.all_reduce(full)),
                         ("S(0)->B all_gather (boxing)", lambda: s0.to_global(sbp=B))):
            on, off = [], []
            with flow.no_grad():
                for _ in range(2):
                    fn()
                for i in range(60 if mb == 1 else 30):
                    for flag, acc in ((True, on), (False, off)) if i % 2 else ((False, off), (True, on)):
                        comm_track.FINGERPRINTS = flag
                        acc.append(_timed(fn))
            comm_track.FINGERPRINTS = True
            diff = statistics.median(a - b for a, b in zip(on, off))
            rows.append((name, mb, statistics.median(on), statistics.median(off), diff, _spread(off)))
    # the exchange alone (both ranks make the same call; no payload follows) vs one raw Gloo
    # all-gather of a fingerprint-sized tensor: 50 back to back (each waits for the peer's), per call,
    # best of 7 interleaved rounds
    words = len(comm_check.fingerprint(0, "all_reduce", full, "x.py:1", 2))
    fp, out = torch.zeros(words, dtype=torch.int64), torch.zeros(2 * words, dtype=torch.int64)
    alone, gloo = [], []
    for _ in range(7):
        alone.append(_timed(lambda: [comm_track.begin("all_reduce", (0, 1), 4, full[:1]) for _ in range(50)]) / 50)
        gloo.append(_timed(lambda: [dist.all_gather_into_tensor(out, fp) for _ in range(50)]) / 50)
    return rows, (min(alone), min(gloo))


def bench_eager(rank: int) -> list[tuple]:
    """(op, shape, global us, local us): a global op vs the same op on the local shards."""
    place = flow.placement("cpu", [0, 1])
    out = []
    for n in (8, 1024):
        a_l, b_l = flow.randn(n // 2, 256), flow.randn(n // 2, 256)
        w_l = flow.randn(256, 256)
        a, b = make_global(a_l, place, (S(0),), (n, 256)), make_global(b_l, place, (S(0),), (n, 256))
        w = make_global(w_l, place, (B,), (256, 256))
        for name, g, loc in (("add S(0)+S(0)", lambda: a + b, lambda: a_l + b_l),
                             ("matmul S(0) x B", lambda: a @ w, lambda: a_l @ w_l)):
            with flow.no_grad():
                number = 200
                for f in (g, loc):
                    f()
                tg, tl = [], []
                for _ in range(5):
                    for f, acc in ((g, tg), (loc, tl)):
                        t0 = time.perf_counter()
                        for _ in range(number):
                            f()
                        acc.append((time.perf_counter() - t0) / number * 1e6)
            out.append((name, (n, 256), min(tg), min(tl)))
    return out


def main() -> None:
    if "RANK" not in os.environ:  # not launched: launch ourselves on 2 ranks
        cmd = [sys.executable, "-m", "holoflow.distributed.launch", "--nproc_per_node", "2", __file__, *sys.argv[1:]]
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "src"),
                                               os.environ.get("PYTHONPATH", "")]))
        raise SystemExit(subprocess.call(cmd, env=env))
    torch.set_num_threads(1)
    flow.env.init()
    rank = flow.env.get_rank()
    fp, (alone, gloo) = bench_fingerprint(rank)
    if rank == 0:
        print("Collective fingerprints (always on): median ms with them on and off, interleaved; overhead = median "
              "of paired differences; noise = half the IQR of the off times")
        print("| collective | size | fingerprint on ms | off ms | overhead ms | noise ms | overhead / noise |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, mb, t_on, t_off, diff, noise in fp:
            print(f"| {name} | {mb} MB | {t_on * 1e3:.3f} | {t_off * 1e3:.3f} | {diff * 1e3:+.3f} | "
                  f"{noise * 1e3:.3f} | {diff / noise if noise else float('inf'):+.2f} |")
        print(f"The fingerprint exchange alone (back to back, per call): {alone * 1e3:.3f} ms; one raw Gloo "
              f"all-gather of the same bytes: {gloo * 1e3:.3f} ms\n")
    if "--fingerprint-only" in sys.argv:
        return
    box = bench_boxing(rank)
    eager = bench_eager(rank)
    if rank != 0:
        return
    print("| boxing | size | holoflow ms | holoflow, no tracking ms | raw torch ms | raw / holoflow | "
          "raw / no-tracking |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, kb, t_hf, t_nt, t_raw in box:
        size = f"{kb} KB" if kb < 1024 else f"{kb >> 10} MB"
        print(f"| {name} | {size} | {t_hf * 1e3:.3f} | {t_nt * 1e3:.3f} | {t_raw * 1e3:.3f} | "
              f"{t_raw / t_hf:.2f} | {t_raw / t_nt:.2f} |")
    print()
    print("| global op (2 ranks) | logical shape | global us | local us | overhead us |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, shape, tg, tl in eager:
        print(f"| {name} | {shape} | {tg:.1f} | {tl:.1f} | {tg - tl:.1f} |")


if __name__ == "__main__":
    main()
