"""``ASGD`` (averaged stochastic gradient descent), torch's single-tensor formulas."""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.tensor import Tensor
from ..ops import creation as C
from ._checks import check_hyper
from .optimizer import Optimizer, new_step, scalar_dtype, step_values

__all__ = ["ASGD"]


def _scalar_state(value: float) -> Tensor:
    """A scalar tensor of state (``eta``, ``mu``) of :func:`scalar_dtype`, as torch keeps them."""
    return Tensor._make(torch.tensor(value, dtype=scalar_dtype()))


class ASGD(Optimizer):
    """ASGD, as ``torch.optim.ASGD``: ``p = p * (1 - lambd * eta) - eta * g``, then the average
    ``ax += mu * (p - ax)`` (a copy of ``p`` while ``mu`` is 1, i.e. before step ``t0``); after
    the step ``eta = lr / (1 + lambd * lr * t) ** alpha`` and ``mu = 1 / max(1, t - t0)``.

    ``eta`` and ``mu`` are scalar tensors in the state (float32 unless the default dtype is
    float64), read as Python numbers each step (torch's non-capturable path), so the numbers
    round as torch's do on the CPU.
    """

    def __init__(self, params: Iterable, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75,
                 t0: float = 1e6, weight_decay: float = 0, foreach: bool | None = None,
                 maximize: bool = False, differentiable: bool = False, capturable: bool = False) -> None:
        check_hyper("ASGD", lr=lr, weight_decay=weight_decay)
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                        foreach=foreach, maximize=maximize, differentiable=differentiable,
                        capturable=capturable)
        super().__init__(params, defaults)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        return {"step": new_step(), "eta": _scalar_state(float(group["lr"])),
                "mu": _scalar_state(1.0), "ax": C.zeros_like(p)}

    def _update(self, V, group: dict, params: list, grads: list, states: list) -> None:
        lr, lambd, alpha, t0, wd = (float(group["lr"]), group["lambd"], group["alpha"], group["t0"],
                                    group["weight_decay"])
        ps, gs, axs = V.of(params), V.of(grads), V.of([st["ax"] for st in states])
        steps = step_values(states)
        if group["maximize"]:
            gs = V.neg(gs)
        if wd != 0:
            gs = V.add(gs, ps, alpha=wd)
        etas = [st["eta"].item() for st in states]
        V.mul_(ps, [1 - lambd * eta for eta in etas])   # the decay term
        V.add_(ps, gs, alpha=[-eta for eta in etas])
        mus = [st["mu"].item() for st in states]
        averaging = [i for i, mu in enumerate(mus) if mu != 1]
        copying = [i for i, mu in enumerate(mus) if mu == 1]
        if averaging:
            avg = [axs[i] for i in averaging]
            delta = V.sub([ps[i] for i in averaging], avg)
            V.mul_(delta, [mus[i] for i in averaging])
            V.add_(avg, delta)
        if copying:
            V.copy_([axs[i] for i in copying], [ps[i] for i in copying])
        for st, t in zip(states, steps):
            st["eta"].fill_(lr / ((1 + lambd * lr * t) ** alpha))
            st["mu"].fill_(1 / max(1, t - t0))
