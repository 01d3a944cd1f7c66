"""``holoflow.autograd``: ``backward``, ``grad``, ``Function`` and the grad-mode switches."""
from __future__ import annotations

from typing import Sequence

import torch

from ..core import grad_mode
from ..core.autograd import run_backward
from ..core.grad_mode import enable_grad, inference_mode, no_grad, set_grad_enabled
from ..core.tensor import Tensor
from .function import Function, FunctionCtx

__all__ = ["backward", "grad", "Function", "FunctionCtx", "no_grad", "enable_grad",
           "set_grad_enabled", "inference_mode"]


def _as_list(x) -> list:
    return [x] if isinstance(x, Tensor) else list(x)


def _no_global_double_backward(tensors: list, create_graph: bool) -> None:
    if create_graph and any(t._global is not None for t in tensors):
        from ..core.errors import UnsupportedError
        raise UnsupportedError("holoflow.autograd: create_graph=True (double backward) through global "
                               "tensors is not supported yet; take higher derivatives on local tensors "
                               "(x.to_local()) or run the model on one device")


def _seed_grads(outputs: list, grads) -> list:
    grads = [None] * len(outputs) if grads is None else _as_list(grads) if not isinstance(grads, Tensor) else [grads]
    if len(grads) != len(outputs):
        raise RuntimeError(f"holoflow.autograd: got {len(grads)} gradients for {len(outputs)} outputs")
    seeded = []
    for i, (t, g) in enumerate(zip(outputs, grads)):
        if not t.requires_grad:
            raise RuntimeError(f"holoflow.autograd: element {i} of tensors does not require grad and "
                               f"does not have a grad_fn; call .requires_grad_() on the inputs you "
                               f"differentiate with respect to")
        if g is None:
            if t.numel() != 1:
                raise RuntimeError(f"holoflow.autograd: grad can be implicitly created only for "
                                   f"scalar outputs; this output has shape {tuple(t.shape)}. Pass "
                                   f"gradient= a tensor of that shape (e.g. ones_like(output))")
            g = _ones_like(t)
        elif not isinstance(g, Tensor):
            g = Tensor._make(torch.as_tensor(g, dtype=t._data.dtype, device=t._data.device))
        elif tuple(g.shape) != tuple(t.shape):
            raise RuntimeError(f"holoflow.autograd: gradient has shape {tuple(g.shape)} but the output "
                               f"has shape {tuple(t.shape)}; they must match")
        if t._global is not None:
            from ..distributed.global_tensor import seed_grad
            g = seed_grad(t, g)
        seeded.append(g)
    return seeded


def _ones_like(t: Tensor) -> Tensor:
    from .. import ones_like
    return ones_like(t)


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None) -> None:
    """Accumulates gradients of ``tensors`` into the ``.grad`` of graph leaves."""
    outputs = _as_list(tensors)
    _no_global_double_backward(outputs, create_graph)
    grads = _seed_grads(outputs, grad_tensors)
    retain = create_graph if retain_graph is None else retain_graph
    if inputs is None:
        run_backward(outputs, grads, retain, create_graph)
        return
    inputs = _as_list(inputs)
    got = run_backward(outputs, grads, retain, create_graph, capture=inputs, accumulate=False)
    for t, g in zip(inputs, got):
        if g is not None:
            if t._global is not None:
                g = t._box_grad(g)
            g = g if create_graph else g.detach()
            t.grad = g if t.grad is None else t.grad + g


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool | None = None,
         materialize_grads: bool = False) -> tuple:
    """Returns the gradients of ``outputs`` w.r.t. ``inputs`` without touching ``.grad``."""
    outputs, inputs = _as_list(outputs), _as_list(inputs)
    _no_global_double_backward(outputs + inputs, create_graph)
    for i, t in enumerate(inputs):
        if not t.requires_grad:
            raise RuntimeError(f"holoflow.autograd.grad: input {i} does not require grad")
    grads = _seed_grads(outputs, grad_outputs)
    retain = create_graph if retain_graph is None else retain_graph
    got = run_backward(outputs, grads, retain, create_graph, capture=inputs, accumulate=False)
    got = [t._box_grad(g) if g is not None and t._global is not None else g for t, g in zip(inputs, got)]
    result = []
    for i, (t, g) in enumerate(zip(inputs, got)):
        if g is None:
            if materialize_grads:
                from .. import zeros_like
                g = zeros_like(t)
            elif not allow_unused:
                raise RuntimeError(f"holoflow.autograd.grad: input {i} (shape {tuple(t.shape)}) was "
                                   f"not used to compute the outputs; pass allow_unused=True if that "
                                   f"is expected")
        result.append(g)
    return tuple(result)


