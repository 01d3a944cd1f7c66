"""``Muon`` (torch 2.13's ``torch.optim.Muon``): momentum orthogonalised by a quintic
Newton-Schulz iteration in bfloat16, for 2-D parameters, with torch's defaults, errors, learning
rate adjustments and state layout.

The rule reads whole matrices (a norm, matrix products), so it is written per parameter in
Tensor methods torch and holoflow tensors share: local eager steps run it on the torch storages
(torch's kernels in torch's order, so the numbers are torch's), global parameters on the holoflow
tensors, a split update gathered first (each rank orthogonalises the whole matrix: products of
bfloat16 shards would round their pieces apart). torch has no multi-tensor variant.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from ..core.sbp import B
from ..core.tensor import Tensor
from ..ops import creation as C
from ..ops.linalg import addmm
from ._checks import refuse_shards, scalar, whole_pieces
from .optimizer import Optimizer

__all__ = ["Muon"]

# Keller Jordan's constants (torch.optim._muon)
EPS = 1e-7
DEFAULT_A, DEFAULT_B, DEFAULT_C = 3.4445, -4.7750, 2.0315
DEFAULT_NS_STEPS = 5
_ADJUSTMENTS = (None, "original", "match_rms_adamw")


def zeropower_via_newtonschulz(grad: Any, ns_coefficients: tuple[float, float, float], ns_steps: int,
                               eps: float) -> Any:
    """The (approximate) orthogonalisation ``U S' V^T`` of a 2-D ``grad`` (torch storage or
    holoflow tensor), in bfloat16: normalised to spectral norm <= 1, then ``ns_steps`` quintic
    iterations ``X <- a X + (b A + c A A) X`` with ``A = X X^T`` (on the wide orientation)."""
    if ns_steps >= 100:
        raise ValueError(f"holoflow.optim.Muon: ns_steps={ns_steps}; the number of Newton-Schulz steps "
                         f"must be less than 100 for computational efficiency")
    if len(grad.shape) != 2:
        raise ValueError(f"holoflow.optim.Muon: input tensor gradient must be a 2D matrix, got shape "
                         f"{tuple(grad.shape)}")
    if len(ns_coefficients) != 3:
        raise ValueError(f"holoflow.optim.Muon: ns_coefficients must be a tuple of exactly 3 values, got "
                         f"{ns_coefficients!r}")
    a, b, c = ns_coefficients
    mm = torch.addmm if isinstance(grad, torch.Tensor) else addmm
    tall = grad.size(0) > grad.size(1)
    x = grad.bfloat16()
    if tall:
        x = x.T
    # (torch divides in place; out of place runs the same kernel)
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = mm(x, mm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adjust_lr(lr: float, adjust_lr_fn: str | None, param_shape: Any) -> float:
    """torch's learning-rate scaling by the matrix shape ``(A, B)``: ``sqrt(max(1, A/B))``
    ("original", the default) or ``0.2 * sqrt(max(A, B))`` ("match_rms_adamw")."""
    A, B = param_shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        ratio = math.sqrt(max(1, A / B))
    elif adjust_lr_fn == "match_rms_adamw":
        ratio = 0.2 * math.sqrt(max(A, B))
    else:
        ratio = 1.0
    return lr * ratio


class Muon(Optimizer):
    """Muon, as ``torch.optim.Muon`` (lr 1e-3, weight_decay 0.1, momentum 0.95, nesterov True,
    ns_coefficients (3.4445, -4.7750, 2.0315), eps 1e-7, ns_steps 5).

    ``buf = lerp(buf, g, 1 - momentum)``; the update ``O = NS(lerp(g, buf, momentum))`` (nesterov)
    or ``NS(buf)``; ``p *= 1 - lr * weight_decay``; ``p -= adjust_lr(lr, shape) * O``. Only 2-D
    parameters: optimize biases and embeddings with another optimizer (AdamW).
    """

    def __init__(self, params: Iterable, lr: float | Tensor = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = (DEFAULT_A, DEFAULT_B, DEFAULT_C),
                 eps: float = EPS, ns_steps: int = DEFAULT_NS_STEPS, adjust_lr_fn: str | None = None) -> None:
        name = "holoflow.optim.Muon"
        if isinstance(lr, (Tensor, torch.Tensor)) and lr.numel() != 1:
            raise ValueError(f"{name}: Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"{name}: Learning rate should be >= 0 but is: {lr}")
        if not 0.0 <= momentum:
            raise ValueError(f"{name}: momentum should be >= 0 but is: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"{name}: weight decay should be >= 0 but is: {weight_decay}")
        if adjust_lr_fn not in _ADJUSTMENTS:
            raise ValueError(f"{name}: Adjust learning rate function {adjust_lr_fn} is not supported; use "
                             f"None, 'original' or 'match_rms_adamw'")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"{name}: Muon only supports 2D parameters whereas we found a parameter "
                                     f"with size: {p.size()}; optimize it with another optimizer (AdamW)")

    def _init_state(self, p: Tensor, group: dict) -> dict:
        if p.is_complex():
            raise RuntimeError("holoflow.optim.Muon: Muon does not support complex parameters")
        return {"momentum_buffer": C.zeros_like(p)}

    def _loop(self, group: dict, params: list, grads: list, states: list, storages: bool) -> None:
        """torch's ``_single_tensor_muon``, on torch storages or on holoflow tensors."""
        lr, wd, mom = scalar(group["lr"]), group["weight_decay"], group["momentum"]
        for p, g, st in zip(params, grads, states):
            if g.dim() != 2:
                raise ValueError(f"holoflow.optim.Muon: Param gradient must be a 2D matrix, got shape "
                                 f"{tuple(g.shape)}")
            param, grad, buf = (p._data, g._data, st["momentum_buffer"]._data) if storages else \
                (p, g, st["momentum_buffer"])
            buf.lerp_(grad, 1 - mom)
            update = grad.lerp(buf, mom) if group["nesterov"] else buf
            if not storages and update._global is not None and any(s != B for s in update._global.sbp):
                # a split (or partial) update gathered: its bfloat16 products on shards would sum
                # pieces rounded apart, not torch's numbers; every rank orthogonalises the matrix
                update = update.to_global(sbp=(B,) * len(update._global.sbp))
            update = zeropower_via_newtonschulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
            param.mul_(1 - lr * wd)
            param.add_(update, alpha=-adjust_lr(lr, group["adjust_lr_fn"], p.shape))

    def _step_foreach(self, group: dict, params: list, grads: list, states: list) -> None:
        refuse_shards(self, group, params, grads, eager_foreach=True)
        self._loop(group, params, grads, states, storages=True)

    def _step_ops(self, group: dict, params: list, grads: list, states: list) -> None:
        refuse_shards(self, group, params, grads, eager_foreach=False)
        self._loop(group, params, grads, states, storages=whole_pieces(params, grads))
