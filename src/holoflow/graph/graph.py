"""``holoflow.nn.Graph``: the same modules, traced once into an IR, optimised by passes, lowered
to a plan and run by the actor runtime (DESIGN §7), with OneFlow's API."""
from __future__ import annotations

import time
from typing import Any



from ..core import grad_mode
from ..core.errors import HoloflowError
from ..core.tensor import Tensor
from . import passes
from .config import GraphConfig
from .ir import Graph as IRGraph
from .ir import to_python
from .lower import lower
from .optimizer import add_optimizer_updates
from .pytree import flatten, unflatten
from .trace import Tracer


class Graph:
    """Subclass, assign modules, override ``build()``; the first call compiles.

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
        self.config = GraphConfig()
        self._compiled: dict = {}
        self._debug = 0
        self._log: list = []

    # -- definition ----------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        from ..nn import Module
        if isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def build(self, *args, **kwargs):
        raise NotImplementedError("holoflow.nn.Graph: subclasses must define build(self, ...)")

    def add_optimizer(self, optim, *, lr_sch=None, is_sparse: bool = False) -> None:
        """Adds an optimizer (and scheduler): ``loss.backward()`` in build also updates."""
        self._optimizers.append((optim, lr_sch))

    def set_grad_scaler(self, grad_scaler) -> None:
        self._grad_scaler = grad_scaler

    def debug(self, v_level: int = 0, *, ranks=None, max_py_stack_depth: int = 2) -> None:
        """``v_level >= 1`` prints each compile's passes; ``>= 2`` also prints the IR."""
        self._debug = v_level

    @property
    def training(self) -> bool:
        return bool(self._optimizers)

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self, destination=None) -> dict:
        out = {} if destination is None else destination
        for name, m in self._modules.items():
            out[name] = m.state_dict()
        for i, (opt, sch) in enumerate(self._optimizers):
            out[f"optimizer{i}"] = opt.state_dict()
            if sch is not None:
                out[f"lr_scheduler{i}"] = sch.state_dict()
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
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

    # -- compile and run -------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        leaves, spec = flatten((args, kwargs))
        key = _cache_key(leaves, spec)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self._compile(leaves, spec)
        feeds = {n: t._data for n, t in zip(compiled.feed_names, (x for x in leaves if isinstance(x, Tensor)))}
        result = compiled.run(feeds)
        for _, sch in self._optimizers:
            if sch is not None:
                sch.step()
        return result

    def _compile(self, leaves: list, spec) -> "Compiled":
        t0 = time.perf_counter()
        names = self._state_names()
        tracer = Tracer(names)
        lazy = [tracer.feed(x._data, f"input{i}") if isinstance(x, Tensor) else x
                for i, x in enumerate(leaves)]
        args, kwargs = unflatten(lazy, spec)
        hooks = self._scope_hooks(tracer)
        saved_grads = {id(p): p.grad for p in self._all_params()}
        try:
            with tracer, grad_mode.enable_grad():
                out = self.build(*args, **kwargs)
                if self._optimizers:
                    add_optimizer_updates(tracer, self._optimizers, self.config)
        finally:
            for h in hooks:
                h.remove()
            for p in self._all_params():
                p.grad = saved_grads.get(id(p))
        out_leaves, out_spec = flatten(out)
        ir = tracer.graph(tuple(out_leaves), out_spec)
        self._log = []
        ir = passes.run(ir, self.config, self._log)
        lowered = lower(ir, ir.frees)
        compiled = Compiled(ir, lowered, self.config.executor, time.perf_counter() - t0)
        if self._debug >= 1:
            print(self._summary(compiled))
        if self._debug >= 2:
            print(to_python(ir))
        return compiled

    def _all_params(self) -> list:
        seen, out = set(), []
        for m in self._modules.values():
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        for opt, _ in self._optimizers:
            for g in opt.param_groups:
                for p in g["params"]:
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

    # -- printing ----------------------------------------------------------------------------------
    def _summary(self, c: "Compiled") -> str:
        lines = [f"(GRAPH:{type(self).__name__}) compiled in {c.compile_s:.2f}s: {len(c.ir.nodes)} nodes, "
                 f"{len(c.lowered.tasks)} tasks, planned peak {c.peak_bytes / 2**20:.2f} MiB"]
        for name, before, after, dt in self._log:
            lines.append(f"  pass {name:<20} {before:>5} -> {after:<5} nodes  {dt * 1e3:7.1f} ms")
        return "\n".join(lines)

    def __repr__(self) -> str:
        lines = [f"(GRAPH:{type(self).__name__}):"]
        for name, m in self._modules.items():
            body = repr(m).replace("\n", "\n    ")
            lines.append(f"  (MODULE:{name}): {body}")
        lines.append(f"  (CONFIG): {self.config}")
        for c in self._compiled.values():
            lines.append(f"  (IR): {len(c.ir.nodes)} nodes, {len(c.ir.feeds)} feeds, "
                         f"{len(c.ir.state)} state tensors, {len(c.lowered.tasks)} tasks")
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


class Compiled:
    """One compiled plan (per input signature) and its executor."""

    def __init__(self, ir: IRGraph, lowered, executor: str, compile_s: float) -> None:
        from ..runtime import Runtime, SequentialExecutor
        from .passes.memory_plan import peak_bytes
        self.ir, self.lowered, self.compile_s = ir, lowered, compile_s
        self.feed_names = lowered.feed_names
        self.peak_bytes = peak_bytes(ir, ir.frees)
        self.executor = Runtime(lowered.plan) if executor == "actor" else SequentialExecutor(lowered.plan)

    def run(self, feeds: dict):
        got = self.executor(feeds)
        outs = []
        for o in self.ir.outputs:
            if hasattr(o, "id"):
                outs.append(Tensor._make(got[f"v{o.id}"]))
            else:
                outs.append(o)
        return unflatten(outs, self.ir.out_spec)

    def close(self) -> None:
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()


def _cache_key(leaves: list, spec) -> tuple:
    parts = []
    for x in leaves:
        if isinstance(x, Tensor):
            parts.append(("T", tuple(x.shape), x._data.dtype, x._data.device))
        else:
            try:
                hash(x)
                parts.append(("C", x))
            except TypeError:
                parts.append(("C", repr(x)))
    return (spec, tuple(parts))


