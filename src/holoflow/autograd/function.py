"""``holoflow.autograd.Function``: user-defined ops with their own forward and backward."""
from __future__ import annotations

import torch

import functools

from ..core import grad_mode
from ..core.anomaly import ANOMALY, note_forward
from ..core.autograd import _FREED, GradNode, _zeros_for
from ..core.node import unpack_saved
from ..core.saved import _LIVE, SavedTensor, current as _saved_hooks, pack
from ..core.dispatch import check_inplace_target, take_history
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
        if saved is None or (saved and getattr(self, "_freed", False)):
            raise RuntimeError("holoflow: trying to backward through a custom Function a second "
                               "time; pass retain_graph=True to the first backward()")
        for d, v in getattr(self, "_versions", ()):
            if d._version != v:
                raise RuntimeError(f"holoflow: a tensor saved by {type(self).__name__} with "
                                   f"save_for_backward was modified in place (version {d._version},"
                                   f" expected {v})")
        if getattr(self, "_packed", False):   # saved through pack hooks: unpacked at each read
            return tuple(unpack_saved(s) if type(s) is SavedTensor else s for s in saved)
        return saved

    def _pack(self, hooks: tuple) -> None:
        """What ``save_for_backward`` kept, through ``hooks``' pack (at the end of the forward,
        as torch packs a Function's saved tensors); no version is checked after that."""
        saved = getattr(self, "_saved", None)
        if saved:
            self._saved = tuple(pack(t, hooks) if isinstance(t, Tensor) else t for t in saved)
            self._versions, self._packed = (), True

    def save_for_forward(self, *tensors) -> None:
        """torch's tensors for a ``jvp`` staticmethod (read back as ``saved_tensors`` there):
        holoflow computes forward mode by reverse mode through ``backward``, so they are only kept."""
        self._saved_for_forward = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        self._non_diff = {id(t) for t in tensors}

    def mark_dirty(self, *tensors) -> None:
        """Declares the inputs ``forward`` modified in place (they must be returned): their
        history moves onto this Function, as after any in-place op."""
        self._dirty = tensors

    def set_materialize_grads(self, value: bool) -> None:
        """Whether ``backward`` gets zeros (the default) or None for the gradient of an output
        that nothing used; a non-tensor output's is always None, as torch's."""
        self._materialize = value


def _function_grad(node: GradNode, *dys):
    fn, ctx = node.attrs["fn"], node.attrs["ctx"]
    # (the engine frees a node's saved state after a backward without retain_graph: what
    # save_for_backward kept is then gone, as torch's)
    ctx._freed = node._saved is _FREED
    # backward of global tensors flows as each rank's local pieces: the user's backward sees (and
    # returns) global gradients, as hooks do
    dys = tuple(m.grad_view(d) if m is not None and d is not None else d for m, d in zip(ctx._output_globals, dys))
    if node.out_metas is not None and getattr(ctx, "_materialize", True):   # (the op reads none: see apply)
        like = next((d for d in dys if d is not None), None)
        dys = tuple(_zeros_for(m, like) if d is None and m is not None else d for d, m in zip(dys, node.out_metas))
    grads = fn.backward(ctx, *dys)
    grads = grads if isinstance(grads, tuple) else (grads,)
    n = len(node.edges)
    if len(grads) < n or any(g is not None for g in grads[n:]):
        raise RuntimeError(f"holoflow: function {fn.__name__}Backward returned an incorrect number of "
                           f"gradients (expected {n}, got {len(grads)})")
    metas = node.attrs["ctx"]._input_metas
    return tuple(_local_piece(fn.__name__, i, _validate(fn.__name__, i, g, metas[i]), ctx._input_globals[i])
                 if node.edges[i] is not None else g for i, g in enumerate(grads[:n]))


def _local_piece(name: str, i: int, g, meta):
    """A custom backward's gradient for global input ``i`` (of GlobalMeta ``meta``) as the local
    piece backward continues with; a local gradient for a global input is refused."""
    if g is None or meta is None:
        return g
    if g._global is None:
        raise RuntimeError(f"holoflow: Function {name}Backward returned a local gradient of shape "
                           f"{tuple(g.shape)} at index {i} for a global input (sbp {meta.sbp} on "
                           f"{meta.placement}); return a global gradient, e.g. the one backward was given "
                           f"times a global tensor, or grad.to_global(placement, sbp)")
    if not hasattr(g._global, "tracer") and g._global.placement != meta.placement:
        raise RuntimeError(f"holoflow: Function {name}Backward returned a gradient on {g._global.placement} at "
                           f"index {i} for an input on {meta.placement}; move it with "
                           f".to_global(placement=...)")
    return meta.grad_local(g)


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
    """Subclass with static ``forward(ctx, *args)`` and ``backward(ctx, *grads)``; call ``apply``.
    Or, torch's other style: ``forward(*args)`` without ``ctx`` plus a static
    ``setup_context(ctx, inputs, output)`` that saves what ``backward`` needs."""

    _op: Op | None = None

    @staticmethod
    def setup_context(ctx: FunctionCtx, inputs: tuple, output) -> None:
        """Overridden to split ``forward`` from the saving of state: ``forward`` then takes no
        ``ctx``; this one gets the inputs and ``forward``'s result (in no-grad mode, as forward)."""
        raise NotImplementedError("holoflow: setup_context is not overridden: forward takes ctx")

    @classmethod
    def apply(cls, *args):
        # (torch.func refuses a Function whose forward takes ctx; holoflow's own, compiled calls and
        # checkpoints among them, run under its transforms)
        if grad_mode.STATE.level > 0 and cls.setup_context is Function.setup_context and \
                not cls.__module__.startswith("holoflow."):
            raise RuntimeError(f"holoflow: {cls.__name__} is an autograd.Function whose forward takes ctx; to use "
                               f"it under holoflow.func's transforms (vmap, grad, jvp, jacrev, ...) it must override "
                               f"the setup_context staticmethod, as torch.func asks: forward(*args) without ctx, "
                               f"setup_context(ctx, inputs, output) saving what backward needs")
        ctx = FunctionCtx()
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        ctx._input_metas = [(tuple(a.shape), a.dtype) if isinstance(a, Tensor) else None for a in args]
        ctx._input_globals = [a._global if isinstance(a, Tensor) else None for a in args]
        edges = tuple(((a.grad_fn, a._out_idx) if a.grad_fn is not None else a)
                      if isinstance(a, Tensor) and a.requires_grad else None for a in args)
        with grad_mode.no_grad():
            if cls.setup_context is Function.setup_context:
                out = cls.forward(ctx, *args)
            else:
                out = cls.forward(*args)
                cls.setup_context(ctx, args, out)
        record = any(ctx.needs_input_grad) and grad_mode.is_grad_enabled()
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        dirty = {id(t) for t in getattr(ctx, "_dirty", ())}
        if dirty - {id(o) for o in outs}:
            raise RuntimeError(f"holoflow: {cls.__name__}: some tensors marked dirty in forward were not "
                               f"returned; the inputs modified in place must all be outputs of the Function")
        # an input returned as it is (not marked dirty) comes back as a new tensor on the same
        # storage, as torch's: taking the Function's history must not rewrite the input's
        ins = {id(a) for a in args if isinstance(a, Tensor)}
        outs = tuple(_alias(o) if isinstance(o, Tensor) and id(o) in ins and id(o) not in dirty else o
                     for o in outs)
        if not record:
            return outs[0] if single else outs
        if cls.__dict__.get("_op") is None:
            # the engine passes None for an output that got no gradient (grad_reads=()): the
            # rule gives zeros in its place unless ctx.set_materialize_grads(False) said not to
            cls._op = Op(cls.__name__, kernel=None, grad=_function_grad, save="inputs", grad_reads=())
        ctx._output_globals = [o._global if isinstance(o, Tensor) else None for o in outs]
        node = GradNode(cls._op, edges, {"fn": cls, "ctx": ctx}, (), ())
        if len(outs) > 1:
            node.out_metas = tuple((o._data.shape, o._data.dtype, o._data.device) if isinstance(o, Tensor)
                                   else None for o in outs)
        non_diff = getattr(ctx, "_non_diff", set())
        for i, o in enumerate(outs):
            if not isinstance(o, Tensor) or id(o) in non_diff:
                continue
            if not (o._data.is_floating_point() or o._data.is_complex()):
                continue
            if id(o) in dirty:   # its old history (or its base's) is rebased onto this node
                check_inplace_target(o, cls.__name__)
                take_history(o, Tensor._make(o._data, node, i), cls.__name__)
            else:
                o._rg, o.grad_fn, o._out_idx = True, node, i
        node._saved = ()
        if ANOMALY.enabled:
            note_forward(node)
        if _LIVE[0]:
            hooks = _saved_hooks()
            if hooks is not None:
                ctx._pack(hooks)
        return outs[0] if single else outs


def _alias(t: Tensor) -> Tensor:
    a = Tensor._make(t._data)
    a._global = t._global
    return a


def once_differentiable(fn):
    """Decorates a Function's ``backward`` that is not itself differentiable: it runs without
    recording, and differentiating its result again (``create_graph=True``) raises, as torch's."""
    @functools.wraps(fn)
    def wrapper(ctx, *args):
        with grad_mode.no_grad():
            outputs = fn(ctx, *args)
        if not (grad_mode.is_grad_enabled() and any(isinstance(a, Tensor) and a._rg for a in args)):
            return outputs
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        node = GradNode(_DELAYED_ERROR, (), {}, (), ())
        node._saved = ()
        res = tuple(Tensor._make(o._data, node) if isinstance(o, Tensor) and
                    (o._data.is_floating_point() or o._data.is_complex()) else o for o in outs)
        return res[0] if single else res
    return wrapper


def _delayed_error(ctx, *dys):
    raise RuntimeError("holoflow: trying to differentiate twice a function that was marked with "
                       "@once_differentiable")


_DELAYED_ERROR = Op("delayed_error", kernel=None, grad=_delayed_error)
