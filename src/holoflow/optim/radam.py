"""``RAdam`` (rectified Adam; decoupled weight decay optional), torch's single-tensor formulas."""
from __future__ import annotations

from typing import Iterable

from ..core.tensor import Tensor
from ..ops import creation as C
from ._checks import check_betas, check_hyper
from .optimizer import Optimizer, new_step

__all__ = ["RAdam"]


class RAdam(Optimizer):
    """RAdam, as ``torch.optim.RAdam``: Adam's moments; while the approximated SMA length
    ``rho_t`` is at most 5 the step is plain momentum ``lr * m / (1 - b1**t)``, after that it is
    scaled by the adaptive term and the variance rectification.

    One path (holoflow ops) serves local, global and traced parameters."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        check_hyper("RAdam", lr=lr, eps=eps, weight_decay=weight_decay)
        check_betas("RAdam", betas)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize,
                        foreach=foreach, capturable=capturable,
                        decoupled_weight_decay=decoupled_weight_decay, differentiable=differentiable)
        super().__init__(params, defaults)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        return {"step": new_step(), "exp_avg": C.zeros_like(p), "exp_avg_sq": C.zeros_like(p)}

    def _step_ops(self, group: dict, params: list, grads: list, states: list) -> None:
        (b1, b2), lr, eps, wd = group["betas"], float(group["lr"]), group["eps"], group["weight_decay"]
        rho_inf = 2 / (1 - b2) - 1
        for p, g, st in zip(params, grads, states):
            g = -g if group["maximize"] else g
            st["step"].add_(1)
            t = st["step"].item()
            if wd != 0:
                if group["decoupled_weight_decay"]:
                    p.mul_(1 - lr * wd)
                else:
                    g = g.add(p, alpha=wd)
            m, v = st["exp_avg"], st["exp_avg_sq"]
            m.add_(g - m, alpha=1 - b1)
            v.mul_(b2).add_(g * g, alpha=1 - b2)
            bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
            corrected = m / bc1
            rho_t = rho_inf - 2 * t * (b2 ** t) / bc2
            if rho_t > 5.0:
                rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
                adaptive = (bc2 ** 0.5) / v.sqrt().add_(eps)
                p.add_(corrected * lr * adaptive * rect, alpha=-1.0)
            else:
                p.add_(corrected * lr, alpha=-1.0)

    _step_foreach = _step_ops
