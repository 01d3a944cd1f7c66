"""Plan builders shared by the runtime tests."""
import random
import time

import torch

from holoflow.runtime import Plan, TaskSpec

D = 4
STREAMS = ("compute", "comm", "h2d")


def _mix_fn(mats, n_out):
    """Deterministic torch work: out_j = tanh(sum_k v_k @ M_kj) (a constant when nothing is consumed)."""
    def fn(*vals):
        outs = []
        for j in range(n_out):
            acc = mats[-1][j].clone()
            for k, v in enumerate(vals):
                acc = acc + v @ mats[k][j]
            outs.append(torch.tanh(acc))
        return tuple(outs)
    return fn


def random_plan(seed: int) -> Plan:
    """A random DAG over several streams with loop-carried state, multi-consumer regsts, random
    slot counts and, sometimes, tasks that consume nothing or only state (tick-gated)."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    inputs = [f"x{i}" for i in range(rng.randint(1, 2))]
    state = [f"s{i}" for i in range(rng.randint(1, 2))]
    initial = {s: torch.randn(D, D, generator=g) for s in state}
    available = inputs + state
    specs = []
    for k in range(rng.randint(3, 7)):
        cons = [] if rng.random() < 0.1 else rng.sample(available, rng.randint(1, min(3, len(available))))
        prods = [f"t{k}_{j}" for j in range(rng.randint(1, 2))]
        specs.append([f"task{k}", rng.choice(STREAMS), cons, prods, rng.randint(1, 3)])
        available += prods
    for s in state:      # each state regst gets its next value from a random task
        spec = rng.choice(specs)
        spec[3].append(s)
        spec[4] = max(spec[4], 2)
    tasks = []
    for name, stream, cons, prods, rn in specs:
        mats = [[torch.randn(D, D, generator=g) / 2 for _ in prods] for _ in range(len(cons) + 1)]
        tasks.append(TaskSpec(name, stream, _mix_fn(mats, len(prods)), tuple(cons), tuple(prods),
                              register_num=rn, source=f"plans.py:{name}"))
    produced = [r for _, _, _, prods, _ in specs for r in prods if r not in state]
    outputs = rng.sample(produced, min(3, len(produced))) + rng.sample(state, 1) + inputs[:1]
    return Plan(tasks, inputs=tuple(inputs), outputs=tuple(outputs), initial=initial,
                input_register_num=rng.randint(1, 3))


def random_feeds(plan: Plan, n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(1000 + seed)
    return [{x: torch.randn(D, D, generator=g) for x in plan.inputs} for _ in range(n)]


def sleeper(seconds: float):
    def fn(v):
        if seconds:                 # sleep(0) would still wait for the GIL: keep 0 really instant
            time.sleep(seconds)
        return (v,)
    return fn


def chain(register_num: int, sleeps: tuple[float, ...], input_register_num: int = 2,
          same_stream: bool = False) -> Plan:
    """x -> stage0 -> stage1 -> ... each sleeping, on its own stream unless ``same_stream``."""
    tasks, prev = [], "x"
    for k, s in enumerate(sleeps):
        stream = "compute" if same_stream else f"s{k}"
        tasks.append(TaskSpec(f"stage{k}", stream, sleeper(s), (prev,), (f"r{k}",), register_num=register_num))
        prev = f"r{k}"
    return Plan(tasks, inputs=("x",), outputs=(prev,), input_register_num=input_register_num)
