"""Automatic parallel planning: ``graph.config.enable_auto_parallel()`` chooses the SBP of the
parameters of a graph of global tensors with one cost model that predicts step time and memory.

What is chosen. The parameters the user left broadcast on their placement, a 1-D or N-D mesh
(with ``enable_auto_parallel_ignore_user_sbp_config()``, as OneFlow: every parameter and the
graph's global inputs, so a broadcast batch may be split), each among the nd-SBPs of ``B`` or
``S(d)`` per mesh axis that split every dim evenly. The rest follows: while
``build`` is traced every op takes the signature the one cost function picks for its inputs (as
eager does), and gradients are boxed to their parameter's SBP, so one assignment of parameter
SBPs is one program: data parallel (all ``B``), Megatron-style tensor parallel (``S(0)`` then
``S(1)``), or a mix. Under ``enable_zero`` (stages 1-3) the traces run the ZeRO passes, so what
stays data parallel is costed sharded. When memory decides (``HeavyMemoryDown``, or a limit the
parameters' layouts do not meet), the outputs of a stack's blocks are variables too
(:class:`Activation`).

The cost model (:func:`predict`), per rank, on the traced logical graph after the passes:

- compute: each node on this rank's local shapes and attrs, by the roofline: the larger of the
  FLOPs its op declares (``Op.flops``: products, convolutions, attention) at the device's FLOP
  rate and the bytes it reads and writes at the device's memory bandwidth (:class:`DeviceModel`;
  an update also reads and writes its parameter and optimizer state); a calibrated model times
  the node's kernel itself on example inputs instead (once per op, shapes and attrs: a skinny
  product of a small batch with a large weight runs far below both peaks on a CPU); times
  ``set_auto_parallel_computation_cost_ratio``;
- communication: every boxing node (``global_graph.boxing_points``: the collectives and their bytes
  over links per rank, from the one cost function ``boxing.cost``) at the placement's
  :class:`~holoflow.graph.global_graph.LinkModel` (measured by ``calibrate`` or the default guess),
  plus ``set_auto_parallel_wait_time`` per collective;
- the step: compute and communication on one :func:`timeline`, as the runtime runs them: a
  collective lowering issues in flight (a gradient bucket's all-reduce, a ZeRO reduce-scatter, an
  all-gather) runs beside the compute after it until a node reads its result, so data
  parallelism's gradient all-reduces hide behind the rest of backward; where the placement has
  no core to spare for the communicator (CPU ranks already keeping every core busy:
  ``bucket_grads.spare_core``) nothing overlaps and the step is their sum;
- memory: the parameters and the optimizer's state (``state_per_param`` tensors of each
  parameter's local shape) this rank holds, plus the peak of its intermediates (activations,
  gradients) under the memory plan (``memory_plan.peak_bytes`` of this rank's graph).

The figures are round defaults (:meth:`DeviceModel.default`, ``LinkModel()``) unless
``enable_auto_parallel(calibrate=True)`` measures the device (a matmul, a copy, then each node's
kernel) and the links (``global_graph.calibrate``), every rank taking the slowest rank's figures.

The search (:func:`plan`): coordinate descent from the user's assignment over :func:`roles` (a
parameter, or the parameters of one role in repeated blocks, moved together), largest first:
each candidate SBP of one role is traced (no kernel runs; the parameter's data is not
moved while searching) and kept when it lowers the objective; sweeps repeat until none does
(at most ``MAX_SWEEPS``). Then pairs of the ``PAIR_PARAMS`` largest roles move together
(a layout that only pays when two change at once, as Megatron's MLP), the descent resuming after
any pair that helps. The objective follows ``enable_auto_memory``: ``"Disable"`` the predicted
step time; ``"AdaptiveMemory"`` (default) the step time among plans within the memory limit
(``limit=`` bytes per rank; on CUDA the device's total memory; none on the CPU), the least memory
when no plan fits; ``"HeavyMemoryDown"`` the least memory, then time. Every rank derives the same plan
from the same figures: with round defaults without communication; with measured kernels each
candidate's compute is the slowest rank's (one small all-gather per candidate).

Applying the plan lays each chosen parameter out in place (a broadcast parameter keeps this
rank's shard: no communication; any other change is an eager boxing every rank runs in the same
order); existing ``.grad`` of re-laid parameters is dropped and broadcast optimizer state follows
its parameter on the first update (graph/optimizer.py ``align_state``). ``graph.auto_parallel_plan()``
returns the :class:`Plan`: each parameter's SBP before and after, the predicted step of the
starting assignment and of the chosen one.
"""
from __future__ import annotations

import itertools
import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..core import grad_mode
from ..core.errors import UnsupportedError
from ..core.keys import cache_key
from ..core.registry import REGISTRY
from ..core.sbp import B, S
from ..core.tensor import Tensor
from ..distributed import world
from ..distributed.global_tensor import GlobalMeta
from ..distributed.sharding import local_shape, nd_str, shard_of
from . import global_graph
from .global_graph import ASYNC_FORMS, GLOBAL_BOX, GLOBAL_BOX_BUCKET, link_model, localize, node_boxing_points
from .ir import IRGraph, Node, Value
from .passes.bucket_grads import spare_core
from .passes.memory_plan import last_uses, peak_bytes

MAX_SWEEPS = 3
# a calibrated model's figures carry timing noise (a few percent between runs of one kernel): a
# move must win by more than this fraction of the step to be taken, so close calls keep the
# layout planning started from instead of flipping from run to run with the noise
NOISE = 0.03
PAIR_PARAMS = 2   # the largest parameters whose pairs are also tried together (N-D meshes: 8 x 8 pairs)
MEMORY_MODES = ("Disable", "AdaptiveMemory", "HeavyMemoryDown")


@dataclass(frozen=True)
class DeviceModel:
    """What one device computes per second: FLOPs of declared products, bytes of everything else.
    Defaults are deliberately round figures (every rank must use the same ones)."""

    flops_per_s: float
    bytes_per_s: float

    calibrated: bool = False

    @staticmethod
    def default(device_type: str) -> "DeviceModel":
        if device_type == "cuda":
            return DeviceModel(200e12, 2e12)
        return DeviceModel(50e9, 10e9)

    @staticmethod
    def calibrate(device, ranks: tuple = (), repeats: int = 5) -> "DeviceModel":
        """Measures a float32 matmul's FLOP rate and a copy's bytes per second on ``device``; with
        ``ranks`` (a collective: every rank calls it) every rank takes the slowest rank's figures,
        so all derive the same plan. ``device``: a torch or holoflow device, or its name."""
        device = torch.device(str(device))
        n = 512 if device.type == "cpu" else 4096
        g = _generator(device)
        a, b = torch.randn(n, n, device=device, generator=g), torch.randn(n, n, device=device, generator=g)
        big = torch.empty(1 << 22, device=device)   # 16 MiB

        def best(fn) -> float:
            fn()
            out = float("inf")
            for _ in range(repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                fn()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                out = min(out, time.perf_counter() - t0)
            return out
        mm, cp = best(lambda: a @ b), best(lambda: big.clone())
        if len(ranks) > 1:
            got = world.comm().all_gather_shapes((mm, cp), ranks)
            mm, cp = max(g[0] for g in got), max(g[1] for g in got)
        return DeviceModel(2.0 * n ** 3 / mm, 2.0 * big.numel() * 4 / cp, True)

    def node_seconds(self, n: Node) -> float | None:
        """A calibrated model's time of node ``n`` of a rank's local graph: its kernel run on
        example inputs of its local shapes (floats random, integers zero: a valid index), the
        fastest of a few runs, remembered per op, input metas and attrs. None where the roofline
        must do (an uncalibrated model, a node with its own kernel, attrs known only by
        identity, a kernel that fails on example data)."""
        op = REGISTRY.get(n.op)
        if not self.calibrated or op is None or n.kernel is not None:
            return None
        ins = tuple((v.shape, v.dtype, v.device) if isinstance(v, Value) else v for v in n.inputs)
        key = cache_key((n.op, ins, n.attrs))
        if key is None:
            return None
        hit = _MEASURED.get(key, _MISSING)
        if hit is _MISSING:
            hit = _MEASURED[key] = _time_kernel(op, n)
        return hit


_MEASURED: dict = {}   # (op, input metas, attrs) -> measured seconds of its kernel (None: failed)
_MISSING = object()
KERNEL_REPEATS = 3
FLUSH_BYTES = (64 << 20, 256 << 20)   # CPU, CUDA: more than their last-level caches


_GENERATORS: dict = {}   # device -> planning's own generator: timing draws none of the user's numbers


def _generator(device: torch.device) -> torch.Generator:
    """A generator of planning's own on ``device`` (the process's generators, which other threads
    such as simulated ranks draw from concurrently, are never touched)."""
    g = _GENERATORS.get(device)
    if g is None:
        g = _GENERATORS[device] = torch.Generator(device).manual_seed(0)
    return g


def _example(v: Value) -> torch.Tensor:
    if v.dtype.is_floating_point or v.dtype.is_complex:
        return torch.randn(v.shape, dtype=v.dtype, device=v.device, generator=_generator(v.device))
    return torch.zeros(v.shape, dtype=v.dtype, device=v.device)


_FLUSH: dict = {}   # device -> a buffer larger than its caches


def _flush_caches(device: torch.device) -> None:
    """Evicts the caches (writes a buffer larger than them): in a step a kernel's inputs were
    last touched several kernels ago, not by the run just before."""
    buf = _FLUSH.get(device)
    if buf is None:
        buf = _FLUSH[device] = torch.empty(FLUSH_BYTES[device.type == "cuda"] // 4, device=device)
    buf.fill_(1.0)


def _time_kernel(op, n: Node) -> float | None:
    """The fastest of ``KERNEL_REPEATS`` runs of ``op``'s kernel on example inputs of ``n``'s
    metas, each from cold caches, after one warm-up run (None if the kernel refuses example data).
    A random op draws from planning's own generator (None if it takes none: the roofline times it)."""
    args = [_example(v) if isinstance(v, Value) else v for v in n.inputs]
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    attrs = n.attrs
    if op.random:
        if "generator" not in attrs:
            return None
        attrs = {**attrs, "generator": _generator(device)}
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    best = None
    with torch.no_grad(), grad_mode.no_grad():
        for i in range(KERNEL_REPEATS + 1):
            _flush_caches(device)
            if sync is not None:
                sync()
            t0 = time.perf_counter()
            try:
                op.kernel(*args, **attrs)
            except Exception:
                return None
            if sync is not None:
                sync()
            if i:   # (the first run warms caches and allocators up)
                best = min(best or float("inf"), time.perf_counter() - t0)
    return best


@dataclass(frozen=True)
class Prediction:
    """Predicted per-rank figures of one step of a plan: the step is its compute and its
    communication, less what of the communication runs hidden behind compute (``hidden_s``),
    plus the time a pipeline stage waits for the others (``bubble_s``; a pipeline's figures are
    its busiest stage's, :func:`predict_pipeline`)."""

    compute_s: float
    comm_s: float
    memory_bytes: int    # state held (parameters, optimizer state) + the intermediates' planned peak
    collectives: int
    state_bytes: int = 0
    hidden_s: float = 0.0
    bubble_s: float = 0.0

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s - self.hidden_s + self.bubble_s

    def __str__(self) -> str:
        hidden = f", {self.hidden_s * 1e3:.3f} of it hidden behind compute" if self.hidden_s else ""
        bubble = f" + pipeline bubble {self.bubble_s * 1e3:.3f}" if self.bubble_s else ""
        return (f"step {self.step_s * 1e3:.3f} ms (compute {self.compute_s * 1e3:.3f} + communication "
                f"{self.comm_s * 1e3:.3f}{hidden}{bubble}, {self.collectives} collective(s)), "
                f"memory {self.memory_bytes / 2**20:.2f} MiB ({self.state_bytes / 2**20:.2f} of parameters and "
                f"optimizer state)")


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
    trail: list = field(default_factory=list)   # ({parameter: candidate}, Prediction) per trace
    device: DeviceModel | None = None
    link: object = None   # the placement's LinkModel the predictions used

    def __str__(self) -> str:
        lim = f", limit {self.limit / 2**20:.1f} MiB" if self.limit else ""
        how = "calibrated" if self.device is not None and self.device.calibrated else "default"
        dev = (f"device {self.device.flops_per_s / 1e9:.0f} GFLOP/s, {self.device.bytes_per_s / 1e9:.1f} GB/s "
               f"({how}); links {self.link}" if self.device is not None else "")
        lines = [f"auto-parallel plan ({self.evaluated} assignment(s) traced, memory mode "
                 f"{self.memory_mode}{lim}; {dev}):",
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
            ratio: float = 1.0, wait_s: float = 0.0, link=None, overlap: bool | None = None) -> Prediction:
    """Predicted step of the logical graph ``g`` on the first rank of its placement (every rank
    holds equal shards of evenly divided tensors; all ranks agree on the figures); ``link``:
    the links' model (default: the placement's, calibrated or the default guess); ``overlap``:
    whether collectives issued in flight run beside compute (default: when the placement has a
    core to spare for them, ``bucket_grads.spare_core``), see :func:`timeline`."""
    place = next((v.placement for v in (*g.feeds, *(v for v, _ in g.state)) if v.placement is not None), None)
    rank = place.flat_ranks[0] if place is not None else 0
    local = localize(g, rank)   # local shapes and attrs: the kernels a calibrated model times
    link = link or (link_model(place) if place is not None else None)
    costs = [_node_cost(n, ln, rank, state_per_param, device, ratio, link, wait_s)
             for n, ln in zip(g.nodes, local.nodes)]
    compute, comm = [c[0] for c in costs], [c[1] for c in costs]
    collectives = sum(c[2] for c in costs)
    overlap = (place is None or spare_core(place)) if overlap is None else overlap
    step = timeline(local.nodes, compute, comm) if overlap else sum(compute) + sum(comm)
    held = sum(_nbytes(local_shape(p.shape, p._global.sbp, p._global.placement, rank), p.dtype)
               for p in params) * (1 + state_per_param)
    # + intermediates (activations, gradients) at the memory plan's peak
    return Prediction(sum(compute), sum(comm), int(held + peak_bytes(local, local.frees)), round(collectives),
                      int(held), hidden_s=max(0.0, sum(compute) + sum(comm) - step))


def _node_cost(n: Node, ln: Node, rank: int, state_per_param: int, device: DeviceModel, ratio: float,
               link, wait_s: float) -> tuple[float, float, float]:
    """(compute seconds, communication seconds, collectives) of the logical graph's node ``n``
    on ``rank`` (``ln``: its localized twin)."""
    points = node_boxing_points(n)
    count = sum(p.share * sum(1 for s in p.steps if s.collective) for p in points)
    comm = sum(link.seconds(p) for p in points) + wait_s * count if link is not None else 0.0
    boxing = n.op in (GLOBAL_BOX.name, GLOBAL_BOX_BUCKET.name)
    return (0.0 if boxing else _node_seconds(n, ln, rank, state_per_param, device) * ratio), comm, count


def _node_seconds(n: Node, ln: Node, rank: int, state_per_param: int, device: DeviceModel) -> float:
    """One compute node's predicted seconds: its timed kernel (a calibrated model), else the
    roofline of its declared FLOPs and the bytes it moves."""
    measured = device.node_seconds(ln)
    if measured is not None:
        return measured
    ins = [_local(v, rank) for v in n.value_inputs()]
    outs = [_local(v, rank) for v in n.outputs]
    moved = sum(_nbytes(s, v.dtype) for s, v in zip(ins, n.value_inputs())) + \
        sum(_nbytes(s, v.dtype) for s, v in zip(outs, n.outputs))
    if n.effect:   # an update reads its gradients, reads and writes the parameter and its state
        moved *= 3 + 2 * state_per_param
    op = REGISTRY.get(n.op) if n.kernel is None else None
    flops = op.flops(ins, outs, n.attrs) if op is not None and op.flops is not None and ins and outs else 0.0
    # the roofline: a product of a small batch with a large weight is bound by reading the weight
    return max(flops / device.flops_per_s, moved / device.bytes_per_s)


def timeline(nodes, compute: list[float], comm: list[float]) -> float:
    """The step's seconds when the collectives lowering issues in flight (``ASYNC_FORMS``: one
    all-reduce, reduce-scatter or all-gather, a gradient bucket's included) run beside compute,
    as the runtime runs them (global_graph.issue_collectives, graph/lower.py): the caller runs
    the compute nodes one after another in program order; a collective starts when it is issued
    and the collective before it has finished (one communicator, in program order), and the
    caller waits for it only where a node reads its result; other collectives hold the caller
    until they finish. The effect nodes (the update task) run after every other node and every
    collective in flight. ``compute`` / ``comm``: each node's seconds."""
    t = link = 0.0           # when the caller, and the communicator, are next free
    ready: dict = {}         # value -> when a collective in flight delivers it
    rows = list(zip(nodes, compute, comm))
    for phase in (False, True):
        for n, c, m in (r for r in rows if r[0].effect == phase):
            t = max([t, *(ready[v] for v in n.value_inputs() if v in ready)])
            form = ASYNC_FORMS.get(n.op) if n.kernel is None and not n.effect else None
            if m and form is not None and form(n) is not None:
                link = max(t, link) + m
                ready.update((v, link) for v in n.outputs)
            elif m:
                t = link = max(t, link) + c + m
            else:
                t += c
        t = max(t, link)
    return t


class _NoSend:
    """Kernels for the once-per-step moves of a rank graph that is predicted, never run."""

    def send(self, peer: int, tag: int):
        return lambda x: x

    def recv(self, value: Value, peer: int, tag: int):
        return lambda: None


def predict_pipeline(g: IRGraph, placements: list, m: int, schedule: str, params: list, state_per_param: int,
                     device: DeviceModel, ratio: float = 1.0, wait_s: float = 0.0, link=None,
                     memory: str | None = None) -> Prediction:
    """Predicted step of the pipelined logical graph ``g`` (traced on one micro-batch, passed):
    ``m`` micro-batches over the stages on ``placements`` in ``schedule``'s act order.

    Each stage's share (``stages.rank_graph`` of its first rank, localized) is split by phase:
    a micro-batch's forward ``F`` and backward ``B`` (for ZB-H1, ``B`` less the weight gradients
    ``W`` it defers: ``stages.split_weight_grads``; under ``memory="1f1b"`` only what fits, and
    fewer waiting, as the runtime keeps them) cost their nodes' compute and in-stage
    boxing as :func:`predict` counts them; the acts run as the runtime orders them
    (``pipeline_run.stage_order``) in an event simulation (``pipeline_run.simulate_schedule``),
    each move between stages taking the slowest move's link time; then each stage's once-per-step
    update ``U`` (its gradient all-reduces and the optimizer, on :func:`timeline`). The
    figures returned are the busiest stage's: its compute and communication, the rest of the step
    its bubble. Memory is the fullest stage's: parameters and optimizer state, one micro-batch's
    planned peak, the forward-to-backward bytes of each further micro-batch its window holds in
    flight (``pipeline_run.window``) and, for ZB-H1, the inputs of the weight gradients it lets
    wait."""
    from .passes.stages import phases, rank_graph, split_weight_grads, split_weight_grads_within
    from .pipeline import stage_moves
    from .pipeline_run import simulate_schedule, stage_order, window, zb_delay
    ph = phases(g)
    p = len(placements)
    link_of = link or link_model(placements[0])
    moves = stage_moves(g, placements, m)
    hop = max((link_of.latency_s + mv.bytes_per_micro_batch / link_of.bytes_per_s
               for mv in moves if mv.phase in ("F", "B")), default=0.0)
    durations, figures, orders = [], [], []
    for s, place in enumerate(placements):
        rank = place.flat_ranks[0]
        rg = rank_graph(g, placements, ph, rank, _NoSend())
        local = localize(rg.graph, rank)
        # id(local node) -> (compute seconds, communication seconds, collectives)
        cost = {id(ln): _node_cost(n, ln, rank, state_per_param, device, ratio, link_of, wait_s)
                for n, ln in zip(rg.graph.nodes, local.nodes)}

        def of(n: Node) -> tuple:
            """A node's figures; a node the split below made (a norm backward's halves, an
            in-place node made out of place) is costed on its local shapes."""
            if id(n) not in cost:
                cost[id(n)] = (_node_seconds(n, n, rank, state_per_param, device) * ratio, 0.0, 0.0)
            return cost[id(n)]
        phase = {id(ln): rg.phase[id(n)] for n, ln in zip(rg.graph.nodes, local.nodes)}
        by = {k: [ln for ln in local.nodes if phase[id(ln)] == k] for k in "FBU"}
        w_nodes: list = []
        delay, w_bytes = None, 0
        state = {v for v, _ in local.state}
        made = {v for n in by["F"] for v in n.outputs}
        reads_b = {v for n in by["B"] for v in n.value_inputs()}
        # a micro-batch's forward-to-backward bytes (its results and inputs that backward reads)
        act = sum(v.nbytes for v in (made | {v for n in by["F"] for v in n.value_inputs()}) - state if v in reads_b)
        if schedule == "zb-h1":   # weight gradients split off the backward, as the runtime splits them
            sent = {v for (ph_, _, _), vs in rg.send.items() if ph_ == "B" for v in vs}
            keep = sent | {o for o in local.outputs if isinstance(o, Value)} | made
            local_of = dict(zip((v for n in rg.graph.nodes for v in n.outputs),
                                (v for n in local.nodes for v in n.outputs)))
            keep = {local_of.get(v, v) for v in keep}
            if memory == "1f1b" and s > 0:   # deferring only what fits in one micro-batch's activations
                first, w_nodes = split_weight_grads_within(by["B"], keep, act, state)
            else:
                first, w_nodes = split_weight_grads(by["B"], keep)
            w_made = {v for n in w_nodes for v in n.outputs}
            w_bytes = sum(v.nbytes for v in {v for n in w_nodes for v in n.value_inputs()} - w_made - state)
            # the weight gradients a stage lets wait: s, or under memory="1f1b" what fits (`zb_delay`)
            delay = zb_delay(s, act, w_bytes) if memory == "1f1b" and w_nodes else s
            by["B"] = first

        def secs(nodes: list) -> float:
            return sum(of(n)[0] + of(n)[1] for n in nodes)
        durations.append({"F": secs(by["F"]), "B": secs(by["B"]), "W": secs(w_nodes)})
        orders.append(stage_order(schedule, s, p, m, wgrad=bool(w_nodes), delay=delay))
        u = by["U"]
        u_step = timeline(u, [of(n)[0] for n in u], [of(n)[1] for n in u]) \
            if place is None or spare_core(place) else secs(u)
        fb = [*by["F"], *by["B"], *w_nodes]
        held = sum(_nbytes(local_shape(q.shape, q._global.sbp, q._global.placement, rank), q.dtype)
                   for q in params if q._global.placement == place) * (1 + state_per_param)
        mine = [mv for mv in moves if mv.src_stage == s and mv.phase in ("F", "B")]
        figures.append(dict(
            compute=m * sum(of(n)[0] for n in fb) + sum(of(n)[0] for n in u),
            comm=m * sum(of(n)[1] for n in fb) + sum(of(n)[1] for n in u)
            + m * sum(link_of.latency_s + mv.bytes_per_micro_batch / link_of.bytes_per_s for mv in mine),
            u_step=u_step, collectives=m * sum(of(n)[2] for n in fb) + sum(of(n)[2] for n in u),
            # one micro-batch's peak, the activations of the others its window holds in flight
            # and (ZB-H1) the inputs of the weight gradients it lets wait
            memory=held + peak_bytes(local, last_uses(local)) + (window(schedule, s, p, m) - 1) * act
            + (min(delay, m) * w_bytes if w_nodes else 0),
            held=held))
    span = simulate_schedule(orders, durations, hop)[0]
    step = span + max(f["u_step"] for f in figures)
    busy = max(figures, key=lambda f: f["compute"] + f["comm"])
    rest = step - busy["compute"] - busy["comm"]
    return Prediction(busy["compute"], busy["comm"], int(max(f["memory"] for f in figures)),
                      round(busy["collectives"]), int(busy["held"]), hidden_s=max(0.0, -rest),
                      bubble_s=max(0.0, rest))


def candidates(p: Tensor) -> list[tuple]:
    """Every nd-SBP of ``B`` / ``S(d)`` per mesh axis that splits each dim evenly (a dim split
    by several axes is divided by their product)."""
    mesh = p._global.placement.hierarchy
    per_axis = [[B] + [S(d) for d in range(p.dim())] for _ in mesh]
    out = []
    for nd in itertools.product(*per_axis):
        parts = [1] * p.dim()
        for s, k in zip(nd, mesh):
            if isinstance(s, S):
                parts[s.axis] *= k
        if all(size % k == 0 and size >= k for size, k in zip(p.shape, parts)):
            out.append(tuple(nd))
    return out


_REPEATED = re.compile(r"(^|\.)\d+\.(?=[^.]+\.)")   # an index into repeated blocks, not the owner


def roles(named: dict) -> list[list[Tensor]]:
    """The planner's variables: tensors that play one role in repeated blocks (``blocks.3.attn.
    qkv.weight`` and ``blocks.7.attn.qkv.weight``, alike in shape, dtype and SBP) move together,
    largest groups first. A homogeneous stack wants one layout per role, and planning a 12-layer
    model then costs what one layer does. An index that names the parameter's own module
    (``0.weight`` of a Sequential) groups nothing: layers of one stack differ in role (Megatron's
    column- then row-split pair)."""
    groups: dict = {}
    for name, t in named.items():
        key = (_REPEATED.sub(r"\1*.", name), tuple(t.shape), t.dtype, t._global.sbp)
        groups.setdefault(key, []).append(t)
    return sorted(groups.values(), key=lambda g: -sum(t.numel() for t in g))


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


class Activation:
    """A block's output as a planning variable: the graph boxes it to the chosen nd-SBP where the
    block returns it (a forward hook while ``build`` is traced), and the ops after it take their
    signatures from that layout. Between the blocks of a tensor-parallel stack, ``S`` along the
    sequence is Megatron's sequence parallelism: the norms and residuals run on a shard, the
    all-reduce after a row-parallel layer becomes a reduce-scatter and the input of the next
    column-parallel layer is all-gathered. Duck-types a parameter for :func:`candidates`."""

    def __init__(self, path: str, t: Tensor) -> None:
        self.path, self.shape, self.dtype = path, tuple(t.shape), t.dtype
        g = t._global   # the layout the block gives it (the starting point), not the trace's meta
        self._global = GlobalMeta(g.placement, g.sbp, g.shape)   # (which holds the whole trace)
        self.chosen: tuple | None = None   # the layout it is boxed to (None: as the block gives it)

    def numel(self) -> int:
        return math.prod(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def box(self, out):
        """A forward hook's result: ``out`` in the chosen layout (what is no global tensor of the
        planned placement passes as it is)."""
        nd = self.chosen
        if nd is None or not isinstance(out, Tensor) or out._global is None or out._global.sbp == nd \
                or out._global.placement != self._global.placement:
            return out
        return out.to_global(sbp=list(nd))


def activation_roles(acts: dict) -> list[list[Activation]]:
    """Outputs of blocks alike in position, shape, dtype and layout (``blocks.3`` and
    ``blocks.7``) move together, as parameters of one role do."""
    groups: dict = {}
    for path, a in acts.items():
        key = (re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", path), a.shape, a.dtype, a._global.sbp)
        groups.setdefault(key, []).append(a)
    return sorted(groups.values(), key=lambda g: -sum(a.numel() for a in g))


class _Override:
    """Parameters laid out as an assignment says for one trace: their metas change, their data is an
    uninitialized shard (a trace reads shapes, never values); restored on exit. Every parameter of
    the assignment is restored, changed or not: a trace under ZeRO-3 re-lays broadcast parameters
    as their rows (``zero.shard_parameter``), which planning must not keep."""

    def __init__(self, assignment: dict) -> None:
        self.assignment, self.saved = assignment, []

    def __enter__(self) -> None:
        for p, nd in self.assignment.items():
            g = p._global
            if isinstance(p, Activation):
                self.saved.append((p, None, p.chosen, None))
                p.chosen = None if nd == g.sbp else nd
                continue
            self.saved.append((p, p._data, g, p.__dict__.get("_zero3")))
            if nd == g.sbp:
                continue
            shape = local_shape(g.shape, nd, g.placement, world.rank())
            p._data = torch.empty(shape, dtype=p._data.dtype, device=p._data.device)
            p._global = replace(g, sbp=nd)

    def __exit__(self, *exc) -> None:
        for p, data, g, zero3 in reversed(self.saved):
            if isinstance(p, Activation):
                p.chosen = g
                continue
            p._data, p._global = data, g
            if zero3 is None:
                p.__dict__.pop("_zero3", None)


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
         wait_s: float = 0.0, device: DeviceModel | None = None, calibrate: bool = False, link=None,
         feeds: dict | None = None, activations: dict | None = None) -> Plan:
    """Chooses the SBP of ``params`` (name -> global parameter) by coordinate descent over
    :func:`predict` of ``trace()`` (the graph traced and passed, under the parameters' current
    layout). With ``ignore_user_sbp`` the global inputs in ``feeds`` (name -> the tensor ``trace``
    reads) are chosen too, as OneFlow ignores every SBP the user gave (the caller lays them out
    so before each run). ``calibrate``: measure the links and the device first (collectives:
    every rank of the placement plans at once); else ``device`` and ``link`` if given, or the
    round default figures. ``activations`` (path -> :class:`Activation`): block outputs whose
    layout is chosen too when memory decides (``HeavyMemoryDown``, or a limit the parameters'
    layouts alone do not meet): a second descent after the parameters'."""
    if memory_mode not in MEMORY_MODES:
        raise UnsupportedError(f"holoflow.nn.Graph enable_auto_memory: mode {memory_mode!r} is not supported; "
                               f"supported: {', '.join(MEMORY_MODES)}")
    glob = {k: p for k, p in params.items() if p._global is not None}
    places = {p._global.placement for p in glob.values()}
    if not glob:
        raise UnsupportedError("holoflow.nn.Graph enable_auto_parallel: the graph has no global parameters; "
                               "place the model first: model.to_global(placement=flow.placement(...), "
                               "sbp=flow.sbp.broadcast)")
    if len(places) > 1:
        raise UnsupportedError(f"holoflow.nn.Graph enable_auto_parallel: plans parameters on one placement; "
                               f"this graph's parameters are on {sorted(map(str, places))}")
    place = next(iter(places))
    inputs = {k: x for k, x in (feeds or {}).items()
              if ignore_user_sbp and x._global.placement == place and not x.requires_grad}
    movable = {k: p for k, p in glob.items()
               if p.requires_grad and (ignore_user_sbp or all(s == B for s in p._global.sbp))}
    free = roles({**movable, **inputs})
    dev = next(iter(glob.values()))._data.device
    if calibrate:
        global_graph.calibrate(place)
        device = device or DeviceModel.calibrate(dev, tuple(place.flat_ranks))
    device = device or DeviceModel.default(dev.type)
    k = state_per_param(optimizers)
    better = _objective(memory_mode, limit)
    acts = {a.path: a for a in (activations or {}).values() if a._global.placement == place}
    current = {p: p._global.sbp for p in (*glob.values(), *inputs.values(), *acts.values())}
    trail: list = []

    def evaluate(assignment: dict) -> Prediction:
        with _Override(assignment):
            q = predict(trace(), list(glob.values()), k, device, ratio, wait_s, link)
        if device.calibrated and len(place.flat_ranks) > 1:
            # timed kernels differ a little from rank to rank: every rank takes the slowest
            # rank's figure, so all keep the same moves and derive one plan
            got = world.comm().all_gather_shapes((q.compute_s, q.hidden_s), tuple(place.flat_ranks))
            compute_s, hidden_s = max(got, key=lambda f: f[0] - f[1])
            q = replace(q, compute_s=compute_s, hidden_s=hidden_s)
        return q

    start = best = evaluate(current)

    def singles():
        for group in free:
            p = group[0]
            yield from ({q: nd for q in group} for nd in candidates(p) if nd != current[p])

    def pairs():
        # a layout that pays only when two parameters change together (Megatron's MLP: rows of
        # the first weight, columns of the second) is no single step's gain
        for ga, gb in itertools.combinations(free[:PAIR_PARAMS], 2):
            a, b = ga[0], gb[0]
            yield from ({**{q: na for q in ga}, **{q: nb for q in gb}}
                        for na, nb in itertools.product(candidates(a), candidates(b))
                        if na != current[a] and nb != current[b])

    margin = NOISE if device.calibrated else 0.0

    def wins(q: Prediction) -> bool:
        """Whether ``q`` beats the best so far by more than the figures' noise."""
        if better(q) >= better(best):
            return False
        return better(replace(q, compute_s=q.compute_s + margin * q.step_s)) < better(best)

    def improve(moves) -> bool:
        """Tries each move from the assignment kept so far; whether one lowered the objective."""
        nonlocal current, best
        moved = False
        for change in moves():
            q = evaluate({**current, **change})
            trail.append((change, q))
            if wins(q):
                current, best, moved = {**current, **change}, q, True
        return moved

    def descend() -> None:
        for _ in range(MAX_SWEEPS):
            if not improve(singles):
                break

    descend()
    for _ in range(MAX_SWEEPS):   # then pairs of the largest parameters, descending after each gain
        if not improve(pairs):
            break
        descend()
    if acts and (memory_mode == "HeavyMemoryDown" or
                 (memory_mode == "AdaptiveMemory" and limit is not None and best.memory_bytes > limit)):
        free[:] = activation_roles(acts)   # then the blocks' outputs (sequence parallelism, ...)
        descend()
    names = {id(p): k for k, p in (*glob.items(), *inputs.items())}
    names.update({id(a): f"{path} (output)" for path, a in acts.items()})
    choices = {names[id(p)]: (p._global.sbp, current[p]) for p in current}
    return Plan(choices, start, best, len(trail) + 1, memory_mode, limit,
                [({names[id(p)]: nd for p, nd in change.items()}, q) for change, q in trail], device,
                link or link_model(place))


def apply(result: Plan, params: dict) -> None:
    """Lays each parameter out as the plan chose (see the module docstring); inputs' choices are
    the caller's to apply to each run's inputs."""
    rank = world.rank()
    for name, (before, after) in result.choices.items():
        if before == after or name not in params:
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
