"""nn.Graph vs PyTorch eager and torch.compile on GPT-mini and the small CNN (CPU training steps).

Run: ``PYTHONPATH=src python bench/graph.py [--steps N] [--no-compile]``. Prints step times, ratios
(graph / torch eager, target <= 0.7; graph / torch.compile, target <= 1.0), first-call compile
time (target <= 10 s) and activation memory (graph's planned peak / torch eager's saved tensors,
target <= 0.8).

Measured (2 CPU cores shared with other jobs, 10 steps; noisy):
  GPT-mini: graph 63.8 ms | holoflow eager 84.4 | torch eager 48.3 | torch.compile 64.0 ms/step
            graph/torch eager 1.32 (MISSED, target 0.7); graph/torch.compile 1.00 (met, borderline);
            first call 8.8 s (met; 6.9 s trace, most of it the one-off meta-kernel/_dynamo import);
            planned peak 2.40 MiB / torch saved tensors 2.79 MiB = 0.86 (MISSED, target 0.8)
  CNN:      graph 124 ms | holoflow eager 121 | torch eager 189 | torch.compile 27.6 ms/step
            graph/torch eager 0.66 (met); graph/torch.compile 4.49 (MISSED); first call 0.66 s;
            memory 0.70 (met)
Profile (graph.config.enable_profiling, GPT-mini, per iteration): linear 16.2 ms (26%), sdpa
backward 8.5 ms (14%), linear_grad_weight 7.5 ms, layer_norm 6.6 ms, linear_grad_input 5.8 ms,
gelu 3.1 ms, adamw_update 2.4 ms: the time is inside aten kernels (on contended cores), not in
holoflow's per-node overhead; the graph already beats holoflow eager by 25%. Reaching 0.7x torch
eager needs kernel-level work: fusing bias/GELU/residual adds (fuse_add_to_output, elementwise
fusion passes, not yet written), a fused linear backward (one addmm for grad_input+grad_weight
per layer), and avoiding the 9 sum_to_size reductions for biases. torch.compile's CNN win is
inductor's fused conv+BN+ReLU C++ code; matching it needs codegen beyond direct kernel calls.
Memory: the planned peak counts every intermediate (including the fp32 logits and their grad),
torch's figure counts only saved tensors; activation checkpointing lowers the planned peak.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import holoflow as flow
from holoflow.examples import cnn, gpt
from holoflow.graph import Graph


class Train(Graph):
    def __init__(self, m, opt, loss_fn):
        super().__init__()
        self.model, self.loss_fn = m, loss_fn
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = self.loss_fn(self.model, x, y)
        loss.backward()
        return loss


def gpt_case(lib):
    lib.manual_seed(0)
    m = gpt.build(lib)(65, 32, 2, 64, 4)
    rng = np.random.default_rng(0)
    x, y = (lib.tensor(rng.integers(0, 65, (8, 32))) for _ in range(2))
    return m, lib.optim.AdamW(m.parameters(), lr=1e-3), (x, y), lambda m, x, y: m(x, y)[1]


def cnn_case(lib):
    lib.manual_seed(0)
    m = cnn.build(lib)(32)
    rng = np.random.default_rng(0)
    x = lib.tensor(rng.standard_normal((64, 1, 8, 8)).astype(np.float32))
    y = lib.tensor(rng.integers(0, 10, (64,)))
    return m, lib.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), (x, y), \
        lambda m, x, y: lib.nn.functional.cross_entropy(m(x), y)


def timeit(step, steps: int) -> float:
    for _ in range(3):
        step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps


def torch_step(m, opt, batch, loss_fn):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(m, *batch)
        loss.backward()
        opt.step()
        return loss
    return step


def saved_bytes(m, opt, batch, loss_fn) -> int:
    """Bytes autograd saves for backward in one torch eager step (activation memory)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(m, *batch)
    return total[0]


def bench(name: str, case, steps: int, compile_: bool) -> dict:
    m, opt, batch, loss_fn = case(flow)
    g = Train(m, opt, loss_fn)
    t0 = time.perf_counter()
    g(*batch)
    first = time.perf_counter() - t0
    c = next(iter(g._compiled.values()))
    t_graph = timeit(lambda: g(*batch), steps)
    t_flow = timeit(torch_step(*case(flow)), steps)
    tm, topt, tbatch, tloss = case(torch)
    t_torch = timeit(torch_step(tm, topt, tbatch, tloss), steps)
    t_compiled = float("nan")
    if compile_:
        cm, copt, cbatch, closs = case(torch)
        cstep = torch.compile(torch_step(cm, copt, cbatch, closs))
        t_compiled = timeit(cstep, steps)
    r = dict(name=name, nodes=len(c.ir.nodes), first=first, trace=c.compile_s, graph=t_graph, flow_eager=t_flow,
             torch=t_torch, compiled=t_compiled, planned=c.peak_bytes, saved=saved_bytes(tm, topt, tbatch, tloss))
    return r


def report(r: dict) -> None:
    print(f"== {r['name']}: {r['nodes']} IR nodes")
    print(f"  step ms: graph {r['graph'] * 1e3:.2f} | holoflow eager {r['flow_eager'] * 1e3:.2f} | "
          f"torch eager {r['torch'] * 1e3:.2f} | torch.compile {r['compiled'] * 1e3:.2f}")
    print(f"  graph / torch eager   = {r['graph'] / r['torch']:.2f}  (target <= 0.7)")
    print(f"  graph / torch.compile = {r['graph'] / r['compiled']:.2f}  (target <= 1.0)")
    print(f"  first call {r['first']:.2f} s (trace+passes+lower {r['trace']:.2f} s; target <= 10 s)")
    print(f"  memory: planned peak {r['planned'] / 2**20:.2f} MiB / torch saved {r['saved'] / 2**20:.2f} MiB "
          f"= {r['planned'] / max(r['saved'], 1):.2f}  (target <= 0.8)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    cases = (("GPT-mini (2 layers, d=64, seq 32, batch 8)", gpt_case), ("CNN (width 32, batch 64)", cnn_case))
    for name, case in cases:
        report(bench(name, case, a.steps, not a.no_compile))


if __name__ == "__main__":
    main()
