"""``holoflow.nn.Graph``: the same modules, traced once into an IR, optimised by passes, lowered
to a plan and run by the actor runtime (docs/architecture.md, "Graph"), with OneFlow's API.

While ``build()`` is traced, ``loss.backward()`` (a scalar loss) records the backward — divided
by the gradient-accumulation steps and multiplied by the grad scaler's live scale, as eager code
would write it — and the optimizers, grad scaler and LR schedulers become effect nodes run after
each iteration (graph/optimizer.py). ``set_gradient_accumulation_steps(n)`` traces ``build`` on
one of ``n`` micro-batches (dim 0 of every tensor input) and runs it ``n`` times per call, as
OneFlow does: eager's numbers for ``(loss / n).backward()`` per micro-batch, and outputs packed
per micro-batch (a scalar loss comes back with shape ``(n,)``);
``config.enable_amp`` is the amp pass (passes/amp.py), while an ``autocast`` region written inside
``build`` is applied as it is traced.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import time
from typing import Any, Iterable, Iterator

import torch

from ..core import grad_mode, saved
from ..core.errors import ArgTypeError, ArgValueError, HoloflowError, UnsupportedError
from ..core.tensor import Tensor
from . import passes
from .config import GraphConfig
from .lower import Compiled, lower
from .optimizer import add_optimizer_updates
from .pytree import flatten, unflatten
from ..distributed import world
from ..optim.optimizer import has_step_hooks
from .global_graph import explain as explain_boxing
from .global_graph import boxing_points, calibrate, check_same_program, is_global, link_model, localize
from .trace import Tracer, is_user_file, user_line
from .zero import shard_parameter
from . import pipeline
from .pipeline_run import PipelineCompiled
from .passes.stages import implicit_placements, is_move, tag_update_nodes
from ..nn import Module


LOG = logging.getLogger("holoflow.graph")


class GraphBuildError(HoloflowError):
    """``build()`` raised while being traced; names the user's line."""


_BUILD_ERRORS: dict = {}


def build_error(cause: BaseException, message: str) -> GraphBuildError:
    """A :class:`GraphBuildError` that is also every builtin class ``cause`` is (a ``TypeError``
    for ``build()`` called with the wrong arguments, an ``IndexError`` for a dim out of range...),
    so callers catch it as they would the error itself, as torch's classes go."""
    extra = [c for c in type(cause).__mro__ if c.__module__ == "builtins" and not issubclass(GraphBuildError, c)]
    bases = tuple(c for c in extra if not any(d is not c and issubclass(d, c) for d in extra))
    if not bases:
        return GraphBuildError(message)
    cls = _BUILD_ERRORS.get(bases)
    if cls is None:
        name = "GraphBuildError_" + "_".join(c.__name__ for c in bases)
        try:
            cls = type(name, (GraphBuildError, *bases), {"__module__": __name__})
        except TypeError:   # a builtin class whose layout can't be mixed in (OSError...)
            cls = GraphBuildError
        cls = _BUILD_ERRORS.setdefault(bases, cls)
    return cls(message)


def _state_walk(roots, optimizers) -> tuple[tuple, tuple]:
    """``(flags, layout)`` of the state under ``roots``, each module once, in a fixed order; read
    on every call, so one plain walk rather than ``modules()``' generators (a 12-layer GPT has
    ~115 modules).

    ``flags``: every module's ``training`` flag, its parameters' ``requires_grad`` and its state's
    dtypes: a parameter frozen or unfrozen between calls changes what backward computes and the
    optimizer updates, and a model cast between calls (``model.double()``) what every kernel
    reads, as in eager (part of the plan's cache key).

    ``layout``: the placement and SBP of every parameter and buffer and of the optimizers'
    parameters (None: local). A plan reads the state as it was laid out when it was compiled;
    ``module.to_global(...)`` between calls re-lays it out, so the plan is compiled again, as
    eager's next call would run on the new layout. (Not part of the cache key: ZeRO stage 3 and
    the auto-parallel plan re-lay parameters out while compiling, which is the layout the plan
    then keeps.)"""
    flags, layout, seen, stack = [], [], set(), list(roots)[::-1]
    while stack:
        m = stack.pop()
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        flags.append(m.training)
        for p in m._parameters.values():
            if p is None:
                flags.append(None)
                layout.append(None)
                continue
            flags.append((p._rg, p._data.dtype))   # (a parameter is a leaf: _rg is requires_grad)
            g = p._global
            layout.append(None if g is None else (g.placement, g.sbp))
        for b in m._buffers.values():
            if b is None:
                flags.append(None)
                layout.append(None)
                continue
            flags.append(b._data.dtype)
            g = b._global
            layout.append(None if g is None else (g.placement, g.sbp))
        subs = m._modules
        if subs:
            stack.extend(reversed(subs.values()))
    for opt, _ in optimizers:
        for group in opt.param_groups:
            layout.extend((p._global.placement, p._global.sbp) if p._global is not None else None
                          for p in group["params"])
    return tuple(flags), tuple(layout)


class Graph:
    """Subclass, assign modules, override ``build()``; the first call (per input signature) compiles.

    >>> class TrainGraph(flow.nn.Graph):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.model = model
    ...         self.add_optimizer(optimizer, lr_sch=scheduler)
    ...     def build(self, x, y):
    ...         loss = self.model(x, y)
    ...         loss.backward()
    ...         return loss
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_modules", {})
        self._optimizers: list = []
        self._grad_scaler = None
        self._scale_t: Tensor | None = None
        self.config = GraphConfig()
        self._compiled: dict = {}
        self._debug = 0
        self._log: list = []
        self._auto_plan = None   # config.enable_auto_parallel: the plan chosen (graph/auto_parallel.py)
        self._feed_sbp: dict = {}   # input position -> the nd-SBP the plan lays that input out in
        # block path -> auto_parallel.Activation: block outputs the plan boxes to a layout of its own
        self._act_vars: dict = {}

    # -- definition ----------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Module):
            self._modules[name] = value
            pipeline.attach_configs(self, name, value)   # OneFlow's module.config (set_stage, ...)
        object.__setattr__(self, name, value)

    def build(self, *args, **kwargs):
        raise NotImplementedError("holoflow.nn.Graph: subclasses must define build(self, ...)")

    def add_optimizer(self, optim, *, lr_sch=None, is_sparse: bool = False) -> None:
        """Adds an optimizer (and its LR scheduler, stepped once per call after the update)."""
        if not hasattr(optim, "param_groups") or not hasattr(optim, "step"):
            raise TypeError(f"holoflow.nn.Graph.add_optimizer: expects an optimizer (holoflow.optim.SGD, "
                            f"AdamW, ...), got a {type(optim).__name__}")
        if any(o is optim for o, _ in self._optimizers):
            raise ArgValueError(f"holoflow.nn.Graph.add_optimizer: this {type(optim).__name__} was already "
                                f"added to {type(self).__name__}; each optimizer is added once (twice would "
                                f"step its parameters twice per call)")
        added = {id(p) for o, _ in self._optimizers for g in o.param_groups for p in g["params"]}
        shared = sum(id(p) in added for g in optim.param_groups for p in g["params"])
        if shared:
            raise ArgValueError(f"holoflow.nn.Graph.add_optimizer: {shared} parameter(s) of this "
                                f"{type(optim).__name__} are already updated by an optimizer added before; "
                                f"a parameter belongs to one optimizer (use parameter groups for different "
                                f"settings)")
        self._optimizers.append((optim, lr_sch))

    def set_grad_scaler(self, grad_scaler) -> None:
        """A ``holoflow.amp.GradScaler``: the traced loss is scaled before backward; the update
        unscales the gradients, skips the step on inf/nan and adapts the scale, as eager does."""
        self._grad_scaler = grad_scaler

    def debug(self, v_level: int = 0, *, ranks=None, max_py_stack_depth: int = 2) -> None:
        """What each compile prints: ``v_level >= 1`` a summary, what every pass did and, for a global
        graph, the boxing table of :meth:`explain` (the links calibrated once per placement: a short
        collective measurement on every rank); ``>= 2`` also the program that runs (the Python
        source the plan executes, verbatim); ``>= 3`` also the IR after every pass. ``passes_log``
        and :meth:`explain` give the same afterwards."""
        if isinstance(v_level, bool) or not isinstance(v_level, int):
            raise ArgTypeError(f"holoflow.nn.Graph.debug: v_level takes an int (0 quiet .. 3 the IR after every "
                               f"pass), got {v_level!r} (a {type(v_level).__name__})")
        self._debug = v_level

    @property
    def passes_log(self) -> list:
        """The most recent compile's pipeline: a ``PassRecord`` (name, ``graph`` = the IR after it,
        ``seconds``, node counts, per-op changes) for the trace and each pass that ran;
        ``print(record)`` shows the IR after that pass as Python."""
        return list(self._log)

    def explain(self) -> str:
        """The most recent compile's summary, what each pass did, the auto-parallel plan, every
        boxing with its source line (global graphs), and the program that runs."""
        if not self._compiled:
            return f"(GRAPH:{type(self).__name__}) not compiled yet: call it once first"
        c = next(reversed(self._compiled.values()))
        boxing = f"\n{explain_boxing(c.logical)}" if is_global(c.logical) else ""
        if isinstance(c, PipelineCompiled):   # moves between stages: send/recv with their bytes
            boxing += "\n" + pipeline.explain_moves(pipeline.stage_moves(c.logical, c.placements, c.m))
        planned = f"\n{self._auto_plan}" if self._auto_plan is not None else ""
        return f"{self._summary(c)}{planned}{boxing}\n{c.program.source}"

    def boxing(self) -> list:
        """Every redistribution of the most recent compile of a global graph: ``BoxingPoint``s
        with the node (and its user source line), SBP before -> after, the collectives, bytes; then,
        for a pipelined graph, each move between stages (``pipeline.StageMove``: send/recv, bytes)."""
        if not self._compiled:
            raise HoloflowError(f"holoflow.nn.Graph {type(self).__name__}: not compiled yet: call it once first")
        c = next(reversed(self._compiled.values()))
        moves = pipeline.stage_moves(c.logical, c.placements, c.m) if isinstance(c, PipelineCompiled) else []
        return boxing_points(c.logical) + moves

    def graph_module(self, module_or_path: Any) -> "GraphModule":
        """OneFlow's per-module settings: ``g.graph_module(g.model.blocks[0]).activation_checkpointing = True``."""
        from .passes.checkpointing import _module_paths
        paths = _module_paths(self)
        path = module_or_path if isinstance(module_or_path, str) else paths.get(id(module_or_path))
        if path not in paths.values():
            raise HoloflowError(f"holoflow.nn.Graph: {module_or_path!r} is not a module of this graph")
        return GraphModule(self, path)

    @property
    def training(self) -> bool:
        return bool(self._optimizers)

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self, destination=None) -> dict:
        """Modules, optimizers, schedulers and the grad scaler, by name."""
        out = {} if destination is None else destination
        for name, m in self._modules.items():
            out[name] = m.state_dict()
        for i, (opt, sch) in enumerate(self._optimizers):
            out[f"optimizer{i}"] = opt.state_dict()
            if sch is not None:
                out[f"lr_scheduler{i}"] = sch.state_dict()
        if self._grad_scaler is not None:
            out["grad_scaler"] = self._grad_scaler.state_dict()
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Restores what :meth:`state_dict` returned; compiled plans keep working (they read the
        live tensors)."""
        for name, m in self._modules.items():
            if name in state:
                m.load_state_dict(state[name], strict=strict)
            elif strict:
                raise HoloflowError(f"holoflow.nn.Graph.load_state_dict: missing module {name!r}")
        for i, (opt, sch) in enumerate(self._optimizers):
            if f"optimizer{i}" in state:
                opt.load_state_dict(state[f"optimizer{i}"])
            if sch is not None and f"lr_scheduler{i}" in state:
                sch.load_state_dict(state[f"lr_scheduler{i}"])
        if self._grad_scaler is not None and state.get("grad_scaler"):
            self._grad_scaler.load_state_dict(state["grad_scaler"])
            if self._scale_t is not None:
                self._scale_t._data.fill_(self._grad_scaler.get_scale())

    # -- run -------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        leaves, spec = flatten((args, kwargs))
        fed = self._lay_out(leaves, spec)
        c = self._get(fed, spec)
        _refuse_saved_hooks(c)
        out = c.run(c.feeds(fed))
        _write_inputs(c, leaves, out)
        return unflatten(out, c.ir.out_spec)

    def stream(self, batches: Iterable) -> Iterator:
        """Streams batches through the actor runtime: the source prefetches batch i+1 while i
        runs. Each batch is a tuple of ``build``'s positional arguments (or one tensor); yields
        what ``graph(*batch)`` would return, in order, with the same numbers.

        >>> losses = [l.item() for l in g.stream((x, y) for x, y in loader)]
        """
        def keyed():
            for b in batches:
                leaves, spec = flatten((b if isinstance(b, tuple) else (b,), {}))
                laid = self._lay_out(leaves, spec)
                yield _cache_key(laid, spec, self._flags()), laid, spec, leaves
        for _, group in itertools.groupby(keyed(), key=lambda k: k[0]):
            _, leaves, spec, _ = first = next(group)
            c = self._get(leaves, spec)  # compiled between runs: never while a plan executes
            _refuse_saved_hooks(c)
            fed: collections.deque = collections.deque()   # each batch's leaves, until its outputs come

            def feeds(items, c=c, fed=fed):
                for _, lv, _, given in items:
                    fed.append(given)
                    yield c.feeds(lv)
            for out in c.stream(feeds(itertools.chain([first], group))):
                _write_inputs(c, fed.popleft(), out)
                yield unflatten(out, c.ir.out_spec)

    def _get(self, leaves: list, spec) -> Compiled:
        flags, layout = _state_walk(self._modules.values(), self._optimizers)
        key = _cache_key(leaves, spec, (self.config.profiling, self.config.executor, flags, self._hook_flags()))
        c = self._compiled.get(key)
        if c is not None and c.layout != layout:
            c.close()   # the state was re-laid out since (module.to_global): a stale plan
            del self._compiled[key]
            c = None
        if c is None:
            if self.config.auto_parallel and self._auto_plan is None:
                self._plan_parallel(leaves, spec)
            c = self._compiled[key] = self._compile(leaves, spec)
            c.layout = _state_walk(self._modules.values(), self._optimizers)[1]   # as compiled (ZeRO-3 included)
        return c

    def predict(self, *args, device=None, link=None, **kwargs):
        """The cost model's prediction of one step on these inputs (``graph/cost_model.Prediction``:
        compute, communication, collectives, memory per rank; for pipeline stages or micro-batches,
        the busiest stage's figures and the schedule's bubble, ``cost_model.predict_pipeline``),
        with the auto-parallel plan first when ``config.enable_auto_parallel()`` is on (under the
        same figures). Traced and passed, never run, so ranks that exist only as simulated ones
        (``distributed.world.simulate(64, ...)``: the others need only convert the model) predict
        a cluster that is not there (``device``: a ``cost_model.DeviceModel`` such as
        ``DeviceModel.default("cuda")``; ``link``: a ``global_graph.LinkModel``)."""
        from . import auto_parallel, cost_model
        leaves, spec = flatten((args, kwargs))
        params = [p for p in self._all_params() if p._global is not None]
        dev = device or cost_model.DeviceModel.default(
            next((p._data.device.type for p in params), "cpu"))
        k = auto_parallel.state_per_param([o for o, _ in self._optimizers])
        cfg = self.config
        if cfg.auto_parallel and self._auto_plan is None:
            self._plan_parallel(leaves, spec, device, link)
        ir, pipe = self._passed(self._lay_out(leaves, spec), spec)
        if pipe is not None:
            return cost_model.predict_pipeline(ir, *pipe, cfg.pipeline_schedule, params, k, dev,
                                               cfg.auto_parallel_ratio, cfg.auto_parallel_wait_s, link,
                                               memory=cfg.pipeline_memory)
        return cost_model.predict(ir, params, k, dev, cfg.auto_parallel_ratio, cfg.auto_parallel_wait_s, link,
                                  zero=cfg.zero)

    def _pipeline_logical(self, ir, cfg, log: list, mark: int, stages) -> tuple:
        """A pipeline's logical graph and its stages' placements (set, or one per placement in the
        order of the forward moves): micro-batches are the runtime's iterations, so the grad_acc
        pass is off; gradient reductions run once per step in the update task."""
        if not is_global(ir):
            raise UnsupportedError(f"holoflow.nn.Graph {type(self).__name__}: pipeline stages need global tensors: "
                                   f"module.to_global(placement, sbp) for each stage's modules and global inputs")
        ir = tag_update_nodes(ir, mark)
        cfg.grad_acc_steps, cfg.allreduce_bucket_mb = 1, 0
        ir = passes.run(ir, cfg, log)
        return ir, stages.placements if stages is not None else implicit_placements(ir)

    def _traced_passed(self, leaves: list, spec):
        """``build`` traced on ``leaves`` and passed: the logical graph a compile would lower (one
        placement: what the auto-parallel planner reads)."""
        ir, pipe = self._passed(leaves, spec)
        if pipe is not None:
            raise UnsupportedError("holoflow.nn.Graph: auto-parallel plans cover one placement; "
                                   "this graph has pipeline stages or micro-batches of global tensors")
        return ir

    def _passed(self, leaves: list, spec) -> tuple:
        """``build`` traced on ``leaves`` and passed as a compile passes it: (the logical graph,
        None), or for pipeline stages / micro-batches of global tensors (the logical graph traced
        on one micro-batch, (the stages' placements, micro-batches))."""
        from .passes.checkpointing import flagged_paths
        ir, _, stages, m, piped, mark = self._trace(leaves, spec)
        cfg = self.config.for_passes(flagged_paths(self))
        cfg.global_graph = is_global(ir)
        if piped or any(is_move(n) for n in ir.nodes):
            ir, placements = self._pipeline_logical(ir, cfg, [], mark, stages)
            return ir, (placements, m)
        return passes.run(ir, cfg, []), None

    def _plan_parallel(self, leaves: list, spec, device=None, link=None) -> None:
        """``config.enable_auto_parallel``: the parameters' SBP chosen by the cost model before the
        first compile (graph/auto_parallel.py), each candidate traced and passed, then applied."""
        from . import auto_parallel
        from .passes.checkpointing import flagged_paths
        cfg = self.config
        names = self._state_names()
        params = {names.get(id(p), f"param{i}"): p for i, p in enumerate(self._all_params())}
        feeds = {f"input{i}": x for i, x in enumerate(leaves) if isinstance(x, Tensor) and x._global is not None}

        def trace():
            return self._traced_passed(leaves, spec)
        limit = cfg.auto_memory_limit
        dev = self._device(leaves)
        if limit is None and dev is not None and dev.type == "cuda":
            limit = torch.cuda.get_device_properties(dev).total_memory
        settings = []
        if cfg.auto_memory == "HeavyMemoryDown" or limit is not None:   # memory may decide: blocks'
            self._act_vars = self._block_outputs(leaves, spec)           # outputs are variables too,
            settings = auto_parallel.memory_settings(                    # ZeRO and recomputation
                cfg, [] if flagged_paths(self) else [path for path, m in self._repeated_blocks()
                                                      if next(m.children(), None) is not None])
        chosen = auto_parallel.plan(trace, params, [o for o, _ in self._optimizers],
                                    ignore_user_sbp=cfg.auto_parallel_ignore_user_sbp, memory_mode=cfg.auto_memory,
                                    limit=limit, ratio=cfg.auto_parallel_ratio, wait_s=cfg.auto_parallel_wait_s,
                                    calibrate=cfg.auto_parallel_calibrate, device=device, link=link, feeds=feeds,
                                    activations=self._act_vars, settings=settings, zero=lambda: cfg.zero)
        auto_parallel.apply(chosen, params)
        for setting in settings:
            setting.set(chosen.choices[setting.name][1])
        for path, var in list(self._act_vars.items()):   # the chosen block outputs stay boxed
            before, after = chosen.choices[f"{path} (output)"]
            var.chosen = after if after != before else None
            if var.chosen is None:
                del self._act_vars[path]
        if limit is not None and chosen.chosen.memory_bytes > limit:
            LOG.warning(f"holoflow.nn.Graph {type(self).__name__}: enable_auto_parallel found no layout within the "
                        f"memory limit of {limit / 2**20:.1f} MiB per rank; the least memory it found is "
                        f"{chosen.chosen.memory_bytes / 2**20:.1f} MiB ({chosen.chosen.state_bytes / 2**20:.1f} of "
                        f"parameters and optimizer state), kept"
                        + (f" (it tried {' and '.join(s.name for s in settings)} too)" if settings else "")
                        + ". To fit: "
                        + ("enable_zero(True, stage=3) (shards what stays data parallel), " if
                           not any(s.name == "ZeRO" for s in settings) and (cfg.zero is None or cfg.zero.stage < 3)
                           else "")
                        + ("activation checkpointing, " if not any(s.name != "ZeRO" for s in settings) else "")
                        + "a smaller batch per rank, or more ranks")
        self._feed_sbp = {int(name[len("input"):]): after for name, (before, after) in chosen.choices.items()
                          if name in feeds and before != after}
        self._auto_plan = chosen
        if self._debug >= 1:
            print(chosen)

    def _repeated_blocks(self):
        """``(path, module)`` of every block of a stack: a child of a Sequential or ModuleList
        that has another child of its class (transformer blocks, a CNN's stages)."""
        from ..nn.containers import ModuleList, Sequential
        for mname, root in self._modules.items():
            for path, m in root.named_modules(prefix=mname):
                if not isinstance(m, (Sequential, ModuleList)):
                    continue
                kids = list(m.named_children())
                kinds = [type(c) for _, c in kids]
                yield from ((f"{path}.{name}", c) for name, c in kids if kinds.count(type(c)) > 1)

    def _block_outputs(self, leaves: list, spec) -> dict:
        """The outputs of the stacks' blocks that are global tensors: one trace with recording
        hooks, each an ``auto_parallel.Activation`` at the layout the block gives it."""
        from .auto_parallel import Activation
        seen: dict = {}

        def record(path: str):
            def hook(mod, inp, out) -> None:
                seen.setdefault(path, out)
            return hook
        handles = [m.register_forward_hook(record(path)) for path, m in self._repeated_blocks()]
        try:
            self._traced_passed(leaves, spec)
        finally:
            for h in handles:
                h.remove()
        return {p: Activation(p, t) for p, t in seen.items()
                if isinstance(t, Tensor) and t._global is not None and t.dim() > 0}

    def _layout_hooks(self) -> list:
        """Forward hooks boxing the blocks' outputs the auto-parallel plan lays out (while traced)."""
        modules = dict(self._repeated_blocks()) if self._act_vars else {}
        return [modules[path].register_forward_hook(lambda mod, inp, out, _v=var: _v.box(out))
                for path, var in self._act_vars.items() if path in modules]

    def _lay_out(self, leaves: list, spec) -> list:
        """The inputs as the auto-parallel plan lays them out (planning first if it is due): with
        ``enable_auto_parallel_ignore_user_sbp_config`` the plan may choose an input's SBP too
        (a broadcast batch split for data parallelism: a local slice); the caller's tensors keep
        theirs."""
        if self.config.auto_parallel and self._auto_plan is None:
            self._plan_parallel(leaves, spec)
        if not self._feed_sbp:
            return leaves
        return [x.to_global(sbp=list(self._feed_sbp[i]))
                if i in self._feed_sbp and isinstance(x, Tensor) and x._global is not None
                and x._global.sbp != self._feed_sbp[i] else x for i, x in enumerate(leaves)]

    def auto_parallel_plan(self):
        """The plan ``config.enable_auto_parallel`` chose (``graph/auto_parallel.Plan``: each
        parameter's SBP before and after, the predicted step and memory of both)."""
        if self._auto_plan is None:
            raise HoloflowError(f"holoflow.nn.Graph {type(self).__name__}: no auto-parallel plan: enable "
                                f"config.enable_auto_parallel() and call the graph once")
        return self._auto_plan

    def _flags(self) -> tuple:
        """Module train/eval flags, parameters' requires_grad and profiling: a change traces a new
        plan."""
        return (self.config.profiling, self.config.executor, _state_walk(self._modules.values(), ())[0],
                self._hook_flags())

    def _hook_flags(self) -> tuple:
        """Which optimizers have step hooks: their plans run effects calling them around the
        update (graph/optimizer.py), so a hook added to an optimizer that had none compiles again."""
        return tuple(has_step_hooks(o) for o, _ in self._optimizers)

    # -- compile ---------------------------------------------------------------------------------
    def _trace(self, leaves: list, spec) -> tuple:
        """``build`` traced on ``leaves``: the IR (the user's outputs, then the inputs build wrote in
        place), those inputs' positions, the pipeline stages, micro-batches, whether micro-batches
        or stages make it a pipeline, and where the update nodes begin."""
        tracer = Tracer(self._state_names())
        dev = self._device(leaves)
        tracer.device_type = dev.type if dev is not None else "cpu"
        # stages, or micro-batches of a global graph: graph/pipeline.py (traced on one micro-batch)
        stages = pipeline.resolve_stages(self)
        m = self.config.grad_acc_steps
        piped = stages is not None or (m > 1 and any(
            x._global is not None for x in (*leaves, *self._all_params()) if isinstance(x, Tensor)))
        traced = pipeline.micro_protos(leaves, m) if m > 1 else leaves   # traced on one micro-batch
        # a local host feed of an accelerator graph is traced on that device: the plan's copy
        # stream moves it there (graph/cuda_streams.py), so ``x.device`` in build() names it
        lazy = [tracer.feed(x, f"input{i}", dev if dev is not None and dev.type != "cpu" else None)
                if isinstance(x, Tensor) else x for i, x in enumerate(traced)]
        args, kwargs = unflatten(lazy, spec)
        scale = self._scale_tensor(dev)
        hooks = self._scope_hooks(tracer) + (pipeline.stage_hooks(self, stages) if stages is not None else []) \
            + self._layout_hooks()
        saved_grads = {id(p): p.grad for p in self._all_params()}
        for p in self._all_params():   # an eager step's leftover .grad is no part of the program
            p.grad = None
            # ZeRO-3 lays its parameters out as their rows before build() reads any of them: a
            # read that is no op (``p.detach()``) must see the layout the plan will hold
            shard_parameter(p, self.config.zero)
            if p.__dict__.get("_grad_dtype", p._data.dtype) not in (None, p._data.dtype):
                raise UnsupportedError(f"holoflow.nn.Graph: a parameter of shape {tuple(p.shape)} has grad_dtype "
                                       f"{p.grad_dtype} (not its dtype {p.dtype}): a graph's gradients and updates "
                                       f"are in the parameter's dtype; reset it (p.grad_dtype = p.dtype) or train "
                                       f"this model eagerly")
        train = bool(self._optimizers)
        try:
            with contextlib.ExitStack() as stack:
                tracer.backward_rule = self._backward_rule(scale, tracer, m)
                tracer.zero = self.config.zero
                tracer.amp = bool(self.config.amp)
                stack.enter_context(tracer)
                stack.enter_context(grad_mode.enable_grad() if train else grad_mode.no_grad())
                out = self._trace_build(args, kwargs)
                if train:
                    add_optimizer_updates(tracer, self._optimizers, self._grad_scaler if scale is not None else None,
                                          scale, self.config.zero)
        except GraphBuildError:
            raise
        except Exception as e:
            raise build_error(e, f"holoflow.nn.Graph {type(self).__name__}: build() failed while tracing"
                                 f"{_user_frame(e)}: {type(e).__name__}: {e}") from e
        finally:
            for h in hooks:
                h.remove()
            for p in self._all_params():
                p.grad = saved_grads.get(id(p))
        out_leaves, out_spec = flatten(out)
        # inputs written in place inside build (``x.add_(1)``, ``x[0] = 0``): their last values
        # are extra outputs (after the user's, which ``out_spec`` rebuilds) copied back into the
        # caller's tensors after the call, as eager's write would be seen
        written = [i for i, (x, t) in enumerate(zip(traced, lazy)) if isinstance(x, Tensor)
                   and t.__dict__.get("_v") is not tracer.feeds[_feed_index(traced, i)]]
        ir = tracer.graph(tuple(out_leaves) + tuple(lazy[i] for i in written), out_spec)
        return ir, written, stages, m, piped, getattr(tracer, "pp_mark", len(ir.nodes))

    def _compile(self, leaves: list, spec) -> Compiled:
        t0 = time.perf_counter()
        ir, written, stages, m, piped, mark = self._trace(leaves, spec)
        log = [passes.record("trace", ir.with_(nodes=()), ir, time.perf_counter() - t0)]
        from .passes.checkpointing import flagged_paths
        cfg = self.config.for_passes(flagged_paths(self))
        cfg.global_graph = is_global(ir)
        if self.config.zero is not None and not cfg.global_graph:   # OneFlow accepts it too: a no-op
            LOG.warning(f"holoflow.nn.Graph {type(self).__name__}: enable_zero(stage={self.config.zero.stage}) "
                        f"has no effect: this graph's parameters and inputs are local, and ZeRO shards "
                        f"data-parallel state across the ranks of global parameters; model.to_global(placement, "
                        f"broadcast) and global inputs to use it")
        if piped or any(is_move(n) for n in ir.nodes):   # moves between placements: stages by placement
            if written:
                raise UnsupportedError(
                    f"holoflow.nn.Graph {type(self).__name__}: build() writes its input(s) "
                    f"{written} in place; a pipeline or a global graph with gradient "
                    f"accumulation (micro-batches as runtime iterations) does not write inputs back to "
                    f"the caller: write into a copy (x = x + 1) or return the new value")
            return self._compile_pipeline(ir, cfg, log, stages, m, t0, mark)
        ir = passes.run(ir, cfg, log)
        logical = ir
        if is_global(ir):  # this rank's plan, derived from the logical graph without communication
            ir = localize(ir, world.rank(), seed=check_same_program(ir))
        lowered = lower(ir, profile=self.config.profiling, compile_tasks=self.config.compile_tasks,
                        gather_ahead=self.config.gather_ahead)
        c = Compiled(ir, lowered, self.config.executor, time.perf_counter() - t0, self.config.profiling, log,
                     logical=logical)
        c.written_inputs = tuple(written)
        self._log = log
        if self._debug >= 1:
            print(self._summary(c))
            if is_global(logical):   # every rank compiles: the link calibration is collective
                place = next(v.placement for v in (*logical.feeds, *(v for v, _ in logical.state))
                             if v.placement is not None)
                if link_model(place).calibrated is False:
                    calibrate(place)
                print(explain_boxing(logical))
        if self._debug >= 3:
            print("\n\n".join(map(str, log)))
        if self._debug >= 2:
            print(c.program.source)
        return c

    def _compile_pipeline(self, ir, cfg, log: list, stages, m: int, t0: float, mark: int):
        """Stages / micro-batches (graph/pipeline.py), each rank's plan (graph/pipeline_run.py)."""
        if self.config.compile_tasks:
            LOG.warning(f"holoflow.nn.Graph {type(self).__name__}: enable_compile does not apply to pipeline stages "
                        f"or micro-batches of global tensors yet; this graph runs uncompiled")
        ir, placements = self._pipeline_logical(ir, cfg, log, mark, stages)
        seed = pipeline.check_same_program(ir, placements)
        c = PipelineCompiled(ir, placements, m, self.config.pipeline_schedule, memory=self.config.pipeline_memory,
                             seed=seed,
                             rank=world.rank(), comm=world.comm(), passes_log=log,
                             compile_s=time.perf_counter() - t0, profile=self.config.profiling)
        self._log = log
        if self._debug >= 1:
            print(self._summary(c))
        if self._debug >= 2:
            print(c.program.source)
        return c

    def _trace_build(self, args: tuple, kwargs: dict):
        # on one micro-batch under gradient accumulation: passes/grad_acc.py or the pipeline
        # runtime repeats it
        return self.build(*args, **kwargs)

    def _scale_tensor(self, device) -> Tensor | None:
        """The live scale the traced loss multiplies by (None without an enabled grad scaler)."""
        s = self._grad_scaler
        if s is None or not s.is_enabled():
            return None
        if self._scale_t is None:
            from ..ops.creation import full
            if s._scale is None:
                s._lazy_init(device)
            self._scale_t = full((), s.get_scale(), dtype=s._scale.dtype, device=device)
        return self._scale_t

    def _backward_rule(self, scale: Tensor | None, tracer: Tracer | None = None, micro: int = 1):
        """``loss.backward()`` inside build (the tracer calls this rule): a scalar loss, scaled by
        the grad scaler before the traced backward (and by 1/m when build is traced on one of m
        micro-batches, as OneFlow does)."""
        def rule(tensors: list, grads: list, run) -> None:
            if not self._optimizers:
                raise GraphBuildError(f"holoflow.nn.Graph: loss.backward() at {user_line()} in an inference "
                                      f"graph; call self.add_optimizer(opt) in __init__ to train")
            if len(tensors) != 1 or tensors[0].numel() != 1:
                raise GraphBuildError(f"holoflow.nn.Graph: loss.backward() at {user_line()} needs a scalar loss, "
                                      f"got shape {tuple(tensors[0].shape)}; reduce it first (e.g. loss.mean())")
            loss = tensors[0] * pipeline.scale_on(scale, tensors[0]) if scale is not None else tensors[0]
            if micro > 1:
                loss = loss / micro
            # earlier micro-batches' grads are set aside and added after (same order as eager):
            # autograd's own accumulation may copy a gradient with raw torch, which no trace sees
            params = self._all_params()
            held = [p.grad for p in params]
            for p in params:
                p.grad = None
            try:
                run([loss], grads)
            finally:
                for p, old in zip(params, held):
                    if old is not None:
                        p.grad = old if p.grad is None else old + p.grad
                if tracer is not None:
                    tracer.pp_mark = len(tracer.nodes)   # what follows reads backward's results
        return rule

    def _device(self, leaves: list) -> torch.device | None:
        """The device the graph computes on: its parameters' accelerator if they are on one, else
        the first input tensor's (None without tensors)."""
        for p in self._all_params():
            if p._data.device.type not in ("cpu", "meta"):
                return p._data.device
        return next((x._data.device for x in leaves if isinstance(x, Tensor)), None)

    def _all_params(self) -> list:
        seen, out = set(), []
        params = [p for m in self._modules.values() for p in m.parameters()]
        params += [p for opt, _ in self._optimizers for g in opt.param_groups for p in g["params"]]
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    def _state_names(self) -> dict[int, str]:
        names = {}
        for mname, m in self._modules.items():
            for n, p in m.named_parameters():
                names.setdefault(id(p), f"{mname}.{n}")
            for n, b in m.named_buffers():
                names.setdefault(id(b), f"{mname}.{n}")
        return names

    def _scope_hooks(self, tracer: Tracer) -> list:
        """Forward hooks that keep ``tracer.scope`` = the module path being traced."""
        handles = []
        for mname, root in self._modules.items():
            for sub, m in root.named_modules(prefix=mname):
                def pre(mod, inp, _n=sub):
                    tracer.scope.append(_n)

                def post(mod, inp, out):
                    tracer.scope.pop()
                handles.append(m.register_forward_pre_hook(pre))
                handles.append(m.register_forward_hook(post))
        return handles

    # -- profiling -------------------------------------------------------------------------------
    def profile_table(self) -> str:
        """Per-op time per iteration and the actors' acts, for each plan compiled with
        ``config.enable_profiling()``."""
        return "\n".join(f"plan {i}:\n{c.profile_table()}" for i, c in enumerate(self._compiled.values())
                         if c.profile)

    def write_trace(self, path: str) -> None:
        """The actors' acts of the most recently compiled plan as a Chrome/Perfetto trace."""
        c = next(reversed(self._compiled.values()))
        if isinstance(c, PipelineCompiled):   # every rank's acts in one file (collective)
            c.write_trace(path)
            return
        c.executor.write_trace(path)

    def print_profile(self) -> None:
        print(self.profile_table())
        if self.config.profile_path:
            self.write_trace(self.config.profile_path)
            print(f"(GRAPH:{type(self).__name__}) trace written to {self.config.profile_path}")

    # -- printing --------------------------------------------------------------------------------
    def _notes(self) -> list[str]:
        notes = []
        passes.load_all()
        for flag, name in (("fuse_add_to_output", "fuse_add_to_output"), ("fuse_model_update", "fuse_update")):
            if getattr(self.config, flag) and not any(p.name == name for p in passes.PIPELINE):
                notes.append(f"{flag} is recorded; no pass implements it yet")
        return notes

    def _summary(self, c: Compiled) -> str:
        lines = [f"(GRAPH:{type(self).__name__}) compiled in {c.compile_s:.2f}s: {len(c.ir.nodes)} nodes, "
                 f"{len(c.lowered.tasks)} tasks, planned peak {c.peak_bytes / 2**20:.2f} MiB"]
        lines += [f"  {r.summary()}" for r in c.passes_log]
        lines += [f"  note: {n}" for n in self._notes()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        lines = [f"(GRAPH:{type(self).__name__}):"]
        for name, m in self._modules.items():
            lines.append(f"  (MODULE:{name}): " + repr(m).replace("\n", "\n    "))
        lines.append(f"  (CONFIG): {self.config}")
        lines += [f"  (NOTE): {n}" for n in self._notes()]
        for c in self._compiled.values():
            ops: dict[str, int] = {}
            for n in c.ir.nodes:
                ops[n.op] = ops.get(n.op, 0) + 1
            top = ", ".join(f"{k}x{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
            lines.append(f"  (IR): {len(c.ir.nodes)} nodes, {len(c.ir.feeds)} feeds, {len(c.ir.state)} state "
                         f"tensors, {len(c.lowered.tasks)} tasks, planned peak {c.peak_bytes / 2**20:.2f} MiB; "
                         f"ops: {top}")
        return "\n".join(lines)

    def close(self) -> None:
        for c in self._compiled.values():
            c.close()
        self._compiled.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class GraphModule:
    """A module's graph-level settings (OneFlow's ``nn.graph.GraphModule``), by module path."""

    def __init__(self, graph: Graph | None, path: str, module: Any = None) -> None:
        self.graph, self.path, self.module = graph, path, module

    @classmethod
    def for_module(cls, module: Any) -> "GraphModule":
        """``module.to(nn.graph.GraphModule)``: the module's graph-level settings."""
        return cls(None, "", module)

    def _module(self) -> Any:
        if self.module is None:
            self.module = pipeline.graph_module_at(self.graph, self.path)
        return self.module

    @property
    def activation_checkpointing(self) -> bool:
        if self.graph is None:
            cfg = self._module().__dict__.get("config")
            return bool(cfg is not None and cfg.activation_checkpointing)
        return self.path in self.graph.config.checkpointed_scopes

    @activation_checkpointing.setter
    def activation_checkpointing(self, on: bool) -> None:
        if self.graph is None:
            cfg = self._module().__dict__.get("config")
            if cfg is None:
                raise HoloflowError("holoflow.nn.Graph: activation_checkpointing needs the module in a graph")
            cfg.activation_checkpointing = on
            return
        from .passes.checkpointing import set_activation_checkpointing
        set_activation_checkpointing(self.graph, self.path, bool(on))

    def set_stage(self, stage_id: int | None = None, placement: Any = None) -> None:
        """Puts the module on pipeline stage ``stage_id`` with ``placement`` (default: its
        parameters'); its global inputs are moved there (graph/pipeline.py)."""
        pipeline.set_stage(self._module(), stage_id, placement)

    @property
    def stage_id(self) -> int | None:
        return pipeline.stage_of(self._module())

    @stage_id.setter
    def stage_id(self, value: int) -> None:
        pipeline.set_stage(self._module(), value, None)


def _feed_index(leaves: list, i: int) -> int:
    """The feed number of tensor leaf ``i`` (non-tensor leaves are constants, not feeds)."""
    return sum(isinstance(x, Tensor) for x in leaves[:i])


def _refuse_saved_hooks(c) -> None:
    """A training plan called under saved tensor hooks would silently run without them (it keeps
    what its backward reads itself): refused, as its trace refuses them."""
    if saved.current() is not None and any("bw" in n.tags for n in c.ir.nodes):
        saved.refuse_in_graph()


def _write_inputs(c, leaves: list, out: list) -> None:
    """Copies the last values of inputs that ``build`` wrote in place (the trailing outputs)
    into the caller's tensors."""
    written = c.written_inputs
    for i, v in zip(written, out[len(out) - len(written):]):
        x = leaves[i]
        if x._global is not None and v._global is not None and v._global.sbp != x._global.sbp:
            v = v.to_global(sbp=list(x._global.sbp))   # an input the plan laid out otherwise
        x._data.copy_(v._data)


def _user_frame(e: BaseException) -> str:
    tb, hit = e.__traceback__, ""
    while tb is not None:
        if is_user_file(tb.tb_frame.f_code.co_filename):
            import os
            hit = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return hit


def _cache_key(leaves: list, spec, flags: tuple = ()) -> tuple:
    parts = []
    for x in leaves:
        if isinstance(x, Tensor):
            g = x._global   # a global input of another placement or SBP compiles another plan
            parts.append(("T", tuple(x.shape), x._data.dtype, x._data.device) +
                         ((g.placement, g.sbp) if g is not None else ()))
        else:
            try:
                hash(x)
                parts.append(("C", x))
            except TypeError:
                parts.append(("C", repr(x)))
    return (spec, tuple(parts), flags)
