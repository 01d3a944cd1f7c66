"""Tracing: ``build()`` runs through the normal dispatch with lazy tensors (meta storage), and
every op application — forward, the backward that ``loss.backward()`` runs, in-place updates —
is recorded as an IR node (docs/architecture.md, "Graph"). The same grad rules as eager build the backward
graph."""
from __future__ import annotations

import dataclasses

import functools
import os
import sys
from typing import Any

import torch

from ..core import grad_mode, interpret
from ..core.dispatch import (apply, distinct_elements, follows_base, holds_elements_twice, refresh, refresh_value,
                             take_history, wrap)
from ..core.dispatch import assign as write_into
from ..core.interpret import Interpreter
from ..core.views import VIEW_SCATTER, aliases, detached_from, make_view, replay, stamp_of
from ..core.errors import HoloflowError, UnsupportedError
from ..core.keys import cache_key
from ..core.sbp import B
from ..distributed.global_dispatch import decide
from ..distributed.sharding import normalize_sbp
from ..ops.conversion import CLONE
from ..ops.loss import AMP_BOUNDARY
from .global_graph import GLOBAL_BOX, GLOBAL_TAG, LazyGlobal
from ..core.registry import Meta, Op, infer_metas, meta_attrs
from ..core.tensor import Tensor
from .ir import SEQ1, IRGraph, Node, Value, may_alias
from .pipeline import trace_move
from .zero import ZERO3, shard_parameter

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_USER = (os.path.join(_PKG, "examples"),)   # holoflow's own example models count as user code


@functools.lru_cache(maxsize=4096)
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




def _as_meta(t: torch.Tensor) -> torch.Tensor:
    """A fresh meta tensor with ``t``'s strides: never a view, since eager code (autograd's
    "clone a view gradient" path) may copy a view's storage with raw torch, which a trace
    cannot follow."""
    if t.device.type == "meta" and t._base is None:
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _strided_outputs(op: Op, metas: list, attrs: dict):
    """The outputs of an op with a shape rule when an input is strided: the kernel's on meta
    tensors, in the layout eager's has (an elementwise op keeps a transposed input's strides,
    and a later reshape views or copies by them; the rule's outputs are contiguous). None when
    every input is contiguous (the rule's layout is the kernel's) or the meta kernel fails (the
    rule then runs, and names a bad input)."""
    if op.view or not any(isinstance(m, torch.Tensor) and not m.is_contiguous() for m in metas):
        return None
    try:
        return _meta_outputs(op, metas, attrs)
    except Exception:
        return None


_OUT_METAS: dict = {}   # (op, input metas with strides, attrs) -> output (shape, stride, dtype)s
_MAX_OUT_METAS = 1 << 16


def _meta_key(op: Op, metas: list, attrs: dict):
    """The key of an op's run on meta inputs, or None when it cannot be one: a view (its outputs
    must alias the input), or a real tensor or unhashable value among the inputs or attrs."""
    if op.view:
        return None
    parts = []
    for m in metas:
        if isinstance(m, torch.Tensor):
            if m.device.type != "meta":
                return None
            parts.append((tuple(m.shape), m.stride(), m.storage_offset(), m.dtype))
        else:   # by type and value: ``x * 2`` and ``x * 2.0`` differ (an int tensor's dtype)
            k = cache_key(m)
            if k is None:
                return None
            parts.append(k)
    a = cache_key(attrs)
    return None if a is None else (op.name, tuple(parts), a)


def _logical_views(op: Op, x: torch.Tensor, rest: list, attrs: dict) -> tuple | None:
    """Per output of view op ``op``, whether torch's kernel on ``x`` (a meta tensor with the
    logical strides) returns a view of it; None where the meta kernel refuses."""
    try:
        out = op.kernel(x, *[r._data if isinstance(r, Tensor) else r for r in rest],
                        **meta_attrs(attrs))
    except Exception:
        return None
    return tuple(aliases(o, x) for o in ((out,) if isinstance(out, torch.Tensor) else out))


def _meta_outputs(op: Op, metas: list, attrs: dict):
    """``op``'s kernel on meta tensors (its outputs' shapes, strides and dtypes), run once per
    key: meta kernels written in Python (torch's refs and decompositions: layer_norm's backward
    costs ~10 ms) dominate tracing, and equal layers, and the auto-parallel planner's repeated
    traces, run the same ones. Outputs that are fresh tensors are remembered; an output that is an
    input (``x.to(x.dtype)``) or a view is not."""
    key = _meta_key(op, metas, attrs)
    hit = _OUT_METAS.get(key) if key is not None else None
    if hit is not None:
        outs = tuple(torch.empty_strided(sh, st, dtype=dt, device="meta") for sh, st, dt in hit[1])
        return outs[0] if hit[0] is None else hit[0](*outs)
    out = op.kernel(*metas, **meta_attrs(attrs))
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    if key is not None and all(isinstance(o, torch.Tensor) and o.device.type == "meta" and o._base is None
                               and all(o is not m for m in metas) for o in outs):
        if len(_OUT_METAS) >= _MAX_OUT_METAS:
            _OUT_METAS.clear()
        kind = None if isinstance(out, torch.Tensor) else (type(out) if hasattr(out, "_fields") else
                                                            (lambda *xs, _t=type(out): _t(xs)))
        _OUT_METAS[key] = (kind, tuple((tuple(o.shape), o.stride(), o.dtype) for o in outs))
    return out


def _device_of(ins: tuple, attrs: dict) -> torch.device:
    """The real device of a node's outputs: a device attr, else its first tensor input's."""
    d = attrs.get("device")
    if isinstance(d, torch.device) and d.type != "meta":
        return d
    for v in ins:
        if isinstance(v, Value):
            return v.device
    return torch.device("cpu")


def _value_like(x: Tensor, name: str) -> Value:
    """The IR value of a real tensor: a global one by its logical shape, placement and SBP."""
    d, g = x._data, x._global
    if g is None:
        return Value.like(d, name)
    return Value(tuple(g.shape), d.dtype, d.device, name, placement=g.placement, sbp=g.sbp)


def _what(x: Tensor, names: dict) -> str:
    """How an error names a traced tensor: the graph input or parameter it is, else its shape."""
    v = x.__dict__.get("_v")
    if v is not None and v.name.startswith("input"):
        return f"graph input {v.name} (shape {tuple(x.shape)})"
    if id(x) in names:
        return f"{names[id(x)]} (shape {tuple(x.shape)})"
    return f"a tensor of shape {tuple(x.shape)}"


def _placement(op: Op, inputs: tuple, names: dict | None = None):
    """The placement of an op's global inputs (None if all are local); mixing raises, naming the
    tensors (graph inputs by position, parameters by name)."""
    names = names or {}
    place, first = None, None
    for x in inputs:
        if isinstance(x, Tensor) and x._global is not None:
            if place is not None and x._global.placement != place:
                raise HoloflowError(f"holoflow.nn.Graph: {op.name} at {user_line()} mixes placements: "
                                    f"{_what(first, names)} on {place} and {_what(x, names)} on "
                                    f"{x._global.placement}; move one with .to_global(placement=...)")
            place, first = x._global.placement, first if first is not None else x
    if place is not None:
        for x in inputs:
            if isinstance(x, Tensor) and x._global is None:
                raise HoloflowError(f"holoflow.nn.Graph: {op.name} at {user_line()} mixes a local tensor, "
                                    f"{_what(x, names)}, with global tensors on {place}; make it global "
                                    f"first (.to_global(placement, sbp)), create it with placement=/sbp=, or, "
                                    f"for tensors the model creates itself (torch.arange(T, device=x.device)), "
                                    f"call it inside holoflow.utils.global_view.global_mode(True, "
                                    f"placement=..., sbp=...), where creation ops make global tensors")
    return place


def _records(inputs: tuple) -> bool:
    """Whether autograd records an op on ``inputs`` (grad mode on, the op has a grad rule), as
    eager decides: an input requires grad, or a view's base does (``dispatch.follows_base``). The
    view inputs are re-derived first (history and value), as eager's grad node re-derives them;
    an op that records nothing reads a view's value only (``Tracer.value_of``)."""
    if not (any(isinstance(x, Tensor) and x._rg for x in inputs) or follows_base(inputs)):
        return False
    for x in inputs:
        if isinstance(x, Tensor) and x._view is not None:
            refresh(x)
    return True


class Tracer(Interpreter):
    """The interpreter of a graph trace: records every op as an IR node, in order, and returns
    lazy tensors (meta storage). ``loss.backward()`` runs the eager engine's grad rules, which bind
    back here, so backward is recorded too (tagged ``bw``)."""

    lazy = True

    def __init__(self, names: dict[int, str] | None = None) -> None:
        super().__init__()
        self.backward_rule: Any = None        # nn.Graph's checks and loss scaling for backward()
        self.zero: Any = None                 # graph/zero.py's Zero when config.enable_zero
        self.in_backward = 0
        self.amp = False   # config.enable_amp: composite ops' inputs are marked (AMP_BOUNDARY)
        self._ctx: list = []
        self.nodes: list[Node] = []
        self.state: dict[int, tuple[Value, Tensor]] = {}
        self.current: dict[int, Value] = {}   # id(real tensor) -> its latest value (in-place writes)
        self.updates: dict[int, tuple[Tensor, Value]] = {}
        self.names = names or {}
        self.scope: list[str] = []
        self.feeds: list[Value] = []
        self.by_data: dict[int, tuple] = {}     # id(meta storage) -> (Value, storage): saved outputs
        # values that may share memory with a feed or state (memory the caller, the optimizer's
        # step or a write-back changes after the node ran): those, joined through nodes that may
        # alias (ir.may_alias: view ops, boxing by a local slice, ops not declared fresh)
        self.external: set[Value] = set()
        self.device_type: str | None = None     # the feeds' device type: autocast reads its policy
        self._quiet = False   # a write reaching a detach()ed alias's source: its version moved already

    # -- values --------------------------------------------------------------------------------
    def feed(self, x: Tensor, name: str, device: torch.device | None = None) -> Tensor:
        """A lazy tensor standing for graph input ``x`` (a global input keeps its placement and
        SBP, with its logical shape); a local one on the host is taken as on ``device`` if given
        (the plan copies it there)."""
        v = _value_like(x, name)
        if device is not None and x._global is None and v.device.type == "cpu":
            v = dataclasses.replace(v, device=device)
        self.feeds.append(v)
        self.external.add(v)
        t = self.lazy_tensor(torch.empty(v.shape, dtype=v.dtype, device="meta"), v)
        if x._global is not None:
            t._global = LazyGlobal(x._global.placement, x._global.sbp, x._global.shape, tracer=self)
        return t

    def written_inputs(self, lazy: list) -> list[int]:
        """The positions in ``lazy`` (the traced function's flattened inputs: feeds in order,
        non-tensor leaves between them) of the inputs the trace wrote in place (``x.add_(1)``,
        ``x[0] = 0``): their value is no longer the feed's."""
        feeds = iter(self.feeds)
        return [i for i, t in enumerate(lazy) if isinstance(t, Tensor) and t.__dict__.get("_v") is not next(feeds)]

    def lazy_tensor(self, meta: torch.Tensor, v: Value) -> Tensor:
        t = Tensor._make(meta)
        self.bind_value(t, v)
        return t

    def bind_value(self, t: Tensor, v: Value) -> None:
        t.__dict__["_v"] = v
        self.by_data[id(t._data)] = (v, t._data)

    def overwrite(self, x: Tensor, values: Tensor) -> None:
        self.bind_value(x, self.value_of(values))   # (a saved output is read by its storage: by_data)

    def value_of(self, x: Tensor) -> Value:
        if x._view is not None:   # (its value; its history only where eager's is: _records)
            refresh_value(x)
        elif "_detached_from" in x.__dict__:
            src = detached_from(x)
            if src is not None:   # a detach()ed alias: its source's current value (writes since included)
                v = self.value_of(src)
                if "_v" in x.__dict__ and x.__dict__["_v"] is not v:
                    x._data = src._data
                    self.bind_value(x, v)
                return v
        v = x.__dict__.get("_v")
        if v is not None:
            return v
        key = id(x)
        if key in self.current:
            return self.current[key]
        if x._data.device.type == "meta":
            hit = self.by_data.get(id(x._data))
            if hit is not None and hit[1] is x._data:  # a saved output re-wrapped by a grad rule
                return hit[0]
            raise HoloflowError("holoflow.nn.Graph: a lazy tensor from another trace was used here; "
                                "tensors created inside build() cannot outlive it")
        v = _value_like(x, self.names.get(key, f"c{len(self.state)}"))
        self.state[key] = (v, x)
        self.external.add(v)
        self.current[key] = v
        return v

    @staticmethod
    def meta_of(x: Tensor) -> torch.Tensor:
        d = x._data
        return d if d.device.type == "meta" else torch.empty(tuple(x.shape), dtype=d.dtype, device="meta")

    # -- the interpreter protocol ------------------------------------------------------------------
    def value_token(self, x: Tensor) -> object:
        if "_detached_from" in x.__dict__ and x._view is None:   # (a detach()ed alias: its source's)
            return self.value_of(x)
        return x.__dict__.get("_v") or self.current.get(id(x))

    def device_type_of(self, x: Tensor) -> str:
        d = x._data.device
        return (self.device_type or "cpu") if d.type == "meta" else d.type

    def composite(self, name: str, inputs: tuple) -> tuple:
        if not self.amp:   # (an autocast region above the trace has cast them already)
            return inputs
        return tuple(apply(AMP_BOUNDARY, x, amp_policy=name) if isinstance(x, Tensor) and x.is_floating_point()
                     else x for x in inputs)

    def globalize(self, t: Tensor, placement, sbp) -> Tensor:
        nd = normalize_sbp(sbp, placement, t.dim())
        return self.box(self.make_global(t, placement, (B,) * placement.ndim), nd)

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
        for x in inputs:
            if isinstance(x, Tensor) and x._global is None and x._data.device.type == "meta":
                self._adopt(x)
        place = _placement(op, inputs, self.names)
        if place is None:
            return self._record(op, inputs, attrs)
        return self._bind_global(op, inputs, attrs, place)

    def _bind_global(self, op: Op, inputs: tuple, attrs: dict, place):
        """An op on global values: the signature eager would choose; inputs whose SBP differs
        are boxed by recorded ``global_box`` nodes; outputs are global values of that SBP."""
        if self.zero is not None and self.zero.stage >= 3:   # ZeRO-3: parameters read whole, gathered here
            inputs = tuple(self._gather_zero3(x) if isinstance(x, Tensor) and shard_parameter(x, self.zero)
                           else x for x in inputs)
        metas = [Meta(tuple(x.shape), x._data.dtype) if isinstance(x, Tensor) else x for x in inputs]
        cur = [x._global.sbp for x in inputs if isinstance(x, Tensor)]
        sig, logical, _ = decide(op, metas, attrs, cur, place,
                                 meta_attrs(attrs))
        if logical is None:   # the shape rule said why: run it again for the message
            try:
                infer_metas(op, tuple(m.empty() if isinstance(m, Meta) else m for m in metas),
                            meta_attrs(attrs))
                why = "no shape rule"
            except NotImplementedError as e:
                why = str(e)
            raise HoloflowError(f"holoflow.nn.Graph: op {op.name!r} at {user_line()} cannot be traced on "
                                f"global tensors ({why}); its output shape depends on data")
        boxed, j = [], 0
        for x in inputs:
            if isinstance(x, Tensor):
                if sig[0][j] != x._global.sbp:
                    x = self.box(x, sig[0][j])
                j += 1
            boxed.append(x)
        res = self._record(op, tuple(boxed), attrs, (place, sig))
        if op.view and boxed[0] is not inputs[0]:
            # a view of the boxed copy is still a view of the tensor it was taken from: writes
            # through it reach that tensor (its view_scatter boxes again), as in eager; but only
            # where torch's kernel views the tensor itself (its logical strides): a reshape of an
            # expanded tensor copies, and a later write into the tensor must not reach the copy
            outs = (res,) if isinstance(res, Tensor) else tuple(res)
            logical = _logical_views(op, self.meta_of(inputs[0]), boxed[1:], attrs)
            for i, o in enumerate(outs):
                if o._view is not None:
                    if logical is not None and not logical[i]:
                        o._view = None
                    else:
                        make_view(o, inputs[0], op, attrs, None if isinstance(res, Tensor) else i)
        return res

    def _gather_zero3(self, p: Tensor) -> Tensor:
        """A ZeRO-3 parameter (kept S(0)) all-gathered for the op about to read it (graph/zero.py)."""
        out = self.box(p, tuple(B for _ in p._global.sbp))
        self.nodes[-1] = self.nodes[-1].with_(tags=self.nodes[-1].tags | {ZERO3})
        return out

    def _adopt(self, x: Tensor) -> None:
        """A saved output re-wrapped by a grad rule (``ctx.out``) gets its value's global meta back."""
        hit = self.by_data.get(id(x._data))
        if hit is not None and hit[1] is x._data and hit[0].placement is not None:
            v = hit[0]
            x._global = LazyGlobal(v.placement, v.sbp, torch.Size(v.shape), tracer=self)

    def leaf_grad_sbp(self, t: Tensor) -> tuple:
        """The SBP leaf ``t``'s gradient is boxed to: its ``grad_sbp`` or SBP, unless ZeRO
        shards it (graph/zero.py)."""
        nd = self.zero.grad_sbp(t) if self.zero is not None else None
        return nd or t._global.grad_sbp or t._global.sbp

    def box(self, x: Tensor, nd: tuple) -> Tensor:
        """Records the redistribution of global value ``x`` to ``nd`` (same placement)."""
        g = x._global
        if tuple(nd) == tuple(g.sbp):
            return x
        attrs = {"place": g.placement, "src": g.sbp, "dst": tuple(nd), "shape": tuple(g.shape)}
        return self._record(GLOBAL_BOX, (x,), attrs, (g.placement, ((g.sbp,), (tuple(nd),))))

    def move(self, x: Tensor, place, nd: tuple) -> Tensor:
        """Records global value ``x`` moved to another placement (graph/pipeline.py)."""
        return trace_move(self, x, place, tuple(nd), user_line())

    def convert_global(self, x: Tensor, place, nd: tuple) -> Tensor:
        """A parameter or buffer (live global state) converted inside build(): recorded as a
        move (another placement) or a boxing (same placement) of its value, which the graph reads
        live each run (boxing it now would make a constant of this call's value that backward
        cannot pass through)."""
        return self.move(x, place, nd) if place != x._global.placement else self.box(x, nd)

    def make_global(self, x: Tensor, place, nd: tuple) -> Tensor:
        """A local traced value that every rank computes identically, as a broadcast global one."""
        if any(s != B for s in nd):
            raise UnsupportedError("holoflow.nn.Graph: inside build(), a local tensor becomes global "
                                   "only as broadcast; make inputs global before calling the graph")
        return self._record(GLOBAL_TAG, (x,), {}, (place, (((),), (tuple(nd),))))

    def _record(self, op: Op, inputs: tuple, attrs: dict, glob: tuple | None = None):
        record = op.grad is not None and grad_mode.STATE.enabled and _records(inputs)
        ins = tuple(self.value_of(x) if isinstance(x, Tensor) else x for x in inputs)
        metas = [self.meta_of(x) if isinstance(x, Tensor) else x for x in inputs]
        try:
            out = _strided_outputs(op, metas, attrs) if op.shape is not None else None
            if out is None and op.shape is not None:
                ms = op.shape([Meta.of(m) if isinstance(m, torch.Tensor) else m for m in metas], attrs)
                outs_ = [torch.empty(m.shape, dtype=m.dtype, device="meta") for m in ms]
                out = outs_[0] if len(outs_) == 1 and op.outputs is None else \
                    (op.out_type(*outs_) if op.out_type is not None else tuple(outs_))
            elif out is None:  # real-device attrs (``to(device=cpu)``) become meta: shapes only
                out = _meta_outputs(op, metas, attrs)
        except NotImplementedError as e:
            raise HoloflowError(f"holoflow.nn.Graph: op {op.name!r} cannot be traced ({e}); its output "
                                f"shape depends on data. Compute it outside the graph.") from e
        except RuntimeError as e:
            if "meta tensor" not in str(e):
                from ..core.dispatch import op_error
                raise op_error(op, inputs, attrs, e) from e
            shown = ", ".join(f"{k}={v!r}" for k, v in attrs.items() if not isinstance(v, torch.Tensor))
            raise HoloflowError(f"holoflow.nn.Graph: op {op.name!r}({shown}) cannot be traced: it reads the values "
                                f"of its inputs to size its output ({e}). Give the size explicitly (an argument "
                                f"such as num_classes) or compute it outside the graph.") from e
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
        saved = None
        if record and op.saves_inputs:   # what the grad rule reads: the inputs' values now
            saved = tuple(self._frozen(x, v) if isinstance(x, Tensor) else x for x, v in zip(inputs, ins))
        res = wrap(op, inputs, attrs, out, record, saved=saved, views=views, logical=glob is not None)
        outs = (res,) if isinstance(res, Tensor) else tuple(res)
        dev = _device_of(ins, attrs)
        if glob is None:
            vals = tuple(Value(tuple(o._data.shape), o._data.dtype, dev) for o in outs)
        else:
            place, sig = glob
            vals = tuple(Value(tuple(o._data.shape), o._data.dtype, dev, placement=place, sbp=nd)
                         for o, nd in zip(outs, sig[1]))
            for o, nd in zip(outs, sig[1]):
                o._global = LazyGlobal(place, nd, o._data.shape, tracer=self)
        for o, v in zip(outs, vals):
            self.bind_value(o, v)
        tags = frozenset({"bw"}) if self.in_backward else frozenset()
        if len(outs) == 1 and not isinstance(res, Tensor):   # a kernel returning a 1-tuple (a vjp
            tags |= {SEQ1}                                    # op's gradients): the program unpacks it
        # a lazy tensor's ``x.to(x.device)`` names meta: at run time that is the input's device
        attrs = {k: dev if isinstance(v, torch.device) and v.type == "meta" else v for k, v in attrs.items()}
        node = Node(op.name, ins, attrs, vals, user_line(), "/".join(self.scope),
                    tags=tags, sbp=None if glob is None or op is GLOBAL_TAG else glob[1])
        self.nodes.append(node)
        if may_alias(node) and any(isinstance(v, Value) and v in self.external for v in ins):
            self.external.update(vals)
        return res

    def _frozen(self, x: Tensor, v: Value) -> Tensor:
        """``x`` as a grad node saves it: its value ``v`` and history now. A later in-place write
        rebinds ``x`` to a new value (and a detach()ed alias reads its source's), where eager's grad
        rule would read the storage it saved or refuse a changed one: the rule reads ``v``. A leaf
        that requires grad is saved as itself (a double backward accumulates into it), and so is a
        real (state) tensor: the rule reads it as eager's reads the storage it saved, an in-place
        write since refused by its version counter (`_bump`) as eager refuses it."""
        if x._rg and x.grad_fn is None or x._data.device.type != "meta":
            return x
        t = Tensor._make(x._data, x.grad_fn, x._out_idx)
        t._rg, t._global = x._rg, x._global
        self.bind_value(t, v)
        return t

    def assign(self, x: Tensor, out: Tensor, name: str) -> Tensor:
        """An in-place write, recorded functionally: ``x`` takes the new value; a view's base
        takes a ``view_scatter`` of it (other views of the base re-derive from that). A value that
        may share memory with a feed or state (``dst.copy_(w)`` writes parameter ``w`` expanded, or
        boxed by a local slice) is cloned first: eager copies it into ``x``'s own storage, while the
        plan would hand out ``w``'s memory as ``x``, which the optimizer's step, a write-back or the
        caller then changes. Intermediates need no copy (the memory plan keeps aliases alive)."""
        if 0 in x._data.stride() and distinct_elements(x._data) is not None:
            # (eager writes each shared element once, refusing values that differ between them)
            raise RuntimeError(f"holoflow.{name.rstrip('_')}_: a traced write into an expanded tensor (shape "
                               f"{tuple(x.shape)}, strides {x._data.stride()}: elements shared) is not supported; "
                               f"clone() it before writing")
        if self.value_of(out) in self.external:
            with grad_mode.no_grad():   # the value only: ``x`` still takes ``out``'s history
                value = apply(CLONE, out, memory_format=torch.contiguous_format)
            value.grad_fn, value._out_idx, value._rg = out.grad_fn, out._out_idx, out._rg
            out = value
        vi = x._view
        root, whole = x, out
        self._bump(vi.base if vi is not None else x)
        if vi is not None:
            self.value_of(x)  # re-derives x first if its base changed
            base = vi.base
            with grad_mode.no_grad():  # the value only: take_history links the autograd side
                new_base = apply(VIEW_SCATTER, base, out, chain=vi.chain)
                if base._global is not None and new_base._global.sbp != base._global.sbp:
                    new_base = new_base.to_global(sbp=base._global.sbp)   # the base keeps its layout
            self._set(base, new_base)
            root, whole = base, new_base
        self._set(x, out)
        before = None if vi is None else (vi.base.grad_fn, vi.base._out_idx)
        take_history(x, out, name)
        src = detached_from(root) if "_detached_from" in root.__dict__ else None
        if src is not None:
            # a detach()ed alias was written (or a view of one): the tensor it was detached from
            # takes the new value as eager's shared storage would, its history untouched. A view
            # of the alias written: the same view of the source takes that value (only the region
            # changes: the whole alias's value sent through an expanded source would write its
            # shared elements once per alias, the unwritten ones with the old values)
            quiet, self._quiet = self._quiet, self._quiet or root._data.device.type != "meta"
            try:
                with grad_mode.no_grad():
                    target, value = (src, whole) if vi is None else \
                        (replay(vi.chain, src, lambda op, t, attrs: apply(op, t, **attrs)), out)
                    plain = Tensor._make(value._data)
                    plain._global = value._global
                    self.bind_value(plain, self.value_of(value))
                    # a real alias was bumped above, with its source when they share a version counter
                    # (``w.detach()``; ``w.data`` has its own, unseen by autograd's checks, as in torch)
                    write_into(target, plain, name)
            finally:
                self._quiet = quiet
        if vi is not None:
            if (vi.base.grad_fn, vi.base._out_idx) != before or holds_elements_twice(x):
                # the write rebased the base's history: the view is re-derived from it, as eager's
                # (torch's rebase_history): its gradient passes the base's view_scatter, which
                # gives the base's old history zeros where it was overwritten (not None), and a
                # view's overlapping windows meet in the base first
                refresh(x, force=True)
            else:
                # a write that left the base's history as it was (under no_grad, through a detach()ed
                # alias): the view's value is current, its history (stale already, maybe) re-derived
                # at its next use, as eager's storage version moved
                x.__dict__["_vt"] = stamp_of(vi.base)[2]
        return x

    def _bump(self, x: Tensor) -> None:
        """An in-place write of ``x``, a real (state) tensor, in program order: its storage's
        version counter moves on as eager's write moves it. A grad rule that saved the tensor
        (a parameter, saved as itself by `_frozen`) then refuses a backward after the write, as
        eager and torch do, where the graph would otherwise read the written value; a lazy
        tensor needs none (the rule reads the value it saved)."""
        if not self._quiet and x._data.device.type != "meta":
            torch.autograd.graph.increment_version(x._data)

    def _set(self, x: Tensor, out: Tensor) -> None:
        """``x`` holds ``out``'s value from here on: a lazy tensor is rebound; a real (state)
        tensor is recorded as updated, and reads after this point see the new value (a real
        detach()ed alias is not: its value is its source's, written next by ``assign``)."""
        v = self.value_of(out)
        if "_v" in x.__dict__ or x._data.device.type == "meta":
            d, had = out._data, x._data
            if had.device.type == "meta" and d.device.type == "meta" and d.shape == had.shape \
                    and d.stride() != had.stride():
                # eager's write keeps the tensor's layout (a transposed view stays transposed, and a
                # later reshape of it copies rather than views): the meta keeps it too
                d = torch.empty_strided(d.shape, had.stride(), dtype=d.dtype, device="meta")
            x._data = d
            self.bind_value(x, v)
        elif "_detached_from" not in x.__dict__ or detached_from(x) is None:
            self.value_of(x)  # registers it as state if first seen
            self.current[id(x)] = v
            self.updates[id(x)] = (x, v)

    def effect(self, op: str, inputs: tuple, attrs: dict, kernel: Any) -> None:
        """Records a node run for its side effect on state (e.g. the optimizer update)."""
        ins = tuple(self.value_of(x) if isinstance(x, Tensor) else x for x in inputs)
        self.nodes.append(Node(op, ins, attrs, (), user_line(), effect=True, kernel=kernel))

    def graph(self, outputs: tuple, out_spec: Any) -> IRGraph:
        outs = tuple(self.value_of(o) if isinstance(o, Tensor) else o for o in outputs)
        return IRGraph(tuple(self.feeds), tuple(self.state.values()), tuple(self.nodes), outs,
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
