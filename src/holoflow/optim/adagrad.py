"""``Adagrad`` (lr_decay, initial_accumulator_value, weight decay, maximize), torch's formulas."""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.tensor import Tensor
from ..ops import creation as C
from .optimizer import Optimizer, advance_steps, new_step, step_values

__all__ = ["Adagrad"]


def _fused_adagrad(group: dict, params: list, grads: list, states: list) -> None:
    """Adagrad's update as one ``torch._fused_adagrad_`` call (a lowering of
    :meth:`Adagrad._update`: torch's kernel, the same hyper-parameters)."""
    steps = advance_steps(states, params[0]._data.device)
    torch._fused_adagrad_([p._data for p in params], [g._data.contiguous() for g in grads],
                          [st["sum"]._data for st in states], steps, lr=float(group["lr"]),
                          lr_decay=group["lr_decay"], weight_decay=group["weight_decay"], eps=group["eps"],
                          maximize=group["maximize"])


class Adagrad(Optimizer):
    """Adagrad, as ``torch.optim.Adagrad``: ``s += g*g``; ``p -= clr * g / (sqrt(s) + eps)`` with
    ``clr = lr / (1 + (t - 1) * lr_decay)``. State is created for every parameter up front.
    ``fused=True`` runs torch's fused kernel (``torch._fused_adagrad_``, CPU as torch's)."""

    fused_update = staticmethod(_fused_adagrad) if hasattr(torch, "_fused_adagrad_") else None

    def __init__(self, params: Iterable, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, foreach: bool | None = None,
                 *, maximize: bool = False, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        if fused and differentiable:
            raise RuntimeError("holoflow.optim.Adagrad: `fused` does not support `differentiable` (as torch)")
        for name, val in (("learning rate", lr), ("lr_decay", lr_decay), ("weight_decay", weight_decay),
                          ("initial_accumulator_value", initial_accumulator_value), ("epsilon", eps)):
            if val < 0.0:
                raise ValueError(f"holoflow.optim.Adagrad: invalid {name} {val}")
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self._state_of(p, group)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        return {"step": new_step(bool(group["fused"])), "sum": C.full_like(p, group["initial_accumulator_value"])}

    def _update(self, V, group: dict, params: list, grads: list, states: list) -> None:
        lr, wd, decay, eps = float(group["lr"]), group["weight_decay"], group["lr_decay"], group["eps"]
        ps, gs = V.of(params), V.of(grads)
        steps = step_values(states)
        if group["maximize"]:
            gs = V.neg(gs)
        if wd != 0:
            gs = V.add(gs, ps, alpha=wd)
        sums = V.of([st["sum"] for st in states])
        V.addcmul_(sums, gs, gs, 1)
        std = V.sqrt(sums)
        V.add_(std, eps)
        V.addcdiv_(ps, gs, std, [-(lr / (1 + (t - 1) * decay)) for t in steps])
