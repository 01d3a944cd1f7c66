"""Pipeline schedules of nn.Graph (graph/pipeline.py), measured from the actor runtime's trace.

    python bench/pipeline.py                      # p=2 (m=4, 8) and p=4 (m=8), 1F1B and GPipe
    python bench/pipeline.py --kernel matmul      # real compute instead of timed kernels
    python bench/pipeline.py --trace pipe.json    # also one merged Perfetto trace (last config)

Balanced synthetic stages on simulated ranks (one thread per rank): each stage is a Linear(16, 16)
(parameters and gradients, so the optimizer and the gradient accumulation run) and a synthetic
kernel taking ``--ms`` in forward and twice that in backward. With ``--kernel sleep`` (default)
the kernel waits (no CPU), so the figures are the schedule's own on any machine; with
``--kernel matmul`` it multiplies ``--d`` x ``--d`` matrices (then the stages share this machine's
cores, and p > cores distorts the figures).

Per stage, the bubble is the idle fraction of its compute lane over each step's makespan (first
forward anywhere to last backward anywhere), read from the runtime's recorded acts, averaged over
the steps after the first, best of ``--rounds`` runs (other load on the machine only adds idle
time); the ideal is (p-1)/(m+p-1) for both 1F1B and GPipe; for zb-h1 (p-1)/(3m+p-1), the zero-bubble
paper's H1 figure for F = B_input = W, and its worst stage is compared with 1F1B's measured
bubble (the ideal ratio is (m+p-1)/(3m+p-1), about a third). Memory: the most micro-batches a
stage held in flight (forward done, backward not yet) and the peak activation bytes it kept, from
the runtime: 1F1B holds at most p - stage, GPipe up to m; ZB-H1 holds 1F1B's in flight plus the
inputs of its deferred weight gradients (the layer inputs and output gradients of the weight ops,
up to s + 1 micro-batches on stage s; at most p micro-batches between a forward and its weight
gradients), printed separately. Not a timed test.

``zb-h1-mem`` is ``set_pipeline_schedule("zb-h1", memory="1f1b")``: a stage defers only the
weight gradients whose inputs fit in one micro-batch's activations, chosen by the work the plan
estimates from shapes. On ``--stage gpt`` with a timed kernel the timed op's weight gradient holds
all the time but looks cheap (an elementwise op), so that row is a worst case; the real split is
measured with the blocks' own compute:

    python bench/pipeline.py --stage gpt --kernel none --gpt-d 256 --gpt-t 64 --configs 2:8
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import torch  # noqa: E402

import holoflow as flow  # noqa: E402
from holoflow.core.dispatch import apply  # noqa: E402
from holoflow.core.sbp import B  # noqa: E402
from holoflow.distributed import world  # noqa: E402
from holoflow.ops.family import binary, unary  # noqa: E402
from holoflow.runtime.timeline import bubble_fractions  # noqa: E402

KERNEL = {"kind": "sleep", "d": 512}
STAGE = {"kind": "linear"}      # --stage: "linear" (Linear(16, 16)) or "gpt" (a GPT block, d=32, T=16)
GPT = {"d": 32, "T": 16}   # --gpt-d, --gpt-t


def _work(x: torch.Tensor, ms: float = 0.0) -> torch.Tensor:
    if x.device.type != "meta" and ms > 0:
        if KERNEL["kind"] == "sleep":
            time.sleep(ms / 1000)
        else:   # about ms of matmuls
            a = torch.ones(KERNEL["d"], KERNEL["d"])
            t_end = time.perf_counter() + ms / 1000
            while time.perf_counter() < t_end:
                a = a @ a * 1e-3
    return x.clone()


WORK = unary("bench_pipeline_work", _work)


def _scale_grad(ctx, dy):
    # backward = an input gradient and a weight gradient, each as long as the forward
    a, b = ctx.inputs
    return apply(WORK, dy * b, ms=ctx.ms), apply(WORK, (dy * a).sum(0), ms=ctx.ms)


SCALE = binary("bench_pipeline_scale", lambda a, b, ms=0.0: _work(a, ms) * b, _scale_grad, "inputs")


class Stage(flow.nn.Module):
    """A Linear(16, 16) and a synthetic op: forward ``ms``; backward ``ms`` for the input gradient
    and ``ms`` for the weight gradient (so F = B_input = W, as the zero-bubble paper assumes)."""

    def __init__(self, ms: float):
        super().__init__()
        self.fc, self.ms = flow.nn.Linear(16, 16), ms
        self.w = flow.nn.Parameter(flow.ones(16))

    def forward(self, x):
        return apply(SCALE, self.fc(x), self.w, ms=self.ms)


class GPTStage(flow.nn.Module):
    """A GPT block (examples/gpt.py: layer norms, causal attention through SDPA, MLP) and the
    timed op on its flattened output: a realistic ratio of activations to weight-gradient inputs."""

    def __init__(self, ms: float):
        super().__init__()
        from holoflow.examples import gpt
        self.block = gpt.build(flow)(17, GPT["T"], 1, GPT["d"], max(2, GPT["d"] // 64)).blocks[0]
        self.w, self.ms = flow.nn.Parameter(flow.ones(GPT["d"])), ms

    def forward(self, x):
        h = self.block(x)
        if KERNEL["kind"] == "none":   # the block's own compute only
            return h
        return apply(SCALE, h.reshape(-1, GPT["d"]), self.w, ms=self.ms).reshape(h.shape)


def run_rank(rank: int, p: int, m: int, schedule: str, ms: float, steps: int, batch: int, trace: str | None):
    places = [flow.placement("cpu", ranks=[s]) for s in range(p)]
    flow.manual_seed(0)
    make = GPTStage if STAGE["kind"] == "gpt" else Stage
    stages = [make(ms) for _ in range(p)]
    for st, pl in zip(stages, places):
        st.to_global(placement=pl, sbp=[B])
    seq = flow.nn.Sequential(*stages)
    opt = flow.optim.SGD(seq.parameters(), lr=0.01)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.seq = seq
            for i, pl in enumerate(places):
                self.seq[i].to(flow.nn.graph.GraphModule).set_stage(i, pl)
            self.config.set_gradient_accumulation_steps(m)
            if schedule == "zb-h1-mem":
                self.config.set_pipeline_schedule("zb-h1", memory="1f1b")
            else:
                self.config.set_pipeline_schedule(schedule)
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.seq(x).square().mean()
            loss.backward()
            return loss

    g = G()
    shape = (batch // 4, GPT["T"], GPT["d"]) if STAGE["kind"] == "gpt" else (batch, 16)
    x = flow.tensor(torch.randn(*shape)).to_global(placement=places[0], sbp=[B])
    for _ in range(steps):
        g(x)
    c = next(iter(g._compiled.values()))
    if trace:
        g.write_trace(trace)
    return c.acts(), dict(c.mem), c.stage


def measure(p: int, m: int, schedule: str, ms: float, steps: int, batch: int, trace: str | None = None) -> dict:
    res = world.simulate(p, lambda r: run_rank(r, p, m, schedule, ms, steps, batch, trace), timeout=600)
    acts = [a for part, _, _ in res for a in part if a["step"] >= 1]   # step 0 compiles and warms up
    bubbles = bubble_fractions(acts)
    return {"bubble": [bubbles[r] for r in range(p)], "mem": [mem for _, mem, _ in res],
            "ideal": (p - 1) / (m + p - 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", choices=["sleep", "matmul", "none"], default="sleep",
                    help="none (with --stage gpt): no timed op, the GPT block's own compute")
    ap.add_argument("--ms", type=float, default=10.0, help="forward ms per stage per micro-batch (backward 2x)")
    ap.add_argument("--d", type=int, default=256, help="matmul size for --kernel matmul")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="runs per config; the best is printed")
    ap.add_argument("--configs", default="2:4,2:8,4:8", help="p:m pairs")
    ap.add_argument("--trace", default=None)
    ap.add_argument("--stage", choices=["linear", "gpt"], default="linear",
                    help="linear: Linear(16, 16) + timed op; gpt: a GPT block (d=32, T=16) + timed op")
    ap.add_argument("--gpt-d", type=int, default=32, help="model width of the GPT block stages")
    ap.add_argument("--gpt-t", type=int, default=16, help="sequence length of the GPT block stages")
    args = ap.parse_args()
    KERNEL.update(kind=args.kernel, d=args.d)
    STAGE.update(kind=args.stage)
    GPT.update(d=args.gpt_d, T=args.gpt_t)
    if args.kernel == "none" and args.stage != "gpt":
        ap.error("--kernel none needs --stage gpt (the linear stage has no compute of its own)")
    torch.set_num_threads(1)
    print(f"pipeline bench: {args.kernel} kernels, {args.ms} ms forward / {2 * args.ms} ms backward per stage "
          f"and micro-batch, {args.steps} steps (first dropped), simulated ranks, best of {args.rounds} rounds")
    print(f"{'p':>2} {'m':>2} {'schedule':<8} {'ideal':>6}  {'bubble per stage':<28} {'worst dev':>9}  "
          f"{'in flight per stage':<20} peak activation bytes per stage")
    ok, prev = True, None
    configs = [tuple(int(v) for v in c.split(":")) for c in args.configs.split(",")]
    for i, (p, m) in enumerate(configs):
        for schedule in ("1f1b", "gpipe", "zb-h1", "zb-h1-mem"):
            last = i == len(configs) - 1 and schedule == "zb-h1"
            rounds = [measure(p, m, schedule, args.ms, args.steps, 8 * m, args.trace if last else None)
                      for _ in range(args.rounds)]
            r = min(rounds, key=lambda x: max(x["bubble"]))   # best round: load only adds idle time
            if schedule == "zb-h1-mem":   # memory-capped ZB-H1: its bubble and peak next to 1F1B's
                ratio = max(r["bubble"]) / max(prev["bubble"])
                nbytes = [mm["peak_bytes"] for mm in r["mem"]]
                print(f"{p:>2} {m:>2} {schedule:<8} {'':>6}  {' '.join(f'{b:.3f}' for b in r['bubble']):<28} "
                      f"{'':>9}  {str([mm['peak_in_flight'] for mm in r['mem']]):<20} {nbytes}\n{'':>12}"
                      f"worst bubble {ratio:.2f}x 1F1B's; peak activation bytes "
                      f"{max(nbytes) / max(prev['bytes']):.3f}x 1F1B's (its memory bound)")
                continue
            if schedule == "zb-h1":   # bubble (p-1)(F + B_input - W) over m(F + B_input + W): F = B_input = W
                r["ideal"] = (p - 1) / (3 * m + p - 1)
            dev = max(abs(b - r["ideal"]) / r["ideal"] for b in r["bubble"])
            flight = [mm["peak_in_flight"] for mm in r["mem"]]
            nbytes = [mm["peak_bytes"] for mm in r["mem"]]
            bound = [min(m, p - s) if schedule != "gpipe" else m for s in range(p)]
            line = (f"{p:>2} {m:>2} {schedule:<8} {r['ideal']:>6.3f}  "
                    f"{' '.join(f'{b:.3f}' for b in r['bubble']):<28} {100 * dev:>8.1f}%  "
                    f"{str(flight):<20} {nbytes}")
            if schedule == "zb-h1":
                # gated: the worst stage's bubble against 1F1B's measured one (ZB-H1's ideal is
                # (p-1)/(3m+p-1), a third of 1F1B's for large m), and activation bytes against
                # 1F1B's plus what the deferred weight gradients keep (their inputs)
                ratio = max(r["bubble"]) / max(prev["bubble"])
                wbytes = [mm["peak_w_bytes"] for mm in r["mem"]]
                wwait = [mm["peak_w_waiting"] for mm in r["mem"]]
                ideal_ratio = r["ideal"] / ((p - 1) / (m + p - 1))
                mem_ok = all(z <= f + wb for z, f, wb in zip(nbytes, prev["bytes"], wbytes))
                within = ratio <= ideal_ratio * 1.25 and mem_ok and all(f <= b for f, b in zip(flight, bound))
                ok &= within
                print(line + f"\n{'':>12}worst bubble {ratio:.2f}x 1F1B's (ideal {ideal_ratio:.2f}x); "
                      f"W waiting at most {wwait} micro-batches, their inputs {wbytes} bytes; "
                      f"peak <= 1F1B's {prev['bytes']} + W inputs: {'ok' if within else 'OUT OF BOUNDS'}")
                continue
            r["bytes"] = nbytes
            if schedule == "1f1b":
                prev = r
            within = dev <= 0.10 and all(f <= b for f, b in zip(flight, bound))
            ok &= within
            print(line + f"  (bound {bound}) {'ok' if within else 'OUT OF BOUNDS'}")
    if args.trace:
        print(f"trace of the last 1F1B config written to {args.trace}: open it at https://ui.perfetto.dev")
    print("all within bounds (1F1B / GPipe: 10% of (p-1)/(m+p-1) and in-flight bounds; ZB-H1: bubble within 25% "
          "of its ideal ratio to 1F1B's, bytes <= 1F1B's + deferred W inputs)" if ok else "SOME FIGURES OUT OF BOUNDS")


if __name__ == "__main__":
    main()
