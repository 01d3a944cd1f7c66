"""torch's export-friendly forms: ``cond`` and ``while_loop`` (run eagerly, differentiable
through the branch or iterations that ran) and ``nonzero_static`` (torch's kernel: a static
``(size, ndim)`` output, no host sync; a meta kernel for nn.Graph's trace).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..core import dtype as _dtype
from ..core.dispatch import apply
from ..core.registry import defop
from ..core.sbp import B
from ..core.tensor import Tensor
from .tensor_meta import _tensor

__all__ = ["nonzero_static", "cond", "while_loop"]


# torch's kernel: the output shape is ``(size, ndim)`` whatever the values (no host sync on CUDA;
# a meta kernel for nn.Graph's trace), unlike ``nonzero`` followed by a slice or a pad
NONZERO_STATIC = defop("nonzero_static",
                       lambda x, size, fill_value: torch.nonzero_static(x, size=size, fill_value=fill_value),
                       sbp=lambda metas, attrs: [((B,), (B,))], differentiable=False)


def nonzero_static(input: Tensor, *, size: int, fill_value: int = -1) -> Tensor:
    """The indices of the non-zero entries as an ``(size, ndim)`` tensor: truncated, or padded
    with ``fill_value``, as ``torch.nonzero_static``."""
    _tensor("nonzero_static", input)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise RuntimeError(f"holoflow.nonzero_static: 'size' must be a non-negative integer, got {size!r}")
    return apply(NONZERO_STATIC, input, size=size, fill_value=int(fill_value))


def _as_cond_pred(pred: Any) -> bool:
    if isinstance(pred, Tensor):
        if pred.numel() != 1:
            raise RuntimeError(f"holoflow.cond: expected pred to be bool or single-element tensor, but got "
                               f"a tensor of shape {tuple(pred.shape)}")
        return bool(pred.item())
    if isinstance(pred, (bool, int)):
        return bool(pred)
    raise RuntimeError(f"holoflow.cond: expected pred to be bool or single-element tensor, got "
                       f"{type(pred).__name__}")


def cond(pred: Any, true_fn: Callable, false_fn: Callable, operands: tuple | list = ()) -> Any:
    """Runs ``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, as ``torch.cond`` in
    eager mode (differentiable through the branch that ran)."""
    if not (callable(true_fn) and callable(false_fn)):
        raise RuntimeError("holoflow.cond: expected true_fn and false_fn to be callable")
    if not isinstance(operands, (tuple, list)):
        raise RuntimeError(f"holoflow.cond: expected operands to be a tuple or a list, got "
                           f"{type(operands).__name__}")
    return (true_fn if _as_cond_pred(pred) else false_fn)(*operands)


def while_loop(cond_fn: Callable, body_fn: Callable, carried_inputs: tuple | list) -> tuple:
    """``while cond_fn(*carried): carried = body_fn(*carried)``; returns the carried values, as
    ``torch.while_loop`` in eager mode (differentiable through the iterations that ran)."""
    if not (callable(cond_fn) and callable(body_fn)):
        raise RuntimeError("holoflow.while_loop: expected cond_fn and body_fn to be callable")
    if not isinstance(carried_inputs, (tuple, list)):
        raise RuntimeError(f"holoflow.while_loop: carried_inputs must be a tuple or a list, got "
                           f"{type(carried_inputs).__name__}")
    carried = tuple(carried_inputs)
    while True:
        p = cond_fn(*carried)
        if isinstance(p, Tensor) and (p.numel() != 1 or p.dtype is not _dtype.bool):
            raise RuntimeError(f"holoflow.while_loop: cond_fn must return a boolean scalar tensor or a bool, "
                               f"got shape {tuple(p.shape)} of {p.dtype}")
        if not bool(p):
            return carried
        out = body_fn(*carried)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(carried):
            raise RuntimeError(f"holoflow.while_loop: body_fn returned {len(out)} values for {len(carried)} "
                               f"carried inputs")
        carried = out


for _name, _fn in {"nonzero_static": nonzero_static}.items():
    if not hasattr(Tensor, _name):
        setattr(Tensor, _name, _fn)
