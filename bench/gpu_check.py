"""Every CUDA figure of issue 11 in one run (the device machine is lent briefly):

1. op tables on CUDA against torch on CUDA (float32, forward + backward): the pass count;
2. attention on CUDA: holoflow's sdpa against torch's (bf16 autocast; causal, bool mask, float
   mask), max differences of values and grads, and the aten kernels its backward ran (fused
   flash / cuDNN / memory-efficient backward expected, no float32 math path);
3. the GPT-2-small training step (12 layers, d=768, 12 heads, T=1024, B=8, vocab 50304, bf16
   autocast, fused AdamW) — torch eager, torch.compile, holoflow eager, nn.Graph, nn.Graph with
   ``enable_compile`` — each variant
   in its own process: ms/step, ratios (holoflow eager / torch eager, target <= 1.15; graph /
   torch.compile, target <= 1.0), MFU (target >= 47%, aim 55%), peak memory
   (``torch.cuda.max_memory_allocated``; target: graph and eager <= torch eager's), and the
   first losses of each (the same weights and batch, so they must agree to bf16 noise);
4. ``exec``: nn.Graph's actor runtime against the sequential executor on CUDA (results, ms/step,
   a pinned host batch through the copy stream);
5. ``profile``: per variant, wall vs host-enqueue ms/step, device-kernel ms/step, the top kernels
   and every host-device synchronization inside a step.

On one H200 (2026-12) the default run took ~2.5 min plus ~30 s to start the machine; its
results so far are in bench/results-cuda.md.

    PYTHONPATH=src:tests python bench/gpu_check.py                 # everything
    PYTHONPATH=src:tests python bench/gpu_check.py attn gpt        # parts: attn, ops, gpt, exec, profile
    CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH=src:tests python bench/gpu_check.py exec --deterministic
    PYTHONPATH=src:tests python bench/gpu_check.py gpt --small     # GPT-mini shapes (a quick try)
    PYTHONPATH=src:tests python bench/gpu_check.py --device cpu --small   # a dry run of the script, no GPU
    PYTHONPATH=src:tests python bench/gpu_check.py profile            # where each variant's step time goes

MFU counts 6 N + 12 L T d flops per token (N: parameters without the position embedding, the
tied head once; PaLM's estimate, as nanoGPT) against ``--peak-tflops`` (989: H100/H200 SXM dense
bf16).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np
import torch

VARIANTS = ("torch_eager", "torch_compile", "holoflow_eager", "holoflow_compile", "holoflow_graph",
            "holoflow_graph_compile")
MODULES = ["ops.test_elementwise", "ops.test_reduction", "ops.test_linalg", "ops.test_shape",
           "ops.test_indexing", "ops.test_nn_ops", "ops.test_loss", "ops.test_nn_extra", "ops.test_extra_ops",
           "ops.test_more_ops", "ops.test_fft", "ops.test_complex_ops", "ops.test_decomp", "ops.test_rnn",
           "ops.test_sampling", "ops.test_views", "ops.test_random", "perf_paths.test_sdpa_fused",
           "perf_paths.test_linear_backward", "perf_paths.test_matmul_grad_ops"]
SHAPES = {"gpt2s": dict(L=12, D=768, H=12, T=1024, B=8, V=50304),
          "small": dict(L=2, D=64, H=4, T=32, B=8, V=65)}


DEV = "cuda"   # --device: cpu runs the whole script on the CPU (a dry run before a lease)


def on_gpu() -> bool:
    return DEV.startswith("cuda")


def sync() -> None:
    if on_gpu():
        torch.cuda.synchronize()


def op_tables() -> None:
    import harness
    ok = bad = 0
    failures = []
    for mod in MODULES:
        for case in importlib.import_module(mod).CASES:
            if case.random:
                continue
            try:  # run_case moves the case's inputs to DEV and makes its own tensors there
                harness.run_case(case, torch.float32, device=DEV)
                ok += 1
            except Exception as e:  # reported below, counted
                bad += 1
                failures.append(f"{case.name}: {type(e).__name__}: {' | '.join(str(e).splitlines())[:400]}")
    print(f"op tables on {DEV} (float32, fwd+bwd vs torch on {DEV}): {ok} passed, {bad} failed")
    for f in failures:
        print("   ", f)


def attention_check() -> None:
    """holoflow's sdpa vs torch's on CUDA under bf16 autocast, and the kernels its backward runs."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    import holoflow as flow

    class Aten(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    g = torch.Generator(device=DEV).manual_seed(0)
    B, H, T, E = (4, 12, 1024, 64) if on_gpu() else (2, 4, 64, 16)
    q, k, v = (torch.randn(B, H, T, E, device=DEV, generator=g) for _ in range(3))
    masks = {"causal": None, "bool mask": torch.rand(T, T, device=DEV, generator=g) > 0.2,
             "float mask": torch.randn(1, H, T, T, device=DEV, generator=g)}
    for name, mask in masks.items():
        causal = mask is None
        tt = [x.clone().requires_grad_() for x in (q, k, v)]
        ft = [flow.from_torch(x.clone()).requires_grad_() for x in (q, k, v)]
        with torch.autocast(DEV, dtype=torch.bfloat16):
            want = F.scaled_dot_product_attention(*tt, attn_mask=mask, is_causal=causal)
        fm = None if mask is None else flow.from_torch(mask)
        with flow.autocast(DEV, dtype=flow.bfloat16):
            got = flow.nn.functional.scaled_dot_product_attention(*ft, attn_mask=fm, is_causal=causal)
        dy = torch.randn(want.shape, device=DEV, generator=g).to(want.dtype)
        want.backward(dy)
        aten = Aten()
        with aten:
            got.backward(flow.from_torch(dy))
        sync()
        dout = (got.to_torch().float() - want.float()).abs().max().item()
        dgrad = max((f.grad.to_torch().float() - t.grad.float()).abs().max().item() for f, t in zip(ft, tt))
        kernels = sorted({o for o in aten.ops if "attention" in o or o in ("logsumexp", "masked_fill", "_softmax")})
        print(f"sdpa {name:<10} bf16: dtype {got.dtype} (torch {want.dtype}), max |dout| {dout:.3g}, "
              f"max |dgrad| {dgrad:.3g}; backward kernels {kernels}")
        times = {}
        for lib, xs, mk in ((torch, tt, mask), (flow, ft, fm)):
            def fwd_bwd():
                with lib.autocast(DEV, dtype=lib.bfloat16):
                    o = lib.nn.functional.scaled_dot_product_attention(*xs, attn_mask=mk, is_causal=causal)
                o.sum().backward()
            for _ in range(2):
                fwd_bwd()
            sync()
            t0 = time.perf_counter()
            for _ in range(10):
                fwd_bwd()
            sync()
            times[lib.__name__] = (time.perf_counter() - t0) / 10 * 1e3
        print(f"    forward+backward: torch {times['torch']:.3f} ms, holoflow {times['holoflow']:.3f} ms "
              f"({times['holoflow'] / times['torch']:.2f}x)", flush=True)


def executors_check(steps: int) -> None:
    """nn.Graph on CUDA: the actor runtime (compute, update and copy streams as CUDA streams ordered
    by events) against the sequential executor, bit for bit over 3 training steps from the same
    weights, then each one's ms/step with the batch already on the device and, for the actor
    runtime, with the batch in pinned host memory (its ``copy`` stream moves the next batch while
    the current one computes: the two times should be about equal)."""
    import holoflow as flow
    from holoflow.examples import gpt
    s = dict(L=4, D=512, H=8, T=512, B=16, V=50304) if on_gpu() else SHAPES["small"]
    rng = np.random.default_rng(0)
    host = [torch.from_numpy(rng.integers(0, s["V"], (s["B"], s["T"]))) for _ in range(2)]
    if on_gpu():
        host = [t.pin_memory() for t in host]
    results = {}
    for ex, where in (("actor", "device"), ("sequential", "device"), ("actor", "host"), ("sequential", "again")):
        flow.manual_seed(0)
        m = gpt.build(flow)(s["V"], s["T"], s["L"], s["D"], s["H"]).to(DEV)
        opt = flow.optim.AdamW(m.parameters(), lr=1e-4)

        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.m = m
                self.add_optimizer(opt)
                self.config.enable_amp(True, dtype=flow.bfloat16)
                self.config.set_executor(ex)

            def build(self, x, y):
                _, loss = self.m(x, y)
                loss.backward()
                return loss
        g = Train()
        x, y = (flow.from_torch(t if where == "host" else t.to(DEV)) for t in host)
        losses = [g(x, y).to_torch().float().cpu() for _ in range(3)]
        params = [p.to_torch().detach().float().cpu().clone() for p in m.parameters()]
        for _ in range(2):
            g(x, y)
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            g(x, y)
        sync()
        results[ex, where] = ((time.perf_counter() - t0) / steps * 1e3, losses, params)
    a, q = results["actor", "device"], results["sequential", "device"]
    def diff(r1, r2) -> str:
        same = all(torch.equal(u, v) for u, v in zip(r1[1] + r1[2], r2[1] + r2[2]))
        worst = max((u - v).abs().max().item() for u, v in zip(r1[1] + r1[2], r2[1] + r2[2]))
        return f"{'bit for bit' if same else 'NOT bit for bit'} (max |diff| {worst:.3g})"
    again = results.pop(("sequential", "again"))
    print(f"nn.Graph on {DEV} (GPT L={s['L']} d={s['D']} T={s['T']} B={s['B']}, bf16 autocast), losses "
          f"{[round(float(v), 5) for v in a[1]]}:\n  actor runtime vs sequential executor: {diff(a, q)}; "
          f"sequential run twice (the kernels' own determinism): {diff(q, again)}")
    for (ex, where), (ms, _, _) in results.items():
        print(f"  {ex:<10} batch on {where:<6}: {ms:8.2f} ms/step")
    print(f"  actor / sequential = {a[0] / q[0]:.3f} (target <= 1.05); actor host batch / device batch = "
          f"{results['actor', 'host'][0] / a[0]:.3f} (the copy overlapped: ~1.0)")


def gpt_flops_per_step(s: dict, n_params: int) -> float:
    per_token = 6 * (n_params - s["T"] * s["D"]) + 12 * s["L"] * s["T"] * s["D"]
    return per_token * s["B"] * s["T"]


def run_variant(variant: str, shape: str, steps: int) -> dict:
    """One variant in this process: step time, peak memory, first losses."""
    import holoflow as flow
    from holoflow.examples import gpt
    s = SHAPES[shape]
    lib = torch if variant.startswith("torch") else flow
    torch.backends.cuda.matmul.allow_tf32 = True
    lib.manual_seed(0)
    m = gpt.build(lib)(s["V"], s["T"], s["L"], s["D"], s["H"]).to(DEV)
    n_params = sum(p.numel() for p in m.parameters())
    opt = lib.optim.AdamW(m.parameters(), lr=1e-4, fused=on_gpu())
    rng = np.random.default_rng(0)
    x, y = (lib.tensor(rng.integers(0, s["V"], (s["B"], s["T"]))).to(DEV) for _ in range(2))
    call = flow.compile(m) if variant == "holoflow_compile" else m   # (the model; the loop stays eager)

    def step():
        with lib.autocast(DEV, dtype=lib.bfloat16):
            _, loss = call(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    t0 = time.perf_counter()
    if variant == "torch_compile":
        step = torch.compile(step)
    elif variant.startswith("holoflow_graph"):
        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.m = m
                self.add_optimizer(opt)
                self.config.enable_amp(True, dtype=flow.bfloat16)
                self.config.allow_fuse_model_update_ops(True)
                self.config.allow_fuse_add_to_output(True)
                self.config.enable_compile(variant == "holoflow_graph_compile")   # Inductor per compute task

            def build(self, x, y):
                _, loss = self.m(x, y)
                loss.backward()
                return loss
        graph = Train()

        def step():
            return graph(x, y)
    losses = [float(step().detach()) for _ in range(3)]
    sync()
    first = time.perf_counter() - t0
    if variant == "holoflow_graph_compile":   # which tasks Inductor compiled, and why not the others
        for c in graph._compiled.values():
            nodes = {spec.name: spec.meta.get("nodes") for spec in c.lowered.plan.tasks}
            for name, task in c.lowered.compiled.items():
                print(f"  enable_compile: task {name} ({nodes[name]} nodes): {task.state}"
                      f"{' - ' + task.reason if task.reason else ''}", flush=True)
    if PROFILE:
        return profile_steps(variant, step)
    if on_gpu():
        torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        step()
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    ms = (time.perf_counter() - t) / steps * 1e3
    peak = torch.cuda.max_memory_allocated() if on_gpu() else 1
    return dict(variant=variant, ms=ms, peak=peak, losses=losses, first_s=first,
                flops=gpt_flops_per_step(s, n_params), params=n_params)


PROFILE = False   # --profile: run_variant reports where a step's time goes instead of timing it


def profile_steps(variant: str, step, n: int = 5) -> dict:
    """Where a step's time goes: wall ms/step (synchronized), the host's ms/step to enqueue it (no
    synchronization: equal to the wall time when the host is the bottleneck), and, from
    torch.profiler over ``n`` steps, device-kernel ms/step, kernels/step and the top kernels."""
    from torch.profiler import ProfilerActivity, profile
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    host = (time.perf_counter() - t0) / n * 1e3
    sync()
    wall = (time.perf_counter() - t0) / n * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        sync()
    syncs = sync_points(step) if on_gpu() else []
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    total = sum(e.self_device_time_total for e in kernels) / 1e3 / n
    count = sum(e.count for e in kernels) / n
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:14]
    return dict(variant=variant, wall=wall, host=host, kernel_ms=total, kernels=count,
                top=[(e.key[:90], e.self_device_time_total / 1e3 / n, e.count / n) for e in top], syncs=syncs)


def sync_points(step) -> list[str]:
    """The host-device synchronizations one step makes (torch's sync debug mode), each as the
    innermost frames of the project's code that asked for it, with how many times."""
    import collections
    import traceback
    import warnings
    seen: collections.Counter = collections.Counter()

    def hook(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "/holoflow/" in f.filename or "gpu_check" in f.filename]
        seen[" <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames[-4:][::-1])] += 1
    old = warnings.showwarning
    warnings.showwarning = hook
    torch.cuda.set_sync_debug_mode(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = hook
            step()
            sync()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = old
    return [f"{c}x {k}" for k, c in seen.most_common(8)]


def variant_child(variant: str, args: list[str], timeout: int) -> dict | None:
    """Runs one GPT variant in a fresh process (``--variant``) and returns its RESULT; a timeout
    or failure is printed (with the child's last output) and gives None."""
    cmd = [sys.executable, __file__, "--variant", variant, *args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ)
    except subprocess.TimeoutExpired:
        print(f"  {variant}: timed out after {timeout}s")
        return None
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not line:
        print(f"  {variant}: failed (rc {p.returncode}): {(p.stderr or p.stdout).strip()[-1500:]}")
        return None
    return json.loads(line[-1][7:])


def profile_table(shape: str, timeout: int, variants=("torch_eager", "holoflow_eager", "holoflow_graph")) -> None:
    for v in variants:
        r = variant_child(v, ["--shape", shape, "--device", DEV, "--profile"], timeout)
        if r is None:
            continue
        print(f"profile {v} ({shape}): wall {r['wall']:.2f} ms/step, host enqueue {r['host']:.2f} ms/step, "
              f"device kernels {r['kernel_ms']:.2f} ms/step in {r['kernels']:.0f} kernels", flush=True)
        for name, ms, c in r["top"]:
            print(f"    {ms:7.3f} ms {c:6.1f}x  {name}")
        print(f"  host-device synchronizations in one step: {len(r['syncs'])} places")
        for where in r["syncs"]:
            print(f"    {where}")


def gpt_table(shape: str, steps: int, peak_tflops: float, timeout: int, variants=VARIANTS) -> None:
    res = {}
    for v in variants:
        r = variant_child(v, ["--shape", shape, "--steps", str(steps), "--device", DEV], timeout)
        if r is None:
            continue
        res[v] = r
        print(f"  {v}: {res[v]['ms']:.2f} ms/step, peak {res[v]['peak'] / 2**30:.2f} GiB, "
              f"first {res[v]['first_s']:.1f}s", flush=True)
    s = SHAPES[shape]
    print(f"GPT {shape} (L={s['L']} d={s['D']} T={s['T']} B={s['B']} V={s['V']}), bf16 autocast, fused AdamW, "
          f"each variant in its own process, {steps} steps:")
    print(f"  {'variant':<16}{'ms/step':>9}{'MFU %':>8}{'peak GiB':>10}{'first s':>9}  first losses")
    for v, r in res.items():
        mfu = r["flops"] / (r["ms"] * 1e-3) / (peak_tflops * 1e12) * 100
        print(f"  {v:<16}{r['ms']:>9.2f}{mfu:>8.1f}{r['peak'] / 2**30:>10.2f}{r['first_s']:>9.1f}  "
              f"{np.round(r['losses'], 4).tolist()}")

    def ratio(a: str, b: str, key: str) -> str:
        return f"{res[a][key] / res[b][key]:.2f}" if a in res and b in res else "n/a"
    print(f"  holoflow eager / torch eager     = {ratio('holoflow_eager', 'torch_eager', 'ms')}  (target <= 1.15)")
    print(f"  nn.Graph / torch.compile         = {ratio('holoflow_graph', 'torch_compile', 'ms')}  (target <= 1.0)")
    print(f"  holoflow.compile / torch.compile = {ratio('holoflow_compile', 'torch_compile', 'ms')}")
    print(f"  nn.Graph compiled / torch.compile = {ratio('holoflow_graph_compile', 'torch_compile', 'ms')}  "
          f"(target <= 1.0)")
    print(f"  nn.Graph / torch eager           = {ratio('holoflow_graph', 'torch_eager', 'ms')}")
    print(f"  peak memory eager / torch eager  = {ratio('holoflow_eager', 'torch_eager', 'peak')}  (target <= 1.0)")
    print(f"  peak memory graph / torch eager  = {ratio('holoflow_graph', 'torch_eager', 'peak')}  (target <= 1.0)")
    print(f"  peak memory compiled graph / torch eager = "
          f"{ratio('holoflow_graph_compile', 'torch_eager', 'peak')}  (target <= 1.0)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("parts", nargs="*", default=["attn", "ops", "gpt", "exec", "profile"])
    ap.add_argument("--small", action="store_true", help="GPT-mini shapes instead of GPT-2 small")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per GPT variant process")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS, help="the GPT part's variants")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the whole script on the CPU")
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--deterministic", action="store_true", help="torch.use_deterministic_algorithms (warn only; "
                    "set CUBLAS_WORKSPACE_CONFIG=:4096:8 too): the executors part's bit-for-bit check without "
                    "the kernels' own non-determinism")
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="gpt2s", help=argparse.SUPPRESS)
    a = ap.parse_args()
    global DEV, PROFILE
    DEV, PROFILE = a.device, a.profile
    if a.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if a.variant:
        print("RESULT " + json.dumps(run_variant(a.variant, a.shape, a.steps)))
        return
    print(torch.__version__, torch.cuda.get_device_name(0) if on_gpu() else DEV, flush=True)
    t = time.time()
    for part in a.parts:
        t0 = time.time()
        try:
            {"ops": op_tables, "attn": attention_check, "exec": lambda: executors_check(a.steps),
             "profile": lambda: profile_table("small" if a.small else "gpt2s", a.timeout),
             "gpt": lambda: gpt_table("small" if a.small else "gpt2s", a.steps, a.peak_tflops, a.timeout,
                                      a.variants)}[part]()
        except Exception:  # the other parts still run; this one's traceback is the figure
            traceback.print_exc()
        print(f"  ({part}: {time.time() - t0:.1f}s)", flush=True)
    print(f"total {time.time() - t:.1f}s")


if __name__ == "__main__":
    main()
