"""Pipeline parallelism in nn.Graph: stages, micro-batches, schedules from register counts
(docs/architecture.md, "Pipeline stages and schedules").

- **Stages.** ``module.to(nn.graph.GraphModule).set_stage(i, P)`` or ``module.config.set_stage(i, P)``
  (OneFlow's two spellings; ``config.stage_id = i`` takes the placement of the module's parameters)
  puts a module on stage ``i``. Inputs of a staged module on another placement are moved to ``P``
  (as OneFlow does); a move between placements inside a trace is a ``stage_move`` node, whose
  gradient is the move back.
- **Micro-batches.** ``config.set_gradient_accumulation_steps(m)`` traces ``build`` once on a
  micro-batch (each input split along dim 0 of its local shard, OneFlow's ``unpack``); the loss
  is scaled by ``1/m`` before backward; every output comes back per micro-batch (OneFlow's
  ``pack``): scalars stacked to shape ``(m,)``, others concatenated along dim 0.
- **Per rank.** Each rank lowers only its stage's nodes (graph/passes/stages.py): a forward task
  and a backward task on its ``compute`` stream, one send and one receive task per stage boundary
  and direction on ``comm.*`` streams, and an update task that sums the micro-batches' gradients
  and runs the optimizer (and the data-parallel gradient reductions) once per step.
- **Schedules emerge from register counts.** Micro-batches are the runtime's iterations; the
  forward task's regsts (what backward reads) have ``w`` slots, so a stage holds at most ``w``
  micro-batches in flight: ``w = p - s`` on stage ``s`` of ``p`` gives 1F1B, ``w = m`` GPipe. No
  loop anywhere decides the order: the actors act when their regsts allow.
"""
from __future__ import annotations

import datetime
import queue
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..core.errors import HoloflowError, UnsupportedError
from ..core.registry import defop
from ..core.sbp import B
from ..core.tensor import Tensor
from ..distributed import world
from ..distributed.global_tensor import GlobalMeta, make_global
from ..distributed.sharding import local_shape
from ..runtime import Plan, Runtime, TaskSpec
from ..runtime.timeline import write_merged
from .global_graph import fingerprint, localize
from .ir import IRGraph, Task, Value, _Gen, program
from .passes.checkpointing import set_activation_checkpointing
from .passes.stages import check_stages, phases, rank_graph, split_weight_grads

SCHEDULES = ("1f1b", "gpipe", "zb-h1")


# -- the stage of a module ----------------------------------------------------------------------------

@dataclass
class _StageSetting:
    stage_id: int
    placement: Any
    history: list = field(default_factory=list)   # every (stage_id, placement) set, for conflicts


_STAGES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def set_stage(module: Any, stage_id: int | None, placement: Any = None) -> None:
    """Records ``module``'s pipeline stage (checked when a graph compiles); ``None`` unstages it."""
    if stage_id is None:
        _STAGES.pop(module, None)
        return
    if isinstance(stage_id, bool) or not isinstance(stage_id, int) or stage_id < 0:
        raise ValueError(f"holoflow.nn.Graph: set_stage: stage_id must be an int >= 0, got {stage_id!r}")
    if placement is not None and not hasattr(placement, "flat_ranks"):
        raise TypeError(f"holoflow.nn.Graph: set_stage: placement must be a holoflow.placement, "
                        f"got {type(placement).__name__}")
    s = _STAGES.get(module)
    if s is None:
        s = _STAGES[module] = _StageSetting(stage_id, placement)
    s.stage_id, s.placement = stage_id, placement
    s.history.append((stage_id, placement))


def stage_of(module: Any) -> int | None:
    s = _STAGES.get(module)
    return None if s is None else s.stage_id


class ModuleConfig:
    """OneFlow's block config of a module in a graph (``graph.model.layer.config``):
    ``set_stage(stage_id, placement)``, ``stage_id``, ``activation_checkpointing``."""

    def __init__(self, module: Any, graph: Any = None, path: str = "") -> None:
        self._module = weakref.ref(module)
        self._graph, self._path = (weakref.ref(graph) if graph is not None else None), path

    def set_stage(self, stage_id: int | None = None, placement: Any = None) -> None:
        set_stage(self._module(), stage_id, placement)

    @property
    def stage_id(self) -> int | None:
        return stage_of(self._module())

    @stage_id.setter
    def stage_id(self, value: int) -> None:
        set_stage(self._module(), value, None)

    @property
    def activation_checkpointing(self) -> bool:
        g = self._graph() if self._graph is not None else None
        return g is not None and self._path in g.config.checkpointed_scopes

    @activation_checkpointing.setter
    def activation_checkpointing(self, on: bool) -> None:
        g = self._graph() if self._graph is not None else None
        if g is None:
            raise HoloflowError("holoflow.nn.Graph: activation_checkpointing needs the module to be in a graph")
        set_activation_checkpointing(g, self._path, bool(on))


def attach_configs(graph: Any, name: str, module: Any) -> None:
    """Gives every submodule of a module assigned to a graph OneFlow's ``.config`` (unless the
    module already has an attribute of that name)."""
    for path, m in module.named_modules(prefix=name):
        if "config" not in m.__dict__ and not hasattr(type(m), "config") and "config" not in m._modules \
                and "config" not in m._parameters and "config" not in m._buffers:
            m.__dict__["config"] = ModuleConfig(m, graph, path)


# -- resolving stages at compile time -----------------------------------------------------------------

@dataclass
class Stages:
    """The graph's stages: ``placements[i]`` is stage i's; ``by_path`` the staged module paths."""

    placements: list
    by_path: dict

    def stage_of_place(self, place: Any) -> int | None:
        for i, p in enumerate(self.placements):
            if p == place:
                return i
        return None


def _param_placement(m: Any, path: str):
    places = {p._global.placement for p in m.parameters() if p._global is not None}
    if len(places) > 1:
        raise HoloflowError(f"holoflow.nn.Graph: module {path!r} has parameters on several placements "
                            f"{sorted(map(str, places))}; give set_stage its placement")
    return next(iter(places), None)


def resolve_stages(graph: Any) -> Stages | None:
    """The stages set on the graph's modules, checked: one stage per module (nested settings and
    re-settings agree), one placement per stage and disjoint ranks, ids 0..p-1, the parameters of
    a staged module on its stage's placement. None when no module has a stage."""
    found: dict[str, tuple] = {}
    inherited: dict[int, tuple] = {}
    for name, root in graph._modules.items():
        for path, m in root.named_modules(prefix=name):
            s = _STAGES.get(m)
            parent = next((found[p] for p in sorted(found, key=len, reverse=True)
                           if path.startswith(p + ".")), None)
            if s is not None:
                ids = {sid for sid, _ in s.history}
                if len(ids) > 1:
                    raise HoloflowError(f"holoflow.nn.Graph: module {path!r} was put on stages {sorted(ids)}; "
                                        f"a module belongs to one pipeline stage")
                place = s.placement or _param_placement(m, path)
                if place is None:
                    raise HoloflowError(f"holoflow.nn.Graph: module {path!r} is on stage {s.stage_id} but has "
                                        f"no placement: set_stage({s.stage_id}, placement) or make it global")
                if parent is not None and parent[0] != s.stage_id:
                    raise HoloflowError(f"holoflow.nn.Graph: module {path!r} is on stage {s.stage_id} inside "
                                        f"{parent[2]!r} on stage {parent[0]}; a module belongs to one stage")
                found[path] = (s.stage_id, place, path)
            cur = found.get(path) or parent
            if cur is not None:
                prev = inherited.get(id(m))
                if prev is not None and prev[0] != cur[0]:
                    raise HoloflowError(f"holoflow.nn.Graph: module {path!r} is used on stage {cur[0]} and, as "
                                        f"{prev[2]!r}, on stage {prev[0]}; a module belongs to one stage")
                inherited[id(m)] = (cur[0], cur[1], path)
    if not found:
        return None
    by_id: dict[int, Any] = {}
    for sid, place, path in found.values():
        if by_id.setdefault(sid, place) != place:
            raise HoloflowError(f"holoflow.nn.Graph: stage {sid} is given two placements, {by_id[sid]} and "
                                f"{place} (module {path!r})")
    if sorted(by_id) != list(range(len(by_id))):
        raise HoloflowError(f"holoflow.nn.Graph: stage ids must be 0, 1, ..., p-1; got {sorted(by_id)}")
    places = [by_id[i] for i in range(len(by_id))]
    for i, a in enumerate(places):
        for j, b in enumerate(places[:i]):
            shared = set(a.flat_ranks) & set(b.flat_ranks)
            if shared:
                raise HoloflowError(f"holoflow.nn.Graph: stages {j} ({b}) and {i} ({a}) share ranks "
                                    f"{sorted(shared)}; each rank belongs to one stage")
    for sid, place, path in found.values():
        m = graph_module_at(graph, path)
        for pn, p in m.named_parameters():
            if p._global is not None and p._global.placement != place:
                raise HoloflowError(f"holoflow.nn.Graph: parameter {path}.{pn} is on {p._global.placement} but "
                                    f"its module is on stage {sid} ({place}); call "
                                    f"module.to_global(placement={place}, ...) first")
    return Stages(places, {path: sid for sid, _, path in found.values()})


def graph_module_at(graph: Any, path: str) -> Any:
    head, *rest = path.split(".")
    m = graph._modules[head]
    for part in rest:
        m = m._modules[part]
    return m


def stage_hooks(graph: Any, stages: Stages) -> list:
    """Forward pre-hooks moving a staged module's global inputs onto its stage's placement."""
    handles = []
    for path, sid in stages.by_path.items():
        place = stages.placements[sid]

        def pre(mod, args, kwargs, _place=place):
            move = (lambda x: _to_stage(x, _place) if isinstance(x, Tensor) else x)
            return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}
        handles.append(graph_module_at(graph, path).register_forward_pre_hook(pre, with_kwargs=True))
    return handles


def _to_stage(x: Tensor, place: Any) -> Tensor:
    g = x._global
    if g is None or g.placement == place:
        return x
    if place.ndim != g.placement.ndim:
        return x.to_global(placement=place, sbp=(B,) * place.ndim)
    return x.to_global(placement=place)


# -- the stage move: an IR node between placements ------------------------------------------------------

def _move_kernel(t: torch.Tensor, **attrs) -> torch.Tensor:
    raise HoloflowError("holoflow.nn.Graph: a stage_move node runs only as a pipeline's send/recv tasks")


def _move_grad(ctx, dy):
    g = dy._global
    if g is None or not hasattr(g, "tracer"):
        raise UnsupportedError("holoflow.nn.Graph: a stage move is differentiated only inside a graph trace")
    return (g.tracer.move(dy, ctx.src, tuple(g.sbp)),)


STAGE_MOVE = defop("stage_move", _move_kernel, grad=_move_grad, shape=lambda metas, attrs: [metas[0]],
                   family="boxing")


def trace_move(tracer: Any, x: Tensor, place: Any, nd: tuple, where: str) -> Tensor:
    """Records ``x`` (a traced global value) moved to ``place`` with SBP ``nd``: boxed to ``nd`` on
    its own placement, then a ``stage_move`` node (each rank of the source sends its shard to the
    rank at the same mesh position of the destination)."""
    g = x._global
    if tuple(place.hierarchy) != tuple(g.placement.hierarchy):
        raise UnsupportedError(f"holoflow.nn.Graph: moving a tensor from {g.placement} to {place} at {where}: "
                               f"inside a graph, stage moves need placements of the same mesh shape")
    x = tracer.box(x, tuple(nd))
    attrs = {"src": g.placement, "dst": place, "shape": tuple(g.shape)}
    return tracer._record(STAGE_MOVE, (x,), attrs, (place, ((tuple(nd),), (tuple(nd),))))


def check_same_program(g: IRGraph, placements: list) -> None:
    """Every rank of every stage traced the same logical graph (compared before anything runs)."""
    ranks = tuple(sorted({r for p in placements for r in p.flat_ranks}))
    if len(ranks) < 2 or world.rank() not in ranks:
        return
    got = world.comm().all_gather_shapes(fingerprint(g), ranks)
    if len(set(got)) > 1:
        by: dict = {}
        for r, f in zip(ranks, got):
            by.setdefault(f, []).append(r)
        raise HoloflowError("holoflow.nn.Graph: the pipeline's ranks traced different programs (graph fingerprints "
                            + "; ".join(f"ranks {rs}: {f}" for f, rs in by.items()) + "); every rank must build the "
                            "same graph")


# -- micro-batches --------------------------------------------------------------------------------------

def micro_protos(leaves: list, m: int) -> list:
    """Stand-ins of the graph inputs with a micro-batch's logical shape (what build is traced on)."""
    out = []
    for i, x in enumerate(leaves):
        if not isinstance(x, Tensor):
            out.append(x)
            continue
        g = x._global
        shape = tuple(g.shape) if g is not None else tuple(x.shape)
        if not shape or shape[0] % m:
            raise HoloflowError(f"holoflow.nn.Graph: gradient accumulation / pipelining splits every input along "
                                f"dim 0 into {m} micro-batches, but input {i} has shape {shape}; pass a batch whose "
                                f"size is a multiple of {m}")
        mb = (shape[0] // m,) + shape[1:]
        proto = Tensor._make(torch.empty((0,), dtype=x._data.dtype, device=x._data.device))
        if g is not None:
            for r in g.placement.flat_ranks:
                full, part = local_shape(shape, g.sbp, g.placement, r), local_shape(mb, g.sbp, g.placement, r)
                if full[0] != part[0] * m:
                    raise HoloflowError(
                        f"holoflow.nn.Graph: input {i} (shape {shape}, sbp {g.sbp} on {g.placement}) does not split "
                        f"into {m} equal micro-batches on rank {r} (local rows {full[0]}); use a batch size that "
                        f"is a multiple of {m} x the ranks it is split over")
            proto._global = GlobalMeta(g.placement, g.sbp, torch.Size(mb), g.grad_sbp)
        else:
            proto = Tensor._make(torch.empty(mb, dtype=x._data.dtype, device=x._data.device))
        out.append(proto)
    return out


def split_local(x: Tensor, m: int) -> list:
    """This rank's micro-batch pieces of input ``x`` (its local shard split along dim 0)."""
    d = x._data
    if d.dim() == 0 or d.shape[0] == 0 and x._global is not None:
        return [d] * m
    return list(torch.chunk(d, m, dim=0))


def pack(pieces: list, scalar: bool) -> torch.Tensor:
    """OneFlow's pack of per-micro-batch outputs: scalars stacked, others concatenated on dim 0."""
    return torch.stack(pieces) if scalar else torch.cat(pieces, dim=0)


# -- point to point between stage ranks ------------------------------------------------------------------

_MAIL: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
P2P_TIMEOUT = 120.0


def _mailbox(comm: Any, key: tuple) -> queue.Queue:
    boxes = _MAIL.setdefault(comm, {})
    q = boxes.get(key)
    if q is None:
        q = boxes.setdefault(key, queue.Queue())
    return q


def p2p_send(comm: Any, t: torch.Tensor, src: int, dst: int, channel: int) -> None:
    """Sends ``t`` to rank ``dst`` on ``channel`` (simulated ranks: a queue; real worlds: a tagged
    torch.distributed send)."""
    if hasattr(comm, "_exchange"):       # simulated ranks share the process
        _mailbox(comm, (src, dst, channel)).put(t.clone())
        return
    work = dist.isend(t.contiguous(), dst, tag=channel)
    try:
        work.wait(datetime.timedelta(seconds=P2P_TIMEOUT))
    except Exception as e:
        raise HoloflowError(f"holoflow.nn.Graph pipeline: rank {src} could not send to rank {dst} "
                            f"(channel {channel}) within {P2P_TIMEOUT}s: {e}") from e


def p2p_recv(comm: Any, shape: tuple, dtype: torch.dtype, device: Any, src: int, dst: int,
             channel: int) -> torch.Tensor:
    if hasattr(comm, "_exchange"):
        try:
            return _mailbox(comm, (src, dst, channel)).get(timeout=P2P_TIMEOUT)
        except queue.Empty:
            raise HoloflowError(f"holoflow.nn.Graph pipeline: rank {dst} waited {P2P_TIMEOUT}s for rank {src} "
                                f"(channel {channel}); the sending stage did not run") from None
    buf = torch.empty(shape, dtype=dtype, device=device)
    work = dist.irecv(buf, src, tag=channel)
    try:
        work.wait(datetime.timedelta(seconds=P2P_TIMEOUT))
    except Exception as e:
        raise HoloflowError(f"holoflow.nn.Graph pipeline: rank {dst} waited {P2P_TIMEOUT}s for rank {src} "
                            f"(channel {channel}): {e}") from e
    return buf


# -- the per-rank plan and its runner ----------------------------------------------------------------------

def window(schedule: str, stage: int, p: int, m: int) -> int:
    """Micro-batches a stage may hold in flight (the forward task's register_num)."""
    if schedule == "gpipe":
        return m
    return max(1, min(m, p - stage))


class _Lowered:
    def __init__(self, tasks: list) -> None:
        self.tasks = tasks


class _Source:
    def __init__(self, source: str) -> None:
        self.source = source


class PipelineCompiled:
    """One rank's pipelined plan of a graph (what ``Graph._compile`` returns when stages or
    micro-batches are set on a global graph); the interface of ``lower.Compiled``."""

    def __init__(self, logical, placements: list, m: int, schedule: str, *, rank: int, comm: Any,
                 passes_log: list, compile_s: float, profile: bool = False) -> None:
        self.ir = self.logical = logical
        self.placements, self.m, self.schedule = placements, m, schedule
        self.p, self.rank, self.comm = len(placements), rank, comm
        self.passes_log, self.compile_s, self.profile = passes_log, compile_s, profile
        self.kind, self.iterations, self.peak_bytes = "actor", 0, 0
        self.stage = next((i for i, pl in enumerate(placements) if rank in pl.flat_ranks), None)
        self.mem = {"in_flight": 0, "peak_in_flight": 0, "bytes": 0, "peak_bytes": 0}
        self.runtime, self._out_names = None, {}
        ph = phases(logical)
        check_stages(logical, placements, ph)
        self.rg = rank_graph(logical, placements, ph, rank)
        self.lowered, self.program = _Lowered([]), _Source("# this rank holds no pipeline stage\n")
        if self.rg is not None:
            self._build()

    # -- building ------------------------------------------------------------------------------------
    def _build(self) -> None:
        rg, g = self.rg, self.rg.graph
        ph = rg.phase
        prod_phase = {v: ph[id(n)] for n in g.nodes for v in n.outputs}
        early = set(g.feeds) | {v for v, p in prod_phase.items() if p != "U"}
        state = {v for v, _ in g.state}
        u_nodes = [n for n in g.nodes if ph[id(n)] == "U"]
        acc_sum = list(dict.fromkeys(v for n in u_nodes for v in n.value_inputs() if v in early and v not in state))
        acc_last = [v for _, v in g.updates if v in early and v not in acc_sum]
        sends = [v for vs in rg.send.values() for v in vs]
        outs = [o for o in g.outputs if isinstance(o, Value)]
        exports = list(dict.fromkeys([*outs, *sends, *acc_sum, *acc_last]))
        loc = localize(g.with_(outputs=tuple(exports)), self.rank, self.comm)
        lph = {id(ln): ph[id(n)] for n, ln in zip(g.nodes, loc.nodes)}
        L = dict(zip(g.feeds, loc.feeds))
        L.update(zip(exports, loc.outputs))
        fb = IRGraph(loc.feeds, loc.state, tuple(n for n in loc.nodes if lph[id(n)] != "U"),
                     tuple(L[v] for v in exports), ())
        tasks = [Task(name, "compute", [n for n in fb.nodes if lph[id(n)] == k]) for name, k in
                 (("fwd", "F"), ("bwd", "B"))]
        wt = None
        if self.schedule == "zb-h1" and not acc_last:   # weight gradients split off the backward
            bwd_nodes = tasks[1].nodes
            keep = {L[v] for v in [*outs, *sends]} | {v for n in fb.nodes if lph[id(n)] == "F" for v in n.outputs}
            first, later = split_weight_grads(bwd_nodes, keep)
            if first and later:
                tasks[1].nodes = first
                wt = Task("wgrad", "compute", later)
                tasks.append(wt)
        tasks = [t for t in tasks if t.nodes]
        _wire(tasks, fb, {L[v] for v in exports})
        gen = _Gen(fb, self.profile)
        gen.tasks = tasks
        prog = gen.build()
        ns = prog.load()
        name = prog.name
        sources = [prog.source]
        lock, fifo, mem = threading.Lock(), deque(), self.mem
        w = window(self.schedule, self.stage, self.p, self.m)
        specs = []
        by = {t.name.rstrip("_0123456789"): t for t in tasks}
        ft, bt = by.get("fwd"), by.get("bwd")
        saved = [i for i, v in enumerate(ft.outputs) if bt is not None and v in bt.inputs] if ft else []
        kept = [i for i, v in enumerate(ft.inputs) if bt is not None and v in bt.inputs] if ft else []

        link = ft is not None and bt is not None   # F -> B: the slot that bounds micro-batches in flight

        def fwd(*args, _f=ns[ft.name] if ft else None):
            out = _f(*args)
            # activation bytes this micro-batch keeps for backward: made here or received (or fed)
            nb = sum(t.numel() * t.element_size() for t in [*(out[i] for i in saved), *(args[i] for i in kept)]
                     if isinstance(t, torch.Tensor))
            if link:
                with lock:
                    fifo.append(nb)
                    mem["in_flight"] += 1
                    mem["bytes"] += nb
                    mem["peak_in_flight"] = max(mem["peak_in_flight"], mem["in_flight"])
                    mem["peak_bytes"] = max(mem["peak_bytes"], mem["bytes"])
            return (*out, None) if link else out

        def bwd(*args, _f=ns[bt.name] if bt else None):
            out = _f(*args[:-1] if link else args)
            with lock:
                mem["in_flight"] -= 1
                mem["bytes"] -= fifo.popleft()
            return out
        if wt is not None:
            wfn = _deferred_fn(ns[wt.name], self.m, len(wt.outputs), self.p - 1 - self.stage, mem, lock)
            specs.append(TaskSpec(wt.name, "compute", wfn,
                                  tuple(name(v) for v in wt.inputs), tuple(name(v) for v in wt.outputs),
                                  register_num=2, source=wt.source or None,
                                  meta={"nodes": len(wt.nodes), "phase": "W"}))
        token = (f"{ft.name}_done",) if link else ()
        for t, fn, rn, ins, outs in ((ft, fwd, w, (), token), (bt, bwd, 2, token, ())):
            if t is not None:
                specs.append(TaskSpec(t.name, "compute", fn, tuple(name(v) for v in t.inputs) + ins,
                                      tuple(name(v) for v in t.outputs) + outs, register_num=rn,
                                      source=t.source or None,
                                      meta={"nodes": len(t.nodes), "phase": "F" if t is ft else "B"}))
        mine = self.placements[self.stage]
        for key, vals in rg.recv.items():
            peer = self.placements[key[1]].flat_ranks[mine.flat_ranks.index(self.rank)]
            lv = [L[v] for v in vals]
            specs.append(TaskSpec(f"recv_{key[0]}{key[1]}{key[2]}", f"comm.recv_{key[0]}",
                                  _recv_fn(self.comm, lv, peer, self.rank, _tag(key)), (),
                                  tuple(name(v) for v in lv), register_num=w + 1 if key[0] == "F" else 2,
                                  meta={"phase": key[0], "peer": peer}))   # backward reads received activations
        for key, vals in rg.send.items():
            peer = self.placements[key[2]].flat_ranks[mine.flat_ranks.index(self.rank)]
            lv = [L[v] for v in vals]
            specs.append(TaskSpec(f"send_{key[0]}{key[1]}{key[2]}", f"comm.send_{key[0]}",
                                  _send_fn(self.comm, peer, self.rank, _tag(key)), tuple(name(v) for v in lv), (),
                                  meta={"phase": key[0], "peer": peer}))
        u_local = [n for n in loc.nodes if lph[id(n)] == "U"]
        if u_local or acc_sum or acc_last or loc.updates:
            ins = tuple(L[v] for v in [*acc_sum, *acc_last])
            uprog = program(IRGraph(ins, loc.state, tuple(u_local), (), loc.updates))
            sources.append(uprog.source)
            entry = uprog.load()["program"]
            specs.append(TaskSpec("update", "update", _acc_fn(entry, self.m, len(acc_sum)),
                                  tuple(name(v) for v in ins), (), meta={"phase": "U"}))
        self._feed_names = [name(loc.feeds[j]) for j in range(len(rg.feeds))]
        self._out_names = {i: name(L[self.logical.outputs[i]]) for i in rg.outputs}
        plan = Plan(tuple(specs), inputs=tuple(self._feed_names),
                    outputs=tuple(dict.fromkeys(self._out_names.values())),
                    input_register_num=max(2, self.m))
        self.lowered, self.program = _Lowered(specs), _Source("\n\n".join(sources))
        self.plan = plan
        self.runtime = Runtime(plan, trace=True)

    # -- running ------------------------------------------------------------------------------------
    def feeds(self, leaves: list) -> list:
        return [x for x in leaves if isinstance(x, Tensor)]

    def run(self, leaves: list) -> list:
        m = self.m
        got: list = []
        if self.runtime is not None:
            pieces = [split_local(leaves[i], m) for i in self.rg.feeds]
            feeds = [{n: p[k] for n, p in zip(self._feed_names, pieces)} for k in range(m)]
            tl = self.runtime.timeline
            if tl is not None and sum(len(v) for v in tl._per_stream.values()) > 50_000:
                tl.clear()
            got = self.runtime.run(feeds)
        self.iterations += 1
        res = []
        for i, o in enumerate(self.logical.outputs):
            if not isinstance(o, Value):
                res.append(o)
                continue
            shape = tuple(o.shape) if m == 1 else ((m,) if not o.shape else (o.shape[0] * m,) + tuple(o.shape[1:]))
            if got and i in self._out_names:
                ps = [d[self._out_names[i]] for d in got]
                t = Tensor._make(ps[0] if m == 1 else pack(ps, not o.shape))
            else:
                t = Tensor._make(torch.empty((0,), dtype=o.dtype, device=o.device))
            res.append(make_global(t, o.placement, o.sbp, torch.Size(shape)) if o.placement is not None else t)
        return res

    def stream(self, feeds):
        for leaves in feeds:
            yield self.run(leaves)

    # -- what ran -----------------------------------------------------------------------------------
    def acts(self) -> list[dict]:
        """This rank's recorded acts with absolute times (perf_counter seconds), micro-batch ids."""
        if self.runtime is None or self.runtime.timeline is None:
            return []
        tl = self.runtime.timeline
        phase = {t.name: t.meta.get("phase", "") for t in self.plan.tasks}
        return [{"task": a.actor, "lane": a.stream, "phase": phase.get(a.actor, ""), "mb": a.iteration % self.m,
                 "step": a.iteration // self.m, "start": tl.t0 + a.start, "end": tl.t0 + a.end,
                 "rank": self.rank, "stage": self.stage} for a in tl.acts()]

    def write_trace(self, path: str) -> None:
        """Every rank's acts merged into one Perfetto trace (collective over the stages' ranks;
        the first of them writes ``path``)."""
        ranks = sorted({r for p in self.placements for r in p.flat_ranks})
        parts = self.comm.all_gather_shapes(self.acts(), tuple(ranks)) if len(ranks) > 1 else [self.acts()]
        if self.rank == ranks[0]:
            write_merged(path, [a for part in parts for a in part])

    def profile_table(self) -> str:
        return self.runtime.trace_table() if self.runtime is not None else ""

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()


def _tag(key: tuple) -> int:
    return (1 if key[0] == "F" else 2) * 10000 + key[1] * 100 + key[2]


def _recv_fn(comm: Any, vals: list, src: int, dst: int, tag: int):
    metas = [(tuple(v.shape), v.dtype, v.device) for v in vals]

    def recv() -> tuple:
        return tuple(p2p_recv(comm, s, d, dev, src, dst, tag) for s, d, dev in metas)
    return recv


def _send_fn(comm: Any, dst: int, src: int, tag: int):
    def send(*vals) -> tuple:
        for v in vals:
            p2p_send(comm, v, src, dst, tag)
        return ()
    return send


def _acc_fn(entry: Any, m: int, n_sum: int):
    """The update actor: sums the first ``n_sum`` values over the step's micro-batches (keeps the
    last of the rest) and runs the update program after the last micro-batch."""
    state: dict = {"k": 0, "buf": None}

    def update(*vals) -> tuple:
        k = state["k"]
        state["k"] = (k + 1) % m
        if k == 0:
            state["buf"] = [None] * n_sum
        buf = state["buf"]
        for i, v in enumerate(vals[:n_sum]):
            if v is not None:    # None: nothing yet (a deferred weight gradient comes later)
                buf[i] = v.clone() if buf[i] is None else buf[i].add_(v)
        if k == m - 1:
            entry(*state["buf"], *vals[n_sum:])
            state["buf"] = None
        return ()
    return update


def _deferred_fn(fn: Any, m: int, n_out: int, limit: int, mem: dict, lock: Any):
    """Zero-bubble (ZB-H1 style) weight gradients: the backward task computes and sends the input
    gradients; this task runs the weight gradients after it, keeping up to ``limit``
    (``p - 1 - stage``) micro-batches' weight gradients waiting, so on earlier stages the
    gradients of later micro-batches pass first; the step's last act runs what is left. Outputs
    are summed here and handed to the update task once, after the last micro-batch (None before)."""
    pending: deque = deque()
    state: dict = {"k": 0, "sum": None}

    def run(args: tuple) -> None:
        out = fn(*args)
        with lock:
            mem["bytes"] -= sum(t.numel() * t.element_size() for t in args if isinstance(t, torch.Tensor))
        s = state["sum"]
        state["sum"] = [o.clone() for o in out] if s is None else [a.add_(o) for a, o in zip(s, out)]

    def wgrad(*args) -> tuple:
        k = state["k"]
        state["k"] = (k + 1) % m
        with lock:   # what waiting weight gradients keep alive counts as activation memory
            mem["bytes"] += sum(t.numel() * t.element_size() for t in args if isinstance(t, torch.Tensor))
            mem["peak_bytes"] = max(mem["peak_bytes"], mem["bytes"])
        pending.append(args)
        while len(pending) > (limit if k < m - 1 else 0):
            run(pending.popleft())
        if k < m - 1:
            return (None,) * n_out
        out, state["sum"] = state["sum"], None
        return tuple(out)
    return wgrad


def _wire(tasks: list, g, exported: set) -> None:
    """Each task's inputs (read, made elsewhere), state reads and outputs (read elsewhere)."""
    state, feeds = {v for v, _ in g.state}, set(g.feeds)
    exported = set(exported)
    for t in tasks:
        seen = {v for n in t.nodes for v in n.outputs}
        for v in (v for n in t.nodes for v in n.value_inputs()):
            if v not in seen:
                seen.add(v)
                (t.state if v in state else t.inputs).append(v)
                if v not in state and v not in feeds:
                    exported.add(v)
    for t in tasks:
        t.outputs = [v for n in t.nodes for v in n.outputs if v in exported]
