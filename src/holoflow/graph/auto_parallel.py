"""Automatic parallel planning: ``graph.config.enable_auto_parallel()`` chooses the SBP of the
parameters of a graph of global tensors with one cost model that predicts step time and memory.

What is chosen. The parameters the user left broadcast on a 1-D placement (every parameter with
``enable_auto_parallel_ignore_user_sbp_config()``), each among ``B`` and ``S(d)`` for every dim
``d`` the ranks divide evenly. The rest follows: while ``build`` is traced every op takes the
signature the one cost function picks for its inputs (as eager does), and gradients are boxed to
their parameter's SBP, so one assignment of parameter SBPs is one program: data parallel (all
``B``), Megatron-style tensor parallel (``S(0)`` then ``S(1)``), or a mix.

The cost model (:func:`predict`), per rank, on the traced logical graph after the passes:

- compute: each node on this rank's local shapes: the FLOPs its op declares (``Op.flops``:
  products, convolutions, attention) at the device's FLOP rate, else the bytes it reads and
  writes at the device's memory bandwidth (:class:`DeviceModel`), times
  ``set_auto_parallel_computation_cost_ratio``;
- communication: every boxing node (``global_graph.boxing_points``: the collectives and their bytes
  over links per rank, from the one cost function ``boxing.cost``) at the placement's
  :class:`~holoflow.graph.global_graph.LinkModel` (measured by ``calibrate`` or the default guess),
  plus ``set_auto_parallel_wait_time`` per collective; no overlap with compute is assumed;
- memory: parameters, their gradients and the optimizer's state (``state_per_param`` tensors
  of each parameter's local shape) held by this rank. Activations are not counted yet.

The search (:func:`plan`): coordinate descent from the user's assignment, largest parameters first:
each candidate SBP of one parameter is traced (no kernel runs; the parameter's data is not
moved while searching) and kept when it lowers the objective; sweeps repeat until none does
(at most ``MAX_SWEEPS``). The objective follows ``enable_auto_memory``: ``"Disable"`` the predicted
step time; ``"AdaptiveMemory"`` (default) the step time among plans within the memory limit
(``limit=`` bytes; on CUDA the device's total memory; none on the CPU), the least memory when no
plan fits; ``"HeavyMemoryDown"`` the least memory, then time. Every rank derives the same plan
from the same figures, with no communication.

Applying the plan lays each chosen parameter out in place (a broadcast parameter keeps this
rank's shard: no communication; any other change is an eager boxing every rank runs in the same
order); existing ``.grad`` of re-laid parameters is dropped and broadcast optimizer state follows
its parameter on the first update (graph/optimizer.py ``align_state``). ``graph.auto_parallel_plan()``
returns the :class:`Plan`: each parameter's SBP before and after, the predicted step of the
starting assignment and of the chosen one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..core.errors import UnsupportedError
from ..core.registry import REGISTRY
from ..core.sbp import B, S
from ..core.tensor import Tensor
from ..distributed import world
from ..distributed.sharding import local_shape, nd_str, shard_of
from .global_graph import GLOBAL_BOX, GLOBAL_BOX_BUCKET, boxing_points, link_model
from .ir import IRGraph, Value

MAX_SWEEPS = 3
MEMORY_MODES = ("Disable", "AdaptiveMemory", "HeavyMemoryDown")


@dataclass(frozen=True)
class DeviceModel:
    """What one device computes per second: FLOPs of declared products, bytes of everything else.
    Defaults are deliberately round figures (every rank must use the same ones)."""

    flops_per_s: float
    bytes_per_s: float

    @staticmethod
    def default(device_type: str) -> "DeviceModel":
        if device_type == "cuda":
            return DeviceModel(200e12, 2e12)
        return DeviceModel(50e9, 10e9)


@dataclass(frozen=True)
class Prediction:
    """Predicted per-rank figures of one step of a plan."""

    compute_s: float
    comm_s: float
    memory_bytes: int
    collectives: int

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s

    def __str__(self) -> str:
        return (f"step {self.step_s * 1e3:.3f} ms (compute {self.compute_s * 1e3:.3f} + communication "
                f"{self.comm_s * 1e3:.3f}, {self.collectives} collective(s)), "
                f"{self.memory_bytes / 2**20:.2f} MiB of parameters, gradients and optimizer state")


@dataclass
class Plan:
    """The planner's choice: ``{parameter name: (SBP before, SBP chosen)}`` and the predictions of
    the starting assignment and of the chosen one."""

    choices: dict
    start: Prediction
    chosen: Prediction
    evaluated: int
    memory_mode: str
    limit: int | None = None
    trail: list = field(default_factory=list)   # (parameter, candidate, Prediction) per trace

    def __str__(self) -> str:
        lim = f", limit {self.limit / 2**20:.1f} MiB" if self.limit else ""
        lines = [f"auto-parallel plan ({self.evaluated} assignment(s) traced, memory mode "
                 f"{self.memory_mode}{lim}):",
                 f"  start : {self.start}", f"  chosen: {self.chosen}"]
        for name, (before, after) in self.choices.items():
            mark = "" if before == after else "   (changed)"
            lines.append(f"  {name:<40} {nd_str(before):>8} -> {nd_str(after)}{mark}")
        return "\n".join(lines)


def _local(v: Value, rank: int) -> tuple:
    if v.placement is None:
        return tuple(v.shape)
    return local_shape(v.shape, v.sbp, v.placement, rank)


def _nbytes(shape: tuple, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def predict(g: IRGraph, params: list, state_per_param: int, device: DeviceModel,
            ratio: float = 1.0, wait_s: float = 0.0) -> Prediction:
    """Predicted step of the logical graph ``g`` on the first rank of its placement (every rank
    holds equal shards of evenly divided tensors; all ranks agree on the figures)."""
    place = next((v.placement for v in (*g.feeds, *(v for v, _ in g.state)) if v.placement is not None), None)
    rank = place.ranks[0] if place is not None else 0
    compute = 0.0
    for n in g.nodes:
        if n.op in (GLOBAL_BOX.name, GLOBAL_BOX_BUCKET.name):
            continue
        ins = [_local(v, rank) for v in n.value_inputs()]
        outs = [_local(v, rank) for v in n.outputs]
        op = REGISTRY.get(n.op) if n.kernel is None else None
        if op is not None and op.flops is not None and ins and outs:
            compute += op.flops(ins, outs, n.attrs) / device.flops_per_s
        else:
            moved = sum(_nbytes(s, v.dtype) for s, v in zip(ins, n.value_inputs())) + \
                sum(_nbytes(s, v.dtype) for s, v in zip(outs, n.outputs))
            compute += moved / device.bytes_per_s
    points = boxing_points(g)
    link = link_model(place) if place is not None else None
    comm = sum(link.seconds(p) for p in points) if link is not None else 0.0
    collectives = sum(p.share * sum(1 for s in p.steps if s.collective) for p in points)
    comm += wait_s * collectives
    memory = sum(_nbytes(local_shape(p.shape, p._global.sbp, p._global.placement, rank), p.dtype)
                 for p in params) * (2 + state_per_param)
    return Prediction(compute * ratio, comm, int(memory), round(collectives))


def candidates(p: Tensor) -> list[tuple]:
    """``B`` and ``S(d)`` for every dim the ranks divide evenly (1-D placements)."""
    n = p._global.placement.hierarchy[0]
    return [(B,)] + [(S(d),) for d, size in enumerate(p.shape) if size % n == 0 and size >= n]


def state_per_param(optimizers: list) -> int:
    """Optimizer state tensors per parameter: counted on existing state, else from the defaults
    (momentum: one, Adam's betas: two, plain SGD: none)."""
    most = 0
    for opt in optimizers:
        for st in opt.state.values():
            most = max(most, sum(1 for v in st.values() if isinstance(v, Tensor) and v._data.dim() > 0))
        if not opt.state:
            d = opt.defaults
            most = max(most, 2 + int(bool(d.get("amsgrad"))) if "betas" in d else int(bool(d.get("momentum"))))
    return most


class _Override:
    """Parameters laid out as an assignment says for one trace: their metas change, their data is an
    uninitialized shard (a trace reads shapes, never values); restored on exit."""

    def __init__(self, assignment: dict) -> None:
        self.assignment, self.saved = assignment, []

    def __enter__(self) -> None:
        for p, nd in self.assignment.items():
            g = p._global
            if nd == g.sbp:
                continue
            self.saved.append((p, p._data, g))
            shape = local_shape(g.shape, nd, g.placement, world.rank())
            p._data = torch.empty(shape, dtype=p._data.dtype, device=p._data.device)
            p._global = replace(g, sbp=nd)

    def __exit__(self, *exc) -> None:
        for p, data, g in reversed(self.saved):
            p._data, p._global = data, g


def _objective(mode: str, limit: int | None) -> Callable[[Prediction], tuple]:
    if mode == "Disable":
        return lambda q: (q.step_s,)
    if mode == "HeavyMemoryDown":
        return lambda q: (q.memory_bytes, q.step_s)
    if limit is None:
        return lambda q: (q.step_s,)
    return lambda q: (q.memory_bytes > limit, q.step_s if q.memory_bytes <= limit else q.memory_bytes)


def plan(trace: Callable[[], IRGraph], params: dict, optimizers: list, *, ignore_user_sbp: bool = False,
         memory_mode: str = "AdaptiveMemory", limit: int | None = None, ratio: float = 1.0,
         wait_s: float = 0.0, device: DeviceModel | None = None) -> Plan:
    """Chooses the SBP of ``params`` (name -> global parameter) by coordinate descent over
    :func:`predict` of ``trace()`` (the graph traced and passed, under the parameters' current
    layout)."""
    if memory_mode not in MEMORY_MODES:
        raise UnsupportedError(f"holoflow.nn.Graph enable_auto_memory: mode {memory_mode!r} is not supported; "
                               f"supported: {', '.join(MEMORY_MODES)}")
    glob = {k: p for k, p in params.items() if p._global is not None}
    places = {p._global.placement for p in glob.values()}
    if not glob:
        raise UnsupportedError("holoflow.nn.Graph enable_auto_parallel: the graph has no global parameters; "
                               "place the model first: model.to_global(placement=flow.placement(...), "
                               "sbp=flow.sbp.broadcast)")
    if len(places) > 1 or any(pl.ndim != 1 for pl in places):
        raise UnsupportedError(f"holoflow.nn.Graph enable_auto_parallel: plans parameters on one 1-D placement; "
                               f"this graph's parameters are on {sorted(map(str, places))}")
    free = [p for p in glob.values() if p.requires_grad and (ignore_user_sbp or all(s == B for s in p._global.sbp))]
    free.sort(key=lambda p: -p.numel())
    device = device or DeviceModel.default(next(iter(glob.values()))._data.device.type)
    k = state_per_param(optimizers)
    better = _objective(memory_mode, limit)
    current = {p: p._global.sbp for p in glob.values()}
    trail: list = []

    def evaluate(assignment: dict) -> Prediction:
        with _Override(assignment):
            return predict(trace(), list(glob.values()), k, device, ratio, wait_s)

    start = best = evaluate(current)
    for _ in range(MAX_SWEEPS):
        moved = False
        for p in free:
            for nd in candidates(p):
                if nd == current[p]:
                    continue
                trial = {**current, p: nd}
                q = evaluate(trial)
                trail.append((p, nd, q))
                if better(q) < better(best):
                    current, best, moved = trial, q, True
        if not moved:
            break
    names = {id(p): k for k, p in glob.items()}
    choices = {names[id(p)]: (p._global.sbp, current[p]) for p in glob.values()}
    return Plan(choices, start, best, len(trail) + 1, memory_mode, limit,
                [(names[id(p)], nd, q) for p, nd, q in trail])


def apply(result: Plan, params: dict) -> None:
    """Lays each parameter out as the plan chose (see the module docstring)."""
    rank = world.rank()
    for name, (before, after) in result.choices.items():
        if before == after:
            continue
        p = params[name]
        g = p._global
        if all(s == B for s in before):   # this rank's shard of the whole tensor it holds
            p._data = shard_of(p._data, after, g.placement, rank).clone()
            p._global = replace(g, sbp=after)
        else:
            moved = p.detach().to_global(placement=g.placement, sbp=list(after))
            p._data = moved._data
            p._global = replace(g, sbp=after)
        p.grad = None
