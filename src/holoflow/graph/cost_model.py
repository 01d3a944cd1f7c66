"""The cost model: one step of a traced graph of global tensors predicted per rank, before it runs
(the auto-parallel planner's objective, ``graph.predict()``, pipelines' ``predict_pipeline``).

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
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..core import grad_mode
from ..core.keys import cache_key
from ..core.registry import REGISTRY
from ..distributed import world
from ..distributed.sharding import local_shape
from .global_graph import ASYNC_FORMS, GLOBAL_BOX, GLOBAL_BOX_BUCKET, link_model, localize, node_boxing_points
from .ir import IRGraph, Node, Value
from .passes.bucket_grads import spare_core
from .passes.memory_plan import last_uses, peak_bytes
from .zero import row_sbp


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


def _local(v: Value, rank: int) -> tuple:
    if v.placement is None:
        return tuple(v.shape)
    return local_shape(v.shape, v.sbp, v.placement, rank)


def _nbytes(shape: tuple, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def predict(g: IRGraph, params: list, state_per_param: int, device: DeviceModel,
            ratio: float = 1.0, wait_s: float = 0.0, link=None, overlap: bool | None = None,
            zero=None) -> Prediction:
    """Predicted step of the logical graph ``g`` on the first rank of its placement (every rank
    holds equal shards of evenly divided tensors; all ranks agree on the figures); ``link``:
    the links' model (default: the placement's, calibrated or the default guess); ``overlap``:
    whether collectives issued in flight run beside compute (default: when the placement has a
    core to spare for them, ``bucket_grads.spare_core``), see :func:`timeline`; ``zero``: the
    graph's ``zero.Zero`` config (the optimizer state of what it shards held as rows)."""
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
    held = sum(_held(p, rank, state_per_param, zero) for p in params)
    # + intermediates (activations, gradients) at the memory plan's peak
    return Prediction(sum(compute), sum(comm), int(held + peak_bytes(local, local.frees)), round(collectives),
                      int(held), hidden_s=max(0.0, sum(compute) + sum(comm) - step))


def _held(p, rank: int, state_per_param: int, zero) -> int:
    """Bytes ``rank`` holds of parameter ``p`` and its optimizer state: shards of its layout;
    the state of a parameter ZeRO shards (stages 1-2: the parameter stays whole) as its rows."""
    g = p._global
    mine = _nbytes(local_shape(p.shape, g.sbp, g.placement, rank), p.dtype)
    state = _nbytes(local_shape(p.shape, row_sbp(g.placement), g.placement, rank), p.dtype) \
        if zero is not None and zero.sharded(p) else mine
    return mine + state_per_param * state


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
                     memory: str | None = None, zero=None) -> Prediction:
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
    wait; ``zero``: the graph's ZeRO config, as :func:`predict`'s."""
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
        held = sum(_held(q, rank, state_per_param, zero) for q in params if q._global.placement == place)
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


