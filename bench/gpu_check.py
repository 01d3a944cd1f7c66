"""All CUDA checks in one run (the device machine is lent briefly): op tables on CUDA against
torch, a GPT trained on CUDA under holoflow eager and nn.Graph against torch, and step times.

    PYTHONPATH=src:tests python bench/gpu_check.py
"""
from __future__ import annotations

import importlib
import sys
import time

import numpy as np
import torch

import holoflow as flow
from holoflow.examples import gpt

MODULES = ["ops.test_elementwise", "ops.test_reduction", "ops.test_linalg", "ops.test_shape",
           "ops.test_indexing", "ops.test_nn_ops", "ops.test_loss", "ops.test_nn_extra"]


def cuda(x):
    if isinstance(x, torch.Tensor):
        return x.cuda()
    if isinstance(x, (list, tuple)):
        return type(x)(cuda(v) for v in x)
    if isinstance(x, dict):
        return {k: cuda(v) for k, v in x.items()}
    return x


def op_tables() -> None:
    import harness
    ok = bad = 0
    failures = []
    for mod in MODULES:
        for case in importlib.import_module(mod).CASES:
            if case.random:
                continue
            make = case.make
            case.make = lambda dt, g, _m=make: cuda(_m(dt, g))
            try:
                harness.run_case(case, torch.float32)
                ok += 1
            except Exception as e:  # reported below, counted
                bad += 1
                failures.append(f"{case.name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            finally:
                case.make = make
    print(f"op tables on CUDA (float32, fwd+bwd vs torch on CUDA): {ok} passed, {bad} failed")
    for f in failures[:25]:
        print("   ", f)


def step_time(fn, steps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e3


def gpt_cuda() -> None:
    rng = np.random.default_rng(0)
    for (L, D, T, Bsz) in [(2, 64, 32, 8), (6, 384, 256, 32)]:
        res = {}
        xs, ys = rng.integers(0, 65, (Bsz, T)), rng.integers(0, 65, (Bsz, T))
        for name, lib in (("torch", torch), ("holoflow", flow)):
            lib.manual_seed(0)
            m = gpt.build(lib)(65, T, L, D, 6 if D % 6 == 0 else 4).cuda()
            opt = lib.optim.AdamW(m.parameters(), lr=1e-3)
            x, y = lib.tensor(xs).cuda(), lib.tensor(ys).cuda()

            def step(m=m, opt=opt, x=x, y=y, lib=lib):
                with lib.autocast("cuda", dtype=lib.bfloat16):
                    _, loss = m(x, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                return loss
            losses = [float(step()) for _ in range(5)]
            res[name] = (losses, step_time(step, 20))
            if lib is flow:
                class G(flow.nn.Graph):
                    def __init__(s):
                        super().__init__()
                        s.m = m
                        s.add_optimizer(opt)
                        s.config.enable_amp(True, dtype=flow.bfloat16)
                        s.config.allow_fuse_model_update_ops(True)

                    def build(s, x, y):
                        _, loss = s.m(x, y)
                        loss.backward()
                        return loss
                g = G()
                t0 = time.perf_counter()
                g(x, y)
                compile_s = time.perf_counter() - t0
                res["graph"] = ([float(g(x, y)) for _ in range(3)], step_time(lambda: g(x, y), 20))
                print(f"  graph first call {compile_s:.2f}s")
        (tl, tt), (hl, ht), (gl, gt) = res["torch"], res["holoflow"], res["graph"]
        print(f"GPT L={L} d={D} T={T} B={Bsz} bf16 on CUDA: step ms torch {tt:.2f} holoflow eager {ht:.2f} "
              f"(ratio {ht / tt:.2f}) graph {gt:.2f} (graph/torch {gt / tt:.2f})")
        print(f"  first 5 losses torch {np.round(tl, 4).tolist()} holoflow {np.round(hl, 4).tolist()}")
        print(f"  graph losses (after eager steps) {np.round(gl, 4).tolist()}")


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(0))
    t = time.time()
    for part in sys.argv[1:] or ["ops", "gpt"]:
        {"ops": op_tables, "gpt": gpt_cuda}[part]()
    print(f"total {time.time() - t:.1f}s")
