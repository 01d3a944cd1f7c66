"""Saved-tensor hooks: the engine's side of ``autograd.graph.saved_tensors_hooks``.

While a pair of hooks is pushed (per thread, innermost wins), a grad node hands every tensor it
saves to ``pack`` (under no_grad) and keeps only the packed value; its rule reads
``unpack(packed)`` instead (core/node.py: ``PackedNode``, ``unpack_saved``). The unpacked tensor
takes the original's autograd identity (its grad_fn, or its leaf), never the unpacked value's own
history, so double backward reaches the graph as torch's does. As torch's, the engine checks no version counter of a
packed tensor: the hooks own what was saved (``save_on_cpu`` keeps a copy that a later in-place
write of the original does not reach), and keeping the counter would keep the storage alive.
"""
from __future__ import annotations

import threading
from typing import Callable

from . import grad_mode, interpret
from .errors import UnsupportedError
from .tensor import Tensor


class _Hooks(threading.local):
    stack: tuple = ()            # (pack, unpack) pairs, innermost last
    disabled: str | None = None  # disable_saved_tensors_hooks' message while it is active


_HOOKS = _Hooks()
_LIVE = [0]   # pushes alive in any thread: a node that saves reads its thread's stack only then
_LOCK = threading.Lock()


def push(pack_hook: Callable, unpack_hook: Callable, applies: Callable[[], bool] | None = None) -> None:
    """Makes ``(pack_hook, unpack_hook)`` this thread's innermost pair; with ``applies``, only
    while it returns True (else the pairs outside it act, or none: holoflow.func's forward mode)."""
    msg = _HOOKS.disabled
    if msg is not None and applies is None:   # (a pair with ``applies`` is holoflow's own, not the user's)
        raise RuntimeError(msg)
    _HOOKS.stack = _HOOKS.stack + ((pack_hook, unpack_hook) if applies is None else (pack_hook, unpack_hook, applies),)
    with _LOCK:
        _LIVE[0] += 1


def pop() -> None:
    """Drops this thread's innermost pair."""
    if not _HOOKS.stack:
        raise RuntimeError("holoflow.autograd.graph: no saved tensor hooks to pop; pop only what "
                           "saved_tensors_hooks pushed")
    _HOOKS.stack = _HOOKS.stack[:-1]
    with _LOCK:
        _LIVE[0] -= 1


def current() -> tuple | None:
    """This thread's innermost ``(pack, unpack)``, or None (the hot path asks ``_LIVE`` first)."""
    for pair in reversed(_HOOKS.stack):
        if len(pair) == 2 or pair[2]():
            return pair
    return None


def disable(message: str) -> None:
    """Refuses pushes with ``message`` (torch's check: hooks already pushed raise it too)."""
    _HOOKS.disabled = message
    if any(len(pair) == 2 for pair in _HOOKS.stack):
        raise RuntimeError(message)


def enable() -> None:
    _HOOKS.disabled = None


def disabled_message() -> str | None:
    return _HOOKS.disabled


def refuse_in_graph() -> None:
    """Saved tensor hooks meeting an nn.Graph that trains (its trace, or a call of its plan)."""
    raise UnsupportedError(
        "holoflow.autograd.graph.saved_tensors_hooks: saved tensor hooks (saved_tensors_hooks, "
        "save_on_cpu) do not apply inside nn.Graph: the compiled plan keeps what its backward "
        "reads itself, and later calls would run without the hooks. Leave the hooks' context out "
        "of the graph (call the model eagerly inside it), or recompute activations in the graph "
        "with activation_checkpointing = True on a GraphModule")


class SavedTensor:
    """A tensor a grad node saved through pack hooks: the packed value and the autograd identity
    (grad_fn and output index, or the leaf) that the unpacked tensor takes."""

    __slots__ = ("packed", "unpack", "grad_fn", "out_idx", "leaf", "rg", "glob")


def pack(x: Tensor, hooks: tuple) -> SavedTensor:
    """``hooks``' pack of the saved tensor ``x``, under no_grad as torch runs it; a pack hook that
    writes its input in place is refused (torch's check)."""
    if interpret.is_lazy():
        refuse_in_graph()
    d = x._data
    version = d._version
    state = grad_mode.STATE
    prev, state.enabled = state.enabled, False
    try:
        packed = hooks[0](x)
    finally:
        state.enabled = prev
    if d._version != version:
        raise RuntimeError("holoflow.autograd.graph: a saved tensor pack hook is modifying its input in "
                           "place. Tensors provided as input to pack hook can not be modified by in-place "
                           "operations; pack a copy instead (e.g. return x.clone() after changing it)")
    s = SavedTensor()
    s.packed, s.unpack, s.glob = packed, hooks[1], x._global
    s.grad_fn, s.out_idx, s.rg = x.grad_fn, x._out_idx, x._rg
    s.leaf = x if x._rg and x.grad_fn is None else None
    return s
