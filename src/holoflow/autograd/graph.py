"""``holoflow.autograd.graph``: torch.autograd.graph on holoflow's engine.

Saved-tensor hooks (``saved_tensors_hooks``, ``save_on_cpu``, ``disable_saved_tensors_hooks``)
act in core/saved.py and core/node.py (``PackedNode``); ``Node`` is the type of ``grad_fn``
(core/node.py's ``GradNode`` and a leaf's ``AccumulateGrad``); ``register_multi_grad_hook`` asks
the engine which gradients the pass in progress computes (``core.autograd.will_execute``);
``allow_mutation_on_saved_tensors`` is autograd/saved_mutation.py.
"""
from __future__ import annotations

import abc
import contextlib
import functools
import threading
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, Literal

import torch

from ..core import saved
from ..core.autograd import current_graph_task, will_execute
from ..core.node import AccumulateGrad, GradientEdge, GradNode, grad_accumulator
from ..core.tensor import Tensor
from .saved_mutation import allow_mutation_on_saved_tensors

__all__ = ["saved_tensors_hooks", "save_on_cpu", "disable_saved_tensors_hooks", "register_multi_grad_hook",
           "Node", "GradientEdge", "get_gradient_edge", "increment_version", "allow_mutation_on_saved_tensors"]


class Node(abc.ABC):
    """The type of ``tensor.grad_fn``: ``isinstance(t.grad_fn, Node)`` holds for holoflow's grad
    nodes (names like ``<MulBackward>``) and for a leaf's ``<AccumulateGrad>`` (in
    ``next_functions``)."""

    @abc.abstractmethod
    def name(self) -> str:
        """The node's name."""

    @property
    @abc.abstractmethod
    def next_functions(self) -> tuple[tuple[Node | None, int], ...]:
        """``(node, output index)`` of each input; ``(None, 0)`` for one without a gradient."""

    @property
    @abc.abstractmethod
    def metadata(self) -> dict:
        """A dict of the node's own (anomaly mode keeps the forward traceback there)."""

    @abc.abstractmethod
    def register_hook(self, fn: Callable[..., Any]) -> Any:
        """``fn(grad_inputs, grad_outputs)`` after the node ran; may return new ``grad_inputs``."""

    @abc.abstractmethod
    def register_prehook(self, fn: Callable[..., Any]) -> Any:
        """``fn(grad_outputs)`` before the node runs; may return new ``grad_outputs``."""


Node.register(GradNode)
Node.register(AccumulateGrad)


def get_gradient_edge(tensor: Tensor) -> GradientEdge:
    """The gradient edge of ``tensor``: its grad_fn and output index, or its AccumulateGrad."""
    if not tensor.requires_grad:
        raise RuntimeError("holoflow.autograd.graph.get_gradient_edge: it is not possible to get the gradient "
                           "edge for a Tensor that does not require gradients; call requires_grad_() first")
    fn = tensor.grad_fn
    if fn is None:
        return GradientEdge(grad_accumulator(tensor), 0)
    return GradientEdge(fn, tensor._out_idx)


def increment_version(tensor: Tensor | Iterable[Tensor]) -> None:
    """Moves the version counter of ``tensor`` (or of each tensor of an iterable), as an in-place
    write would: for writes autograd cannot see (a kernel writing through ``data_ptr``)."""
    tensors = (tensor,) if isinstance(tensor, Tensor) else tuple(tensor)
    torch._C._increment_version([t._data for t in tensors])


class saved_tensors_hooks:
    """Context manager: while active, every tensor a grad node saves is ``pack_hook(tensor)``'s
    result, and the node's backward reads ``unpack_hook(packed)``.

    ``pack_hook(tensor) -> Any`` runs under no_grad and must not write ``tensor`` in place;
    ``unpack_hook(Any) -> Tensor`` must give back a tensor with the original's values (it takes
    the original's autograd history, so double backward works). Nested, the innermost pair acts.
    As torch's, the engine checks no version counter of what the hooks hold: an in-place write of
    the original after packing is not caught. Inside ``nn.Graph`` tracing they raise.
    """

    def __init__(self, pack_hook: Callable[[Tensor], Any], unpack_hook: Callable[[Any], Tensor]) -> None:
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self) -> None:
        saved.push(self.pack_hook, self.unpack_hook)

    def __exit__(self, *args: object) -> None:
        saved.pop()


class save_on_cpu(saved_tensors_hooks):
    """Context manager: tensors saved for backward are kept on the CPU and copied back to their
    device when backward reads them (no copy for tensors already on the CPU). ``pin_memory``:
    pinned host memory and asynchronous copies, when ``device_type``'s device is available."""

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        device_module = getattr(torch, device_type, torch.cuda)

        def pack_to_cpu(tensor: Tensor) -> tuple[Any, Tensor]:
            if not pin_memory:
                return (tensor.device, tensor.cpu())
            d = tensor._data
            is_pinnable = device_module.is_available() and not d.is_sparse
            packed = torch.empty(d.size(), dtype=d.dtype, layout=d.layout, pin_memory=is_pinnable)
            packed.copy_(d, non_blocking=is_pinnable)
            return (tensor.device, Tensor._make(packed))

        def unpack_from_cpu(packed: tuple[Any, Tensor]) -> Tensor:
            device, tensor = packed
            return tensor.to(device, non_blocking=pin_memory)

        super().__init__(pack_to_cpu, unpack_from_cpu)


@contextlib.contextmanager
def disable_saved_tensors_hooks(error_message: str) -> Generator[None, None, None]:
    """Context manager: entering ``saved_tensors_hooks`` inside raises RuntimeError(error_message)
    (as does entering this while hooks are active)."""
    maybe_prev_message = None
    try:
        maybe_prev_message = saved.disabled_message()
        saved.disable(error_message)
        yield
    finally:
        if maybe_prev_message is None:
            saved.enable()
        else:
            saved.disable(maybe_prev_message)


class _MultiHandle:
    """Removes every hook ``register_multi_grad_hook`` registered."""

    def __init__(self, handles: tuple) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def __enter__(self) -> _MultiHandle:
        return self

    def __exit__(self, *args: object) -> None:
        self.remove()


def register_multi_grad_hook(tensors: Sequence[Tensor],
                             fn: Callable[[Sequence[Tensor | None]], None] | Callable[[Tensor], None], *,
                             mode: Literal["all", "any"] = "all") -> _MultiHandle:
    """``mode="all"``: ``fn(grads)`` once per backward pass, after the gradient of every tensor
    the pass computes (None for the others: not in the graph, or not needed for its ``inputs``).
    ``mode="any"``: ``fn(grad)`` with the first of them. Returns a handle whose ``remove()``
    removes the hook."""
    supported_modes = ("all", "any")
    if mode not in supported_modes:
        raise ValueError(f"Expects mode to be one of {supported_modes} but got {mode}")
    lock = threading.Lock()
    if mode == "all":
        return _all_hook(tuple(tensors), fn, lock)
    ran: dict[int, bool] = defaultdict(bool)

    @functools.wraps(fn)
    def wrapped_fn(grad: Tensor) -> None:
        task = _task_id()
        with lock:
            prev, ran[task] = ran[task], True
        if not prev:
            fn(grad)
    return _MultiHandle(tuple(t.register_hook(wrapped_fn) for t in tensors if t.requires_grad))


def _all_hook(tensors: tuple, fn: Callable, lock: threading.Lock) -> _MultiHandle:
    where = [_edge_of(i, t) for i, t in enumerate(tensors)]
    count: dict[int, int] = {}
    buffer: dict[int, list] = {}
    expected: dict[int, int] = {}

    def inner(idx: int) -> Callable[[Tensor], None]:
        def inner_hook(grad: Tensor) -> None:
            task = _task_id()
            with lock:
                seen = count.get(task, 0)
                count[task] = seen + 1
                if seen == 0:   # the first gradient of this pass: how many it will compute
                    expected[task] = sum(will_execute(*w) for w in where)
                    buffer[task] = [None] * len(tensors)
                buffer[task][idx] = grad
                done = seen == expected[task] - 1
                grads = buffer.pop(task) if done else None
                if done:
                    del count[task], expected[task]
            if done:
                fn(grads)
        return inner_hook
    return _MultiHandle(tuple(t.register_hook(inner(i)) for i, t in enumerate(tensors)))


def _edge_of(i: int, t: Tensor) -> tuple:
    """``(grad_fn, output index, leaf)``: where ``t``'s gradient is computed."""
    if not t.requires_grad:
        raise AssertionError(f"holoflow.autograd.graph.register_multi_grad_hook: tensor {i} does not require "
                             f"grad, so no gradient of it is ever computed; pass only tensors that require grad "
                             f"(or use mode='any', which skips them)")
    return (t.grad_fn, t._out_idx, t if t.grad_fn is None else None)


def _task_id() -> int:
    task = current_graph_task()
    if task is None:
        raise AssertionError("holoflow.autograd.graph: expected this hook to be called inside a backward call")
    return task.id
