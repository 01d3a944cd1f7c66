"""``holoflow.autograd``: ``backward``, ``grad``, ``Function`` and the grad-mode switches."""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Sequence

import torch

from ..core import grad_mode, interpret
from ..core.autograd import as_roots, run_backward, seed_grads
from ..core.grad_mode import enable_grad, inference_mode, no_grad, set_grad_enabled
from ..core.tensor import Tensor
from . import forward_ad
from .anomaly_mode import detect_anomaly, set_detect_anomaly
from .engine_switches import is_multithreading_enabled, is_view_replay_enabled, set_multithreading_enabled
from .function import Function, FunctionCtx
from .variable import Variable
from ..ops.shape import stack

__all__ = ["backward", "grad", "Function", "FunctionCtx", "no_grad", "enable_grad",
           "set_grad_enabled", "inference_mode", "functional", "profiler", "graph", "detect_anomaly",
           "set_detect_anomaly", "gradcheck", "gradgradcheck", "Variable", "set_multithreading_enabled",
           "is_multithreading_enabled", "is_view_replay_enabled", "forward_ad"]


def variable(*args, **kwargs):
    """torch's deprecated spelling: refused with the name to use."""
    raise RuntimeError("holoflow.autograd.variable(...) is deprecated, use holoflow.tensor(...) instead")


def _as_list(x) -> list:
    return as_roots(x if isinstance(x, (Tensor, tuple, list)) else list(x))


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None) -> None:
    """Accumulates gradients of ``tensors`` (tensors or GradientEdges) into the ``.grad`` of
    graph leaves (or of ``inputs``)."""
    outputs = _as_list(tensors)
    grads = _grad_list(outputs, grad_tensors)
    retain = create_graph if retain_graph is None else retain_graph
    if inputs is not None:   # (a node's GradientEdge: the node runs, nothing accumulates, as torch's)
        inputs = _as_list(inputs)
    interpret.current().backward(outputs, grads, retain, create_graph, inputs)


def _grad_list(outputs: list, grads) -> list:
    if grads is None:
        return [None] * len(outputs)
    return [grads] if isinstance(grads, Tensor) else _as_list(grads)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, only_inputs: bool = True, allow_unused: bool | None = None,
         is_grads_batched: bool = False, materialize_grads: bool = False):
    """Returns the gradients of ``outputs`` w.r.t. ``inputs`` without touching ``.grad``; the
    arguments (and their positional order) are torch.autograd.grad's. ``inputs`` may be a dict
    (e.g. ``dict(model.named_parameters())``), then a dict with the same keys is returned."""
    if materialize_grads and allow_unused is False:
        raise ValueError("Expected allow_unused to be True or not passed when materialize_grads=True, "
                         "but got: allow_unused=False.")
    if allow_unused is None:
        allow_unused = materialize_grads
    if not only_inputs:
        warnings.warn("only_inputs argument is deprecated and is ignored now (defaults to True). To "
                      "accumulate gradient for other parts of the graph, please use "
                      "torch.autograd.backward.", FutureWarning, stacklevel=2)
    keys = None
    if type(inputs) is dict:
        keys, inputs = list(inputs.keys()), list(inputs.values())
    elif isinstance(inputs, Mapping):
        raise TypeError(f"`inputs` argument to `grad()` must be a dict, not {type(inputs).__name__}. "
                        f"Other Mapping types are not supported.")
    outputs, inputs = _as_list(outputs), _as_list(inputs)
    if not inputs:
        raise RuntimeError("`inputs` argument to `grad()` cannot be empty.")
    for i, t in enumerate(inputs):
        if not t.requires_grad:
            raise RuntimeError(f"holoflow.autograd.grad: input {i} does not require grad")
    retain = create_graph if retain_graph is None else retain_graph
    if is_grads_batched:
        result = _batched_grad(outputs, inputs, grad_outputs, retain, create_graph, allow_unused,
                               materialize_grads)
    else:
        result = _grad_once(outputs, inputs, _grad_list(outputs, grad_outputs), retain, create_graph,
                            allow_unused, materialize_grads)
    return tuple(result) if keys is None else dict(zip(keys, result))


def _grad_once(outputs, inputs, grad_outputs, retain, create_graph, allow_unused, materialize_grads):
    grads = seed_grads(outputs, grad_outputs)
    got = run_backward(outputs, grads, retain, create_graph, capture=inputs, accumulate=False)
    got = [t._global.box_grad(t, g) if g is not None and t._global is not None else g
           for t, g in zip(inputs, got)]
    result = []
    for i, (t, g) in enumerate(zip(inputs, got)):
        if g is None:
            if materialize_grads:
                g = t.detach().new_zeros(tuple(t.shape)) if t._global is None else \
                    (t.detach() * 0)
                if create_graph:
                    g.requires_grad_(True)
            elif not allow_unused:
                what = f"shape {tuple(t.shape)}" if isinstance(t, Tensor) else "a GradientEdge"
                raise RuntimeError(f"holoflow.autograd.grad: input {i} ({what}) was not used to compute "
                                   f"the outputs; pass allow_unused=True if that is expected")
        result.append(g)
    return result


def _batched_grad(outputs, inputs, grad_outputs, retain, create_graph, allow_unused, materialize_grads):
    """``is_grads_batched=True``: dim 0 of every grad_output indexes independent vector-Jacobian
    products; computed one by one over the batch and stacked (torch vmaps the engine instead)."""
    gos = _grad_list(outputs, grad_outputs)
    if len(gos) != len(outputs):
        raise RuntimeError(f"grad requires one grad_output per output: got {len(gos)} grad_outputs "
                           f"for {len(outputs)} outputs")
    sizes = set()
    for i, (o, g) in enumerate(zip(outputs, gos)):
        if g is None:
            raise RuntimeError(f"holoflow.autograd.grad: is_grads_batched=True needs a batched "
                               f"grad_output for output {i}, got None")
        if g.dim() == 0 or tuple(g.shape[1:]) != tuple(o.shape):
            raise RuntimeError(f"If `is_grads_batched=True`, we interpret the first dimension of each "
                               f"grad_output as the batch dimension. The sizes of the remaining dimensions "
                               f"are expected to match the shape of corresponding output, but a mismatch "
                               f"was detected: grad_output[{i}] has a shape of {tuple(g.shape)} and "
                               f"output[{i}] has a shape of {tuple(o.shape)}.")
        sizes.add(int(g.shape[0]))
    if len(sizes) != 1:
        raise RuntimeError(f"holoflow.autograd.grad: is_grads_batched=True needs the same batch size "
                           f"in every grad_output, got {sorted(sizes)}")
    (n,) = sizes
    per = [_grad_once(outputs, inputs, [g[b] for g in gos], True if b < n - 1 else retain, create_graph,
                      allow_unused, materialize_grads) for b in range(n)]
    return [None if per[0][i] is None else stack([p[i] for p in per]) for i in range(len(inputs))]


from . import functional  # last: it reads `grad` from this package
from . import graph  # torch.autograd.graph (saved-tensor hooks, Node, multi-grad hooks)
from .gradcheck import gradcheck, gradgradcheck  # (reads `grad`; the name `gradcheck` is the function)
from . import profiler  # torch.autograd.profiler (profile, record_function)
