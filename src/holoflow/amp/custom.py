"""``custom_fwd`` / ``custom_bwd``: decorators for a custom ``autograd.Function``'s ``forward`` and
``backward`` under autocast, as ``torch.amp.custom_fwd`` / ``custom_bwd``.

``custom_fwd(cast_inputs=dt)`` casts the floating inputs (not float64) on ``device_type`` to
``dt`` and runs ``forward`` with autocast off, when it is called inside an autocast region;
without ``cast_inputs`` forward runs in the region as it is. ``custom_bwd`` runs ``backward``
with the autocast state ``forward`` had, as torch's (it reads what custom_fwd put on ``ctx``).
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, Callable

import numpy as np
import torch

from ..core.tensor import Tensor
from .autocast import autocast, get_autocast_dtype, is_autocast_enabled


def _cast(value: Any, device_type: str, dtype: Any) -> Any:
    """``value`` with its floating tensors (not float64) on ``device_type`` cast to ``dtype``,
    through containers, as torch's ``torch.amp.autocast_mode._cast``."""
    if isinstance(value, Tensor):
        ok = value.is_floating_point() and value.device.type == device_type and value._data.dtype is not torch.float64
        return value.to(dtype) if ok else value
    if isinstance(value, (str, bytes, np.ndarray)):
        return value
    if isinstance(value, Mapping):
        return {_cast(k, device_type, dtype): _cast(v, device_type, dtype) for k, v in value.items()}
    if isinstance(value, Iterable):
        items = (_cast(v, device_type, dtype) for v in value)
        return type(value)(items) if isinstance(value, (list, tuple)) else items
    return value


def _check(device_type: Any) -> None:
    if not isinstance(device_type, str):
        raise ValueError(f"holoflow.amp: expected `device_type` of type `str`, got: `{type(device_type)}`")


def custom_fwd(fwd: Callable | None = None, *, device_type: str, cast_inputs: Any = None) -> Callable:
    """Decorates ``forward(ctx, *args)`` of a custom Function (see the module doc)."""
    _check(device_type)
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        args[0]._dtype = get_autocast_dtype(device_type)
        enabled = is_autocast_enabled(device_type)
        args[0]._fwd_used_autocast = enabled and cast_inputs is None
        if cast_inputs is None or not enabled:
            return fwd(*args, **kwargs)
        with autocast(device_type, enabled=False):
            return fwd(*_cast(args, device_type, cast_inputs), **_cast(kwargs, device_type, cast_inputs))
    return decorate_fwd


def custom_bwd(bwd: Callable | None = None, *, device_type: str) -> Callable:
    """Decorates ``backward(ctx, *grads)``: it runs with the autocast state of the forward."""
    _check(device_type)
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def decorate_bwd(*args, **kwargs):
        with autocast(device_type, enabled=args[0]._fwd_used_autocast, dtype=args[0]._dtype):
            return bwd(*args, **kwargs)
    return decorate_bwd
