"""``NAdam`` (Nesterov Adam with momentum decay; decoupled weight decay optional), torch's formulas."""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.tensor import Tensor
from ..ops import creation as C
from ._checks import check_betas, check_hyper
from .optimizer import Optimizer, new_step, scalar_dtype

__all__ = ["NAdam"]


class NAdam(Optimizer):
    """NAdam, as ``torch.optim.NAdam``. ``mu_t = b1 * (1 - 0.5 * 0.96**(t * momentum_decay))``;
    the running product of the ``mu_t`` is a scalar in the state (``mu_product``, float32 unless
    the default dtype is float64), as torch keeps it, so the step sizes round as torch's do.

    One path (holoflow ops) serves local, global and traced parameters."""

    def __init__(self, params: Iterable, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False) -> None:
        check_hyper("NAdam", lr=lr, eps=eps, weight_decay=weight_decay, momentum_decay=momentum_decay)
        check_betas("NAdam", betas)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        differentiable=differentiable)
        super().__init__(params, defaults)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        return {"step": new_step(), "mu_product": Tensor._make(torch.ones((), dtype=scalar_dtype())),
                "exp_avg": C.zeros_like(p), "exp_avg_sq": C.zeros_like(p)}

    def _step_ops(self, group: dict, params: list, grads: list, states: list) -> None:
        (b1, b2), lr, eps, wd = group["betas"], float(group["lr"]), group["eps"], group["weight_decay"]
        decay = group["momentum_decay"]
        for p, g, st in zip(params, grads, states):
            g = -g if group["maximize"] else g
            st["step"].add_(1)
            t = st["step"].item()
            if wd != 0:
                if group["decoupled_weight_decay"]:
                    p.mul_(1 - lr * wd)
                else:
                    g = g.add(p, alpha=wd)
            mu = b1 * (1.0 - 0.5 * (0.96 ** (t * decay)))
            mu_next = b1 * (1.0 - 0.5 * (0.96 ** ((t + 1) * decay)))
            mu_product = st["mu_product"].mul_(mu).item()
            m, v = st["exp_avg"], st["exp_avg_sq"]
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = v.div(1 - b2 ** t).sqrt().add_(eps)
            p.addcdiv_(g, denom, value=-lr * (1.0 - mu) / (1.0 - mu_product))
            p.addcdiv_(m, denom, value=(-lr * mu_next) / (1.0 - mu_product * mu_next))

    _step_foreach = _step_ops
