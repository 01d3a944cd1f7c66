"""Differential fuzzing where the global view and ``nn.Graph`` meet: the random training programs
of tests/graph/test_fuzz_graph.py (random ops over the inputs, a module's parameters and
intermediates, a loss, backward, SGD with momentum or AdamW, 3 steps) run on global tensors:
every parameter and buffer of the module broadcast or split at random, the inputs of random SBPs
(partial sums included), on a 1-D mesh of 2 and a 2x2 mesh of 4 simulated ranks; eagerly and
compiled in an ``nn.Graph`` under a random graph config (fusions, gradient accumulation,
activation checkpointing, ZeRO stage 1/2/3, auto-parallel). Losses, the program's last output and
every parameter and buffer must equal torch's on one device. ``_program(seed, mesh_nd)`` lists a
failing seed's steps and layouts."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import holoflow as flow
from graph import test_fuzz_graph as programs   # (the programs, their module and torch's runs)
from holoflow.core.errors import HoloflowError
from holoflow.distributed import world
from holoflow.sbp import B, P, S

# CI runs 12 programs per mesh and the seeds that found bugs; HOLOFLOW_FUZZ_SEEDS=N runs N (a longer
# local hunt), from HOLOFLOW_FUZZ_FIRST on. Found: 5 (2x2: an output viewing a split parameter was the copy made before the
# step), 107 (2x2: a gradient bucket whose boxing ends in a local reshard sliced the concatenation),
# 201 (2x2: an all-gather of another collective's result was prefetched before that one's wait),
# 345 (1-D: a traced view of a split parameter re-derived with its logical attrs on the shard),
# 435 (a write into an expanded global tensor refused as one differing between shared elements),
# 1065 (2x2, accumulation: an output that is a parameter was planned as a micro-batch's value),
# 1135 (1-D, fused update: an output viewing a parameter was read before the update task ran),
# 1126 (2x2: detach() of a view of a boxed view was a plain tensor, stale after the step),
# 3213 (1-D, ZeRO-3: a no_grad read of w.detach() before w's first op was traced whole, read a shard),
# 4053 (both meshes: a reshape copying an expanded view of a split tensor was made a view of it, so a
# later relu_ of the tensor reached the copy), 5590 (both meshes: an output ``w.t().reshape(-1)`` of a
# parameter, a copy in torch, was re-derived from the parameter after the step as a view), 6722 (1-D:
# a region of a detach()ed expanded view written went on to the source as the alias's whole value:
# refused at run time, writing shared elements), 700385 (1-D, any config: a constant written into the
# whole of a view kept the view's history from before the write, its gradient reached the old value)
FOUND = (5, 107, 201, 345, 435, 1065, 1126, 1135, 3213, 4053, 5590, 6722, 700385)
_FIRST = int(os.environ.get("HOLOFLOW_FUZZ_FIRST", 0))
SEEDS = sorted(set(range(_FIRST, _FIRST + int(os.environ.get("HOLOFLOW_FUZZ_SEEDS", 12)))) | set(FOUND))
CONFIGS = ("plain", "fuse_add_to_output", "fuse_model_update", "grad_acc", "checkpointing", "zero1", "zero2",
           "zero3", "auto_parallel")
# seeds from here run a combination of configs ("zero2+grad_acc+checkpointing"): a longer hunt
# starts there (HOLOFLOW_FUZZ_FIRST=10000); CI's seeds keep single configs
COMBOS_FROM = 10_000
COMBINABLE = ("fuse_add_to_output", "fuse_model_update", "grad_acc", "checkpointing", "zero1", "zero2", "zero3",
              "auto_parallel")   # (auto-parallel with accumulation plans the micro-batch graph: session 30)
MESHES = {"1d": [0, 1], "2x2": [[0, 1], [2, 3]]}
# A graph accumulating gradients returns its outputs' micro-batch shards packed back in row
# order; an output split along dim 0 in other blocks than the batch inputs is refused, naming it
REFUSED = "splits dim 0 into other blocks of rows than the batch inputs"


def _layouts(seed: int, mesh_nd: int) -> tuple:
    """(SBP of x, of z, per parameter/buffer name, config) of ``seed`` on a mesh of ``mesh_nd`` dims."""
    rng = np.random.default_rng(seed + 30_000)

    def pick(ndim: int, partial: bool) -> tuple:
        options = [B] + [S(a) for a in range(ndim)] + ([P] if partial else [])
        return tuple(options[int(rng.integers(0, len(options)))] for _ in range(mesh_nd))
    m = programs._weights(torch, seed)
    state = {k: pick(v.dim(), False) for k, v in m.state_dict().items() if v.is_floating_point()}
    x_sbp, z_sbp, config = pick(2, True), pick(2, True), CONFIGS[int(rng.integers(0, len(CONFIGS)))]
    if seed >= COMBOS_FROM and config not in ("plain", "auto_parallel"):
        # a combination of configs, as a user sets them together (ZeRO with accumulation and
        # checkpointing...): one or two more, at most one ZeRO stage
        others = [c for c in COMBINABLE if c != config and not (c.startswith("zero") and config.startswith("zero"))]
        more = [others[i] for i in rng.choice(len(others), size=int(rng.integers(1, 3)), replace=False)]
        if sum(c.startswith("zero") for c in more) > 1:
            more = [c for c in more if not c.startswith("zero")][:1] or more[:1]
        config = "+".join(sorted({config, *more}))
    if _accumulates(config) and _writes_an_input(seed):
        # (a global graph's micro-batches refuse programs that write their inputs)
        config = "+".join(c for c in config.split("+") if c != "grad_acc") or "plain"
    if _accumulates(config):
        # micro-batches cut each rank's dim-0 shard (OneFlow's): every input splitting dim 0 must
        # split it alike (else the graph refuses, naming them), in blocks of whole micro-batches
        if S(0) in x_sbp and S(0) in z_sbp:
            z_sbp = x_sbp
        x_sbp, z_sbp = (s if len(_blocks(s, mesh_nd)) * 2 <= programs.BATCH else (B,) * mesh_nd for s in (x_sbp, z_sbp))
    return x_sbp, z_sbp, state, config


def _accumulates(config: str) -> bool:
    return "grad_acc" in config.split("+")


def _writes_an_input(seed: int) -> bool:
    """Whether the program of ``seed`` writes in place into memory of its inputs x and z (pool 0, 1)."""
    program = programs._generate(seed)[0]
    pool = programs._shapes(program, seed)
    written = {pool[operands[0]].untyped_storage().data_ptr() for name, operands, _ in program
               if name in programs.INPLACE and name != "buffer_update"}
    return any(pool[i].untyped_storage().data_ptr() in written for i in (0, 1))


def _blocks(sbp: tuple, mesh_nd: int) -> list:
    """The blocks of dim 0 (``(start, stop)`` rows) the shards of a batch input of ``sbp`` hold, in
    row order, on a mesh of 2 per axis (a mesh axis of ``S(0)`` halves each block)."""
    blocks = [(0, programs.BATCH)]
    for s in sbp:
        if s == S(0):
            blocks = [half for a, b in blocks for half in ((a, (a + b) // 2), ((a + b) // 2, b))]
    return blocks


def _micro_rows(x_sbp: tuple, z_sbp: tuple, acc: int) -> list:
    """The rows of each of ``acc`` micro-batches: the k-th piece of every dim-0 block."""
    split = next((s for s in (x_sbp, z_sbp) if S(0) in s), ())
    blocks = _blocks(split, len(split)) if split else [(0, programs.BATCH)]
    return [[r for a, b in blocks for r in range(a + k * (b - a) // acc, a + (k + 1) * (b - a) // acc)]
            for k in range(acc)]


def _reference(seed: int, rows: list) -> tuple:
    """torch on one device, micro-batch ``k`` holding the batch rows ``rows[k]``."""
    program, weights, _, opt_kind = programs._generate(seed)
    torch.manual_seed(0)
    m = programs._weights(torch, seed)
    opt = programs._optimizer(torch, m, opt_kind)
    x, z = (torch.tensor(v) for v in programs._pools(seed, programs.BATCH))
    losses, outs = [], []
    for _ in range(programs.TRAIN_STEPS):
        opt.zero_grad(set_to_none=True)
        for r in rows:   # (one micro-batch: the inputs themselves, which the program may write)
            loss, out = m(x[r], z[r], program, weights) if len(rows) > 1 else m(x, z, program, weights)
            losses.append(float(loss.detach()))
            if loss.requires_grad:
                (loss / len(rows) if len(rows) > 1 else loss).backward()
        opt.step()
        outs.append(programs._np(out))
    return losses, outs, programs._state(m)


def _program(seed: int, mesh_nd: int) -> str:
    x_sbp, z_sbp, state, config = _layouts(seed, mesh_nd)
    return (f"  x {x_sbp}, z {z_sbp}, graph config {config}\n  state {state}\n" + programs._program(seed))


def _whole(t) -> np.ndarray:
    """A global tensor's logical value (every rank gathers it)."""
    nd = t.placement.ndim
    return t.detach().to_global(sbp=(B,) * nd).to_local().to(torch.get_default_dtype()).numpy().copy()


def _global_module(seed: int, place, state_sbps: dict):
    flow.manual_seed(0)
    m = programs._weights(flow, seed)
    return m.to_global(place, lambda name, t: state_sbps.get(name, (B,) * place.ndim))


def _inputs(seed: int, place, x_sbp: tuple, z_sbp: tuple) -> tuple:
    whole = (B,) * place.ndim
    return tuple(flow.tensor(v).to_global(placement=place, sbp=whole).to_global(sbp=s)
                 for v, s in zip(programs._pools(seed, programs.BATCH), (x_sbp, z_sbp)))


def _run(seed: int, place, graph: bool) -> tuple:
    """(losses, outputs, state) of the program on global tensors, eager or as an nn.Graph."""
    program, weights, _, opt_kind = programs._generate(seed)
    x_sbp, z_sbp, state_sbps, config = _layouts(seed, place.ndim)
    m = _global_module(seed, place, state_sbps)
    opt = programs._optimizer(flow, m, opt_kind)
    acc = 2 if _accumulates(config) else 1
    x, z = _inputs(seed, place, x_sbp, z_sbp)
    losses, outs = [], []
    if graph:
        g = programs._Train(m, opt, program, weights)
        programs.configure(g, config)
        for _ in range(programs.TRAIN_STEPS):
            loss, out = g(x, z)
            losses.extend(_whole(loss).reshape(-1).tolist())   # one loss per micro-batch under acc
            outs.append(_whole(out))
    else:
        pieces = [[flow.cat([t[r:r + 1] for r in rows]) for rows in _micro_rows(x_sbp, z_sbp, acc)] if acc > 1
                  else [t] for t in (x, z)]
        for _ in range(programs.TRAIN_STEPS):
            opt.zero_grad(set_to_none=True)
            for xc, zc in zip(*pieces):
                loss, out = m(xc, zc, program, weights)
                losses.append(float(_whole(loss)))
                if loss.requires_grad:
                    (loss / acc if acc > 1 else loss).backward()
            opt.step()
            outs.append(_whole(out))
    return losses, outs, {k: _whole(v) for k, v in m.state_dict().items()}


def _runs(mesh, seeds) -> list:
    """Per simulated rank, ``{seed: (eager, graph) or the exception}``."""
    def rank_fn(rank: int) -> dict:
        place = flow.placement("cpu", mesh)
        out = {}
        for seed in seeds:
            try:
                eager = _run(seed, place, graph=False)
                try:
                    graph = _run(seed, place, graph=True)
                except HoloflowError as e:
                    if REFUSED not in str(e):
                        raise
                    graph = None   # (the documented refusal: compared eagerly only)
                out[seed] = (eager, graph)
            except Exception as e:   # noqa: BLE001 - reported with the program below
                out[seed] = e
        return out

    return world.simulate(int(np.asarray(mesh).size), rank_fn, timeout=1200)


def _agree(seed: int, mesh, results: list, tol: float) -> None:
    """Every rank's eager and graph runs of ``seed`` against torch on one device, within ``tol``."""
    nd = np.asarray(mesh).ndim
    x_sbp, z_sbp, _, config = _layouts(seed, nd)
    acc = 2 if _accumulates(config) else 1
    want = _reference(seed, _micro_rows(x_sbp, z_sbp, acc))
    where = f"seed {seed} on mesh {mesh}:\n{_program(seed, nd)}"
    for rank, res in enumerate(results):
        if isinstance(res[seed], Exception):
            raise AssertionError(f"rank {rank} raised {res[seed]!r}. {where}") from res[seed]
        eager, graph = res[seed]
        programs._assert_close(eager, want, tol, f"rank {rank}: global eager vs torch\n{where}")
        if graph is None:
            continue
        # (under accumulation the graph returns the last micro-batch's output, eager each one's)
        programs._assert_close(graph, want, tol, f"rank {rank}: global graph vs torch\n{where}",
                               outputs=acc == 1)


def _agree_or_rounding(seed: int, mesh, results: list) -> None:
    """float32 within 1e-4; where that fails, the program rerun in float64 must agree to 1e-9:
    float32 sums over shards in another order than torch's on one device, which some programs
    amplify (seed 4189: 5e-4 after three SGD steps in float32, equal in float64). A wrong rule
    fails both."""
    try:
        _agree(seed, mesh, results, 1e-4)
    except AssertionError as in_float32:
        if any(isinstance(res[seed], Exception) for res in results):
            raise
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            _agree(seed, mesh, _runs(mesh, [seed]), 1e-9)
        except AssertionError as in_float64:
            raise in_float64 from in_float32
        finally:
            torch.set_default_dtype(before)


@pytest.mark.parametrize("mesh", list(MESHES.values()), ids=list(MESHES))
def test_random_global_training_programs_agree_with_torch(mesh):
    results = _runs(mesh, SEEDS)
    for seed in SEEDS:
        _agree_or_rounding(seed, mesh, results)


@pytest.mark.parametrize("mesh", list(MESHES.values()), ids=list(MESHES))
def test_float32_rounding_is_told_from_a_wrong_rule(mesh):
    """Seed 4189 is 5e-4 off in float32 and equal in float64: the float64 run is what passes it."""
    results = _runs(mesh, [4189])
    with pytest.raises(AssertionError):
        _agree(4189, mesh, results, 1e-4)
    _agree_or_rounding(4189, mesh, results)
