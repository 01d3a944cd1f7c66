"""``Adam`` and ``AdamW`` (amsgrad, weight decay, maximize), with torch's bias corrections."""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.tensor import Tensor
from ..ops import creation as C
from ..ops import elementwise as E
from .optimizer import Optimizer, new_step, step_values, storages

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    """Adam, as ``torch.optim.Adam``; ``decoupled_weight_decay=True`` is AdamW.

    ``m = lerp(m, g, 1 - b1)``, ``v = b2 * v + (1 - b2) * g * g``,
    ``p -= lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)``.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False) -> None:
        name = type(self).__name__
        if lr < 0.0:
            raise ValueError(f"holoflow.optim.{name}: invalid learning rate {lr}")
        if eps < 0.0:
            raise ValueError(f"holoflow.optim.{name}: invalid epsilon {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"holoflow.optim.{name}: invalid betas {betas}")
        if weight_decay < 0.0:
            raise ValueError(f"holoflow.optim.{name}: invalid weight_decay {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        st = {"step": new_step(), "exp_avg": C.zeros_like(p), "exp_avg_sq": C.zeros_like(p)}
        if group["amsgrad"]:
            st["max_exp_avg_sq"] = C.zeros_like(p)
        return st

    def _step_foreach(self, group: dict, params: list, grads: list, states: list) -> None:
        (b1, b2), lr, wd, eps = group["betas"], float(group["lr"]), group["weight_decay"], group["eps"]
        ps, gs = storages(params), storages(grads)
        ms = [st["exp_avg"]._data for st in states]
        vs = [st["exp_avg_sq"]._data for st in states]
        steps = step_values([st["step"]._data for st in states])
        if group["maximize"]:
            gs = torch._foreach_neg(gs)
        if wd != 0:
            if group["decoupled_weight_decay"]:
                torch._foreach_mul_(ps, 1 - lr * wd)
            else:
                gs = torch._foreach_add(gs, ps, alpha=wd)
        torch._foreach_lerp_(ms, gs, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, 1 - b2)
        if group["amsgrad"]:
            maxes = [st["max_exp_avg_sq"]._data for st in states]
            torch._foreach_maximum_(maxes, vs)
            vs = maxes
        step_size = [-(lr / (1 - b1 ** t)) for t in steps]
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, [(1 - b2 ** t) ** 0.5 for t in steps])
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(ps, ms, denom, step_size)

    def _step_ops(self, group: dict, params: list, grads: list, states: list) -> None:
        (b1, b2), lr, wd, eps = group["betas"], float(group["lr"]), group["weight_decay"], group["eps"]
        for p, g, st in zip(params, grads, states):
            st["step"].add_(1)
            t = st["step"].item()
            if group["maximize"]:
                g = -g
            if wd != 0:
                if group["decoupled_weight_decay"]:
                    p.mul_(1 - lr * wd)
                else:
                    g = g.add(p, alpha=wd)
            m, v = st["exp_avg"], st["exp_avg_sq"]
            m.add_(g - m, alpha=1 - b1)
            v.mul_(b2).add_(g * g, alpha=1 - b2)
            if group["amsgrad"]:
                v = st["max_exp_avg_sq"] = E.maximum(st["max_exp_avg_sq"], v)
            denom = (v.sqrt() / (1 - b2 ** t) ** 0.5).add_(eps)
            p.add_(m / denom, alpha=-(lr / (1 - b1 ** t)))


class AdamW(Adam):
    """Adam with decoupled weight decay (``p *= 1 - lr * wd`` before the update), as torch."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True)
