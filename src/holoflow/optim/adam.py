"""``Adam`` and ``AdamW`` (amsgrad, weight decay, maximize), with torch's bias corrections."""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.tensor import Tensor
from ..ops import creation as C
from .optimizer import Optimizer, advance_steps, new_step, step_values

__all__ = ["Adam", "AdamW"]


def _fused_adam(group: dict, params: list, grads: list, states: list) -> None:
    """Adam's update as one ``torch._fused_adam_`` / ``_fused_adamw_`` call (a lowering of
    :meth:`Adam._update`: torch's kernel, the same hyper-parameters)."""
    steps = advance_steps(states, params[0]._data.device)   # (fused kernels want them on the params' device)
    b1, b2 = group["betas"]
    kernel = torch._fused_adamw_ if group["decoupled_weight_decay"] else torch._fused_adam_
    kernel([p._data for p in params], [g._data.contiguous() for g in grads],
           [st["exp_avg"]._data for st in states], [st["exp_avg_sq"]._data for st in states],
           [st["max_exp_avg_sq"]._data for st in states] if group["amsgrad"] else [],
           steps, lr=float(group["lr"]), beta1=b1, beta2=b2, weight_decay=group["weight_decay"],
           eps=group["eps"], amsgrad=group["amsgrad"], maximize=group["maximize"])


class Adam(Optimizer):
    """Adam, as ``torch.optim.Adam``; ``decoupled_weight_decay=True`` is AdamW.

    ``m = lerp(m, g, 1 - b1)``, ``v = b2 * v + (1 - b2) * g * g``,
    ``p -= lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)``.
    """

    fused_update = staticmethod(_fused_adam) if hasattr(torch, "_fused_adam_") else None

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
        st = {"step": new_step(bool(group["fused"])), "exp_avg": C.zeros_like(p), "exp_avg_sq": C.zeros_like(p)}
        if group["amsgrad"]:
            st["max_exp_avg_sq"] = C.zeros_like(p)
        return st

    def _update(self, V, group: dict, params: list, grads: list, states: list) -> None:
        (b1, b2), lr, wd, eps = group["betas"], float(group["lr"]), group["weight_decay"], group["eps"]
        ps, gs = V.of(params), V.of(grads)
        ms, vs = V.of([st["exp_avg"] for st in states]), V.of([st["exp_avg_sq"] for st in states])
        steps = step_values(states)
        if group["maximize"]:
            gs = V.neg(gs)
        if wd != 0:
            if group["decoupled_weight_decay"]:
                V.mul_(ps, 1 - lr * wd)
            else:
                gs = V.add(gs, ps, alpha=wd)
        V.lerp_(ms, gs, 1 - b1)
        V.mul_(vs, b2)
        V.addcmul_(vs, gs, gs, 1 - b2)
        if group["amsgrad"]:
            maxes = V.of([st["max_exp_avg_sq"] for st in states])
            V.maximum_(maxes, vs)
            vs = maxes
        denom = V.sqrt(vs)
        V.div_(denom, [(1 - b2 ** t) ** 0.5 for t in steps])
        V.add_(denom, eps)
        V.addcdiv_(ps, ms, denom, [-(lr / (1 - b1 ** t)) for t in steps])


class AdamW(Adam):
    """Adam with decoupled weight decay (``p *= 1 - lr * wd`` before the update), as torch."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True)
