"""The optimizer inside a graph: effect nodes that run the optimizer's own update on the live
parameter and state storages, reading hyper-parameters (the scheduler's lr) at run time, so eager
and graph share one update rule.

- without a grad scaler: one effect per param group, the optimizer's own update rule run with its
  multi-tensor (foreach) lowering (optim/lowering.py; passes/fuse_update.py may swap in the
  optimizer's fused lowering);
- with a grad scaler: one effect that hands the gradients to ``scaler.step(opt)`` (unscale, skip
  the step on inf/nan) and ``scaler.update()``, then publishes the new scale to the tensor the
  traced loss scaling reads; under ZeRO the gradients are shards, so that effect unscales them,
  sums the inf/nan count over the ranks (every rank skips, or steps, alike) and runs the sharded
  updates itself; a pipeline stage runs its share of that effect (its parameters' updates), the
  count summed over every stage;
- an optimizer with step hooks (``register_step_pre_hook`` / ``register_step_post_hook``, or
  every optimizer's) gets an effect running its pre hooks before its updates and one running its
  post hooks after them, once per graph step as eager's ``opt.step()`` (with a grad scaler: when
  the step is not skipped);
- the step is booked once per optimizer and graph call (``opt._step_count``, as one eager
  ``opt.step()``), though its updates run once per parameter group and placement: they share a
  `StepBook`;
- one effect per LR scheduler, after the updates: OneFlow steps it once per graph call, and doing
  it in the update task keeps that order when iterations stream.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import torch

from ..core import grad_mode
from ..core.errors import HoloflowError
from ..core.sbp import B
from ..core.tensor import Tensor
from ..distributed import world
from ..distributed.comm_check import call_site
from ..distributed.global_tensor import make_global
from ..distributed.sharding import shard_of
from ..optim.optimizer import has_step_hooks, run_step_post_hooks, run_step_pre_hooks
from .step_book import StepBook, booking, count_step
from .zero import sharded_update


def align_state(params: list, states: list, rank: int, comm: Any = None) -> None:
    """Optimizer state follows its global parameter's layout, so graph and eager steps of one
    optimizer can alternate: state an update created from gradients (SGD's momentum buffer on its
    first step) holds this rank's piece and becomes global like the parameter; broadcast state of
    eager steps before a ZeRO-3 graph re-laid its parameter out as rows takes this rank's rows;
    state laid out otherwise (the rows of a ZeRO graph, given to a graph without ZeRO) is boxed
    to the parameter's SBP."""
    for p, st in zip(params, states):
        meta = p._global
        if meta is None:
            continue
        for k, v in st.items():
            if not isinstance(v, Tensor) or v._data.dim() == 0:
                continue
            if v._global is None and v._data.shape == p._data.shape:
                make_global(v, meta.placement, meta.sbp, meta.shape)
            elif v._global is not None and v._global.sbp != meta.sbp and v.shape == p.shape \
                    and all(s == B for s in v._global.sbp):
                rows = shard_of(v._data, meta.sbp, meta.placement, rank).clone()
                st[k] = make_global(Tensor._make(rows), meta.placement, meta.sbp, meta.shape)
            elif v._global is not None and v._global.placement == meta.placement and v.shape == p.shape \
                    and v._global.sbp != meta.sbp:
                # other pieces (rows a ZeRO graph sharded, loaded or stepped before): boxed to the
                # parameter's layout, one collective every rank of the placement runs alike
                with world.acting_as(rank, comm if comm is not None else world.comm()), grad_mode.no_grad():
                    st[k] = v.to_global(sbp=meta.sbp).detach()


def _group_update(opt, group_index: int, params: list, book: StepBook | None = None):
    """The update effect of ``params`` (of param group ``group_index``): the optimizer's own
    rule, run with its multi-tensor lowering; ``book`` books the step once per graph step."""
    group = opt.param_groups[group_index]
    ran = booking(book)
    rank, comm = world.rank(), world.comm()   # the update runs on a runtime thread
    is_global = any(p._global is not None for p in params)

    def update(*grads):
        ps = list(params)
        gs = [Tensor._make(g) for g in grads]
        states = [opt._state_of(p, group) for p in ps]
        if is_global:
            align_state(ps, states, rank, comm)
        prev, grad_mode.STATE.enabled = grad_mode.STATE.enabled, False
        try:
            if group.get("foreach") is not False and hasattr(opt, "_step_foreach"):
                opt._step_foreach(group, ps, gs, states)
            else:
                opt._step_ops(group, ps, gs, states)
        finally:
            grad_mode.STATE.enabled = prev
        if is_global:
            align_state(ps, states, rank, comm)
        ran()
    update.__name__ = f"{type(opt).__name__.lower()}_update"
    # for passes/fuse_update and pipeline stages (passes/stages.py)
    update.opt, update.group_index, update.params, update.book = opt, group_index, params, book
    return update


def _by_placement(params: list) -> list[list]:
    """``params`` grouped by placement, in first-seen order (one group when all share one, or
    none is global)."""
    groups: dict = {}
    for p in params:
        g = getattr(p, "_global", None)
        groups.setdefault(g.placement if g is not None else None, []).append(p)
    return list(groups.values())


def _scaler_update(scaler, optimizers: list, params: list, scale: Tensor):
    """Eager's ``scaler.step(opt); scaler.update()`` on the graph's gradients."""
    def update(*grads):
        saved = [p.grad for p in params]
        for p, g in zip(params, grads):
            p.grad = Tensor._make(g)
        try:
            for opt in optimizers:
                scaler.step(opt)
            scaler.update()
        finally:
            for p, g in zip(params, saved):
                p.grad = g
        scale._data.copy_(scaler._scale._data)
    return update


def unscale_count(scaler, grads) -> float:
    """Divides the gradients (torch tensors) by the scaler's scale in place; the number of them
    holding inf/nan (what a scaler update sums over ranks or stages before stepping or skipping)."""
    inv = scaler._scale.double().reciprocal().float()._data
    bad = 0.0
    for g in grads:
        if not bool(torch.isfinite(g).all()):
            bad += 1.0
        g.mul_(inv.to(g.device))
    return bad


def finish_scaler_step(scaler, found_inf: bool, scale: Tensor) -> None:
    """``scaler.update()`` after a graph's step, and the new scale published to ``scale`` (the
    tensor the traced loss scaling reads)."""
    scaler._update_scale(found_inf)
    scaler._per_optimizer_states = {}
    scale._data.copy_(scaler._scale._data)


def rank_sum(ranks: tuple, rank: int | None = None, comm: Any = None):
    """A function summing a float over ``ranks`` (one scalar gather; each of them calls it once,
    in the same order): a scaler update's inf/nan count. ``rank`` and ``comm`` default to the
    caller's, read now, as the sum runs on a runtime thread."""
    rank = world.rank() if rank is None else rank
    comm = world.comm() if comm is None else comm

    def total(x: float) -> float:
        if len(ranks) < 2:
            return float(x)
        # pipeline stages call it from their own update programs, at different lines
        with world.acting_as(rank, comm), call_site("GradScaler: the inf/nan count of every rank"):
            return float(sum(comm.all_gather_shapes(float(x), ranks)))
    return total


def _zero_scaler_update(scaler, updates: list, scale: Tensor, ranks: tuple, optimizers: list = (),
                        params: list = (), sbps: list = (), sync: Any = None):
    """``scaler.step(opt); scaler.update()`` on global parameters (under ZeRO or not): the
    gradients are this rank's shards (or whole), so the inf/nan count is summed over ``ranks``
    (or by ``sync``: a pipeline's sum over every stage) before every rank decides to step or to
    skip. A step runs, for each of ``optimizers`` as eager's ``opt.step()``, its pre hooks, its
    updates (sharded ones with their all-gathers) and its post hooks; the hooks see the unscaled
    gradients of ``params`` (nd-SBPs ``sbps``) as their ``.grad``. ``updates``: (optimizer,
    update, gradient indices), each update over one placement. ``kernel.share(indices, sync)``:
    a pipeline stage's share, the updates of the parameters at ``indices``, summing with ``sync``."""
    rank, comm = world.rank(), world.comm()
    total = sync if sync is not None else rank_sum(ranks, rank, comm)

    def update(*grads):
        bad = total(unscale_count(scaler, grads))
        if not bad:   # eager's scaler.step(opt) runs opt.step(), with its hooks, only when finite
            for opt in optimizers:
                with world.acting_as(rank, comm), grads_as_dot_grad(params, sbps, grads):
                    run_step_pre_hooks(opt, (opt,), {}, f"a step pre-hook of {type(opt).__name__}")
                for fn, idx in [(fn, idx) for o, fn, idx in updates if o is opt]:   # (booking its step once)
                    fn(*(grads[i] for i in idx))
                with world.acting_as(rank, comm), grads_as_dot_grad(params, sbps, grads):
                    run_step_post_hooks(opt, (opt,), {})
        finish_scaler_step(scaler, bad > 0, scale)

    def share(here: list, stage_sync: Any):
        at = {i: j for j, i in enumerate(here)}
        mine = []
        for opt, fn, idx in updates:
            if any(i in at for i in idx) and not all(i in at for i in idx):
                raise HoloflowError(f"holoflow.nn.Graph: the update {fn.__name__!r} reads gradients of several "
                                    f"pipeline stages and cannot be split by stage")
            if idx and idx[0] in at:
                mine.append((opt, fn, [at[i] for i in idx]))
        for opt in optimizers:   # a stage holding none of opt's parameters counts its step too, as eager's
            if not any(o is opt for o, _, _ in mine):
                mine.append((opt, partial(count_step, opt), []))
        part = _zero_scaler_update(scaler, mine, scale, ranks, optimizers, [params[i] for i in here],
                                   [sbps[i] for i in here], stage_sync)
        part.__name__ = update.__name__
        return part
    update.__name__ = "grad_scaler_zero_update"
    update.share = share   # for pipeline stages (passes/stages.py)
    return update


def _step_hooks(opt, post: bool, params: list = (), sbps: list = ()):
    """An effect kernel running ``opt``'s step hooks (and every optimizer's) as eager's
    ``opt.step()`` runs them around the update (``args`` = ``(opt,)``, as eager's step hands them):
    pre hooks before the optimizer's updates of this graph step, post hooks after them and before
    the LR schedulers' steps. It takes the gradients of ``params`` (nd-SBPs ``sbps``, traced), and
    the hooks see them as the parameters' ``.grad`` (this rank's piece of a global parameter's
    gradient as a global tensor), as eager hooks do. The hooks are read when the step runs, so a
    hook removed after the graph compiled no longer runs (one added to an optimizer without hooks
    compiles the graph again: ``Graph._get``). ``kernel.restrict(indices)``: the same for the
    parameters at ``indices`` (a pipeline stage's share)."""
    rank, comm = world.rank(), world.comm()

    def hooks(*grads) -> None:
        # on a runtime thread: a hook's global ops (a gradient norm's reduction) talk as this rank
        with world.acting_as(rank, comm), grads_as_dot_grad(params, sbps, grads):
            if post:
                run_step_post_hooks(opt, (opt,), {})
            else:
                run_step_pre_hooks(opt, (opt,), {}, f"a step pre-hook of {type(opt).__name__}")
    hooks.__name__ = "optimizer_step_post_hooks" if post else "optimizer_step_pre_hooks"
    hooks.restrict = lambda idx: _step_hooks(opt, post, [params[i] for i in idx], [sbps[i] for i in idx])
    return hooks


class grads_as_dot_grad:
    """While the block runs, each parameter's ``.grad`` is its gradient of this graph step
    (``grads``: torch tensors, this rank's pieces; ``sbps``: their nd-SBPs, None for a local
    parameter); the previous ``.grad`` afterwards."""

    def __init__(self, params: list, sbps: list, grads: tuple) -> None:
        self.params, self.sbps, self.grads = list(params), list(sbps), grads

    def __enter__(self) -> None:
        self.saved = [p.grad for p in self.params]
        for p, nd, g in zip(self.params, self.sbps, self.grads):
            t = Tensor._make(g)
            p.grad = make_global(t, p._global.placement, nd, p._global.shape) if nd is not None else t

    def __exit__(self, *exc) -> None:
        for p, g in zip(self.params, self.saved):
            p.grad = g


def _hook_effect(tracer, opt, post: bool) -> None:
    """Records the effect running ``opt``'s pre (or post) step hooks with its gradients."""
    params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
    grads = _graph_grads(params)
    sbps = [g._global.sbp if g._global is not None else None for g in grads]
    kernel = _step_hooks(opt, post, params, sbps)
    tracer.effect(kernel.__name__, tuple(grads), {}, kernel)


def _graph_grads(params: list) -> list:
    for p in params:
        if "_v" not in p.grad.__dict__:
            raise HoloflowError("holoflow.nn.Graph: a parameter's .grad was set outside build(); "
                                "call optimizer.zero_grad(set_to_none=True) before the graph runs")
    return [p.grad for p in params]


def add_optimizer_updates(tracer, optimizers: list, scaler=None, scale: Tensor | None = None,
                          zero=None) -> None:
    """Records the updates of every optimizer for the parameters that received a gradient, then
    the scheduler steps. ``optimizers`` holds ``(optimizer, lr_scheduler or None)`` pairs;
    ``zero`` (graph/zero.py) shards the updates of data-parallel parameters."""
    if scaler is not None and (zero is not None or any(
            p._global is not None and p.grad is not None for o, _ in optimizers for g in o.param_groups
            for p in g["params"])):
        # global parameters: the gradients are this rank's pieces, so the inf/nan check is
        # summed over the ranks (eager's scaler.step on local pieces would need global grads)
        params, updates = [], []
        for opt, _ in optimizers:
            book = StepBook(opt)
            for gi, group in enumerate(opt.param_groups):
                for ps in _by_placement([p for p in group["params"] if p.grad is not None]):
                    fn = sharded_update(opt, gi, ps, zero, book) if zero is not None and \
                        any(zero.sharded(p) for p in ps) else _group_update(opt, gi, ps, book)
                    updates.append((opt, fn, list(range(len(params), len(params) + len(ps)))))
                    params += ps
        ranks = tuple(sorted({r for p in params if p._global is not None for r in p._global.placement.flat_ranks}))
        grads = _graph_grads(params)
        sbps = [g._global.sbp if g._global is not None else None for g in grads]
        update = _zero_scaler_update(scaler, updates, scale, ranks, [o for o, _ in optimizers], params, sbps)
        name = "grad_scaler_zero_update" if zero is not None else "grad_scaler_update"
        update.__name__ = name
        tracer.effect(name, tuple(grads), {}, update)
    elif scaler is not None:   # scaler.step(opt) runs opt.step(), hooks included
        params = [p for opt, _ in optimizers for g in opt.param_groups for p in g["params"] if p.grad is not None]
        tracer.effect("grad_scaler_update", tuple(_graph_grads(params)), {},
                      _scaler_update(scaler, [o for o, _ in optimizers], params, scale))
    else:
        for opt, _ in optimizers:
            hooked, book = has_step_hooks(opt), StepBook(opt)
            if hooked:
                _hook_effect(tracer, opt, False)
            for gi, group in enumerate(opt.param_groups):
                for params in _by_placement([p for p in group["params"] if p.grad is not None]):
                    # one update per placement (pipeline stages), one step booked for them all
                    update = sharded_update(opt, gi, params, zero, book) if zero is not None and any(
                        zero.sharded(p) for p in params) else _group_update(opt, gi, params, book)
                    tracer.effect(update.__name__, tuple(_graph_grads(params)), {}, update)
            if hooked:
                _hook_effect(tracer, opt, True)
    for _, sch in optimizers:
        if sch is not None:
            tracer.effect("lr_scheduler_step", (), {}, lambda _s=sch: _s.step())
