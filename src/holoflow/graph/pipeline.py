"""Pipeline parallelism in nn.Graph: stages, micro-batches, schedules from register counts
(docs/architecture.md, "Pipeline stages and schedules").

- **Stages.** ``module.to(nn.graph.GraphModule).set_stage(i, P)`` or ``module.config.set_stage(i, P)``
  (OneFlow's two spellings; ``config.stage_id = i`` takes the placement of the module's parameters)
  puts a module on stage ``i``. Inputs of a staged module on another placement are moved to ``P``
  (as OneFlow does); a move between placements inside a trace is a ``stage_move`` node, whose
  gradient is the move back.
- **Micro-batches.** ``config.set_gradient_accumulation_steps(m)`` traces ``build`` once on a
  micro-batch (each input split along dim 0 of its local shard, OneFlow's ``unpack``); inputs
  whose dim 0 is whole on every rank (a broadcast label beside an ``S(0)`` batch) take the same
  rows of the batch as the split ones (``batch_blocks``), and inputs splitting dim 0 into other
  blocks are refused; the loss is scaled by ``1/m`` before backward; every output comes back per
  micro-batch (OneFlow's ``pack``): scalars stacked to shape ``(m,)``, others concatenated along
  dim 0, each row where its micro-batch's inputs' rows were.
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

import weakref
from fractions import Fraction
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.errors import HoloflowError, UnsupportedError
from ..core.registry import defop
from ..ops.family import like_first_input
from ..core.sbp import B, S
from ..core.tensor import Tensor
from ..distributed import rng, world
from ..distributed.global_tensor import GlobalMeta, make_global
from ..distributed.sharding import local_ranges, local_shape, nd_str
from .global_graph import agree_program, fingerprint
from .ir import IRGraph
from .passes.stages import STAGE
from .passes.checkpointing import set_activation_checkpointing

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


def swap_stage(module: Any, setting: Any) -> Any:
    """Puts ``setting`` (a ``(stage_id, placement)`` pair: a fresh stage of its own; None: none; or
    what an earlier call returned) as ``module``'s stage and returns the one it had: the
    auto-parallel planner's stage cuts, for one trace or for good."""
    old = _STAGES.pop(module, None)
    if isinstance(setting, tuple):
        setting = _StageSetting(*setting, history=[setting])
    if setting is not None:
        _STAGES[module] = setting
    return old


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

    def __reduce__(self):   # a module saved whole after being in a graph: its graph settings are not saved
        return (type(None), ())

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


STAGE_MOVE = defop("stage_move", _move_kernel, grad=_move_grad, shape=like_first_input,
                   family=STAGE)


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


def check_same_program(g: IRGraph, placements: list) -> int:
    """Every rank of every stage traced the same logical graph (compared before anything runs);
    returns the graph's agreed random seed (global_graph.check_same_program)."""
    ranks = tuple(sorted({r for p in placements for r in p.flat_ranks}))
    seed = rng.draw()
    if len(ranks) < 2 or world.rank() not in ranks:
        return seed
    return agree_program(fingerprint(g), seed, ranks, "the pipeline's ranks")


def scale_on(scale: Tensor, loss: Tensor) -> Tensor:
    """The grad scaler's live scale (a local tensor) as a global tensor on a global loss's
    placement, sharing its storage: the scaler's update after each step reaches the traced
    loss scaling (a ``to_global`` copy would freeze the first scale into the graph)."""
    g = loss._global
    if g is None:
        return scale
    place = g.placement
    data = scale._data if place.coords(world.rank()) is not None else scale._data.new_empty((0,))
    return make_global(Tensor._make(data), place, (B,) * place.ndim, scale._data.shape)


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


def splits_rows(nd: tuple) -> bool:
    return any(isinstance(s, S) and s.axis == 0 for s in nd)


def row_blocks(shape: tuple, nd: tuple, place: Any) -> tuple:
    """The distinct ``(start, size)`` ranges of dim 0 held by ``place``'s shards, ascending, as
    fractions of the dim's length."""
    n = shape[0]
    got = {tuple(local_ranges(shape, nd, place, place.coords(r))[0]) for r in place.flat_ranks}
    return tuple((Fraction(a, n), Fraction(k, n)) for a, k in sorted(got))


def batch_blocks(leaves: list, m: int) -> tuple | None:
    """The rows of the batch that make up each micro-batch of a global graph's inputs.

    An input split along dim 0 (``S(0)`` on some mesh axis) is cut into micro-batches on each
    rank, without communication: micro-batch ``k`` is the ``k``-th chunk of every shard, i.e. of
    every block of rows the shards hold. Every other input of the call (broadcast, partial, split
    along another dim) must give micro-batch ``k`` the same rows of the batch, or rows of one
    input would meet rows of another that were not paired with them (a ``B`` label beside an
    ``S(0)`` batch). Returns those blocks (``(start, size)`` as fractions of dim 0), or None when
    micro-batch ``k`` is plain rows ``[k n/m, (k+1) n/m)`` (no input splits dim 0 into several
    blocks). Inputs splitting dim 0 into different blocks raise, naming them."""
    ref = None
    for i, x in enumerate(leaves):
        g = getattr(x, "_global", None) if isinstance(x, Tensor) else None
        if g is None or not g.shape or not splits_rows(g.sbp):
            continue
        blocks = row_blocks(tuple(g.shape), tuple(g.sbp), g.placement)
        if ref is None:
            ref = (i, g, blocks)
        elif blocks != ref[2]:
            j, h = ref[0], ref[1]
            raise HoloflowError(
                f"holoflow.nn.Graph: gradient accumulation (m={m}) cuts each rank's dim-0 shard of an input into "
                f"micro-batches; input {j} (shape {tuple(h.shape)}, sbp {nd_str(h.sbp)} on {h.placement}) and "
                f"input {i} (shape {tuple(g.shape)}, sbp {nd_str(g.sbp)} on {g.placement}) split dim 0 into "
                f"different blocks of rows, so a micro-batch would pair rows that do not belong together; give "
                f"every batch input the same dim-0 split (the same S(0) mesh axes and mesh sizes), or broadcast "
                f"the ones that differ")
    return ref[2] if ref is not None and len(ref[2]) > 1 else None


def micro_rows(n: int, blocks: tuple, m: int, k: int, what: str) -> torch.Tensor | None:
    """The logical rows (dim 0, ascending) of micro-batch ``k`` of ``m`` in a tensor of ``n`` rows
    whose micro-batches follow ``blocks`` (:func:`batch_blocks`); None if ``n`` rows do not cut
    into those blocks and ``m`` equal chunks of each (``what`` names the tensor in the error; an
    empty ``what`` returns None instead of raising)."""
    parts = []
    for start, size in blocks:
        a, k_rows = start * n, size * n
        if a.denominator != 1 or k_rows.denominator != 1 or int(k_rows) % m:
            if not what:
                return None
            raise HoloflowError(
                f"holoflow.nn.Graph: gradient accumulation (m={m}): {what} has {n} rows along dim 0, which do "
                f"not cut into the micro-batches of the batch inputs split along dim 0 (blocks of "
                f"{[float(sz) for _, sz in blocks]} of the rows, each cut in {m}); use a batch size that is a "
                f"multiple of {m * len(blocks)}")
        c = int(k_rows) // m
        parts.append(torch.arange(int(a) + k * c, int(a) + (k + 1) * c))
    return torch.cat(parts)


def split_local(x: Tensor, m: int, blocks: tuple | None = None, index: int = 0) -> list:
    """This rank's micro-batch pieces of input ``x``: its local shard split along dim 0; an input
    whose dim 0 is whole on every rank takes the rows of each micro-batch that ``blocks``
    (:func:`batch_blocks`) gives the inputs split along dim 0."""
    d = x._data
    g = x._global
    if d.dim() == 0 or d.shape[0] == 0 and g is not None:
        return [d] * m
    if blocks is None or g is None or splits_rows(g.sbp):
        return list(torch.chunk(d, m, dim=0))
    return [d.index_select(0, micro_rows(d.shape[0], blocks, m, k, f"input {index}").to(d.device))
            for k in range(m)]


def pack(pieces: list, scalar: bool, blocks: tuple | None = None) -> torch.Tensor:
    """OneFlow's pack of per-micro-batch outputs: scalars stacked, others concatenated on dim 0.
    With ``blocks`` (:func:`batch_blocks`; for a batch-long output whose dim 0 is whole on every
    rank) micro-batch ``k``'s rows go back where its inputs' rows came from, as the shards of an
    ``S(0)`` output do: returning a ``B`` input gives it back unchanged."""
    if scalar:
        return torch.stack(pieces)
    m = len(pieces)
    if blocks is None:
        return torch.cat(pieces, dim=0)
    n = pieces[0].shape[0] * m
    rows = [micro_rows(n, blocks, m, k, "") for k in range(m)]
    if any(r is None for r in rows) or any(p.shape != pieces[0].shape for p in pieces):
        return torch.cat(pieces, dim=0)   # not batch-shaped: pieces in micro-batch order
    out = pieces[0].new_empty((n,) + tuple(pieces[0].shape[1:]))
    for r, p in zip(rows, pieces):
        out.index_copy_(0, r.to(p.device), p)
    return out


@dataclass(frozen=True)
class StageMove:
    """A move between stages (a send/recv pair): the user's line, stages, phase (``F``:
    activations, ``B``: their gradients), the moved value and the bytes each sending rank sends
    per micro-batch (its local shard) and per step (``m`` micro-batches)."""

    node: Any
    phase: str
    src_stage: int
    dst_stage: int
    shape: tuple
    dtype: torch.dtype
    bytes_per_micro_batch: int
    m: int

    @property
    def comm_bytes(self) -> int:
        """Bytes each sending rank sends per step."""
        return self.bytes_per_micro_batch * self.m

    def __str__(self) -> str:
        n = self.node
        what = "activation" if self.phase == "F" else "gradient" if self.phase == "B" else self.phase
        return (f"{n.source or '?':<28} stage {self.src_stage} -> {self.dst_stage}  send/recv ({what})  "
                f"{self.shape} {str(self.dtype).replace('torch.', '')}  {self.bytes_per_micro_batch} B/rank per "
                f"micro-batch, {self.comm_bytes / 1e6:.3f} MB/rank per step")


def stage_moves(g: IRGraph, placements: list, m: int) -> list[StageMove]:
    """Every move between stages of a pipelined logical graph ``g`` (``m`` micro-batches)."""
    from .passes.stages import is_move, phases
    index = {p: i for i, p in enumerate(placements)}
    ph = phases(g)
    out = []
    for n in g.nodes:
        if not is_move(n):
            continue
        v, src = n.inputs[0], n.attrs["src"]
        rank = src.flat_ranks[0]
        nel = 1
        for d in local_shape(v.shape, v.sbp, src, rank):
            nel *= d
        out.append(StageMove(n, ph[id(n)], index[src], index[n.attrs["dst"]], tuple(v.shape), v.dtype,
                             nel * v.dtype.itemsize, m))
    return out


def explain_moves(moves: list[StageMove]) -> str:
    if not moves:
        return "no stage moves"
    total = sum(mv.comm_bytes for mv in moves)
    return "\n".join([f"{len(moves)} stage move(s) (send/recv between stages), {total / 1e6:.3f} MB per sending "
                      f"rank per step:"] + [f"  {mv}" for mv in moves])
