"""``RMSprop`` (alpha, centered, momentum, weight decay, maximize), torch's formulas."""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.tensor import Tensor
from ..ops import creation as C
from .optimizer import Optimizer, new_step, step_values, storages

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """RMSprop, as ``torch.optim.RMSprop``: ``v = a*v + (1-a)*g*g``; ``avg = sqrt(v - mean_g**2
    if centered else v) + eps``; ``p -= lr * g / avg`` (through a momentum buffer if momentum > 0).
    """

    def __init__(self, params: Iterable, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False,
                 capturable: bool = False, foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        for name, val in (("learning rate", lr), ("epsilon", eps), ("momentum", momentum),
                          ("weight_decay", weight_decay), ("alpha", alpha)):
            if val < 0.0:
                raise ValueError(f"holoflow.optim.RMSprop: invalid {name} {val}")
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, capturable=capturable, foreach=foreach,
                        maximize=maximize, differentiable=differentiable)
        super().__init__(params, defaults)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        st = {"step": new_step(), "square_avg": C.zeros_like(p)}
        if group["momentum"] > 0:
            st["momentum_buffer"] = C.zeros_like(p)
        if group["centered"]:
            st["grad_avg"] = C.zeros_like(p)
        return st

    def _step_foreach(self, group: dict, params: list, grads: list, states: list) -> None:
        lr, a, eps, wd, mom = (float(group["lr"]), group["alpha"], group["eps"],
                               group["weight_decay"], group["momentum"])
        ps, gs = storages(params), storages(grads)
        step_values([st["step"]._data for st in states])
        if group["maximize"]:
            gs = torch._foreach_neg(gs)
        if wd != 0:
            gs = torch._foreach_add(gs, ps, alpha=wd)
        vs = [st["square_avg"]._data for st in states]
        torch._foreach_mul_(vs, a)
        torch._foreach_addcmul_(vs, gs, gs, value=1 - a)
        if group["centered"]:
            mg = [st["grad_avg"]._data for st in states]
            torch._foreach_lerp_(mg, gs, 1 - a)
            avg = torch._foreach_addcmul(vs, mg, mg, value=-1)
            torch._foreach_sqrt_(avg)
        else:
            avg = torch._foreach_sqrt(vs)
        torch._foreach_add_(avg, eps)
        if mom > 0:
            bufs = [st["momentum_buffer"]._data for st in states]
            torch._foreach_mul_(bufs, mom)
            torch._foreach_addcdiv_(bufs, gs, avg)
            torch._foreach_add_(ps, bufs, alpha=-lr)
        else:
            torch._foreach_addcdiv_(ps, gs, avg, value=-lr)

    def _step_ops(self, group: dict, params: list, grads: list, states: list) -> None:
        lr, a, eps, wd, mom = (float(group["lr"]), group["alpha"], group["eps"],
                               group["weight_decay"], group["momentum"])
        for p, g, st in zip(params, grads, states):
            st["step"].add_(1)
            if group["maximize"]:
                g = -g
            if wd != 0:
                g = g.add(p, alpha=wd)
            v = st["square_avg"].mul_(a).add_(g * g, alpha=1 - a)
            if group["centered"]:
                mg = st["grad_avg"]
                mg.add_(g - mg, alpha=1 - a)
                avg = (v - mg * mg).sqrt()
            else:
                avg = v.sqrt()
            avg = avg.add_(eps)
            if mom > 0:
                buf = st["momentum_buffer"].mul_(mom).add_(g / avg)
                p.add_(buf, alpha=-lr)
            else:
                p.add_(g / avg, alpha=-lr)
