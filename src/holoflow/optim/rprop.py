"""``Rprop`` (resilient backpropagation), torch's formulas."""
from __future__ import annotations

from typing import Iterable

from ..core.tensor import Tensor
from ..ops import creation as C
from ._checks import check_hyper
from .optimizer import Optimizer, new_step, step_values

__all__ = ["Rprop"]


class Rprop(Optimizer):
    """Rprop, as ``torch.optim.Rprop``: only the sign of the gradient is used. Each element's
    step size grows by ``etaplus`` while its gradient keeps its sign, shrinks by ``etaminus``
    when the sign flips (and that element skips the step, its remembered gradient set to 0),
    clamped to ``step_sizes``; ``p -= sign(g) * step_size``.
    """

    def __init__(self, params: Iterable, lr: float = 1e-2, etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50), *, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False, differentiable: bool = False) -> None:
        check_hyper("Rprop", lr=lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"holoflow.optim.Rprop: invalid eta values {etas[0]}, {etas[1]}; they "
                             f"must satisfy 0 < etaminus < 1 < etaplus")
        defaults = dict(lr=lr, etas=etas, step_sizes=step_sizes, foreach=foreach, maximize=maximize,
                        differentiable=differentiable, capturable=capturable)
        super().__init__(params, defaults)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        lr = float(group["lr"])
        # a complex parameter steps as two real numbers: both parts start at lr (as torch)
        size = C.full_like(p, complex(lr, lr) if p.is_complex() else lr)
        return {"step": new_step(), "prev": C.zeros_like(p), "step_size": size}

    def _update(self, V, group: dict, params: list, grads: list, states: list) -> None:
        (etaminus, etaplus), (lo, hi) = group["etas"], group["step_sizes"]
        ps, gs = V.of(params), V.of(grads)
        prevs, sizes = V.of([st["prev"] for st in states]), V.of([st["step_size"] for st in states])
        step_values(states)
        if group["maximize"]:
            gs = V.neg(gs)
        factors = V.mul(gs, prevs)      # the sign of g * prev becomes the step size's factor
        V.sign_(factors)
        V.masked_fill_(factors, V.gt(factors, 0), etaplus)
        V.masked_fill_(factors, V.lt(factors, 0), etaminus)
        V.masked_fill_(factors, V.eq(factors, 0), 1)
        V.mul_(sizes, factors)
        V.clamp_(sizes, lo, hi)
        gs = V.clone(gs)                # a sign flip: no step for that element, and no memory of it
        V.masked_fill_(gs, V.eq(factors, etaminus), 0)
        V.addcmul_(ps, V.sign(gs), sizes, -1)
        V.copy_(prevs, gs)
