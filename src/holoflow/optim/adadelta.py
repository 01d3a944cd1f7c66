"""``Adadelta`` (rho, weight decay, maximize), torch's single-tensor formulas."""
from __future__ import annotations

from typing import Iterable

from ..core.tensor import Tensor
from ..ops import creation as C
from ._checks import check_hyper
from .optimizer import Optimizer, new_step

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    """Adadelta, as ``torch.optim.Adadelta``: ``v = rho*v + (1-rho)*g*g``,
    ``d = sqrt(u + eps) / sqrt(v + eps) * g``, ``u = rho*u + (1-rho)*d*d``, ``p -= lr * d``.

    One path (holoflow ops) serves local, global and traced parameters."""

    def __init__(self, params: Iterable, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, foreach: bool | None = None, *, capturable: bool = False,
                 maximize: bool = False, differentiable: bool = False) -> None:
        check_hyper("Adadelta", lr=lr, eps=eps, weight_decay=weight_decay)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"holoflow.optim.Adadelta: invalid rho {rho}; it must lie in [0, 1]")
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize,
                        capturable=capturable, foreach=foreach, differentiable=differentiable)
        super().__init__(params, defaults)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        return {"step": new_step(), "square_avg": C.zeros_like(p), "acc_delta": C.zeros_like(p)}

    def _step_ops(self, group: dict, params: list, grads: list, states: list) -> None:
        lr, rho, eps, wd = float(group["lr"]), group["rho"], group["eps"], group["weight_decay"]
        for p, g, st in zip(params, grads, states):
            st["step"].add_(1)
            g = -g if group["maximize"] else g
            if wd != 0:
                g = g.add(p, alpha=wd)
            v, u = st["square_avg"], st["acc_delta"]
            v.mul_(rho).add_(g * g, alpha=1 - rho)
            std = v.add(eps).sqrt_()
            delta = u.add(eps).sqrt_().div_(std).mul_(g)
            u.mul_(rho).add_(delta * delta, alpha=1 - rho)
            p.add_(delta, alpha=-lr)

    _step_foreach = _step_ops
