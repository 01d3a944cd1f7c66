"""nn.Graph (actor runtime and sequential executor) vs holoflow eager, PyTorch eager and torch.compile
on GPT-mini and the small CNN (CPU training steps), each variant in its own fresh process.

    python bench/graph.py [--rounds 3] [--steps 20] [--cases gpt cnn] [--variants ...] [--no-compile]
    python bench/graph.py --one gpt actor [--steps 20]     # one variant in this process: a JSON line
    python bench/graph.py --device cuda --variants actor sequential torch-eager   # on a GPU
    python bench/graph.py --cases cnn --variants actor sequential --paired   # + both executors in one process

Variants: ``actor`` (nn.Graph, the actor runtime as lowered: a CPU device's streams on the caller's
thread), ``actor-thread`` (the same plan with the device's streams on one dedicated worker thread,
the caller only feeding and collecting), ``sequential`` (the reference executor), ``compiled`` (the
actor runtime with ``config.enable_compile()``: each compute task through Inductor, plus OneFlow's
fusion switches ``allow_fuse_model_update_ops`` / ``allow_fuse_add_to_output``;
bench/graph_compile.py splits those apart), ``flow-eager``, ``torch-eager``, ``torch-compile``. The
parent runs every variant in a fresh process, alternating their order round by round, and keeps each
variant's best (order effects inside one process hid the actor runtime's cost once). Each child
times ``--steps`` steps ``--repeat`` times after 3 warm-up steps and reports the fastest mean; the
graph variants also report the first call (trace, passes, lowering) and the planned peak memory;
``torch-eager`` reports the bytes autograd saves. bench/run_all.py runs this and writes the ratios
into bench/results.md.

Each child also reports its minor page faults per timed step (``faults``): glibc's heap trimming
makes a process re-fault its tensors' pages every step or not, depending on where long-lived small
blocks landed (it varies run to run, for every variant alike). ``--paired`` adds a child per case
that times the actor runtime and the sequential executor on one compiled plan in one process,
alternating blocks of ``--steps`` steps (same heap, same OpenMP team, same load): with two intra-op
threads a process runs the CNN at ~3.8 or ~4.9 ms/step for its whole life on this box whichever
executor it uses, which a best-of-rounds ratio between separate processes mistakes for the
executor's cost; the paired ratio (median over rounds) is the runtime's own.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

CASES = {"gpt": "GPT-mini (2 layers, d=64, seq 32, batch 8)", "cnn": "CNN (width 32, batch 64)"}
VARIANTS = ("actor", "actor-thread", "sequential", "compiled", "flow-eager", "torch-eager", "torch-compile")


def gpt_case(lib, device: str = "cpu"):
    from holoflow.examples import gpt
    lib.manual_seed(0)
    m = gpt.build(lib)(65, 32, 2, 64, 4).to(device)
    rng = np.random.default_rng(0)
    x, y = (lib.tensor(rng.integers(0, 65, (8, 32)), device=device) for _ in range(2))
    return m, lib.optim.AdamW(m.parameters(), lr=1e-3), (x, y), lambda m, x, y: m(x, y)[1]


def cnn_case(lib, device: str = "cpu"):
    from holoflow.examples import cnn
    lib.manual_seed(0)
    m = cnn.build(lib)(32).to(device)
    rng = np.random.default_rng(0)
    x = lib.tensor(rng.standard_normal((64, 1, 8, 8)).astype(np.float32), device=device)
    y = lib.tensor(rng.integers(0, 10, (64,)), device=device)
    return m, lib.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), (x, y), \
        lambda m, x, y: lib.nn.functional.cross_entropy(m(x), y)


def timeit(step, steps: int, repeat: int, sync=lambda: None) -> float:
    """The fastest of ``repeat`` means over ``steps`` calls, after 3 warm-up calls (seconds);
    ``sync`` waits for the device (CUDA) before each clock read."""
    for _ in range(3):
        step()
    best = float("inf")
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        best = min(best, (time.perf_counter() - t) / steps)
    return best


def torch_step(m, opt, batch, loss_fn):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(m, *batch)
        loss.backward()
        opt.step()
        return loss
    return step


def saved_bytes(m, batch, loss_fn) -> int:
    """Bytes autograd saves for backward in one torch eager step (activation memory)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(m, *batch)
    return total[0]


def train_graph(m, opt, loss_fn):
    """An nn.Graph training step of ``m``: forward, ``loss_fn``, backward, ``opt``'s update."""
    from holoflow.graph import Graph

    class Train(Graph):
        def __init__(self):
            super().__init__()
            self.model = m
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = loss_fn(self.model, x, y)
            loss.backward()
            return loss
    return Train()


def faults() -> int:
    """Minor page faults of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def paired(g, batch: tuple, steps: int, repeat: int, sync=lambda: None) -> dict:
    """The actor runtime and the sequential executor on ``g``'s compiled plan, in this process,
    alternating blocks of ``steps`` calls (``2 * repeat`` blocks each, after 3 warm-up calls of
    each): their fastest block means (ms) and the median ratio of adjacent blocks."""
    from holoflow.graph.lower import make_executor
    c = next(iter(g._compiled.values()))
    exs = {k: make_executor(c.lowered.plan, k, device=c.lowered.device) for k in ("actor", "sequential")}
    best = {k: float("inf") for k in exs}
    last: dict[str, float] = {}
    ratios = []
    for b in range(2 * repeat):
        for k in (("actor", "sequential") if b % 2 == 0 else ("sequential", "actor")):
            c._executor = exs[k]
            last[k] = timeit(lambda: g(*batch), steps, 1, sync)
            best[k] = min(best[k], last[k] * 1e3)
        ratios.append(last["actor"] / last["sequential"])
    c._executor = None
    for ex in exs.values():
        ex.close()
    return {"ms_actor": best["actor"], "ms_sequential": best["sequential"],
            "ratio": statistics.median(ratios), "ms": best["actor"]}


def one(case: str, variant: str, steps: int, repeat: int, device: str = "cpu") -> dict:
    """Measures one variant in this process (``paired``: both executors, `paired`)."""
    make = {"gpt": lambda lib: gpt_case(lib, device), "cnn": lambda lib: cnn_case(lib, device)}[case]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    r: dict = {"case": case, "variant": variant, "threads": torch.get_num_threads(), "device": device}
    if variant.startswith("torch"):
        m, opt, batch, loss_fn = make(torch)
        step = torch_step(m, opt, batch, loss_fn)
        if variant == "torch-compile":
            t0 = time.perf_counter()
            step = torch.compile(step)
            step()
            r["first_s"] = time.perf_counter() - t0
        else:
            r["saved_bytes"] = saved_bytes(m, batch, loss_fn)
        r["ms"] = timeit(step, steps, repeat, sync) * 1e3
        return r
    import holoflow as flow
    m, opt, batch, loss_fn = make(flow)
    if variant == "flow-eager":
        r["ms"] = timeit(torch_step(m, opt, batch, loss_fn), steps, repeat, sync) * 1e3
        return r

    g = train_graph(m, opt, loss_fn)
    g.config.set_executor("sequential" if variant == "sequential" else "actor")
    if variant == "compiled":
        g.config.enable_compile()
        g.config.allow_fuse_model_update_ops(True)
        g.config.allow_fuse_add_to_output(True)
    if variant == "paired":
        g(*batch)
        return {**r, **paired(g, batch, steps, repeat, sync)}
    t0 = time.perf_counter()
    g(*batch)
    r["first_s"] = time.perf_counter() - t0
    c = next(iter(g._compiled.values()))
    if variant == "actor-thread":       # the device's streams on one worker thread of their own
        from holoflow.runtime import SOURCE_STREAM, Runtime
        plan = c.lowered.plan
        c.executor.close()
        c._executor = Runtime(plan, threads={s: "cpu" for s in {t.stream for t in plan.tasks}}
                              | {SOURCE_STREAM: "caller"})
    r.update(nodes=len(c.ir.nodes), tasks=len(c.lowered.plan.tasks), trace_s=c.compile_s, planned_bytes=c.peak_bytes)
    f0 = faults()
    r["ms"] = timeit(lambda: g(*batch), steps, repeat, sync) * 1e3
    r["faults"] = (faults() - f0) / ((3 + steps * repeat))
    return r


def child_cmd(case: str, variant: str, steps: int, repeat: int, device: str = "cpu") -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--one", case, variant, "--steps", str(steps),
            "--repeat", str(repeat), "--device", device]


def parse_result(out: str) -> dict:
    """The last ``RESULT {json}`` line of a child's output."""
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"no RESULT line in the child's output:\n{out[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run_child(cmd: list[str], timeout: float = 1800.0) -> str:
    """A child's stdout; raises with the end of its stderr when it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {p.stderr[-1500:]}")
    return p.stdout


def alternate(jobs: dict[str, list[str]], rounds: int, log=print, runner=run_child, key: str = "ms") -> dict[str, dict]:
    """Runs each job (a command printing a RESULT line) once per round in a fresh process, the
    order reversed every other round; keeps each job's fastest result (smallest ``key``, also its
    unit in the log), with every round's result under ``"runs"``. A failed job is logged and
    recorded as ``{"error": ...}``."""
    best: dict[str, dict] = {}
    names = list(jobs)
    for k in range(rounds):
        for name in (names if k % 2 == 0 else names[::-1]):
            try:
                r = parse_result(runner(jobs[name]))
            except Exception as e:      # noqa: BLE001 -- reported, the other variants still run
                log(f"  {name}: FAILED {type(e).__name__}: {str(e)[-600:]}")
                best.setdefault(name, {"error": "failed"})
                continue
            extra = "".join(f"  {f} {r[f]:.3f}" for f in ("ratio", "faults") if f in r)
            log(f"  round {k + 1}: {name:<24} {r[key]:9.2f} {key}{extra}")
            old = best.get(name, {})
            runs = [*old.get("runs", ()), r]
            if key not in old or r[key] < old[key]:
                best[name] = {**r, "rounds": old.get("rounds", 0) + 1, "runs": runs}
            else:
                old["rounds"] += 1
                old["runs"] = runs
    return best


def report(case: str, res: dict[str, dict]) -> None:
    ms = {v: res[f"{case}:{v}"]["ms"] for v in VARIANTS if "ms" in res.get(f"{case}:{v}", {})}
    print(f"== {CASES[case]}")
    print("  ms/step: " + " | ".join(f"{v} {t:.2f}" for v, t in ms.items()))

    def ratio(a: str, b: str, target: str) -> None:
        if a in ms and b in ms:
            print(f"  {a} / {b} = {ms[a] / ms[b]:.3f}  ({target})")
    ratio("actor", "sequential", "target <= 1.05")
    ratio("actor-thread", "sequential", "a dedicated device thread, for comparison")
    ratio("actor", "torch-eager", "target <= 0.6 on GPT-mini")
    ratio("actor", "torch-compile", "target <= 1.0 on the CNN")
    ratio("compiled", "torch-eager", "target <= 0.6 on GPT-mini, with enable_compile()")
    ratio("compiled", "torch-compile", "target <= 1.0 on the CNN, with enable_compile()")
    ratio("flow-eager", "torch-eager", "target <= 1.1")
    pair = res.get(f"{case}:paired", {})
    if "runs" in pair:
        rs = sorted(r["ratio"] for r in pair["runs"])
        print(f"  actor / sequential, same process = {statistics.median(rs):.3f} (median of {len(rs)} processes, "
              f"range {rs[0]:.3f}-{rs[-1]:.3f}; each the median of alternating blocks)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=2, metavar=("CASE", "VARIANT"), help="measure one variant in this process")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--paired", action="store_true", help="also time the actor runtime and the sequential "
                    "executor in one process per round, alternating (`paired`)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the actor runtime on CUDA streams; "
                    "not measured in CI)")
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one(*a.one, a.steps, a.repeat, a.device)))
        return
    variants = [v for v in a.variants if not (a.no_compile and v in ("torch-compile", "compiled"))]
    for case in a.cases:
        jobs = {f"{case}:{v}": child_cmd(case, v, a.steps, a.repeat, a.device) for v in variants}
        if a.paired:
            jobs[f"{case}:paired"] = child_cmd(case, "paired", a.steps, a.repeat, a.device)
        report(case, alternate(jobs, a.rounds))


if __name__ == "__main__":
    main()
