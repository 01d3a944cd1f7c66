"""The optimizer inside a graph: one effect node per param group that runs the optimizer's own
multi-tensor (foreach) update on the live parameter and state storages, reading the group's
hyper-parameters (the scheduler's lr) at run time. Eager and graph share one update rule."""
from __future__ import annotations

from ..core import grad_mode
from ..core.errors import HoloflowError
from ..core.tensor import Tensor


def _group_update(opt, group_index: int, params: list):
    group = opt.param_groups[group_index]

    def update(*grads):
        ps = list(params)
        gs = [Tensor._make(g) for g in grads]
        states = [opt._state_of(p, group) for p in ps]
        prev, grad_mode.STATE.enabled = grad_mode.STATE.enabled, False
        try:
            if group.get("foreach") is not False and hasattr(opt, "_step_foreach"):
                opt._step_foreach(group, ps, gs, states)
            else:
                opt._step_ops(group, ps, gs, states)
        finally:
            grad_mode.STATE.enabled = prev
        opt._step_count = getattr(opt, "_step_count", 0) + 1
    update.__name__ = f"{type(opt).__name__.lower()}_update"
    return update


def add_optimizer_updates(tracer, optimizers: list, config) -> None:
    """Records the updates of every optimizer for the parameters that received a gradient."""
    for opt, _ in optimizers:
        for gi, group in enumerate(opt.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if "_v" not in p.grad.__dict__:
                    raise HoloflowError("holoflow.nn.Graph: a parameter's .grad was set outside build(); "
                                        "call optimizer.zero_grad(set_to_none=True) before the graph runs")
            grads = [p.grad for p in params]
            tracer.effect(f"{type(opt).__name__.lower()}_update", tuple(grads),
                          {}, _group_update(opt, gi, params))
