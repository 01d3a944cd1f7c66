"""``holoflow.testing``: ``assert_close`` / ``make_tensor`` with torch's rules, on holoflow tensors."""
from __future__ import annotations

from typing import Any

import torch

from .core.tensor import Tensor

__all__ = ["assert_close", "make_tensor"]


def _to_torch(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.to_torch()
    if isinstance(x, (list, tuple)):
        return type(x)(_to_torch(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_torch(v) for k, v in x.items()}
    return x


def assert_close(actual: Any, expected: Any, *args: Any, **kwargs: Any) -> None:
    """``torch.testing.assert_close`` on holoflow tensors (or containers of them): the same
    default tolerances per dtype, dtype/device/stride checks and failure messages."""
    torch.testing.assert_close(_to_torch(actual), _to_torch(expected), *args, **kwargs)


def make_tensor(*shape: Any, dtype: Any, device: Any = "cpu", **kwargs: Any) -> Tensor:
    """``torch.testing.make_tensor``, returning a holoflow tensor."""
    from .core.device import to_torch as dev_to_torch
    from .core.dtype import to_torch as dt_to_torch
    requires_grad = kwargs.pop("requires_grad", False)
    t = Tensor._make(torch.testing.make_tensor(*shape, dtype=dt_to_torch(dtype),
                                               device=dev_to_torch(device), **kwargs))
    return t.requires_grad_() if requires_grad else t
