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

``Graph`` here is the user's class (modules, optimizers, state, calls and the plan cache); its
bases add one job each: the auto-parallel planner and the cost model's view
(graph_auto_parallel.py), the compile (graph_compile.py), and what it prints
(graph_printing.py). Plans are cached under cache_key.py's key.
"""
from __future__ import annotations

import collections
import itertools
from typing import Any, Iterable, Iterator

from ..core import saved
from ..core.errors import ArgValueError, HoloflowError
from ..core.forward_ad import any_dual
from ..core.tensor import Tensor
from .cache_key import _cache_key, _state_walk
from .config import GraphConfig
from .lower import Compiled
from .pytree import flatten, unflatten
from ..optim.optimizer import has_step_hooks
from . import pipeline
from .graph_auto_parallel import GraphAutoParallel
from ..nn import Module


class Graph(GraphAutoParallel):
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
        _refuse_duals(leaves, type(self).__name__)
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
                _refuse_duals(leaves, type(self).__name__)
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

    def _flags(self) -> tuple:
        """Module train/eval flags, parameters' requires_grad and profiling: a change traces a new
        plan."""
        return (self.config.profiling, self.config.executor, _state_walk(self._modules.values(), ())[0],
                self._hook_flags())

    def _hook_flags(self) -> tuple:
        """Which optimizers have step hooks: their plans run effects calling them around the
        update (graph/optimizer.py), so a hook added to an optimizer that had none compiles again."""
        return tuple(has_step_hooks(o) for o, _ in self._optimizers)

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


def _refuse_duals(leaves: list, name: str) -> None:
    """A plan's kernels (planned buffers, fused and compiled tasks) would drop the tangent of an
    input that is a forward-AD dual tensor (autograd/forward_ad.py): refused."""
    if any(isinstance(x, Tensor) and any_dual(x._data) for x in leaves):
        raise RuntimeError(f"holoflow.nn.Graph {name}: an input is a forward-AD dual tensor (make_dual); a graph "
                           f"runs no forward-mode AD. Call the module eagerly inside the dual level, or use "
                           f"holoflow.func.jvp")


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
