"""``SGD`` with momentum, dampening, Nesterov, weight decay and maximize (torch's formulas)."""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.tensor import Tensor
from ..ops import creation as C
from .optimizer import Optimizer, required

__all__ = ["SGD"]


def _fused_sgd(group: dict, params: list, grads: list, states: list) -> None:
    """SGD's update as ``torch._fused_sgd_`` (a lowering of :meth:`SGD._update`: torch's kernel,
    the same hyper-parameters). Parameters without a momentum buffer yet take their gradient as
    the buffer (torch's first step), in a call of their own when others already have one."""
    mom = group["momentum"]
    kw = dict(weight_decay=group["weight_decay"], momentum=mom, lr=float(group["lr"]),
              dampening=group["dampening"], nesterov=group["nesterov"], maximize=group["maximize"])
    ps, gs = [p._data for p in params], [g._data.contiguous() for g in grads]
    if mom == 0:
        torch._fused_sgd_(ps, gs, [], is_first_step=False, **kw)
        return
    fresh = [i for i, st in enumerate(states) if "momentum_buffer" not in st]
    old = [i for i, st in enumerate(states) if "momentum_buffer" in st]
    for i in fresh:   # (a global gradient's buffer is global too: its shard is what the kernel fills)
        g = grads[i]
        states[i]["momentum_buffer"] = C.zeros_like(g) if g._global is not None else \
            Tensor._make(torch.empty_like(gs[i]))
    for first, idx in ((True, fresh), (False, old)):
        if idx:
            torch._fused_sgd_([ps[i] for i in idx], [gs[i] for i in idx],
                              [states[i]["momentum_buffer"]._data for i in idx], is_first_step=first, **kw)


class SGD(Optimizer):
    """Stochastic gradient descent, as ``torch.optim.SGD``.

    With momentum ``m`` and dampening ``d``: ``buf = m * buf + (1 - d) * g`` (``buf = g`` on the
    first step), then ``p -= lr * (g + m * buf if nesterov else buf)``.
    """

    fused_update = staticmethod(_fused_sgd) if hasattr(torch, "_fused_sgd_") else None

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        if lr is not required and lr < 0.0:
            raise ValueError(f"holoflow.optim.SGD: invalid learning rate {lr}")
        if momentum < 0.0:
            raise ValueError(f"holoflow.optim.SGD: invalid momentum {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"holoflow.optim.SGD: invalid weight_decay {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("holoflow.optim.SGD: nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach,
                        differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)

    def _state_of(self, p: Tensor, group: dict) -> dict:
        # torch keeps no SGD state without momentum, and creates the buffer on the first step
        return self.state[p] if group["momentum"] != 0 else {}

    def _update(self, V, group: dict, params: list, grads: list, states: list) -> None:
        ps, gs = V.of(params), V.of(grads)
        lr, wd, mom = float(group["lr"]), group["weight_decay"], group["momentum"]
        if group["maximize"]:
            gs = V.neg(gs)
        if wd != 0:
            gs = V.add(gs, ps, alpha=wd)
        if mom != 0:
            fresh = [i for i, st in enumerate(states) if "momentum_buffer" not in st]
            old = [i for i, st in enumerate(states) if "momentum_buffer" in st]
            if old:  # torch's first step takes the gradient itself as the buffer
                bufs = V.of([states[i]["momentum_buffer"] for i in old])
                V.mul_(bufs, mom)
                V.add_(bufs, [gs[i] for i in old], alpha=1 - group["dampening"])
            for i, b in zip(fresh, V.clone([gs[i] for i in fresh])):
                states[i]["momentum_buffer"] = V.tensor(b)
            bufs = V.of([st["momentum_buffer"] for st in states])
            gs = V.add(gs, bufs, alpha=mom) if group["nesterov"] else bufs
        V.add_(ps, gs, alpha=-lr)
