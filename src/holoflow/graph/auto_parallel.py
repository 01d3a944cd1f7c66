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
(:class:`Activation`). A graph with micro-batches is planned on its micro-batch graph: gradient
accumulation on one placement, or pipeline stages the user placed (``set_stage``), each stage's
parameters among the nd-SBPs of its own mesh, and, unless the user set it, the pipeline schedule
(:func:`schedule_setting`: 1F1B, ZB-H1, ZB-H1 within 1F1B's memory, GPipe), all predicted by
:func:`~holoflow.graph.cost_model.predict_pipeline`. Unless the user set it, the micro-batch count
too (:func:`micro_batch_setting`), where micro-batches train as the whole batch (:func:`row_tags`,
:func:`micro_batch_refusal`). The stages are the user's; with ``enable_auto_parallel_stage_cuts``
the planner may move where their cuts fall in a stack of blocks staged block by block (:class:`Cuts`).

The cost model is graph/cost_model.py (:func:`~holoflow.graph.cost_model.predict`).

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
from dataclasses import astuple, dataclass, field, replace
from typing import Callable

import torch

from ..core.errors import UnsupportedError
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from ..distributed import world
from ..distributed.global_tensor import GlobalMeta
from ..distributed.placement import placement
from ..distributed.sharding import local_shape, nd_str, shard_of
from . import global_graph
from .cost_model import DeviceModel, Prediction, predict, predict_pipeline
from .global_graph import link_model
from .ir import Value
from .zero import Zero

MAX_SWEEPS = 3
# a calibrated model's figures carry timing noise (a few percent between runs of one kernel): a
# move must win by more than this fraction of the step to be taken, so close calls keep the
# layout planning started from instead of flipping from run to run with the noise
NOISE = 0.03
PAIR_PARAMS = 2   # the largest parameters whose pairs are also tried together (N-D meshes: 8 x 8 pairs)
MEMORY_MODES = ("Disable", "AdaptiveMemory", "HeavyMemoryDown")


@dataclass
class Plan:
    """The planner's choice: ``{parameter name: (SBP before, SBP chosen)}`` (and of each setting
    it chose, :class:`Setting`: ``{name: (value before, value chosen)}``) and the predictions of
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
    kept: dict = field(default_factory=dict)   # {setting: why the planner left the user's value}

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
            lines.append(f"  {name:<40} {_shown(before):>8} -> {_shown(after)}{mark}")
        lines += [f"  {name:<40} kept: {why}" for name, why in self.kept.items()]
        return "\n".join(lines)


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


_REPEATED = re.compile(r"(?:(?<=\.)|^)\d+(?=\.[^.]+\.)")   # an index into repeated blocks, not the owner


def roles(named: dict) -> list[list[Tensor]]:
    """The planner's variables: tensors that play one role in repeated blocks (``blocks.3.attn.
    qkv.weight`` and ``blocks.7.attn.qkv.weight``, alike in shape, dtype, SBP and mesh shape; the
    blocks of every pipeline stage, ``stages.0.1.fc.weight`` with ``stages.1.0.fc.weight``) move together,
    largest groups first. A homogeneous stack wants one layout per role, and planning a 12-layer
    model then costs what one layer does. An index that names the parameter's own module
    (``0.weight`` of a Sequential) groups nothing: layers of one stack differ in role (Megatron's
    column- then row-split pair)."""
    groups: dict = {}
    for name, t in named.items():
        key = (_REPEATED.sub("*", name), tuple(t.shape), t.dtype, t._global.sbp, t._global.placement.hierarchy)
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
        key = (re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", path), a.shape, a.dtype, a._global.sbp,
               a._global.placement.hierarchy)
        groups.setdefault(key, []).append(a)
    return sorted(groups.values(), key=lambda g: -sum(a.numel() for a in g))


class Setting:
    """A setting of the graph the planner chooses when memory decides and the user left it unset
    (:func:`memory_settings`): ``options``, the first the current one; ``set`` puts one on the
    graph's config for a trace (and, chosen, for good)."""

    def __init__(self, name: str, options: tuple, set: Callable[[object], None]) -> None:
        self.name, self.options, self.set = name, options, set
        self.value = options[0]


def memory_settings(cfg, blocks: list[str]) -> list[Setting]:
    """What may trade time for memory besides layouts, where the user set none of it: ZeRO's
    stage (default ``shard_min_size``) and recomputing the stacks' blocks in backward
    (``blocks``: their module paths in order; the outermost ones are checkpointed: none, the
    first half, or all, each block's recomputation costing alike)."""
    out = []
    if cfg.zero is None:
        out.append(Setting("ZeRO", (None, Zero(1), Zero(2), Zero(3)), lambda v: setattr(cfg, "zero", v)))
    outer = [b for b in blocks if not any(b.startswith(a + ".") for a in blocks)]
    if outer and not cfg.checkpointed_scopes:
        options = (frozenset(), frozenset(outer[:len(outer) // 2]), frozenset(outer))
        out.append(Setting("activation checkpointing", tuple(dict.fromkeys(options)),
                           lambda v: setattr(cfg, "checkpointed_scopes", set(v))))
    return out


SCHEDULES = {"1f1b": ("1f1b", None), "zb-h1": ("zb-h1", None), "zb-h1 (1F1B's memory)": ("zb-h1", "1f1b"),
             "gpipe": ("gpipe", None)}


def schedule_setting(cfg) -> Setting | None:
    """The pipeline schedule (:data:`SCHEDULES`: ``set_pipeline_schedule``'s name and memory
    mode), chosen by time and memory like a layout where the user set none, else None."""
    if cfg.pipeline_schedule_set:
        return None
    now = next(k for k, v in SCHEDULES.items() if v == (cfg.pipeline_schedule, cfg.pipeline_memory))

    def put(name: str) -> None:
        cfg.pipeline_schedule, cfg.pipeline_memory = SCHEDULES[name]
    return Setting("pipeline schedule", (now, *(k for k in SCHEDULES if k != now)), put)


def micro_batch_setting(cfg, options: list[int]) -> Setting | None:
    """The micro-batch count of a graph with pipeline stages (``options``: the counts that train
    as the whole batch, :func:`micro_batch_refusal`, the user's 1 first), chosen by time and memory
    like the schedule: more micro-batches shrink the bubble and each micro-batch's kernels, and
    the window of a stage holds more micro-batches' activations. None where the user set the
    count or nothing else trains alike."""
    if cfg.grad_acc_steps_set or len(options) < 2:
        return None
    return Setting("micro-batches", tuple(options), lambda v: setattr(cfg, "grad_acc_steps", v))


# how a forward value depends on the batch's rows, besides S(axis) (row i along that axis, from row
# i of the inputs alone) and None (not at all): the mean or sum over the rows of such values (and
# linear in it), or anything else
MEAN_OF_ROWS, SUM_OF_ROWS, COUPLED = "mean", "sum", "coupled"


def row_tags(g, ph: dict) -> dict:
    """``{value: tag}`` for the forward (phase ``F``) values of the logical graph ``g`` that the
    inputs reach (every tensor input is a batch split along dim 0, as micro-batches split it).
    Asked of each op's declared SBP signatures: an op that computes each row of a split batch from
    that row alone has a signature taking the batch split (``S``) and the rest broadcast; one that
    reduces the rows has ``S -> P`` (a mean if the op ``averages``); batch statistics (batch norm in
    training) have neither; random ops (dropout) couple too: micro-batches would draw apart."""
    tags: dict = {v: S(0) if v.shape else COUPLED for v in g.feeds}
    for n in g.nodes:
        if ph.get(id(n)) != "F":
            continue
        ins = [tags.get(v) for v in n.value_inputs()]
        if any(t is not None for t in ins):
            tags.update(zip(n.outputs, _node_rows(n, ins)))
    return tags


def _node_rows(n, ins: list) -> list:
    """The row tags of node ``n``'s outputs from its value inputs' (:func:`row_tags`)."""
    from ..core.registry import REGISTRY, Meta
    from .passes.stages import STAGE
    op = REGISTRY.get(n.op)
    coupled = [COUPLED] * len(n.outputs)
    if op is None or n.kernel not in (None, op.inplace_kernel) or COUPLED in ins or op.random:
        # (a node with a kernel of its own, fused, is not the op it names; one run in place is.
        # A random op would draw for each micro-batch, not the whole batch's draws)
        return coupled
    if op.family in ("boxing", STAGE):   # a layout or a placement changes, not the value
        return [ins[0]] * len(n.outputs)
    if op.sbp is None:
        return coupled
    partial = {t for t in ins if t in (MEAN_OF_ROWS, SUM_OF_ROWS)}
    if len(partial) > 1:
        return coupled
    want = tuple(B if t is None else P if t in partial else t for t in ins)
    metas = [Meta(tuple(x.shape), x.dtype) if isinstance(x, Value) else x for x in n.inputs]
    try:
        sig = next((s for s in op.sbp(metas, n.attrs) if tuple(s[0]) == want), None)
    except Exception:   # (a rule that cannot read these attrs: nothing is known)
        return coupled
    if sig is None:
        return coupled
    reduced = next(iter(partial)) if partial else MEAN_OF_ROWS if op.averages else SUM_OF_ROWS
    return [s if isinstance(s, S) else reduced if s == P else COUPLED for s in sig[1]]


def micro_batch_refusal(g, losses: list, tags: dict) -> tuple[str | None, frozenset]:
    """Why splitting the batch of the logical graph ``g`` (traced on the whole batch, tagged by
    :func:`row_tags`) into micro-batches would not train as the whole batch does, or None; and the
    outputs that are means over the rows (returned as the micro-batches' mean). Micro-batches
    scale each loss by 1/m (OneFlow's gradient accumulation): the sum of their gradients is the
    batch's only where each loss is a mean over the rows of values each row gives alone; the
    outputs must be such rows (dim 0: put back in order) or such means, and no state may be
    written from the batch (running statistics)."""
    made = {v: n for n in g.nodes for v in n.outputs}

    def where(v) -> str:
        n = made.get(v)
        return f"{n.op!r} at {n.source or '?'}" if n is not None else "an input"

    def began(v) -> str:
        """The op where ``v``'s coupling of the rows began (the first such of its ancestors)."""
        seen, todo, first = set(), [v], None
        while todo:
            u = todo.pop()
            n = made.get(u)
            if u in seen or n is None or tags.get(u) != COUPLED:
                continue
            seen.add(u)
            ins = n.value_inputs()
            if all(tags.get(x) != COUPLED for x in ins):
                first = n if first is None or g.nodes.index(n) < g.nodes.index(first) else first
            todo.extend(ins)
        return f" (from {first.op!r} at {first.source or '?'})" if first is not None else ""
    for v, seeded in losses:
        if v is None or seeded:
            return "loss.backward() is called on a tensor with a gradient given", frozenset()
        if tags.get(v) != MEAN_OF_ROWS:
            why = {SUM_OF_ROWS: "a sum over the batch (each micro-batch's would be scaled by 1/m)", None:
                   "independent of the batch"}.get(tags.get(v), "not a mean over the rows of the batch that each "
                                                               "row gives alone (batch statistics, a count of "
                                                               "targets, a slice of rows, random draws)")
            return f"the loss ({where(v)}) is {why}{began(v) if tags.get(v) == COUPLED else ''}", frozenset()
    state = {v for v, _ in g.state}
    averaged = set()
    for i, o in enumerate(g.outputs):
        if not isinstance(o, Value) or o in state:
            continue
        t = tags.get(o)
        if t == MEAN_OF_ROWS:
            averaged.add(i)
        elif t != S(0):
            return f"output {i} ({where(o)}) is no row-wise value nor mean of the batch{began(o)}", frozenset()
    for _, v in g.updates:
        if tags.get(v) is not None:
            return f"state is written from the batch ({where(v)}: running statistics)", frozenset()
    return None, frozenset(averaged)


def same_on_rows(full, micro, k: int, tags: dict) -> bool:
    """Whether the graph traced on one of ``k`` micro-batches (``micro``) is ``full`` (traced on the
    whole batch) on 1/k of the rows: the same forward ops, each row-wise value with 1/k of its rows
    along its batch axis, every other value of the same shape (a slice of the first rows, a
    constant sized by the batch, would differ)."""
    from .passes.stages import phases
    fa, fb = phases(full), phases(micro)
    a = [n for n in full.nodes if fa[id(n)] == "F"]
    b = [n for n in micro.nodes if fb[id(n)] == "F"]
    if len(a) != len(b) or any(x.op != y.op for x, y in zip(a, b)):
        return False
    for x, y in zip(a, b):
        for u, v in zip(x.outputs, y.outputs):
            want = list(u.shape)
            t = tags.get(u)
            if isinstance(t, S):
                if t.axis >= len(want) or want[t.axis] % k:
                    return False
                want[t.axis] //= k
            if tuple(want) != tuple(v.shape):
                return False
    return True


class Cuts(tuple):
    """Where a stack's stages begin: ``cuts[i]`` is the index of the first block of the stack's
    ``i + 1``-th stage (of the ``len(cuts) + 1`` stages its ``n`` blocks span, in order)."""

    def __new__(cls, cuts, n: int) -> "Cuts":
        out = super().__new__(cls, cuts)
        out.n = n
        return out

    def __str__(self) -> str:   # blocks 0-3 | 4-7
        ends = (0, *self, self.n)
        return "blocks " + " | ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in zip(ends, ends[1:]))


def cut_options(user: Cuts, most: int = 64) -> list[Cuts]:
    """The cuts the planner may take, the user's first: every way to give each stage at least one
    block, or where those are more than ``most``, those moving each cut by at most 2 blocks."""
    every = [Cuts(c, user.n) for c in itertools.combinations(range(1, user.n), len(user))]
    if len(every) > most:
        every = [c for c in every if all(abs(a - b) <= 2 for a, b in zip(c, user))]
    return [user] + [c for c in every if c != user]


def _shown(v) -> str:
    """A choice as the plan prints it: an nd-SBP, or a setting's value."""
    if isinstance(v, (str, Cuts)):
        return str(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if v is None or v == frozenset():
        return "off"
    if isinstance(v, Zero):
        return f"stage {v.stage}"
    if isinstance(v, frozenset):
        return f"{len(v)} block(s)"
    return nd_str(v)


class _Override:
    """Parameters laid out as an assignment says for one trace: their metas change, their data is an
    uninitialized shard (a trace reads shapes, never values); restored on exit. Every parameter of
    the assignment is restored, changed or not: a trace under ZeRO-3 re-lays broadcast parameters
    as their rows (``zero.shard_parameter``), which planning must not keep."""

    def __init__(self, assignment: dict) -> None:
        self.assignment, self.saved = assignment, []

    def __enter__(self) -> None:
        for p, nd in self.assignment.items():
            if isinstance(p, Setting):
                self.saved.append((p, None, p.value, None))
                p.set(nd)
                p.value = nd
                continue
            g = p._global
            if isinstance(p, Activation):
                self.saved.append((p, None, p.chosen, None))
                p.chosen = None if nd == g.sbp else nd
                continue
            self.saved.append((p, p._data, g, p.__dict__.get("_zero3")))
            if nd == g.sbp:
                continue
            if world.rank() in g.placement.flat_ranks:   # (elsewhere absent: empty, whatever its layout)
                shape = local_shape(g.shape, nd, g.placement, world.rank())
                p._data = torch.empty(shape, dtype=p._data.dtype, device=p._data.device)
            p._global = replace(g, sbp=nd)

    def __exit__(self, *exc) -> None:
        for p, data, g, zero3 in reversed(self.saved):
            if isinstance(p, Setting):
                p.set(g)
                p.value = g
                continue
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


def plan(trace: Callable[[], tuple], params: dict, optimizers: list, *, ignore_user_sbp: bool = False,
         memory_mode: str = "AdaptiveMemory", limit: int | None = None, ratio: float = 1.0,
         wait_s: float = 0.0, device: DeviceModel | None = None, calibrate: bool = False, link=None,
         feeds: dict | None = None, activations: dict | None = None,
         settings: list[Setting] | None = None, zero: Callable[[], object] = lambda: None,
         schedule: Setting | None = None, pipeline: Callable[[], tuple] = lambda: ("1f1b", None),
         micro: Setting | None = None, cuts: Setting | None = None) -> Plan:
    """Chooses the SBP of ``params`` (name -> global parameter) by coordinate descent over the
    prediction of ``trace()`` (the graph traced and passed under the parameters' current layout:
    ``(logical graph, None)``, or for pipeline stages ``(logical graph, (the stages' placements,
    micro-batches))``, predicted by :func:`predict_pipeline` under ``pipeline()``'s schedule and
    memory mode; each parameter's candidates are on its own stage's placement). With
    ``ignore_user_sbp`` the global inputs in ``feeds`` (name -> the tensor ``trace`` reads) are
    chosen too, as OneFlow ignores every SBP the user gave (the caller lays them out so before
    each run). ``calibrate``: measure the links and the device first (collectives: every rank of
    the placements plans at once); else ``device`` and ``link`` if given, or the
    round default figures. ``activations`` (path -> :class:`Activation`): block outputs whose
    layout is chosen too when memory decides (``HeavyMemoryDown``, or a limit the parameters'
    layouts alone do not meet): a second descent after the parameters'. ``settings``
    (:func:`memory_settings`: ZeRO's stage, recomputation), when memory decides at the start: one
    more variable of the descent, tried first, each combination of their options one move (a
    handful), and again after the blocks' outputs; ``zero()``: the graph's ZeRO config of the
    moment (the state it shards). ``schedule`` (:func:`schedule_setting`): the pipeline schedule,
    a variable of every descent (it trades bubble for memory); ``micro`` (:func:`micro_batch_setting`):
    the micro-batch count, likewise (each combination with the schedule one move); ``cuts``: where
    the stages' cuts fall in a stack of blocks (:class:`Cuts`), a variable of the first descent."""
    if memory_mode not in MEMORY_MODES:
        raise UnsupportedError(f"holoflow.nn.Graph enable_auto_memory: mode {memory_mode!r} is not supported; "
                               f"supported: {', '.join(MEMORY_MODES)}")
    glob = {k: p for k, p in params.items() if p._global is not None}
    places = {p._global.placement for p in glob.values()}
    if not glob:
        raise UnsupportedError("holoflow.nn.Graph enable_auto_parallel: the graph has no global parameters; "
                               "place the model first: model.to_global(placement=flow.placement(...), "
                               "sbp=flow.sbp.broadcast)")
    with _Override({p: p._global.sbp for p in glob.values()}):   # (ZeRO-3's trace re-lays them)
        pipe = trace()[1]
    if len(places) > 1 and pipe is None:
        raise UnsupportedError(f"holoflow.nn.Graph enable_auto_parallel: plans parameters on one placement, or "
                               f"on each pipeline stage's; this graph's parameters are on {sorted(map(str, places))} "
                               f"and it has no stages (module.config.set_stage(i, placement))")
    place = next(iter(places)) if pipe is None else pipe[0][0]
    ranks = sorted({r for q in places for r in q.flat_ranks})   # (every rank plans, each stage's too)
    inputs = {k: x for k, x in (feeds or {}).items()
              if ignore_user_sbp and x._global.placement in places and not x.requires_grad}
    movable = {k: p for k, p in glob.items()
               if p.requires_grad and (ignore_user_sbp or all(s == B for s in p._global.sbp))}
    layouts = roles({**movable, **inputs})
    free = list(layouts)
    dev = next(iter(glob.values()))._data.device
    if calibrate:   # (pipeline stages: the links of all their ranks, one model every rank agrees on)
        measured = global_graph.calibrate(place if pipe is None else placement(place.type, ranks))
        link = link or (measured if pipe is not None else None)
        device = device or DeviceModel.calibrate(dev, tuple(ranks))
    device = device or DeviceModel.default(dev.type)
    k = state_per_param(optimizers)
    better = _objective(memory_mode, limit)
    acts = {a.path: a for a in (activations or {}).values() if a._global.placement in places}
    settings = settings or []
    timing = [schedule] if schedule is not None and pipe is not None and len(pipe[0]) > 1 else []
    timing += [micro] if micro is not None and pipe is not None else []
    current = {p: p._global.sbp for p in (*glob.values(), *inputs.values(), *acts.values())}
    current.update({s: s.value for s in (*settings, *timing)})
    if cuts is not None and pipe is not None:   # (where each stage's work falls: a group of its own,
        free.insert(0, [cuts])                  # set after the parameters' layouts in each trace)
        current[cuts] = cuts.value
    trail: list = []

    def evaluate(assignment: dict) -> Prediction:
        with _Override(assignment):
            ir, pipe = trace()
            if pipe is None:
                q = predict(ir, list(glob.values()), k, device, ratio, wait_s, link, zero=zero())
            else:
                name, memory = pipeline()
                q = predict_pipeline(ir, *pipe, name, list(glob.values()), k, device, ratio, wait_s, link,
                                     memory=memory, zero=zero())
        if device.calibrated and len(ranks) > 1:
            # timed kernels differ a little from rank to rank: every rank takes the slowest
            # rank's figures, so all keep the same moves and derive one plan (a pipeline's are
            # the busiest stage's, which the timed acts pick: its communication too)
            got = world.comm().all_gather_shapes(astuple(q), tuple(ranks))
            q = max((Prediction(*f) for f in got), key=lambda f: f.step_s)
        return q

    start = best = evaluate(current)

    def moves_of(group):
        if isinstance(group[0], Setting):   # ZeRO and recomputation, or the schedule: every
            was = [current[s] for s in group]   # combination one move
            yield from [dict(zip(group, combo)) for combo in itertools.product(*(s.options for s in group))
                        if list(combo) != was]
            return
        p = group[0]
        yield from ({q: nd for q in group} for nd in candidates(p) if nd != current[p])

    def singles():
        for group in free:
            yield from moves_of(group)

    def pairs():
        # a layout that pays only when two parameters change together (Megatron's MLP: rows of
        # the first weight, columns of the second) is no single step's gain
        # (each pair's moves listed from the layout it had before any of them: a pair taken
        # first must not hide a later one sharing a layout with it, Megatron's S(0), S(1) behind
        # S(0), S(0))
        for ga, gb in itertools.combinations(layouts[:PAIR_PARAMS], 2):
            a, b = ga[0], gb[0]
            was_a, was_b = current[a], current[b]
            yield from [{**{q: na for q in ga}, **{q: nb for q in gb}}
                        for na, nb in itertools.product(candidates(a), candidates(b))
                        if na != was_a and nb != was_b]

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

    def memory_decides() -> bool:
        return memory_mode == "HeavyMemoryDown" or \
            (memory_mode == "AdaptiveMemory" and limit is not None and best.memory_bytes > limit)

    if settings and memory_decides():   # tried first: from data parallel, ZeRO may fit where only
        free.insert(0, settings)        # slower layouts would
    if timing:
        free.insert(0, timing)
    descend()
    for _ in range(MAX_SWEEPS):   # then pairs of the largest parameters, descending after each gain
        if not improve(pairs):
            break
        descend()
    if acts and memory_decides():
        free[:] = activation_roles(acts)   # then the blocks' outputs (sequence parallelism, ...)
        descend()
        if settings and memory_decides() and improve(lambda: moves_of(settings)):
            free[:] = layouts + activation_roles(acts) + ([timing] if timing else [])
            descend()
    names = {id(p): k for k, p in (*glob.items(), *inputs.items())}
    names.update({id(a): f"{path} (output)" for path, a in acts.items()})
    names.update({id(s): s.name for s in (*settings, *timing, *([cuts] if cuts is not None else []))})
    choices = {names[id(p)]: (p.value if isinstance(p, Setting) else p._global.sbp, current[p]) for p in current}
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
