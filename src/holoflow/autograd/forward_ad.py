"""``holoflow.autograd.forward_ad``: torch's forward-mode AD API (``dual_level``, ``make_dual``,
``unpack_dual``).

Forward mode here is torch's own: a dual tensor's storage is a torch dual tensor, so every torch
kernel holoflow runs carries the tangent as torch computes it, eagerly, with torch's formulas
(the same numbers; an op torch has no forward formula for raises torch's error). holoflow's tape
records reverse mode alongside as before, and a backward pass inside the level runs its kernels
on the dual values, so ``autograd.grad(..., create_graph=True)`` of a dual gives the tangent of
the gradient (forward over reverse: Hessian-vector products), as torch's.

What holoflow's tape cannot follow is a tangent's own dependence on tensors that require grad
(torch records that in its reverse mode: reverse over forward). A tangent unpacked from a tensor
that requires grad therefore requires grad, as torch's, through a node that refuses a backward
pass with the way out (``holoflow.func.jvp``, whose tangents are differentiable in everything);
a tangent that requires grad is refused by ``make_dual`` for the same reason. Global tensors
(whose collectives would drop tangents) and traced calls (``nn.Graph``, ``holoflow.compile``)
refuse dual tensors.
"""
from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import torch
import torch.autograd.forward_ad as _torch_fw

from ..core import grad_mode
from ..core.interpret import is_lazy
from ..core.tensor import Tensor
from .function import Function, once_differentiable

__all__ = ["dual_level", "enter_dual_level", "exit_dual_level", "make_dual", "unpack_dual", "UnpackedDualTensor"]

_WAY_OUT = ("holoflow.func.jvp computes Jacobian-vector products whose results are differentiable (in the "
            "primals, the tangents and whatever the function closes over)")


class UnpackedDualTensor(NamedTuple):
    """``unpack_dual``'s result: the primal (a view of the tensor, without tangent) and the tangent
    at the level asked for (None if the tensor has none)."""

    primal: Any
    tangent: Any


def enter_dual_level() -> int:
    """Enters a new forward-AD level and returns its index (torch: one level at a time)."""
    return _torch_fw.enter_dual_level()


def exit_dual_level(*, level: int | None = None) -> None:
    """Exits the level (the current one by default): every tangent of that level is gone."""
    _torch_fw.exit_dual_level(level=level)


class dual_level(contextlib.ContextDecorator):
    """Context manager of a forward-AD level, as ``torch.autograd.forward_ad.dual_level``::

        with dual_level():
            y = f(make_dual(x, t))
            jvp = unpack_dual(y).tangent

    or as a decorator of a function whose body is the level.
    """

    def __enter__(self) -> int:
        return enter_dual_level()

    def __exit__(self, *exc: Any) -> None:
        exit_dual_level()


def _checked(value: Any, what: str, who: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"holoflow.autograd.forward_ad.{who}: expected {what} to be a holoflow Tensor, got "
                        f"{type(value).__name__}")
    if value.is_global:
        raise RuntimeError(f"holoflow.autograd.forward_ad.{who}: {what} is a global tensor "
                           f"({value.placement}, {value.sbp}); forward-mode AD runs on local tensors only (a "
                           f"collective would drop the tangent): call it on .to_local() pieces, or use "
                           f"holoflow.func.jvp on the global function")
    if is_lazy():
        raise RuntimeError(f"holoflow.autograd.forward_ad.{who}: dual tensors are eager only, not inside an "
                           f"nn.Graph or holoflow.compile trace; {_WAY_OUT}")
    return value


def _view(tensor: Tensor, data: torch.Tensor) -> Tensor:
    """A view of ``tensor`` on holoflow's tape (its reverse-mode history) whose storage is ``data``,
    a torch view of ``tensor``'s storage carrying (or stripped of) a tangent."""
    out = tensor.view_as(tensor)
    out._data = data
    return out


def make_dual(tensor: Tensor, tangent: Tensor, *, level: int | None = None) -> Tensor:
    """A view of ``tensor`` with ``tangent`` as its forward gradient at ``level`` (the current
    one by default); reverse mode still reaches ``tensor`` through it."""
    _checked(tensor, "tensor", "make_dual")
    _checked(tangent, "tangent", "make_dual")
    if tangent.requires_grad and grad_mode.STATE.enabled:
        raise RuntimeError("holoflow.autograd.forward_ad.make_dual: the tangent requires grad, but holoflow's "
                           "forward-mode tangents are not differentiable (reverse mode over forward mode): pass "
                           f"tangent.detach(), or use holoflow.func.jvp: {_WAY_OUT}")
    try:
        dual = _torch_fw.make_dual(tensor._data, tangent._data, level=level)
    except (RuntimeError, ValueError) as e:
        raise type(e)(f"holoflow.autograd.forward_ad.make_dual (tensor {tuple(tensor.shape)} {tensor.dtype}, "
                      f"tangent {tuple(tangent.shape)} {tangent.dtype}): {e}") from None
    return _view(tensor, dual)


class _Tangent(Function):
    """The tangent of a tensor that requires grad: requires grad too (torch's does), and a backward
    pass through it is refused (what it depends on is torch's record, not holoflow's)."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, tangent: Tensor) -> Tensor:
        return tangent

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Any) -> Any:
        raise RuntimeError("holoflow.autograd.forward_ad: a backward pass reached a forward-mode tangent (from "
                           "unpack_dual of a tensor that requires grad); holoflow cannot differentiate tangents "
                           f"(reverse mode over forward mode): {_WAY_OUT}. Detach the tangent where its gradient "
                           "is not wanted")


def unpack_dual(tensor: Tensor, *, level: int | None = None) -> UnpackedDualTensor:
    """``(primal, tangent)`` of ``tensor`` at ``level`` (the current one by default): the primal
    a view of ``tensor`` without tangent (reverse mode reaches ``tensor`` through it), the tangent
    None when ``tensor`` has none there."""
    _checked(tensor, "tensor", "unpack_dual")
    primal, tangent = _torch_fw.unpack_dual(tensor._data, level=level)
    if tangent is None:
        return UnpackedDualTensor(_view(tensor, primal), None)
    t = Tensor._make(tangent)
    if tensor.requires_grad and grad_mode.STATE.enabled:
        t = _Tangent.apply(tensor, t)
    return UnpackedDualTensor(_view(tensor, primal), t)
