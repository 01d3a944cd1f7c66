"""``holoflow.autograd.Variable``: torch's legacy alias of Tensor. ``Variable(t, requires_grad)``
returns a Tensor sharing ``t``'s storage, without its history; ``isinstance(x, Variable)`` holds
for every Tensor."""
from __future__ import annotations

import warnings

import torch

from ..core.tensor import Tensor

__all__ = ["Variable"]


class VariableMeta(type):
    def __instancecheck__(cls, other: object) -> bool:
        return isinstance(other, Tensor)


class Variable(metaclass=VariableMeta):
    """``Variable(data=None, requires_grad=False, volatile=False)``: a Tensor, as torch's."""

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = False, volatile: bool = False,
                _grad_fn: object = None, name: str | None = None) -> Tensor:  # type: ignore[misc]
        if volatile:
            warnings.warn("volatile was removed and now has no effect. Use `with torch.no_grad():` instead.",
                          stacklevel=2)
        if _grad_fn is not None:
            raise RuntimeError("holoflow.autograd.Variable: _grad_fn is not supported; build the history with "
                               "holoflow ops (or an autograd.Function)")
        if data is None:
            t = Tensor._make(torch.empty(0))
        elif not isinstance(data, Tensor):
            raise TypeError(f"Variable data has to be a tensor, but got {type(data).__name__}")
        else:
            t = data.detach()
        if requires_grad:
            t.requires_grad_(True)
        return t
