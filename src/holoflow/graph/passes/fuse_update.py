"""Fused model update (``config.allow_fuse_model_update_ops(True)``): the optimizer's effect
node — by default its multi-tensor ``foreach`` update, several kernels per step — becomes one
call of torch's fused multi-tensor kernel where one exists for the optimizer (Adam and AdamW:
``torch._fused_adam_`` / ``_fused_adamw_``), reading the group's hyper-parameters at run time
as the foreach path does. Other optimizers keep their foreach update."""
from __future__ import annotations

import torch

from ..ir import Graph
from . import register


def _fusable(opt) -> bool:
    from ...optim import Adam
    return isinstance(opt, Adam) and hasattr(torch, "_fused_adam_")


def fused_adam_update(opt, group_index: int, params: list):
    """The update of one Adam/AdamW param group as a single fused kernel."""
    group = opt.param_groups[group_index]

    def update(*grads):
        states = [opt._state_of(p, group) for p in params]
        for p, st in zip(params, states):  # fused kernels want the counters on the params' device
            if st["step"]._data.device != p._data.device:
                st["step"]._data = st["step"]._data.to(p._data.device)
        steps = [st["step"]._data for st in states]
        torch._foreach_add_(steps, 1)
        b1, b2 = group["betas"]
        kernel = torch._fused_adamw_ if group["decoupled_weight_decay"] else torch._fused_adam_
        kernel([p._data for p in params], [g.contiguous() for g in grads],
               [st["exp_avg"]._data for st in states], [st["exp_avg_sq"]._data for st in states],
               [st["max_exp_avg_sq"]._data for st in states] if group["amsgrad"] else [],
               steps, lr=float(group["lr"]), beta1=b1, beta2=b2, weight_decay=group["weight_decay"],
               eps=group["eps"], amsgrad=group["amsgrad"], maximize=group["maximize"])
        opt._step_count = getattr(opt, "_step_count", 0) + 1
    update.__name__ = f"fused_{type(opt).__name__.lower()}_update"
    update.opt, update.group_index, update.params = opt, group_index, params
    return update


@register("fuse_update", enabled=lambda cfg: bool(getattr(cfg, "fuse_model_update", False)))
def fuse_update(g: Graph, config=None) -> Graph:
    nodes = []
    for n in g.nodes:
        k = n.kernel
        if n.effect and k is not None and hasattr(k, "opt") and _fusable(k.opt):
            n = n.with_(op=f"fused_{n.op}", kernel=fused_adam_update(k.opt, k.group_index, k.params))
        nodes.append(n)
    return g.with_(nodes=tuple(nodes))
