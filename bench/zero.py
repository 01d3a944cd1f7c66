"""ZeRO stages 0-3 of a data-parallel global graph: per-rank bytes of parameters, gradients and
optimizer state, and the parameters after a few steps against single-process training.

    python bench/zero.py                # GPT of bench/dp_overlap.py, 2 simulated ranks, 3 steps
    python bench/zero.py --ranks 4 --steps 5

Ranks are simulated (threads of this process, in-memory collectives): the bytes and values are
the same as on Gloo, the times are not a measurement of anything. For each stage: the local bytes
of the parameters (stage 3 keeps its shards), of the gradients the update reads (stage >= 2:
reduce-scattered shards), of the optimizer state (stage >= 1: shard-sized), the plan's peak, and
the bound ``stage-0 bytes / N + the unsharded remainder`` (parameters too small or with fewer
rows than ranks stay whole); "params vs 1 process" is max |w - w1| / max |w1| over the
parameters after the steps, w1 single-process training's (AdamW divides by sqrt(v): gradients
near zero turn rounding differences of the data-parallel sum into visible ones; ``--sgd`` shows
the rounding level), "vs stage 0" the same against plain data parallelism. Not a timed test.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
SGD = "--sgd" in sys.argv


def run(rank: int | None, n: int, stage: int, steps: int, init: dict | None = None) -> dict:
    import holoflow as flow
    from holoflow.core.sbp import B, S
    from holoflow.examples import gpt
    from holoflow.graph.zero import Zero, state_bytes
    cfg = gpt.Config(n_layer=4, n_embd=128, n_head=4, block_size=64, batch_size=32)
    flow.manual_seed(0)
    model = gpt.make_model(flow, cfg)
    if init is not None:   # the simulated ranks share one RNG: every rank starts from the same weights
        model.load_state_dict(init)
    place = flow.placement("cpu", list(range(n))) if rank is not None else None
    if place is not None:
        model.to_global(place, B)
    params = list(model.parameters())
    eligible = sum(p.numel() * 4 for p in params if place is not None and Zero(1).sharded(p))
    opt = flow.optim.AdamW(model.parameters(), lr=1e-3) if not SGD else \
        flow.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            if stage:
                self.config.enable_zero(True, stage=stage)

        def build(self, x, y):
            if place is not None:
                with flow.utils.global_view.global_mode(True, placement=place, sbp=B):
                    _, loss = self.model(x, y)
            else:
                _, loss = self.model(x, y)
            loss.backward()
            return loss
    graph = Train()
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        xb = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size), generator=g)
        yb = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size), generator=g)
        x, y = flow.from_torch(xb), flow.from_torch(yb)
        if place is not None:
            x, y = (t.to_global(place, B).to_global(sbp=S(0)) for t in (x, y))
        graph(x, y)
    c = next(reversed(graph._compiled.values()))
    state_vals = {v for v, _ in c.ir.state}
    grads = {v for nd in c.ir.nodes if nd.effect for v in nd.value_inputs() if v not in state_vals}
    whole = [(p.to_global(sbp=B).to_local() if place is not None else p).detach().to_torch() for p in params]
    return {"params": sum(p._data.numel() * p._data.element_size() for p in params),
            "grads": sum(v.nbytes for v in grads), "state": state_bytes(opt), "peak": c.peak_bytes,
            "eligible": eligible, "values": whole}


def main() -> None:
    from holoflow.distributed import world
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--sgd", action="store_true", help="SGD with momentum instead of AdamW")
    a = ap.parse_args()
    n = a.ranks
    import holoflow as flow
    from holoflow.examples import gpt
    flow.manual_seed(0)
    cfg = gpt.Config(n_layer=4, n_embd=128, n_head=4, block_size=64, batch_size=32)
    init = {k: v.detach().clone() for k, v in gpt.make_model(flow, cfg).state_dict().items()}
    single = run(None, 1, 0, a.steps, init)
    rows = {}
    for stage in (0, 1, 2, 3):
        rows[stage] = world.simulate(n, lambda r, s=stage: run(r, n, s, a.steps, init), timeout=600)[0]
    base = rows[0]
    cut = base["eligible"] * (n - 1) / n
    print(f"GPT (4 layers, d=128, seq 64, batch 32), {'SGD' if SGD else 'AdamW'}, {n} simulated ranks, "
          f"{a.steps} steps; ZeRO-eligible parameters {base['eligible'] / 2**20:.2f} of "
          f"{base['params'] / 2**20:.2f} MiB")
    print(f"{'stage':<6} {'params MiB':>11} {'grads MiB':>10} {'opt state MiB':>14} {'peak MiB':>9} "
          f"{'vs stage 0':>11} {'vs 1 process':>13}  within bound")
    for stage, r in rows.items():
        diff = max(float((w - s).abs().max() / s.abs().max()) for w, s in zip(r["values"], single["values"]))
        d0 = max(float((w - s).abs().max() / s.abs().max()) for w, s in zip(r["values"], base["values"]))
        ok = []
        for key, from_stage in (("state", 1), ("grads", 2), ("params", 3)):
            per = round(base["state"] / base["params"]) if key == "state" else 1   # state tensors per parameter
            bound = base[key] - (cut * per if stage >= from_stage else 0)
            ok.append(r[key] <= bound + 1024)   # step counters stay whole
        print(f"{stage:<6} {r['params'] / 2**20:11.3f} {r['grads'] / 2**20:10.3f} {r['state'] / 2**20:14.3f} "
              f"{r['peak'] / 2**20:9.2f} {d0:11.1e} {diff:13.1e}  {'yes' if all(ok) else 'NO'}")


if __name__ == "__main__":
    main()
