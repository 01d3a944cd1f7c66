"""Gradient clipping, as ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``.

Local tensors outside graph traces take a fast path on the storages (``torch._foreach_norm`` and
``torch._foreach_mul_``, as torch does): two fused calls per device and dtype instead of five
dispatched ops per gradient. Global tensors and traces go op by op, so SBP and nn.Graph see
every step.
"""
from __future__ import annotations

import math
import warnings
from typing import Iterable

import torch

from holoflow.core.grad_mode import no_grad
from holoflow.ops.creation import tensor
from holoflow.ops.elementwise import isfinite
from holoflow.ops.shape import stack
from holoflow.core.interpret import is_lazy
from holoflow.core.sbp import B
from holoflow.core.tensor import Tensor

__all__ = ["clip_grad_norm", "clip_grad_norm_", "clip_grad_value_"]   # (torch's list)


def _tensors(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def _local(tensors: list[Tensor], foreach: bool | None) -> bool:
    """Whether the torch fast path applies: eager, local tensors, and ``foreach`` not False."""
    return foreach is not False and not is_lazy() and all(t._global is None for t in tensors)


def _by_device_dtype(datas: list[torch.Tensor]) -> dict[tuple, list[torch.Tensor]]:
    groups: dict[tuple, list[torch.Tensor]] = {}
    for d in datas:
        groups.setdefault((d.device, d.dtype), []).append(d)
    return groups


def _nonfinite_error(norm_type: float) -> RuntimeError:
    return RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is "
                        f"non-finite, so it cannot be clipped. To disable this error and scale the "
                        f"gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")


def _norm(t: Tensor, norm_type: float) -> Tensor:
    if norm_type == math.inf:
        return t.abs().max()
    if norm_type == -math.inf:
        return t.abs().min()
    if norm_type == 0:
        return (t != 0).to(t.dtype).sum()
    return t.abs().pow(norm_type).sum().pow(1.0 / norm_type)


def _total_norm_fast(datas: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """torch's own reduction: one ``_foreach_norm`` per (device, dtype), then the norm of norms."""
    first = datas[0].device
    norms = [n.to(first) for group in _by_device_dtype(datas).values()
             for n in torch._foreach_norm(group, norm_type)]
    return torch.linalg.vector_norm(torch.stack(norms), norm_type)


@no_grad()
def get_total_norm(tensors: Tensor | Iterable[Tensor], norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach: bool | None = None) -> Tensor:
    """The ``norm_type``-norm of all ``tensors`` together (the norm of their norms).

    >>> float(get_total_norm([holoflow.tensor([3.0]), holoflow.tensor([4.0])]))
    5.0
    """
    tensors = _tensors(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    if _local(tensors, foreach):
        total = Tensor._make(_total_norm_fast([t._data for t in tensors], norm_type))
    else:
        norms = [_norm(t, norm_type) for t in tensors]
        norms = [_placed_as(n, norms[0]) for n in norms]  # pipeline stages: one placement (OneFlow's)
        total = _norm(stack([n.to(norms[0].dtype) for n in norms]), norm_type)
    if error_if_nonfinite and not bool(isfinite(total)):
        raise _nonfinite_error(norm_type)
    return total


@no_grad()
def clip_grads_with_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, total_norm: Tensor,
                          foreach: bool | None = None) -> None:
    """Scales every ``.grad`` by ``min(1, max_norm / (total_norm + 1e-6))`` in place."""
    grads = [p.grad for p in _tensors(parameters) if p.grad is not None]
    if not grads:
        return
    if _local([*grads, total_norm], foreach):
        coef_data = torch.clamp(max_norm / (total_norm._data + 1e-6), max=1.0)
        for (device, _), datas in _by_device_dtype([g._data for g in grads]).items():
            torch._foreach_mul_(datas, coef_data.to(device))
        return
    coef = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    placed: dict = {}
    for g in grads:
        key = None if g._global is None else g._global.placement
        if key not in placed:
            placed[key] = _placed_as(coef, g)
        g.mul_(placed[key].to(g.dtype))


def _placed_as(t: Tensor, like: Tensor) -> Tensor:
    """Global ``t`` moved (broadcast) to ``like``'s placement when they differ (parameters of
    pipeline stages live on different placements); anything else unchanged."""
    if t._global is None or like._global is None or t._global.placement == like._global.placement:
        return t
    place = like._global.placement
    return t.to_global(placement=place, sbp=[B] * place.ndim)


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


def clip_grad_norm(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                   error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Deprecated alias of :func:`clip_grad_norm_` (torch's), warning with torch's FutureWarning."""
    warnings.warn("`holoflow.nn.utils.clip_grad_norm` is now deprecated in favor of "
                  "`holoflow.nn.utils.clip_grad_norm_`.", FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


@no_grad()
def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
    """Clamps every ``.grad`` to ``[-clip_value, clip_value]`` in place."""
    clip_value = float(clip_value)
    grads = [p.grad for p in _tensors(parameters) if p.grad is not None]
    if grads and _local(grads, foreach):
        for datas in _by_device_dtype([g._data for g in grads]).values():
            torch._foreach_clamp_min_(datas, -clip_value)
            torch._foreach_clamp_max_(datas, clip_value)
        return
    for g in grads:
        g.clamp_(min=-clip_value, max=clip_value)
