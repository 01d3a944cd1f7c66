"""``RMSprop`` (alpha, centered, momentum, weight decay, maximize), torch's formulas."""
from __future__ import annotations

from typing import Iterable

from ..core.tensor import Tensor
from ..ops import creation as C
from .optimizer import Optimizer, new_step, step_values

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

    def _update(self, V, group: dict, params: list, grads: list, states: list) -> None:
        lr, a, eps, wd, mom = (float(group["lr"]), group["alpha"], group["eps"],
                               group["weight_decay"], group["momentum"])
        ps, gs = V.of(params), V.of(grads)
        step_values(states)
        if group["maximize"]:
            gs = V.neg(gs)
        if wd != 0:
            gs = V.add(gs, ps, alpha=wd)
        vs = V.of([st["square_avg"] for st in states])
        V.mul_(vs, a)
        V.addcmul_(vs, gs, gs, 1 - a)
        if group["centered"]:
            mg = V.of([st["grad_avg"] for st in states])
            V.lerp_(mg, gs, 1 - a)
            avg = V.addcmul(vs, mg, mg, -1)
            V.sqrt_(avg)
        else:
            avg = V.sqrt(vs)
        V.add_(avg, eps)
        if mom > 0:
            bufs = V.of([st["momentum_buffer"] for st in states])
            V.mul_(bufs, mom)
            V.addcdiv_(bufs, gs, avg)
            V.add_(ps, bufs, alpha=-lr)
        else:
            V.addcdiv_(ps, gs, avg, -lr)
