"""``Adamax`` (the infinity-norm Adam variant), torch's single-tensor formulas."""
from __future__ import annotations

from typing import Iterable

from ..core.tensor import Tensor
from ..ops import creation as C
from ..ops import elementwise as E
from ._checks import check_betas, check_hyper
from .optimizer import Optimizer, new_step

__all__ = ["Adamax"]


class Adamax(Optimizer):
    """Adamax, as ``torch.optim.Adamax``: ``m = lerp(m, g, 1-b1)``,
    ``u = max(b2*u, |g| + eps)``, ``p -= lr / (1 - b1**t) * m / u``.

    One path (holoflow ops) serves local, global and traced parameters."""

    def __init__(self, params: Iterable, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False, capturable: bool = False) -> None:
        check_hyper("Adamax", lr=lr, eps=eps, weight_decay=weight_decay)
        check_betas("Adamax", betas)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, capturable=capturable)
        super().__init__(params, defaults)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        return {"step": new_step(), "exp_avg": C.zeros_like(p), "exp_inf": C.zeros_like(p)}

    def _step_ops(self, group: dict, params: list, grads: list, states: list) -> None:
        (b1, b2), lr, eps, wd = group["betas"], float(group["lr"]), group["eps"], group["weight_decay"]
        for p, g, st in zip(params, grads, states):
            g = -g if group["maximize"] else g
            st["step"].add_(1)
            t = st["step"].item()
            if wd != 0:
                g = g.add(p, alpha=wd)
            m, u = st["exp_avg"], st["exp_inf"]
            m.lerp_(g, 1 - b1)
            u.copy_(E.maximum(u.mul_(b2), g.abs().add_(eps)))   # (torch: maximum(..., out=exp_inf))
            p.addcdiv_(m, u, value=-(lr / (1 - b1 ** t)))

    _step_foreach = _step_ops
