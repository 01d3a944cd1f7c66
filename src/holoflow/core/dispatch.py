"""The one function every op goes through (DESIGN §6).

``apply(op, *inputs, **attrs)``: positional inputs are holoflow Tensors (or Python scalars, as
constants); attrs are keyword arguments passed to the kernel unchanged.

1. a graph trace is active -> the tracer records the op and returns lazy tensors;
2. any input is global -> the global dispatcher (distributed layer) chooses a signature,
   boxes, and runs this same function on the local shards;
3. otherwise the torch kernel runs on the storages;
4. grad mode is on and an input requires grad -> a Node with the op's grad rule is recorded.
"""
from __future__ import annotations

import torch

from . import grad_mode
from .autograd import Node
from .errors import HoloflowError, describe
from .registry import Op, infer_metas
from .tensor import Tensor


class Hooks:
    """Entry points the upper layers install (the core never imports them)."""

    trace = None          # graph tracing: (op, inputs, attrs) -> outputs
    global_apply = None   # global tensors: (op, inputs, attrs) -> outputs
    pre = None            # amp casts, test recorders: (op, inputs, attrs) -> inputs
    composite = None      # amp casts for ops written as composites: (name, inputs) -> inputs


def apply(op: Op, *inputs, **attrs):
    """Runs ``op`` on ``inputs`` eagerly (or records it while tracing); see module doc."""
    if Hooks.trace is not None:
        return Hooks.trace(op, inputs, attrs)
    if Hooks.pre is not None:
        inputs = Hooks.pre(op, inputs, attrs)
    datas = []
    needs_grad = False
    for x in inputs:
        if isinstance(x, Tensor):
            if x._global is not None:
                return Hooks.global_apply(op, inputs, attrs)
            if x._rg:
                needs_grad = True
            datas.append(x._data)
        else:
            datas.append(x)
    try:
        out = op.kernel(*datas, **attrs)
    except Exception as e:  # a user mistake surfaces as holoflow's error, never torch's bare one
        raise op_error(op, inputs, attrs, e) from e
    record = needs_grad and op.grad is not None and _STATE.enabled
    if not record and type(out) is torch.Tensor:  # the hot path, inlined
        t = _new(Tensor)
        t._data, t._rg, t.grad, t.grad_fn, t._out_idx, t._hooks, t._global = out, False, None, None, 0, None, None
        return t
    return wrap(op, inputs, attrs, out, record)


_STATE = grad_mode.STATE
_new = object.__new__


def run_local(op: Op, inputs: tuple, attrs: dict, saved: tuple | None = None):
    """The local path of :func:`apply` for tensors whose ``_data`` is a shard: runs the kernel
    on the storages and records autograd against ``inputs``, saving ``saved`` (local aliases of
    global inputs) for the grad rule. Used by the global dispatcher and boxing."""
    datas = [x._data if isinstance(x, Tensor) else x for x in inputs]
    try:
        out = op.kernel(*datas, **attrs)
    except Exception as e:
        raise op_error(op, inputs, attrs, e) from e
    record = (op.grad is not None and grad_mode.STATE.enabled
              and any(isinstance(x, Tensor) and x._rg for x in inputs))
    return wrap(op, inputs, attrs, out, record, saved)


def local_alias(x: Tensor) -> Tensor:
    """A local view of a global tensor: same storage and autograd history, no global meta."""
    t = Tensor._make(x._data, x.grad_fn, x._out_idx)
    t._rg = x._rg
    return t


def wrap(op: Op, inputs: tuple, attrs: dict, out, record: bool, saved: tuple | None = None):
    """Wraps kernel outputs as Tensors and, if ``record``, links them to a new grad node."""
    if isinstance(out, torch.Tensor):
        res = Tensor._make(out)
        if record:
            node = _record(op, inputs, attrs, (out,), saved)
            if out.dtype.is_floating_point or out.dtype.is_complex:
                res._rg, res.grad_fn = True, node
        return res
    outs = tuple(out)
    wrapped = [Tensor._make(o) for o in outs]
    if record:
        node = _record(op, inputs, attrs, outs, saved)
        node.out_metas = tuple((o.shape, o.dtype, o.device) for o in outs)
        for i, (w, o) in enumerate(zip(wrapped, outs)):
            if o.dtype.is_floating_point or o.dtype.is_complex:
                w._rg, w.grad_fn, w._out_idx = True, node, i
    return op.out_type(*wrapped) if op.out_type is not None else tuple(wrapped)


def _record(op: Op, inputs: tuple, attrs: dict, outs: tuple, saved: tuple | None = None) -> Node:
    edges, shapes, dtypes = [], [], []
    for x in inputs:
        if isinstance(x, Tensor):
            shapes.append(x._data.shape)
            dtypes.append(x._data.dtype)
            edges.append(((x.grad_fn, x._out_idx) if x.grad_fn is not None else x) if x._rg else None)
        else:
            shapes.append(None)
            dtypes.append(None)
            edges.append(None)
    node = Node(op, tuple(edges), attrs, tuple(shapes), tuple(dtypes))
    if op.save:
        node.save((saved or inputs) if op.saves_inputs else None, outs if op.saves_output else None)
    return node


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


_PLAIN = (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError)


def apply_inplace(op: Op, x: Tensor, *rest, **attrs) -> Tensor:
    """Runs ``op`` writing its result into ``x`` (``x.add_(y)``), keeping views of ``x`` aliased.

    With autograd, the out-of-place op is recorded and ``x`` takes over its grad_fn; when the
    op's grad reads its input, that input is a copy of ``x`` taken before the write.
    """
    grad_on = grad_mode.STATE.enabled and (x._rg or any(isinstance(r, Tensor) and r._rg for r in rest))
    if Hooks.trace is None and x._global is None and not grad_on and op.inplace_kernel is not None:
        datas = [r._data if isinstance(r, Tensor) else r for r in rest]
        try:
            op.inplace_kernel(x._data, *datas, **attrs)
        except Exception as e:
            raise op_error(op, (x, *rest), attrs, e) from e
        return x
    if grad_on and x._rg and x.grad_fn is None:
        raise RuntimeError(f"holoflow.{op.name}_: a leaf tensor that requires grad is being used in "
                           f"an in-place operation; do it under holoflow.no_grad() or out of place")
    src = x
    if grad_on and op.saves_inputs and Hooks.trace is None:
        src = Tensor._make(x._data.clone(), x.grad_fn, x._out_idx)
        src._rg, src._global = x._rg, x._global
    out = apply(op, src, *rest, **attrs)
    return assign(x, out, op.name)


def assign(x: Tensor, out: Tensor, name: str) -> Tensor:
    """Writes ``out`` into ``x``'s storage and takes over its autograd history."""
    if x._global is not None and out._global is not None and out._global.sbp != x._global.sbp:
        out = out.to_global(sbp=x._global.sbp)
    if tuple(out._data.shape) != tuple(x._data.shape):
        raise RuntimeError(f"holoflow.{name}_: the result has shape {tuple(out.shape)}, which "
                           f"doesn't match the in-place target's shape {tuple(x.shape)}")
    if Hooks.trace is not None:
        Hooks.trace.assign(x, out)
        return x
    x._data.copy_(out._data)
    if out.grad_fn is not None:
        x.grad_fn, x._out_idx, x._rg = out.grad_fn, out._out_idx, True
    return x
