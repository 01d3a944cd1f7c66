"""Fused model update (``config.allow_fuse_model_update_ops(True)``): the optimizer's effect
node — its update rule run with the multi-tensor ``foreach`` lowering, several kernels per step —
becomes the optimizer's declared fused lowering (``Optimizer.fused_update``: Adam and AdamW as
``torch._fused_adam_`` / ``_fused_adamw_``), reading the group's hyper-parameters at run time as
the foreach path does. Optimizers without one keep their foreach update, and so does a subclass
that rewrites the update rule of the class that declared the fused kernel."""
from __future__ import annotations

from typing import Callable

from ...core.tensor import Tensor
from ...distributed import world
from ..ir import IRGraph
from ..optimizer import align_state
from ..step_book import StepBook, booking
from . import register


def fused_lowering(opt) -> Callable | None:
    """``opt``'s fused update, when it still implements ``opt``'s own update rule."""
    fused = getattr(opt, "fused_update", None)
    if fused is None:
        return None
    mro = type(opt).__mro__
    owner = next(c for c in mro if "fused_update" in c.__dict__)
    rule = next((c for c in mro if {"_update", "_step_foreach"} & c.__dict__.keys()), owner)
    return fused if issubclass(owner, rule) else None


def _contiguous(t):
    return t if not isinstance(t, Tensor) or t._data.is_contiguous() else Tensor._make(t._data.contiguous())


def _dense(params: list, states: list) -> bool:
    return all(p._data.is_contiguous() for p in params) and \
        all(v._data.is_contiguous() for st in states for v in st.values() if isinstance(v, Tensor))


def fused_update(opt, group_index: int, params: list, fused: Callable, book: StepBook | None = None):
    """The update of one param group as the optimizer's fused kernel. torch's fused kernels walk
    their tensors as contiguous memory, so when a parameter or state is not contiguous (a column
    shard viewing its whole tensor) the group is updated on contiguous copies, written back
    after the call. ``book`` books the step once per graph step (the foreach update's)."""
    group = opt.param_groups[group_index]
    ran = booking(book)
    rank, comm = world.rank(), world.comm()   # the update runs on a runtime thread
    is_global = any(p._global is not None for p in params)

    def update(*grads):
        states = [opt._state_of(p, group) for p in params]
        gs = [Tensor._make(g) for g in grads]
        if is_global:
            align_state(params, states, rank, comm)
        if _dense(params, states):
            fused(group, params, gs, states)
        else:
            ps = [_contiguous(p) for p in params]
            sts = [{k: _contiguous(v) for k, v in st.items()} for st in states]
            fused(group, ps, gs, sts)
            for p, q in zip(params, ps):
                if q is not p:
                    p._data.copy_(q._data)
            for st, s in zip(states, sts):
                for k, v in s.items():
                    if isinstance(st.get(k), Tensor) and st[k] is not v:
                        st[k]._data.copy_(v._data)
                    else:
                        st[k] = v
        if is_global:
            align_state(params, states, rank, comm)
        ran()
    update.__name__ = f"fused_{type(opt).__name__.lower()}_update"
    update.opt, update.group_index, update.params, update.book = opt, group_index, params, book
    return update


@register("fuse_update", enabled=lambda cfg: bool(getattr(cfg, "fuse_model_update", False)))
def fuse_update(g: IRGraph, config=None) -> IRGraph:
    nodes = []
    for n in g.nodes:
        k = n.kernel
        fused = fused_lowering(k.opt) if n.effect and k is not None and hasattr(k, "opt") else None
        if fused is not None:
            n = n.with_(op=f"fused_{n.op}", kernel=fused_update(k.opt, k.group_index, k.params, fused,
                                                                   getattr(k, "book", None)))
        nodes.append(n)
    return g.with_(nodes=tuple(nodes))
