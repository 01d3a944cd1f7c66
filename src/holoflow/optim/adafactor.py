"""``Adafactor`` (torch 2.13's ``torch.optim.Adafactor``): factored second moments, relative
step sizes and update clipping, with torch's formulas, defaults, errors and state layout.

Unlike the elementwise rules of optim/lowering.py, Adafactor reads whole tensors (the
parameter's and the update's RMS, row and column means of the squared gradient), so its rule is
written per parameter in Tensor methods that torch and holoflow tensors share (:func:`_one`):
local eager steps run it on the torch storages (torch's own kernels, in torch's order), global
parameters run it on the holoflow tensors, so each reduction sees the logical tensor.
``foreach=True`` runs torch's multi-tensor variant on local storages (:func:`_foreach`): its
alphas round differently, as torch's do; by default torch, and holoflow, take the loop.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from ..core.sbp import B, split
from ..core.tensor import Tensor
from ..ops import creation as C
from ._checks import refuse_shards, scalar, whole_pieces
from .optimizer import Optimizer, new_step, step_values

__all__ = ["Adafactor"]


def _factor_zeros(p: Tensor, shape: list[int]) -> Tensor:
    """Zeros of ``shape`` (``p``'s with dim -1 or -2 reduced to 1) laid out like ``p``: a split
    of the reduced dim becomes broadcast, since one row cannot be cut."""
    g = p._global
    if g is None:
        return Tensor._make(torch.zeros(shape, dtype=p._data.dtype, device=p._data.device))
    nd = tuple(s if isinstance(s, split) and shape[s.axis] != 1 else B for s in g.sbp)
    return C.zeros(*shape, dtype=p.dtype, placement=g.placement, sbp=nd)


def _one(param: Any, grad: Any, row_var: Any, col_var: Any, variance: Any, step: float, *, lr: float,
         d: float, beta2_decay: float, weight_decay: float, eps1: float, eps2: float) -> None:
    """torch's ``_single_tensor_adafactor`` for one parameter; the tensors are torch storages or
    holoflow tensors alike (the same method names and arguments)."""
    one_minus_beta2_t = step ** beta2_decay
    rho_t = min(lr, 1 / (step ** 0.5))
    alpha = max(eps2, param.norm(2).item() / (param.numel() ** 0.5)) * rho_t
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    if grad.dim() > 1:
        # (g * g).mean(dim) without a gradient-sized intermediate, as torch
        row_var.lerp_(grad.norm(dim=-1, keepdim=True).square_().div_(grad.size(-1)), one_minus_beta2_t)
        col_var.lerp_(grad.norm(dim=-2, keepdim=True).square_().div_(grad.size(-2)), one_minus_beta2_t)
        var_estimate = row_var @ col_var
        var_estimate.div_(row_var.mean(dim=-2, keepdim=True).clamp_(min=eps1))
    else:
        variance.lerp_(grad * grad, one_minus_beta2_t)
        var_estimate = variance.clone()   # the update must not write into the state
    update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()   # eps1 squared: a sqrt follows
    update.mul_(grad)
    denom = max(1.0, update.norm(2).item() / ((update.numel() ** 0.5) * d))
    param.add_(update, alpha=-alpha / denom)


def _foreach(params: list, grads: list, states: list, steps: list[float], *, lr: float, d: float,
             beta2_decay: float, weight_decay: float, eps1: float | None, eps2: float) -> None:
    """torch's ``_multi_tensor_adafactor`` on torch storages: per (device, dtype, factored)
    group, ``torch._foreach_*`` calls in torch's order."""
    groups: dict = {}
    for i, (p, g) in enumerate(zip(params, grads)):
        groups.setdefault((p.device, p.dtype, g.dim() > 1), []).append(i)
    for (_, dtype, factored), idx in groups.items():
        ps, gs = [params[i] for i in idx], [grads[i] for i in idx]
        if eps1 is None:   # (torch fixes it from the first group's dtype)
            eps1 = torch.finfo(dtype).eps
        betas = [steps[i] ** beta2_decay for i in idx]
        alphas = [max(eps2, p.norm(2).item() / (p.numel() ** 0.5)) * min(lr, 1 / (steps[i] ** 0.5))
                  for p, i in zip(ps, idx)]
        if weight_decay != 0:
            torch._foreach_mul_(ps, 1 - lr * weight_decay)
        if factored:
            rows = [states[i]["row_var"]._data for i in idx]
            cols = [states[i]["col_var"]._data for i in idx]
            for state_vars, dim in ((rows, -1), (cols, -2)):
                means = [g.norm(dim=dim, keepdim=True) for g in gs]
                torch._foreach_mul_(means, means)
                torch._foreach_div_(means, [g.size(dim) for g in gs])
                torch._foreach_lerp_(state_vars, means, betas)
            updates = [r @ c for r, c in zip(rows, cols)]
            row_means = [r.mean(dim=-2, keepdim=True) for r in rows]
            torch._foreach_clamp_min_(row_means, eps1)
            torch._foreach_div_(updates, row_means)
        else:
            variances = [states[i]["variance"]._data for i in idx]
            torch._foreach_lerp_(variances, torch._foreach_mul(gs, gs), betas)
            updates = [v.clone() for v in variances]
        torch._foreach_clamp_min_(updates, eps1 * eps1)
        torch._foreach_rsqrt_(updates)
        torch._foreach_mul_(updates, gs)
        alphas = [-a / max(1.0, u.norm(2).item() / ((u.numel() ** 0.5) * d)) for a, u in zip(alphas, updates)]
        torch._foreach_mul_(updates, alphas)
        torch._foreach_add_(ps, updates)


class Adafactor(Optimizer):
    """Adafactor, as ``torch.optim.Adafactor`` (lr 1e-2, beta2_decay -0.8, eps (None, 1e-3),
    d 1.0, weight_decay 0.0).

    Per step t: ``beta2_t = 1 - t**beta2_decay``, ``rho = min(lr, 1/sqrt(t))``,
    ``alpha = max(eps2, RMS(p)) * rho``; ``p *= 1 - lr * weight_decay``; a parameter of two or
    more dims keeps row and column means of ``g * g`` (its last two dims), others a full
    ``variance``; ``u = g / max(sqrt(V), eps1)`` and ``p -= alpha * u / max(1, RMS(u) / d)``.
    ``eps1=None`` is the parameter dtype's machine epsilon.
    """

    def __init__(self, params: Iterable, lr: float | Tensor = 1e-2, beta2_decay: float = -0.8,
                 eps: tuple[float | None, float] = (None, 1e-3), d: float = 1.0, weight_decay: float = 0.0, *,
                 foreach: bool | None = None, maximize: bool = False) -> None:
        name = "holoflow.optim.Adafactor"
        if isinstance(lr, (Tensor, torch.Tensor)) and lr.numel() != 1:
            raise ValueError(f"{name}: Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"{name}: Learning rate should be >= 0 but is: {lr}")
        if not 0.0 >= beta2_decay:
            raise ValueError(f"{name}: beta2_decay should be <= 0 but is: {beta2_decay}")
        if eps[0] is not None and not 0.0 <= eps[0]:
            raise ValueError(f"{name}: epsilon1 should be >= 0 (or None) but is: {eps[0]}")
        if not 0.0 <= eps[1]:
            raise ValueError(f"{name}: epsilon2 should be >= 0 but is: {eps[1]}")
        if not 1.0 <= d:
            raise ValueError(f"{name}: Clipping threshold d should be >= 1 but is: {d}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"{name}: weight_decay should be >= 0 but is: {weight_decay}")
        defaults = dict(lr=lr, beta2_decay=beta2_decay, eps=eps, d=d, weight_decay=weight_decay,
                        foreach=foreach, maximize=maximize)
        super().__init__(params, defaults)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        if p.is_complex():
            raise RuntimeError("holoflow.optim.Adafactor: Adafactor does not support complex parameters; "
                               "optimize a real view (torch.view_as_real) or use Adam")
        st = {"step": new_step()}
        if p.dim() > 1:
            shape = list(p.shape)
            st["row_var"] = _factor_zeros(p, shape[:-1] + [1])
            st["col_var"] = _factor_zeros(p, shape[:-2] + [1, shape[-1]])
        else:
            st["variance"] = C.zeros_like(p)
        return st

    def _options(self, group: dict) -> dict:
        return dict(lr=scalar(group["lr"]), d=group["d"], beta2_decay=group["beta2_decay"],
                    weight_decay=group["weight_decay"], eps2=group["eps"][1])

    def _loop(self, group: dict, params: list, grads: list, states: list, storages: bool) -> None:
        """torch's single-tensor loop, on torch storages or on holoflow tensors."""
        steps = step_values(states)
        eps1 = group["eps"][0]
        get = (lambda t: None if t is None else t._data) if storages else (lambda t: t)
        for p, g, st, t in zip(params, grads, states, steps):
            if eps1 is None:   # (torch fixes it from the first parameter's dtype)
                eps1 = torch.finfo(p._data.dtype).eps
            g = -get(g) if group["maximize"] else get(g)
            _one(get(p), g, get(st.get("row_var")), get(st.get("col_var")), get(st.get("variance")), t,
                 eps1=eps1, **self._options(group))

    def _step_foreach(self, group: dict, params: list, grads: list, states: list) -> None:
        refuse_shards(self, group, params, grads, eager_foreach=True)
        if not group["foreach"]:
            self._loop(group, params, grads, states, storages=True)
            return
        gs = [g._data for g in grads]
        if group["maximize"]:
            gs = torch._foreach_neg(gs)
        _foreach([p._data for p in params], gs, states, step_values(states), eps1=group["eps"][0],
                 **self._options(group))

    def _step_ops(self, group: dict, params: list, grads: list, states: list) -> None:
        refuse_shards(self, group, params, grads, eager_foreach=False)
        self._loop(group, params, grads, states, storages=whole_pieces(params, grads))
