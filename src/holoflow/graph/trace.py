"""Tracing: ``build()`` runs through the normal dispatch with lazy tensors (meta storage), and
every op application — forward, the backward that ``loss.backward()`` runs, in-place updates —
is recorded as an IR node (docs/architecture.md, "Graph"). The same grad rules as eager build the backward graph."""
from __future__ import annotations

import os
import sys
from typing import Any

import torch

from ..core import grad_mode, interpret
from ..core.dispatch import apply, refresh, take_history, wrap
from ..core.interpret import Interpreter
from ..core.views import VIEW_SCATTER, aliases, stamp_of
from ..core.errors import HoloflowError
from ..core.registry import Meta, Op
from ..core.tensor import Tensor
from .ir import Graph, Node, Value

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_USER = (os.path.join(_PKG, "examples"),)   # holoflow's own example models count as user code


def is_user_file(path: str) -> bool:
    path = os.path.abspath(path)
    return not path.startswith(_PKG) or path.startswith(_USER)


def user_line() -> str:
    """``file:line`` of the innermost frame outside holoflow (the user's source line)."""
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename
        if is_user_file(path):
            return f"{os.path.basename(path)}:{f.f_lineno}"
        f = f.f_back
    return ""


_META = torch.device("meta")


def _as_meta(t: torch.Tensor) -> torch.Tensor:
    """A fresh meta tensor with ``t``'s strides: never a view, since eager code (autograd's
    "clone a view gradient" path) may copy a view's storage with raw torch, which a trace
    cannot follow."""
    if t.device.type == "meta" and t._base is None:
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _device_of(ins: tuple, attrs: dict) -> torch.device:
    """The real device of a node's outputs: a device attr, else its first tensor input's."""
    d = attrs.get("device")
    if isinstance(d, torch.device) and d.type != "meta":
        return d
    for v in ins:
        if isinstance(v, Value):
            return v.device
    return torch.device("cpu")


class Tracer(Interpreter):
    """The interpreter of a graph trace: records every op as an IR node, in order, and returns
    lazy tensors (meta storage). ``loss.backward()`` runs the eager engine's grad rules, which bind
    back here, so backward is recorded too (tagged ``bw``)."""

    lazy = True

    def __init__(self, names: dict[int, str] | None = None) -> None:
        super().__init__()
        self.backward_rule: Any = None        # nn.Graph's checks and loss scaling for backward()
        self.in_backward = 0
        self._ctx: list = []
        self.nodes: list[Node] = []
        self.state: dict[int, tuple[Value, Tensor]] = {}
        self.current: dict[int, Value] = {}   # id(real tensor) -> its latest value (in-place writes)
        self.updates: dict[int, tuple[Tensor, Value]] = {}
        self.names = names or {}
        self.scope: list[str] = []
        self.feeds: list[Value] = []
        self.by_data: dict[int, tuple] = {}     # id(meta storage) -> (Value, storage): saved outputs
        self.device_type: str | None = None     # the feeds' device type: autocast reads its policy

    # -- values --------------------------------------------------------------------------------
    def feed(self, t: torch.Tensor, name: str) -> Tensor:
        v = Value.like(t, name)
        self.feeds.append(v)
        return self.lazy(torch.empty(t.shape, dtype=t.dtype, device="meta"), v)

    def lazy(self, meta: torch.Tensor, v: Value) -> Tensor:
        t = Tensor._make(meta)
        self.bind_value(t, v)
        return t

    def bind_value(self, t: Tensor, v: Value) -> None:
        t.__dict__["_v"] = v
        self.by_data[id(t._data)] = (v, t._data)

    def value_of(self, x: Tensor) -> Value:
        if x._view is not None:
            refresh(x)
        v = x.__dict__.get("_v")
        if v is not None:
            return v
        key = id(x)
        if key in self.current:
            return self.current[key]
        if x._global is not None:
            from ..core.errors import UnsupportedError
            raise UnsupportedError(
                f"holoflow.nn.Graph: a global tensor (shape {tuple(x.shape)}, sbp {x._global.sbp}) "
                f"reached the trace; graphs of global tensors are not supported yet — run this "
                f"model eagerly (the global view works op by op), or use local tensors in the graph")
        if x._data.device.type == "meta":
            hit = self.by_data.get(id(x._data))
            if hit is not None and hit[1] is x._data:  # a saved output re-wrapped by a grad rule
                return hit[0]
            raise HoloflowError("holoflow.nn.Graph: a lazy tensor from another trace was used here; "
                                "tensors created inside build() cannot outlive it")
        v = Value.like(x._data, self.names.get(key, f"c{len(self.state)}"))
        self.state[key] = (v, x)
        self.current[key] = v
        return v

    @staticmethod
    def meta_of(x: Tensor) -> torch.Tensor:
        d = x._data
        return d if d.device.type == "meta" else torch.empty(d.shape, dtype=d.dtype, device="meta")

    # -- the interpreter protocol ------------------------------------------------------------------
    def value_token(self, x: Tensor) -> object:
        return x.__dict__.get("_v") or self.current.get(id(x))

    def device_type_of(self, x: Tensor) -> str:
        d = x._data.device
        return (self.device_type or "cpu") if d.type == "meta" else d.type

    def composite(self, name: str, inputs: tuple) -> tuple:
        return inputs

    def backward(self, tensors: list, grads: list, retain_graph: bool, create_graph: bool, inputs):
        def run(tensors: list, grads: list) -> None:
            self.in_backward += 1
            try:
                self.parent.backward(tensors, grads, retain_graph, create_graph, inputs)
            finally:
                self.in_backward -= 1
        if self.backward_rule is None:
            run(tensors, grads)
        else:
            self.backward_rule(tensors, grads, run)

    def bind(self, op: Op, inputs: tuple, attrs: dict):
        ins = tuple(self.value_of(x) if isinstance(x, Tensor) else x for x in inputs)
        metas = [self.meta_of(x) if isinstance(x, Tensor) else x for x in inputs]
        try:
            if op.shape is not None:
                ms = op.shape([Meta.of(m) if isinstance(m, torch.Tensor) else m for m in metas], attrs)
                outs_ = [torch.empty(m.shape, dtype=m.dtype, device="meta") for m in ms]
                out = outs_[0] if len(outs_) == 1 and op.outputs is None else \
                    (op.out_type(*outs_) if op.out_type is not None else tuple(outs_))
            else:  # real-device attrs (``to(device=cpu)``) become meta: shapes only
                out = op.kernel(*metas, **{k: _META if isinstance(v, torch.device) else v for k, v in attrs.items()})
        except NotImplementedError as e:
            raise HoloflowError(f"holoflow.nn.Graph: op {op.name!r} cannot be traced ({e}); its output "
                                f"shape depends on data. Compute it outside the graph.") from e
        except Exception as e:
            from ..core.dispatch import op_error
            raise op_error(op, inputs, attrs, e) from e
        views = None
        if op.view:  # which outputs alias the input (meta tensors know it) before _as_meta forgets
            x0 = metas[0]
            views = tuple(aliases(o, x0) for o in ((out,) if isinstance(out, torch.Tensor) else out))
        if isinstance(out, torch.Tensor):
            out = _as_meta(out)
        else:
            out = type(out)(*(_as_meta(o) for o in out)) if hasattr(out, "_fields") else \
                tuple(_as_meta(o) for o in out)
        needs = any(isinstance(x, Tensor) and x._rg for x in inputs)
        record = needs and op.grad is not None and grad_mode.STATE.enabled
        res = wrap(op, inputs, attrs, out, record, views=views)
        outs = (res,) if isinstance(res, Tensor) else tuple(res)
        dev = _device_of(ins, attrs)
        vals = tuple(Value(tuple(o._data.shape), o._data.dtype, dev) for o in outs)
        for o, v in zip(outs, vals):
            self.bind_value(o, v)
        tags = frozenset({"bw"}) if self.in_backward else frozenset()
        # a lazy tensor's ``x.to(x.device)`` names meta: at run time that is the input's device
        attrs = {k: dev if isinstance(v, torch.device) and v.type == "meta" else v for k, v in attrs.items()}
        self.nodes.append(Node(op.name, ins, attrs, vals, user_line(), "/".join(self.scope),
                               tags=tags))
        return res

    def assign(self, x: Tensor, out: Tensor, name: str) -> Tensor:
        """An in-place write, recorded functionally: ``x`` takes the new value; a view's base
        takes a ``view_scatter`` of it (other views of the base re-derive from that)."""
        vi = x._view
        if vi is not None:
            self.value_of(x)  # re-derives x first if its base changed
            base = vi.base
            with grad_mode.no_grad():  # the value only: take_history links the autograd side
                new_base = apply(VIEW_SCATTER, base, out, chain=vi.chain)
            self._set(base, new_base)
        self._set(x, out)
        take_history(x, out, name)
        if vi is not None:
            vi.stamp = stamp_of(vi.base)
        return x

    def _set(self, x: Tensor, out: Tensor) -> None:
        """``x`` holds ``out``'s value from here on: a lazy tensor is rebound; a real (state)
        tensor is recorded as updated, and reads after this point see the new value."""
        v = self.value_of(out)
        if "_v" in x.__dict__ or x._data.device.type == "meta":
            x._data = out._data
            self.bind_value(x, v)
        else:
            self.value_of(x)  # registers it as state if first seen
            self.current[id(x)] = v
            self.updates[id(x)] = (x, v)

    def effect(self, op: str, inputs: tuple, attrs: dict, kernel: Any) -> None:
        """Records a node run for its side effect on state (e.g. the optimizer update)."""
        ins = tuple(self.value_of(x) if isinstance(x, Tensor) else x for x in inputs)
        self.nodes.append(Node(op, ins, attrs, (), user_line(), effect=True, kernel=kernel))

    def graph(self, outputs: tuple, out_spec: Any) -> Graph:
        outs = tuple(self.value_of(o) if isinstance(o, Tensor) else o for o in outputs)
        return Graph(tuple(self.feeds), tuple(self.state.values()), tuple(self.nodes), outs,
                     tuple(self.updates.values()), out_spec)

    # -- entering ----------------------------------------------------------------------------------
    def __enter__(self) -> "Tracer":
        if interpret.is_lazy():
            raise HoloflowError("holoflow.nn.Graph: a graph is already tracing; nn.Graph calls "
                                "cannot be nested inside build()")
        below = interpret.stack()
        self._ctx = [interpret.pushed(self)]
        # interpreters active around the graph call (autocast) keep working on traced values
        for it in reversed(below):
            again = it.above_trace(self.device_type or "cpu")
            if again is not None:
                self._ctx.append(interpret.pushed(again))
        for c in self._ctx:
            c.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for c in reversed(self._ctx):
            c.__exit__(*exc)
        self._ctx = []
