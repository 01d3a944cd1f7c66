"""``apply``: the one function every op goes through, and the eager interpreter beneath it.

``apply(op, *inputs, **attrs)``: positional inputs are holoflow Tensors (or Python scalars, as
constants); attrs are keyword arguments passed to the kernel unchanged. It hands the op to the
innermost interpreter of the stack (core/interpret.py). At the bottom, :class:`Eager`:

1. an input is global -> the global tensor's own interpreter takes over (it boxes and binds the
   local shards back here);
2. otherwise the torch kernel runs on the storages;
3. grad mode is on and an input requires grad -> a GradNode with the op's grad rule is recorded;
4. outputs of a view op that alias the input remember their base (core/views.py).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from . import grad_mode, interpret
from .anomaly import ANOMALY, note_forward
from .dtype import scalar_name
from .autograd import GradNode, accumulate_grad, run_backward, seed_grads
from .node import SEQ
from .errors import HoloflowError, describe
from .interpret import Interpreter
from .native import FAST
from .registry import Op, defop, infer_metas
from .saved import _LIVE
from .tensor import Tensor, mark_inference
from .sbp import P
from .views import (VIEW_READ, VIEW_SCATTER, WRITTEN_VALUES, ViewInfo, aliases, check_multi_output, make_view,
                    may_overlap, replay, stamp_of, written_since_made)


class Eager(Interpreter):
    """The bottom of the stack: runs kernels now and records autograd."""

    def bind(self, op: Op, inputs: tuple, attrs: dict):
        return _eager(op, inputs, attrs)

    def assign(self, x: Tensor, out: Tensor, name: str) -> Tensor:
        d = x._data
        sel = distinct_elements(d) if 0 in d.stride() else None
        if sel is None:
            d.copy_(out._data)
        else:   # an expanded tensor: each shared element written once (torch's fill_ on one)
            o = out._data
            r = o[sel].expand_as(o)
            if not bool((torch.eq(o, r) | (torch.isnan(o) & torch.isnan(r))).all()):
                raise RuntimeError(f"holoflow.{name.rstrip('_')}_: the result differs between elements "
                                   f"that share memory (an expanded tensor of shape {tuple(d.shape)}, "
                                   f"strides {d.stride()}); clone() the tensor before writing it")
            d[sel].copy_(o[sel])
        fn = out._grad_fn   # (as stored: out may be a view, copy_'s source, not to re-derive)
        if fn is not None:
            fn.moved_output(out._data, x._data)
        vi = x._view
        before = None if vi is None else (vi.base.grad_fn, vi.base._out_idx)
        take_history(x, out, name)
        if vi is not None and (vi.base.grad_fn, vi.base._out_idx) != before:
            # the write rebased the base's history: as torch's rebase_history, the view's is
            # re-derived from it right away (what its grad_fn shows from now on), not at its next use
            refresh(x)
        return x

    def backward(self, tensors: list, grads: list, retain_graph: bool, create_graph: bool, inputs):
        grads = seed_grads(tensors, grads)
        for t in inputs or ():   # as torch's: a non-leaf input keeps its .grad from now on
            if t.grad_fn is not None and t.requires_grad:
                t.retain_grad()
        run_backward(tensors, grads, retain_graph, create_graph, capture=inputs)

    def composite(self, name: str, inputs: tuple) -> tuple:
        return inputs

    def value_token(self, x) -> object:
        return None

    def overwrite(self, x: Tensor, values) -> None:
        x._data.copy_(values._data if isinstance(values, Tensor) else values)

    def device_type_of(self, x) -> str:
        return x._data.device.type

    def creation_default(self) -> tuple | None:
        return None

    def globalize(self, t: Tensor, placement, sbp) -> Tensor:
        return placement.interpreter.from_full(t._data, placement, sbp)


EAGER = Eager()
interpret._BOTTOM.append(EAGER)
_CURRENT = interpret._CURRENT
_STATE = grad_mode.STATE
_INFERENCE = grad_mode.INFERENCE_MADE
_new = object.__new__


def accumulate_captured(inputs: Sequence, got: Sequence, create_graph: bool = False) -> None:
    """Each gradient captured for ``inputs`` (``run_backward(capture=...)``) added to its
    ``.grad`` (boxed to a global input's SBP): a pipeline stage's weight part."""
    for t, g in zip(inputs, got):
        if g is not None:
            if t._global is not None:
                g = t._global.box_grad(t, g)
            if not create_graph:   # an own buffer: the gradient may be the caller's seed, or
                g = g.detach()     # shared with another input's (as the engine's leaves get)
                if t._grad is None and g._global is None and not g._data.is_meta:
                    g = Tensor._make(g._data.clone(memory_format=torch.contiguous_format))
            accumulate_grad(t, g, not create_graph)


def apply(op: Op, *inputs, **attrs):
    """Runs ``op`` on ``inputs`` with the active interpreters; see the module doc."""
    top = _CURRENT.get()
    if top is not None:
        return top.bind(op, inputs, attrs)
    return _eager(op, inputs, attrs)


def binary_method(op: Op, **fixed):
    """``Tensor.__<op>__(self, other)``: ``apply(op, self, other, **fixed)`` with apply inlined,
    one Python frame per call (the hot path of Python operators); no frame with the C path."""
    if _FAST is not None:
        return _FAST.binary_method(op, f"__{op.name}__", fixed)

    def method(self, other):
        top = _CURRENT.get()
        if top is not None:
            return top.bind(op, (self, other), {**fixed})
        return _eager(op, (self, other), {**fixed})
    method.__name__ = f"__{op.name}__"
    return method


def _eager(op: Op, inputs: tuple, attrs: dict):
    datas = []
    needs_grad = False
    for x in inputs:
        if isinstance(x, Tensor):
            if x._global is not None:
                return x._global.interpreter.bind(op, inputs, attrs)
            if x._rg:
                needs_grad = True
            datas.append(x._data)
        else:
            datas.append(x)
    try:
        out = op.kernel(*datas, **attrs)
    except Exception as e:  # a user mistake surfaces as holoflow's error, never torch's bare one
        raise op_error(op, inputs, attrs, e) from e
    if not needs_grad and _STATE.enabled and op.grad is not None:
        needs_grad = follows_base(inputs)
    record = needs_grad and op.grad is not None and _STATE.enabled
    if type(out) is torch.Tensor:  # one output: wrap, inlined (the hot path)
        t = _new(Tensor)
        t._data, t._rg, t._grad, t.grad_fn, t._out_idx, t._hooks, t._global = out, False, None, None, 0, None, None
        if record:
            node = _record(op, inputs, attrs, (out,))
            if out.is_floating_point() or out.is_complex():
                t._rg, t.grad_fn = True, node
        elif _INFERENCE[0]:
            mark_inference(t)
        if op.view:
            d = datas[0]
            b = out._base   # views.aliases, inlined
            if out is d or (b is not None and (b is d or b is d._base)):
                x = inputs[0]
                if x._view is not None or _CURRENT.get() is not None:
                    make_view(t, x, op, attrs, None)
                else:   # make_view of a base, inlined (no interpreter: the stamp's token is None)
                    v = t._view = _new(ViewInfo)
                    v.base, v.chain, v.stamp = x, ((op, attrs, None),), (x.grad_fn, x._out_idx, None)
                    v.nograd, v.version, v.at = not _STATE.enabled, None, out._version
        return t
    return wrap(op, inputs, attrs, out, record)


def _init_fast():
    """Hands the classes and the Python fallbacks to the C build of ``apply`` and ``_eager``
    (core/_fast.c), which passes every case but the common one back to the functions above."""
    if FAST is not None:
        FAST.init(Tensor, GradNode, torch.Tensor, ViewInfo, _eager_py, wrap, op_error, _CURRENT, _STATE,
                  ANOMALY, _LIVE, note_forward, SEQ)
    return FAST


def run_local(op: Op, inputs: tuple, attrs: dict, saved: tuple | None = None):
    """The eager path for tensors whose ``_data`` is a shard: runs the kernel on the storages and
    records autograd against ``inputs``, saving ``saved`` (local aliases of global inputs) for
    the grad rule. Used by the global interpreter and boxing."""
    datas = [x._data if isinstance(x, Tensor) else x for x in inputs]
    try:
        out = op.kernel(*datas, **attrs)
    except Exception as e:
        raise op_error(op, inputs, attrs, e) from e
    record = (op.grad is not None and grad_mode.STATE.enabled
              and (any(isinstance(x, Tensor) and x._rg for x in inputs) or follows_base(inputs)))
    return wrap(op, inputs, attrs, out, record, saved, track_views=False)


def local_alias(x: Tensor) -> Tensor:
    """A local view of a global tensor: same storage and autograd history, no global meta."""
    t = Tensor._make(x._data, x.grad_fn, x._out_idx)
    t._rg = x._rg
    return t


def wrap(op: Op, inputs: tuple, attrs: dict, out, record: bool, saved: tuple | None = None,
         track_views: bool = True, views: tuple | None = None, logical: bool = False):
    """Wraps kernel outputs as Tensors and, if ``record``, links them to a new grad node.
    Outputs of a view op that alias input 0 (or those flagged in ``views``) become its views.
    ``logical``: the node's grad rule sees global inputs by their logical shapes (a trace)."""
    if isinstance(out, torch.Tensor):  # one output: no lists
        t = _new(Tensor)
        t._data, t._rg, t._grad, t.grad_fn, t._out_idx, t._hooks, t._global = out, False, None, None, 0, None, None
        if record:
            node = _record(op, inputs, attrs, (out,), saved, logical)
            if out.is_floating_point() or out.is_complex():
                t._rg, t.grad_fn = True, node
        elif _INFERENCE[0]:
            mark_inference(t)
        if op.view and track_views and (views[0] if views is not None else aliases(out, inputs[0]._data)):
            make_view(t, inputs[0], op, attrs, None)
        return t
    outs = tuple(out)
    wrapped = []
    if record:   # one pass: each output wrapped, linked to the node (a float one) and described
        node = _record(op, inputs, attrs, outs, saved, logical)
        metas = []
        for i, o in enumerate(outs):
            w = _new(Tensor)
            dt = o.dtype
            w._data, w._grad, w._hooks, w._global = o, None, None, None
            if dt.is_floating_point or dt.is_complex:
                w._rg, w.grad_fn, w._out_idx = True, node, i
            else:
                w._rg, w.grad_fn, w._out_idx = False, None, 0
            wrapped.append(w)
            metas.append((o.shape, dt, o.device))
        node.out_metas = tuple(metas)
    else:
        for o in outs:
            w = _new(Tensor)
            w._data, w._rg, w._grad, w.grad_fn, w._out_idx, w._hooks, w._global = o, False, None, None, 0, None, None
            if _INFERENCE[0]:
                mark_inference(w)
            wrapped.append(w)
    if op.view and track_views:   # make_view per output, with the base, chain and stamp found once
        x = inputs[0]
        xd, vi = x._data, x._view
        base, chain, stamp = (x, (), stamp_of(x)) if vi is None else (vi.base, vi.chain, vi.stamp)
        nograd = not _STATE.enabled or (vi is not None and vi.nograd)
        token = interpret.token_of(base)   # (a trace's: views.written_since_made)
        for i, (w, o) in enumerate(zip(wrapped, outs)):
            if (views[i] if views is not None else aliases(o, xd)):
                w._view = ViewInfo(base, chain + ((op, attrs, i),), stamp, nograd, o._version, o._version)
                if token is not None:
                    w.__dict__["_made_at"] = token
    return op.out_type(*wrapped) if op.out_type is not None else tuple(wrapped)


def _record(op: Op, inputs: tuple, attrs: dict, outs: tuple, saved: tuple | None = None,
            logical: bool = False) -> GradNode:
    edges, shapes, dtypes = [], [], []
    for x in inputs:
        if isinstance(x, Tensor):
            vi = x._view
            if vi is not None:   # a stale view re-derived first (the common case, stamp_of inlined)
                if vi.version is not None:
                    check_multi_output(x)
                st, b = vi.stamp, vi.base
                if b.grad_fn is not st[0] or b._out_idx != st[1] or written_since(x, vi) or \
                        ((st[2] is not None or _CURRENT.get() is not None) and stamp_of(b) != st):
                    refresh(x)
            d = x._data
            shapes.append(x.shape if logical else d.shape)
            dtypes.append(d.dtype)
            if x._rg:
                fn = x.grad_fn
                edges.append((fn, x._out_idx) if fn is not None else x)
            else:
                edges.append(None)
        else:
            shapes.append(None)
            dtypes.append(None)
            edges.append(None)
    node = _new(GradNode)
    node.op, node.edges, node.attrs, node.shapes, node.dtypes = op, tuple(edges), attrs, tuple(shapes), tuple(dtypes)
    node._outs = node._versions = node.out_metas = node.hooks = node.retains = None
    node.seq = next(SEQ)
    saves_in, saves_out = op._saves
    if saves_in or saves_out:
        node.save(op.saved_of(saved or inputs, node.edges) if saves_in else None,
                  op.outputs_of(outs) if saves_out else None)
    else:
        node._saved = None
    if ANOMALY.enabled:   # anomaly mode: the forward traceback a failing rule reports
        note_forward(node)
    return node


def follows_base(inputs) -> bool:
    """Whether a view among ``inputs`` requires grad through its base, as torch's view does
    whenever its base requires grad. A view whose base was written in place (through another
    view) with a value that requires grad since it was taken is re-derived first. One that has
    no history still (made under ``no_grad``, or taken before its leaf base's ``requires_grad_()``)
    requires grad with none: an op on it is recorded, and no gradient goes past it (torch's view
    has no gradient accumulator of its own)."""
    got = False
    for x in inputs:
        if isinstance(x, Tensor):
            vi = x._view
            if vi is not None and vi.base._rg:
                if vi.nograd:
                    check_nograd_view_unwritten(x)
                elif stamp_of(vi.base) != vi.stamp:
                    if vi.version is not None:
                        check_multi_output(x)
                    refresh(x)
                got = True
    return got


def check_nograd_view_unwritten(v: Tensor) -> None:
    """torch's refusal to use a view made under ``no_grad`` (or taken from one) that requires grad
    (its base does, or it has a history: an op on it recorded one) once its storage was written
    since (by any write: torch compares version counters): which history it should have is
    ambiguous: when autograd records with it, or its history is read (in any grad mode, as
    torch's getter). (In a trace, by the base's value: views.written_since_made.)"""
    vi = v._view
    if not (vi.nograd and (vi.base._rg or v._grad_fn is not None)):
        return
    if "_made_at" in v.__dict__ and written_since_made(v) or \
            "_made_at" not in v.__dict__ and v._data._version != vi.at and _CURRENT.get() is None:
        ops = " of ".join(op.name for op, _, _ in reversed(vi.chain))
        raise RuntimeError(f"holoflow: a view was created in no_grad mode ({ops} of its base) {_NOGRAD_VIEW_REBASED}")


def refresh(v: Tensor, force: bool = False) -> None:
    """Re-derives a view from its base when the base changed since (an in-place write to the
    base or to another of its views): the view's history, and while tracing its value.
    ``force``: re-derived even if the base did not change (a fresh history for an in-place
    write to the view, as torch's CopySlices bypasses the view's old one). A ``retain_grad()``
    follows the view to its new history; its other hooks stay with the old one, as torch's."""
    vi = v._view
    base = vi.base
    # (torch's error is about the storage being written; a trace's symbolic value moving on,
    # the stamp's last part, is no in-place write)
    check_nograd_view_unwritten(v)
    if not force and stamp_of(base) == vi.stamp and not written_since(v, vi):
        return
    if not force and v._data._version == vi.at and base._global is None and "_v" not in base.__dict__ \
            and "_v" not in v.__dict__:
        # torch re-derives a view's history only once its storage was written since: a base whose
        # history changed without a write (detach_(), then requires_grad_() maybe) leaves the view
        # the history it had, or none (stale on purpose: each use looks again)
        return
    if vi.nograd and "_v" not in base.__dict__ and "_v" not in v.__dict__:
        # torch never re-derives a view made under no_grad: it has no history of its base's
        # (one of its own at most, from an op on it that recorded), or the check above refused it
        # (the version it compares stays: a base that requires grad later refuses it then)
        vi.stamp = stamp_of(base)
        return
    if not (base._rg or "_v" in base.__dict__ or "_v" in v.__dict__):
        if v._grad_fn is None:   # as torch's getter, which looks at nothing then: the storage's
            vi.stamp = stamp_of(base)   # version it compares stays (a base that requires grad
            return                      # later re-derives the view if it was written since)
        if base._data._version == vi.at:   # a base detach_()ed since the view was made:
            return   # as torch, the view keeps its history until the storage is written (stale
                     # on purpose: each use looks again)
        cut_history(v)
        vi.stamp, vi.at = stamp_of(base), base._data._version
        return
    before, vi.stamp = vi.stamp, stamp_of(base)
    # a global base's views chain their ops' local attrs in eager (they alias its shard) and logical
    # ones in a trace (a traced base's value is logical): replayed on a local alias of it, but for a
    # traced view of real global state (a parameter), replayed on the state through the tracer
    local = base._global is not None and ("_v" in base.__dict__ or "_v" not in v.__dict__)
    src = local_alias(base) if local else base
    with grad_mode.set_grad_enabled(base._rg):
        fresh = replay(vi.chain, src, lambda op, x, attrs: apply(op, x, **attrs))
    vi.at = base._data._version
    if fresh.grad_fn is not None:
        old, old_idx = v._grad_fn, v._out_idx
        v.grad_fn, v._out_idx, v._rg = fresh.grad_fn, fresh._out_idx, True
        move_retain(old, old_idx, v)
    elif v._grad_fn is not None and not base._rg and "_v" in fresh.__dict__ and before[2] != vi.stamp[2]:
        cut_history(v)   # (a trace's detach_()ed base written since: eager's version test above)
    if "_v" in fresh.__dict__:  # a trace: the view's symbolic value is the re-derived one
        v._data = fresh._data
        v.__dict__["_v"] = fresh.__dict__["_v"]
        v.__dict__.pop("_vt", None)   # (refresh_value's mark: its value is the stamp's now)


def refresh_value(v: Tensor) -> None:
    """A traced view's value re-derived from its base's current one when the base was written
    since, its history not: eager's view reads its storage, and re-derives its history only when
    autograd uses it or its ``grad_fn`` is read (:func:`refresh`), from the base's history then;
    a read that records nothing (``detach()``, an op under ``no_grad``) leaves it as it was.
    ``_vt``: the base's value its value was derived from, when not its stamp's."""
    vi = v._view
    base = vi.base
    now = stamp_of(base)[2]
    if v.__dict__.get("_vt", vi.stamp[2]) == now:
        return
    local = base._global is not None and ("_v" in base.__dict__ or "_v" not in v.__dict__)
    with grad_mode.no_grad():
        fresh = replay(vi.chain, local_alias(base) if local else base, lambda op, x, attrs: apply(op, x, **attrs))
    if "_v" in fresh.__dict__:
        v._data = fresh._data
        v.__dict__["_v"] = fresh.__dict__["_v"]
        v.__dict__["_vt"] = now


def written_since(v: Tensor, vi: ViewInfo) -> bool:
    """Whether ``v``'s storage was written since its history was derived without its base's
    history changing (a write under ``no_grad``, or through a ``detach()``): torch regenerates
    such a view's grad_fn when its version counter moved, so hooks registered on it before the
    write stay with the old one; one made under ``no_grad`` is refused then, if its base requires
    grad (``refresh``). (Not for global views.)"""
    return v._data._version != vi.at and v._global is None


def cut_history(v: Tensor) -> None:
    """``v``, a view whose base has no history since (``detach_()``) and whose storage was written
    since, still requires grad, with a history no gradient goes past: torch regenerates such a
    view's grad_fn from its base's, which is none (an ``AsStridedBackward`` leading nowhere). A
    ``retain_grad()`` follows it there, as torch's."""
    d = v._data
    old, old_idx = v._grad_fn, v._out_idx
    v.grad_fn, v._out_idx, v._rg = _record(VIEW_SCATTER, (Tensor._make(d), 0.0), {"chain": ()}, (d,)), 0, True
    move_retain(old, old_idx, v)


def op_error(op: Op, inputs: tuple, attrs: dict, err: Exception) -> Exception:
    """Builds the error a user sees: the op's own shape rule if it has one, else torch's reason
    with the op name and what it was given."""
    if isinstance(err, HoloflowError) or str(err).startswith("holoflow"):
        return err
    if op.shape is not None:
        try:
            infer_metas(op, tuple(x._data if isinstance(x, Tensor) else x for x in inputs), attrs)
        except Exception as rule_err:  # the rule's message is the better one
            if "holoflow" in str(rule_err):
                return rule_err
    reason = str(err).split("\n")[0]
    args = ", ".join(describe(x) for x in inputs)
    extra = "".join(f", {k}={describe(v)}" for k, v in attrs.items())
    msg = f"holoflow.{op.name}({args}{extra}): {reason}"
    cls = type(err) if type(err) in _PLAIN else RuntimeError
    return cls(msg)


# (torch's out-of-memory and device errors keep their class: ``except torch.OutOfMemoryError``)
_PLAIN = (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError) + tuple(
    c for c in (getattr(torch, "OutOfMemoryError", None), getattr(torch, "AcceleratorError", None)) if c is not None)


# -- in-place ops ---------------------------------------------------------------------------------

_NOGRAD_VIEW_WRITTEN = (
    "holoflow: a view was created in no_grad mode and is being modified in place with grad mode enabled; "
    "as in torch, this ambiguous use is forbidden: make the view and the in-place write both inside the "
    "no_grad block (if the write should not be recorded) or both outside it (if it should)")
_NOGRAD_VIEW_REBASED = (
    "(or taken from such a view) and its base or another view of its base "
    "has been modified in place since; as in torch, using it with grad mode enabled is forbidden (its "
    "history is ambiguous): make the view and the in-place write both inside the no_grad block or both "
    "outside it")


def _check_nograd_view(x: Tensor, rest) -> None:
    """torch's check on a write to a view made under no_grad: an error when autograd would record
    the write (grad mode on, and the view's base or another input requires grad)."""
    vi = x._view
    if (vi is not None and vi.nograd and _STATE.enabled and (_CURRENT.get() is None or interpret.is_lazy())
            and (vi.base._rg or x._rg or any(isinstance(r, Tensor) and r._rg for r in rest))):
        raise RuntimeError(_NOGRAD_VIEW_WRITTEN)


def distinct_elements(d: torch.Tensor) -> tuple | None:
    """For a tensor whose elements are shared (expanded: stride 0 over a dim longer than 1), the
    index that selects each distinct element once; None for the others (an empty one shares
    nothing: torch writes into an empty view of an expanded tensor)."""
    if d.numel() == 0:
        return None
    sel = tuple([slice(0, 1) if st == 0 and n > 1 else slice(None) for st, n in zip(d.stride(), d.shape)])
    return sel if any(s.stop == 1 for s in sel) else None


def apply_inplace(op: Op, x: Tensor, *rest, **attrs) -> Tensor:
    """Runs ``op`` writing its result into ``x`` (``x.add_(y)``), keeping views of ``x`` aliased.

    With autograd, the out-of-place op is recorded and ``x`` takes over its grad_fn (a view's
    base is rebased, core/views.py); when the op's grad reads its input, that input is a copy of
    ``x`` taken before the write.
    """
    lazy = _CURRENT.get() is not None and interpret.is_lazy()
    if x._view is not None:
        _check_nograd_view(x, rest)
    follows = check_view_target(x, op.name)
    rest_follow = False
    if grad_mode.STATE.enabled and not lazy:
        # a view among the other inputs whose base requires grad does too (re-derived first, if
        # its base was written since), as an out-of-place op's inputs do
        views = tuple([r for r in rest if isinstance(r, Tensor) and r._view is not None])
        if views:
            rest_follow = follows_base(views)
    grad_on = grad_mode.STATE.enabled and (x._rg or rest_follow or any(isinstance(r, Tensor) and r._rg for r in rest))
    if follows:   # (re-derived now)
        follows_base((x,))
        grad_on = True
    if op.inplace_kernel is None and holds_elements_twice(x):
        raise RuntimeError(f"holoflow.{op.name}_: the target holds elements at more than one index (overlapping "
                           f"windows, as unfold's), which only an in-place kernel writes as torch does, and "
                           f"{op.name} declares none; write into a clone() of it")
    if not lazy and x._global is None and not grad_on and op.inplace_kernel is not None:
        datas = [r._data if isinstance(r, Tensor) else r for r in rest]
        try:
            op.inplace_kernel(x._data, *datas, **attrs)
        except Exception as e:
            raise op_error(op, (x, *rest), attrs, e) from e
        return x
    if grad_on:
        check_inplace_target(x, op.name)
        if not lazy and x._global is None and op.inplace_kernel is not None and \
                0 in x._data.stride() and distinct_elements(x._data) is not None:
            # elements shared (expanded): torch's kernel decides whether it may write such a tensor
            # (fill_ may, most may not): asked on scratch memory of the same layout
            d = x._data
            probe = torch.empty_strided(d.size(), d.stride(), dtype=d.dtype, device=d.device)
            try:
                op.inplace_kernel(probe, *[r._data if isinstance(r, Tensor) else r for r in rest], **attrs)
            except Exception as e:
                raise op_error(op, (x, *rest), attrs, e) from e
    src = x
    if grad_on and op.saves_inputs and not lazy:  # (a trace is SSA: the old value stays a value)
        if x._global is not None:   # a copy standing for a view (or a view of one): its source's
            fresh_copy(x, True)     # current values are what the op reads
            if x._view is not None and "_copy_of" in x._view.base.__dict__:
                fresh_copy(x._view.base, True)
        if x._view is not None:
            refresh(x)
    if grad_on and x._view is not None and not lazy and x._view.base._rg:
        # the op reads the view through a history of its own: as torch's CopySlices, the
        # gradient of the view's old value goes to the base's old history, past the view's
        # old node (whose tensor hooks belong to the view as it was); x among the other inputs
        # (x.add_(x)) is read as it was, through that node
        rest = tuple([_as_it_is(x) if r is x else r for r in rest])
        refresh(x, force=True)
    if grad_on and op.saves_inputs and not lazy:
        src = Tensor._make(x._data.clone(), x.grad_fn, x._out_idx)
        src._rg, src._global = x._rg, x._global
    if grad_on and x._view is not None and x._view.base._rg and x._global is None and holds_elements_twice(x):
        src = read_for_write(x)
    out = apply(op, src, *rest, **attrs)
    if grad_on and op.inplace_zero_grad and not lazy and x._global is None and \
            (x._data.is_floating_point() or x._data.is_complex()):
        out = apply(ZERO_GRADS, out, src, *[r for r in rest if isinstance(r, Tensor)], dtype=x._data.dtype)
    if (grad_on or lazy or x._global is not None) and op.inplace_kernel is not None and holds_elements_twice(x):
        try:
            out = written_as_torch(op.inplace_kernel, op.name, x, out, rest, attrs)
        except Exception as e:
            raise op_error(op, (x, *rest), attrs, e) from e
    return assign(x, out, op.name)


def _zero_grads_grad(c, dy):
    return (None,) + tuple([dy.detach().new_zeros(c.shapes[i], dtype=c.dtypes[i]) if c.needs_grad[i] else None
                            for i in range(1, len(c.needs_grad))])


# ``values`` (input 0) in ``dtype``, with zero gradients for the other inputs: the result of an op
# declaring ``inplace_zero_grad`` written in place while autograd records (apply_inplace); local
# and eager only
ZERO_GRADS = defop("zero_grads", lambda values, *inputs, dtype: values.to(dtype, copy=True), grad=_zero_grads_grad)


def holds_elements_twice(x: Tensor) -> bool:
    """Whether ``x`` (a global one: its shard) is a layout holding elements at more than one
    index, not expanded (``unfold``'s overlapping windows): writes into it are
    :func:`written_by_kernel`. Traced (an nn.Graph), a view of such a layout: its meta tensor
    has the strides the view ops give its base."""
    d = x._data
    if _CURRENT.get() is not None and interpret.is_lazy() and x._view is None:
        return False
    return 0 not in d.stride() and may_overlap(d)


def written_as_torch(kernel: Callable, name: str, x: Tensor, out: Tensor, args: tuple, kwargs: dict) -> Tensor:
    """``out`` (computed out of place, for the in-place write into ``x``, which holds elements
    at more than one index) with the values torch's in-place ``kernel`` leaves in ``x``; the
    recorded op gives the gradient (as torch's CopySlices: once per element). A global ``x``'s
    shard is written so when it holds whole values (no partial sums) and every other tensor
    operand has its shape (laid out as ``x`` for the kernel)."""
    g = x._global
    if _CURRENT.get() is not None and interpret.is_lazy():
        return _traced_written(kernel, name, x, out, args, kwargs)
    if g is not None:
        fresh_copy(x)   # (a copy standing for a view: its source's values now)
        if out._global.sbp != g.sbp:
            out = out.to_global(sbp=g.sbp)
        args = tuple([r.to_global(sbp=g.sbp) if isinstance(r, Tensor) and r._global is not None and
                      r._global.sbp != g.sbp and tuple(r.shape) == tuple(x.shape) else r for r in args])
        odd = [r for r in args if isinstance(r, Tensor) and (r._global is None or r._global.sbp != g.sbp)]
        if P in g.sbp or odd:
            raise RuntimeError(
                f"holoflow.{name}_: the target, a global tensor of shape {tuple(x.shape)} and sbp {g.sbp}, holds "
                f"elements at more than one index (overlapping windows, as unfold's): torch's kernel writes such "
                f"a tensor element after element, which holoflow does shard by shard only for a target without "
                f"partial sums whose tensor operands have its shape"
                + (f" (not {', '.join(f'{tuple(r.shape)} {r.sbp if r._global else ()}' for r in odd)})" if odd else "")
                + "; write into a clone() of it, or expand() the operands to its shape")
    EAGER.overwrite(out, written_by_kernel(kernel, x._data, *args, **kwargs))
    return out


def _traced_written(kernel: Callable, name: str, x: Tensor, out: Tensor, args: tuple, kwargs: dict) -> Tensor:
    """:func:`written_as_torch` in a trace: ``out`` takes the values of a ``written_values`` node,
    which runs the in-place kernel on a copy of the view's base when the plan runs."""
    if x._global is not None:
        raise RuntimeError(
            f"holoflow.{name}_: in an nn.Graph, the target, a global tensor of shape {tuple(x.shape)} and sbp "
            f"{x._global.sbp}, holds elements at more than one index (overlapping windows, as unfold's), "
            f"which torch's kernel writes element after element; a traced global write can't follow it: "
            f"write into a clone() of it (or do the write eagerly)")
    args, kwargs, slots, operands = list(args), dict(kwargs), [], []
    for key, a in [*enumerate(args), *kwargs.items()]:
        if isinstance(a, Tensor):
            slots.append(key)
            operands.append(a)
            if isinstance(key, int):
                args[key] = None
            else:
                kwargs[key] = None
    vi = x._view
    with grad_mode.no_grad():
        values = apply(WRITTEN_VALUES, vi.base, *operands, chain=vi.chain, kernel=kernel, args=tuple(args),
                       kwargs=kwargs, slots=tuple(slots), dtype=out._data.dtype)
    _CURRENT.get().overwrite(out, values)
    return out


def read_for_write(x: Tensor) -> Tensor:
    """A copy of ``x``'s values for an in-place write into it to compute from. For a view
    holding elements more than once (unfold's overlapping windows) whose base requires grad,
    its gradient goes back into the base's region as torch's CopySlices writes it (once per
    element), not through the view's history (which sums the windows)."""
    if x._view is not None and x._view.base._rg and x._global is None and grad_mode.STATE.enabled and \
            holds_elements_twice(x):
        return apply(VIEW_READ, x._view.base, chain=x._view.chain)
    return x.clone()


def written_by_kernel(kernel: Callable, d: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The values in-place ``kernel`` (torch's ``Tensor.mul_``) leaves in ``d``, a layout holding
    elements at more than one index (:func:`may_overlap`): torch's kernel writes it element after
    element, each write seen by the next index holding the element (``mul_(2)`` doubles it once
    per window), so the result is its own. Run on a copy of the memory ``d`` spans."""
    span = 1 + sum(st * (n - 1) for st, n in zip(d.stride(), d.shape))
    memory = torch.as_strided(d, (span,), (1,), d.storage_offset()).clone()
    scratch = memory.as_strided(d.shape, d.stride(), 0)
    kernel(scratch, *[a._data if isinstance(a, Tensor) else a for a in args], **kwargs)
    return scratch


def _as_it_is(x: Tensor) -> Tensor:
    """An alias of ``x`` (its storage) with its history as it is now."""
    t = Tensor._make(x._data, x._grad_fn, x._out_idx)
    t._rg, t._global = x._rg, x._global   # (a global view stays global: its shard, its layout)
    return t


def check_view_target(x: Tensor, name: str) -> bool:
    """Whether ``x`` is a view whose base requires grad (so it does too), which an in-place op
    then checks as its target here: as its history is stored, before anything re-derives it —
    the op's other inputs included (``x.add_(x)``, ``x.copy_(x)``), as torch's check_inplace.
    While tracing too: nn.Graph and holoflow.compile refuse what eager refuses."""
    follows = x._view is not None and grad_mode.STATE.enabled and x._view.base._rg
    if follows:
        check_inplace_target(x, name)
    return follows


def check_inplace_target(x: Tensor, name: str) -> None:
    name = name.rstrip("_")   # (ops named with torch's trailing underscore: fill_)
    c = x.__dict__.get("_copy_of")
    if c is not None:   # a copy standing for a view: its source is the target that matters
        src = c.source
        if (src._rg or x._rg) and src.grad_fn is None and src._view is None:   # (as a view's, below)
            raise RuntimeError(f"holoflow.{name}_: a view of a leaf tensor that requires grad is being "
                               f"used in an in-place operation; do it under holoflow.no_grad(), or "
                               f"clone the leaf first")
        check_inplace_target(src, name)
    if x._view is None and x._rg and x.grad_fn is None:
        raise RuntimeError(f"holoflow.{name}_: a leaf tensor that requires grad is being used in "
                           f"an in-place operation; do it under holoflow.no_grad() or out of place")
    vi = x._view
    if vi is not None and "_copy_of" in vi.base.__dict__:   # a view of a copy standing for a view
        check_inplace_target(vi.base, name)
    # (torch asks whether the view requires grad and its base is a leaf: a base detach_()ed since
    # the view was taken is one)
    if vi is not None and (vi.base._rg or x._rg) and vi.base.grad_fn is None:
        raise RuntimeError(f"holoflow.{name}_: a view of a leaf tensor that requires grad is being "
                           f"used in an in-place operation; do it under holoflow.no_grad(), or "
                           f"clone the leaf first")
    if vi is not None and vi.base._rg and x._grad_fn is None and not vi.nograd and x._global is None:
        # torch asks whether the view is a leaf by its history as stored, not re-derived: one that
        # requires grad through its base but has none yet (taken before its base required grad,
        # and neither used nor read since) is a leaf then
        raise RuntimeError(f"holoflow.{name}_: a leaf tensor that requires grad is being used in an "
                           f"in-place operation: this view requires grad through its base, written in "
                           f"place since the view was taken, and has no history of its own yet (as in "
                           f"torch, it is re-derived at the view's next use, not by this check): use or "
                           f"read the view (.grad_fn) first, or take it again after the base's write")
    for chain in (vi.chain if vi is not None else (), c.chain if c is not None and not c.detached else ()):
        if any(idx is not None for _, _, idx in chain):
            raise RuntimeError(f"holoflow.{name}_: this tensor is one of several views returned by "
                               f"{next(op.name for op, _, idx in chain if idx is not None)}; such views "
                               f"can't be modified in place while autograd records (as in torch): use an "
                               f"out-of-place op, or .clone() the piece first")


def assign(x: Tensor, out: Tensor, name: str) -> Tensor:
    """Writes ``out`` into ``x``'s storage and takes over its autograd history."""
    if x._global is not None and out._global is not None and out._global.sbp != x._global.sbp:
        out = out.to_global(sbp=x._global.sbp)
    if tuple(out.shape) != tuple(x.shape):   # logical shapes (a traced global's storage is not its shard)
        raise RuntimeError(f"holoflow.{name}_: the result has shape {tuple(out.shape)}, which "
                           f"doesn't match the in-place target's shape {tuple(x.shape)}")
    if out._data.dtype != x._data.dtype and not torch.can_cast(out._data.dtype, x._data.dtype):
        # (torch's rule for in-place results: a float result is never truncated into an integer tensor)
        raise RuntimeError(f"holoflow.{name}_: result type {scalar_name(out._data.dtype)} can't be cast to the "
                           f"desired output type {scalar_name(x._data.dtype)} (the in-place target's); compute "
                           f"out of place, or cast first")
    top = _CURRENT.get()
    if top is not None:
        return top.assign(x, out, name)
    if x._view is not None:
        _check_nograd_view(x, (out,))
        if _STATE.enabled and x._view.base._rg and x._global is None:
            # (a write whose value needs no grad, into a view that requires grad through its base:
            # torch checks it as any recorded write; apply_inplace has, copy_ of a constant has not)
            check_inplace_target(x, name)
    base = x._view.base if x._view is not None else x
    copy_of = "_copy_of" in base.__dict__
    if copy_of:   # a copy standing for a view, written: first its source's current values (the
        fresh_copy(base)   # region not written goes back to the source as it is there now)
    reads = x.__dict__.get("_reads_copy")   # (a detach() aliasing such a copy's storage)
    if reads is not None:
        fresh_copy(reads)
    EAGER.assign(x, out, name)
    if copy_of:   # the write goes on to its source, as a view's to its base
        write_back(base, name)
    if reads is not None:   # its values go on to the copy's source; no history changes (torch's
        with grad_mode.no_grad():   # write through a detached alias touches none)
            write_back(reads, name)
    return x


def write_back(t: Tensor, name: str) -> None:
    """``t`` (a :class:`CopyOf` view) was written: its source takes the new region, as a write
    to a view reaches its base (a ``view_scatter`` of ``t`` into the source, then the source is
    assigned it, which goes on to the source's own base)."""
    c = t.__dict__["_copy_of"]
    fresh_copy(c.source)
    vi = c.source._view
    derived = None if vi is None else (vi.stamp, vi.at)
    assign(c.source, apply(VIEW_SCATTER, c.source, t, chain=c.chain), name)
    if derived is not None and c.source._view is vi:
        # the source (a view) was written only as the way to its base: as torch's view of a base
        # written through another of its views, its history is re-derived at its next use, not
        # now (so a base detach_()ed in between leaves it none, as torch's regenerated view)
        vi.stamp, vi.at = derived
    c.version = c.held[0] = c.source._data._version


def fresh_copy(t: Tensor, strict: bool = False) -> None:
    """Re-derives a :class:`CopyOf` view whose source changed since (its values and history),
    in its own storage: views of it see the new values. ``strict`` (an op about to read it with
    autograd): a piece of a multi-output op, or a view of one, is refused then, as torch refuses
    such views; otherwise only its values are re-derived (``detach()`` reads them)."""
    c = t.__dict__.get("_copy_of")
    if c is None:
        return
    src = c.source
    fresh_copy(src)
    if src._data._version == c.version:
        return
    # (the source's flag as read: a view of a base written since follows the base's new history)
    src_rg = src.requires_grad
    op = next((op for op, _, idx in c.chain if idx is not None), None) if c.multi else refused_piece(src)
    if op is not None and (t.grad_fn is not None or src_rg):
        if strict and grad_mode.STATE.enabled:
            raise RuntimeError(   # (as a piece that aliases its source: views.check_multi_output)
                f"holoflow: a piece of {op.name} is a view whose base has been modified in place since; "
                f"such views (outputs of an op returning several views: unbind, split, chunk) can't be "
                f"used by autograd after that, as in torch: take the pieces after the write, or .clone() "
                f"them before it")
        if c.held[0] != src._data._version:   # its values only: its history stays refused (version unchanged)
            with grad_mode.no_grad():
                t._data.copy_(replay(c.chain, src, lambda op, x, attrs: apply(op, x, **attrs))._data)
            c.held[0] = src._data._version
        return
    had_history = t.grad_fn is not None
    with grad_mode.set_grad_enabled(src_rg):
        y = replay(c.chain, src, lambda op, x, attrs: apply(op, x, **attrs))
    if c.held[0] != src._data._version:   # (not by a detach() sharing the storage already)
        with grad_mode.no_grad():
            t._data.copy_(y._data)
    t.grad_fn, t._out_idx, t._rg = y.grad_fn, y._out_idx, y._rg
    if had_history and not src_rg:   # (its source detach_()ed since: as refresh's views)
        cut_history(t)
    c.version = c.held[0] = src._data._version


def refused_piece(t: Tensor):
    """The multi-output view op (``split``, ``chunk``, ...) whose piece ``t`` is, or a view of
    whose piece it is, when that piece's storage or source was written since it was taken (its
    history refused, as torch refuses such views and views of them: only values are re-derived),
    else None. The piece is a view of its base (its storage written since) or a copy standing for
    one (its source written since)."""
    while t is not None:
        vi = t._view
        if vi is not None and vi.version is not None and t._data._version != vi.version:
            return next(op for op, _, idx in reversed(vi.chain) if idx is not None)
        c = t.__dict__.get("_copy_of")
        if c is None:
            return None
        if c.multi and c.source._data._version != c.version:
            return next(op for op, _, idx in c.chain if idx is not None)
        t = c.source
    return None


def take_history(x: Tensor, out: Tensor, name: str) -> None:
    """``x`` now holds ``out``'s value: it takes over ``out``'s history; if ``x`` is a view, its
    base's history is rebased onto a ``view_scatter`` node (torch's CopySlices). A value with no
    history (``y.copy_(constant)``) with grad mode on cuts ``x``'s: no gradient reaches what ``x``
    held before (it gets zeros, as torch's ``CopyBackwards`` gives; ``x`` still requires grad; for
    a view, the base's gradient is zero on the overwritten slice, and the view re-derives from its
    base). Under ``no_grad`` the history stays, as torch's does; a leaf keeps
    its ``requires_grad``. A ``retain_grad()`` of the tensor whose history changed (``x``, or a
    view's base) moves to its new history, as torch moves it: ``.grad`` is that of the new value."""
    t = x._view.base if x._view is not None else x
    # (the histories as stored: the grad_fn getter would re-derive a view written since, where
    # torch's write looks at nothing, so under no_grad a view would take a history it never has)
    old, old_idx = t._grad_fn, t._out_idx
    vold, vold_idx = x._grad_fn, x._out_idx
    _take_history(x, out)
    move_retain(old, old_idx, t)
    if t is not x and vold is not None and vold.retains and vold_idx in vold.retains:
        move_retain(vold, vold_idx, x)   # (the written view's retain_grad: to its history re-derived
        refresh(x)                       # from the base's new one, as torch regenerates it)
    if t is not x and out._grad_fn is None and (t._grad_fn, t._out_idx) != (old, old_idx):
        # a view written with a value of no history has no op's node to take: its history is
        # re-derived from the base's new one now (torch's rebase_history), not left to a later use
        refresh(x)


def move_retain(old, old_idx: int, t: Tensor) -> None:
    """A ``retain_grad()`` of ``t`` kept at output ``old_idx`` of its old grad node moves to its
    current one, as torch moves it when a tensor's history changes."""
    if old is None or not old.retains or (t.grad_fn is old and t._out_idx == old_idx):
        return
    keep = old.retains.pop(old_idx, None)
    node = t.grad_fn
    if keep is not None and node is not None:
        if node.retains is None:
            node.retains = {}
        node.retains[t._out_idx] = keep


def _take_history(x: Tensor, out: Tensor) -> None:
    vi = x._view
    if out._grad_fn is None:
        if not grad_mode.STATE.enabled:
            return
        if vi is not None and vi.base._rg:
            base = vi.base
            edge = (base.grad_fn, base._out_idx) if base.grad_fn is not None else base
            base.grad_fn, base._out_idx = GradNode(VIEW_SCATTER, (edge, None), {"chain": vi.chain},
                                                   (base._data.shape, out._data.shape),
                                                   (base._data.dtype, out._data.dtype)), 0
        elif vi is None and x.grad_fn is not None:   # (torch's CopyBackwards/FillBackward: the
            # tensor still requires grad, its old history gets zeros; views of it re-derive)
            x.grad_fn, x._out_idx = GradNode(VIEW_SCATTER, ((x.grad_fn, x._out_idx), None), {"chain": ()},
                                             (x._data.shape, out._data.shape),
                                             (x._data.dtype, out._data.dtype)), 0
        return
    if vi is not None:
        base = vi.base
        edge = ((base.grad_fn, base._out_idx) if base.grad_fn is not None else base) if base._rg else None
        node = GradNode(VIEW_SCATTER, (edge, (out._grad_fn, out._out_idx)), {"chain": vi.chain},
                    (base._data.shape, out._data.shape), (base._data.dtype, out._data.dtype))
        base.grad_fn, base._out_idx, base._rg = node, 0, True
        # the view is stale now: Eager.assign re-derives it from the base's new history, as torch
        # regenerates a written view's grad_fn (hooks registered on it since see the gradient of
        # the view, not of every later write that passes through the op's node); so does a trace
        # (graph/trace.py, Tracer.assign)
    x.grad_fn, x._out_idx, x._rg = out._grad_fn, out._out_idx, True


_eager_py = _eager   # the Python reference: the C path hands it (and wrap, op_error) every other case
_FAST = _init_fast()
if _FAST is not None:
    _eager, apply = _FAST.eager, _FAST.apply
