"""``nn.Graph``'s compile (docs/architecture.md, "Graph"): ``build()`` traced with lazy tensors
(its ``loss.backward()`` and the optimizers' updates included), the IR passed, then lowered to this
rank's plan, or to a pipeline's plan for stages and micro-batches of global tensors.
"""
from __future__ import annotations

import contextlib
import logging
import time

import torch

from ..core import grad_mode
from ..core.errors import HoloflowError, UnsupportedError
from ..core.tensor import Tensor
from . import passes
from .lower import Compiled, lower
from .optimizer import add_optimizer_updates
from .pytree import flatten, unflatten
from ..distributed import world
from .global_graph import explain as explain_boxing
from .global_graph import calibrate, check_same_program, is_global, link_model, localize
from .trace import Tracer, is_user_file, user_line
from .zero import shard_parameter
from . import pipeline
from .pipeline_run import PipelineCompiled
from .passes.stages import implicit_placements, is_move, tag_update_nodes
from .graph_printing import GraphPrinting


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


class GraphCompiling(GraphPrinting):
    """The compile of :class:`graph.Graph` (a base class of it: reads the modules, optimizers,
    grad scaler and config ``Graph.__init__`` sets)."""

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
        written = tracer.written_inputs(lazy)
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

    def _layout_hooks(self) -> list:
        """Forward hooks boxing the blocks' outputs the auto-parallel plan lays out (while traced)."""
        modules = dict(self._repeated_blocks()) if self._act_vars else {}
        return [modules[path].register_forward_hook(lambda mod, inp, out, _v=var: _v.box(out))
                for path, var in self._act_vars.items() if path in modules]


def _user_frame(e: BaseException) -> str:
    tb, hit = e.__traceback__, ""
    while tb is not None:
        if is_user_file(tb.tb_frame.f_code.co_filename):
            import os
            hit = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return hit
