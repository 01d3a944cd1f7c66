"""``holoflow.autograd.Function``: user-defined ops with their own forward and backward."""
from __future__ import annotations

import torch

from ..core import grad_mode
from ..core.autograd import GradNode
from ..core.registry import Op
from ..core.tensor import Tensor


class FunctionCtx:
    """The ``ctx`` of a custom Function: ``save_for_backward``, ``saved_tensors``,
    ``needs_input_grad``, ``mark_non_differentiable`` and free attributes."""

    def save_for_backward(self, *tensors) -> None:
        self._saved = tensors
        self._versions = [(t._data, t._data._version) for t in tensors if isinstance(t, Tensor)]

    @property
    def saved_tensors(self) -> tuple:
        saved = getattr(self, "_saved", ())
        if saved is None:
            raise RuntimeError("holoflow: trying to backward through a custom Function a second "
                               "time; pass retain_graph=True to the first backward()")
        for d, v in getattr(self, "_versions", ()):
            if d._version != v:
                raise RuntimeError(f"holoflow: a tensor saved by {type(self).__name__} with "
                                   f"save_for_backward was modified in place (version {d._version},"
                                   f" expected {v})")
        return saved

    def mark_non_differentiable(self, *tensors) -> None:
        self._non_diff = {id(t) for t in tensors}

    def set_materialize_grads(self, value: bool) -> None:
        self._materialize = value


def _function_grad(node: GradNode, *dys):
    fn, ctx = node.attrs["fn"], node.attrs["ctx"]
    grads = fn.backward(ctx, *dys)
    grads = grads if isinstance(grads, tuple) else (grads,)
    n = len(node.edges)
    if len(grads) < n:
        raise RuntimeError(f"holoflow: {fn.__name__}.backward returned {len(grads)} gradients, "
                           f"but forward took {n} inputs")
    metas = node.attrs["ctx"]._input_metas
    return tuple(_validate(fn.__name__, i, g, metas[i]) if node.edges[i] is not None else g
                 for i, g in enumerate(grads[:n]))


def _validate(name: str, i: int, g, meta):
    """torch's checks on a custom backward's gradient: a gradient the input's shape can expand to
    is summed back to it, another shape raises; the dtype becomes the input's."""
    if g is None or meta is None:
        return g
    if not isinstance(g, Tensor):
        raise TypeError(f"holoflow: {name}.backward returned a {type(g).__name__} as gradient {i}; "
                        f"expected a Tensor or None")
    shape, dt = meta
    if tuple(g.shape) != shape:
        try:
            expandable = torch.broadcast_shapes(shape, tuple(g.shape)) == tuple(g.shape)
        except RuntimeError:
            expandable = False
        if not expandable:
            raise RuntimeError(f"holoflow: Function {name}Backward returned an invalid gradient at index "
                               f"{i} - got {list(g.shape)} but expected shape compatible with {list(shape)}")
        lead = g.dim() - len(shape)
        if lead:
            g = g.sum(dim=tuple(range(lead)))
        ones = tuple(d for d, s in enumerate(shape) if s == 1 and g.shape[d] != 1)
        if ones:
            g = g.sum(dim=ones, keepdim=True)
    return g if g.dtype is dt else g.to(dt)


class Function:
    """Subclass with static ``forward(ctx, *args)`` and ``backward(ctx, *grads)``; call ``apply``."""

    _op: Op | None = None

    @classmethod
    def apply(cls, *args):
        ctx = FunctionCtx()
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        ctx._input_metas = [(tuple(a.shape), a.dtype) if isinstance(a, Tensor) else None for a in args]
        with grad_mode.no_grad():
            out = cls.forward(ctx, *args)
        if not (any(ctx.needs_input_grad) and grad_mode.is_grad_enabled()):
            return out
        if cls.__dict__.get("_op") is None:
            cls._op = Op(cls.__name__, kernel=None, grad=_function_grad, save="inputs")
        edges = tuple(((a.grad_fn, a._out_idx) if a.grad_fn is not None else a)
                      if isinstance(a, Tensor) and a.requires_grad else None for a in args)
        node = GradNode(cls._op, edges, {"fn": cls, "ctx": ctx}, (), ())
        outs = out if isinstance(out, tuple) else (out,)
        if len(outs) > 1:
            node.out_metas = tuple((o._data.shape, o._data.dtype, o._data.device) for o in outs)
        non_diff = getattr(ctx, "_non_diff", set())
        for i, o in enumerate(outs):
            if isinstance(o, Tensor) and id(o) not in non_diff and o._data.is_floating_point():
                o._rg, o.grad_fn, o._out_idx = True, node, i
        node._saved = ()
        return out
