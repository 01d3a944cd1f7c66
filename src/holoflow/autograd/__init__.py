"""``holoflow.autograd``: ``backward``, ``grad``, ``Function`` and the grad-mode switches."""
from __future__ import annotations

from typing import Sequence

import torch

from ..core import grad_mode, interpret
from ..core.autograd import no_global_double_backward, run_backward, seed_grads
from ..core.grad_mode import enable_grad, inference_mode, no_grad, set_grad_enabled
from ..core.tensor import Tensor
from .function import Function, FunctionCtx

__all__ = ["backward", "grad", "Function", "FunctionCtx", "no_grad", "enable_grad",
           "set_grad_enabled", "inference_mode"]


def _as_list(x) -> list:
    return [x] if isinstance(x, Tensor) else list(x)


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None) -> None:
    """Accumulates gradients of ``tensors`` into the ``.grad`` of graph leaves."""
    outputs = _as_list(tensors)
    no_global_double_backward(outputs, create_graph)
    grads = _grad_list(outputs, grad_tensors)
    retain = create_graph if retain_graph is None else retain_graph
    interpret.current().backward(outputs, grads, retain, create_graph,
                                 None if inputs is None else _as_list(inputs))


def _grad_list(outputs: list, grads) -> list:
    if grads is None:
        return [None] * len(outputs)
    return [grads] if isinstance(grads, Tensor) else _as_list(grads)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool | None = None,
         materialize_grads: bool = False) -> tuple:
    """Returns the gradients of ``outputs`` w.r.t. ``inputs`` without touching ``.grad``."""
    outputs, inputs = _as_list(outputs), _as_list(inputs)
    no_global_double_backward(outputs + inputs, create_graph)
    for i, t in enumerate(inputs):
        if not t.requires_grad:
            raise RuntimeError(f"holoflow.autograd.grad: input {i} does not require grad")
    grads = seed_grads(outputs, _grad_list(outputs, grad_outputs))
    retain = create_graph if retain_graph is None else retain_graph
    got = run_backward(outputs, grads, retain, create_graph, capture=inputs, accumulate=False)
    got = [t._global.box_grad(t, g) if g is not None and t._global is not None else g
           for t, g in zip(inputs, got)]
    result = []
    for i, (t, g) in enumerate(zip(inputs, got)):
        if g is None:
            if materialize_grads:
                g = t.detach().new_zeros(tuple(t.shape)) if t._global is None else \
                    (t.detach() * 0)
            elif not allow_unused:
                raise RuntimeError(f"holoflow.autograd.grad: input {i} (shape {tuple(t.shape)}) was "
                                   f"not used to compute the outputs; pass allow_unused=True if that "
                                   f"is expected")
        result.append(g)
    return tuple(result)


