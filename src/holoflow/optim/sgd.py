"""``SGD`` with momentum, dampening, Nesterov, weight decay and maximize (torch's formulas)."""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.tensor import Tensor
from .optimizer import Optimizer, required, storages

__all__ = ["SGD"]


class SGD(Optimizer):
    """Stochastic gradient descent, as ``torch.optim.SGD``.

    With momentum ``m`` and dampening ``d``: ``buf = m * buf + (1 - d) * g`` (``buf = g`` on the
    first step), then ``p -= lr * (g + m * buf if nesterov else buf)``.
    """

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

    def _step_foreach(self, group: dict, params: list, grads: list, states: list) -> None:
        ps, gs = storages(params), storages(grads)
        lr, wd, mom = float(group["lr"]), group["weight_decay"], group["momentum"]
        if group["maximize"]:
            gs = torch._foreach_neg(gs)
        if wd != 0:
            gs = torch._foreach_add(gs, ps, alpha=wd)
        if mom != 0:
            bufs, old = [], []
            for st, g in zip(states, gs):
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = Tensor._make(g.detach().clone())
                    bufs.append(None)
                else:
                    old.append(st["momentum_buffer"]._data)
                    bufs.append(old[-1])
            if old:
                new_g = [g for b, g in zip(bufs, gs) if b is not None]
                torch._foreach_mul_(old, mom)
                torch._foreach_add_(old, new_g, alpha=1 - group["dampening"])
            bufs = [st["momentum_buffer"]._data for st in states]
            gs = torch._foreach_add(gs, bufs, alpha=mom) if group["nesterov"] else bufs
        torch._foreach_add_(ps, gs, alpha=-lr)

    def _step_ops(self, group: dict, params: list, grads: list, states: list) -> None:
        lr, wd, mom = float(group["lr"]), group["weight_decay"], group["momentum"]
        for p, g, st in zip(params, grads, states):
            if group["maximize"]:
                g = -g
            if wd != 0:
                g = g.add(p, alpha=wd)
            if mom != 0:
                buf = st.get("momentum_buffer")
                if buf is None:
                    buf = st["momentum_buffer"] = g.detach().clone()
                else:
                    buf.mul_(mom).add_(g, alpha=1 - group["dampening"])
                g = g.add(buf, alpha=mom) if group["nesterov"] else buf
            p.add_(g, alpha=-lr)
