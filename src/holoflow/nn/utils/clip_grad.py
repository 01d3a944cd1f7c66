"""Gradient clipping, as ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``."""
from __future__ import annotations

import math
from typing import Iterable

import holoflow as flow
from holoflow.core.tensor import Tensor


def _tensors(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def _norm(t: Tensor, norm_type: float) -> Tensor:
    if norm_type == math.inf:
        return t.abs().max()
    if norm_type == -math.inf:
        return t.abs().min()
    if norm_type == 0:
        return (t != 0).to(t.dtype).sum()
    return t.abs().pow(norm_type).sum().pow(1.0 / norm_type)


@flow.no_grad()
def get_total_norm(tensors: Tensor | Iterable[Tensor], norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach: bool | None = None) -> Tensor:
    """The ``norm_type``-norm of all ``tensors`` together (the norm of their norms)."""
    tensors = _tensors(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return flow.tensor(0.0)
    norms = [_norm(t, norm_type) for t in tensors]
    total = _norm(flow.stack([n.to(norms[0].dtype) for n in norms]), norm_type)
    if error_if_nonfinite and not bool(flow.isfinite(total)):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is "
                           f"non-finite, so it cannot be clipped. To disable this error and scale the "
                           f"gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
    return total


@flow.no_grad()
def clip_grads_with_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, total_norm: Tensor,
                          foreach: bool | None = None) -> None:
    """Scales every ``.grad`` by ``min(1, max_norm / (total_norm + 1e-6))`` in place."""
    grads = [p.grad for p in _tensors(parameters) if p.grad is not None]
    if not grads:
        return
    coef = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Rescales the gradients so their total ``norm_type``-norm is at most ``max_norm``;
    returns the total norm before clipping.

    Example::

        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """
    parameters = _tensors(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total, foreach)
    return total


@flow.no_grad()
def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
    """Clamps every ``.grad`` to ``[-clip_value, clip_value]`` in place."""
    clip_value = float(clip_value)
    for p in _tensors(parameters):
        if p.grad is not None:
            p.grad.clamp_(min=-clip_value, max=clip_value)
