"""``autograd.graph.allow_mutation_on_saved_tensors``: tensors saved for backward may be written in
place inside the block; the first write to a saved tensor's memory clones it first, and backward
reads the clone (the values forward saw), as torch's.

Two parts, as torch's: saved-tensor hooks (core/saved.py) pack each saved tensor as a handle
keyed by its storage, and a ``TorchDispatchMode`` sees every ATen op holoflow's kernels run (the
in-place ops, ``copy_`` of an assignment, an optimizer's foreach kernels) and, before one that
writes a storage some handle holds, clones what the handle holds. Backward outside the block that
recorded the graph raises torch's AssertionError; blocks do not nest (RuntimeError).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Generator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..core import saved
from ..core.tensor import Tensor

__all__ = ["allow_mutation_on_saved_tensors"]

_ACTIVE = threading.Lock()   # (held while a block is open: blocks do not nest)
_IDS = itertools.count()


def _storage_key(d: torch.Tensor) -> int:
    return d.untyped_storage().data_ptr() if d.numel() else -1


class _AllowMutationOnSavedContext:
    """What a block holds: per handle, the saved tensor (``original``) until a write to its memory
    clones it (``cloned``); per storage, the handles saved from it."""

    def __init__(self) -> None:
        self.original: dict[int, Tensor] = {}
        self.cloned: dict[int, torch.Tensor] = {}
        self.by_storage: dict[int, set[int]] = {}
        self.open = True

    def pack(self, t: Tensor) -> tuple:
        handle = next(_IDS)
        self.original[handle] = t
        key = _storage_key(t._data)
        if key >= 0:
            self.by_storage.setdefault(key, set()).add(handle)
        return self, handle

    @staticmethod
    def unpack(packed: tuple) -> Tensor:
        ctx, handle = packed
        if not ctx.open:
            raise AssertionError("holoflow: trying to backward outside of the 'allow_mutation_on_saved_tensors' "
                                 "context in which the graph was originally recorded; run backward inside it")
        if handle in ctx.cloned:
            return Tensor._make(ctx.cloned[handle])
        return ctx.original[handle]

    def before_write(self, d: torch.Tensor) -> None:
        """Clones every saved tensor of ``d``'s storage not cloned yet (``d`` is about to change)."""
        for handle in self.by_storage.pop(_storage_key(d), ()):
            t = self.original.pop(handle, None)
            if t is not None:
                self.cloned[handle] = t._data.clone()

    def clear(self) -> None:
        self.open = False
        self.original.clear()
        self.cloned.clear()
        self.by_storage.clear()


class _CloneBeforeMutate(TorchDispatchMode):
    """Before an ATen op writes a tensor argument (in place, ``out=``, or a foreach list), the
    saved tensors of its storage are cloned."""

    def __init__(self, ctx: _AllowMutationOnSavedContext) -> None:
        super().__init__()
        self.ctx = ctx

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.ctx.by_storage:
            for i, arg in enumerate(func._schema.arguments):
                if arg.alias_info is None or not arg.alias_info.is_write:
                    continue
                value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
                for t in (value if isinstance(value, (list, tuple)) else (value,)):
                    if isinstance(t, torch.Tensor):
                        self.ctx.before_write(t)
        return func(*args, **kwargs)


@contextlib.contextmanager
def allow_mutation_on_saved_tensors() -> Generator[_AllowMutationOnSavedContext, None, None]:
    """Inside the block, a tensor saved for backward may be written in place: the write clones
    it first, and backward (run inside the block too) reads the values forward saved.

    >>> with holoflow.autograd.graph.allow_mutation_on_saved_tensors():
    ...     a = holoflow.ones(2, 3, requires_grad=True)
    ...     b = a.clone()
    ...     out = (b ** 2).sum()
    ...     b.sin_()
    ...     out.backward()      # a.grad == 2 (b's values before sin_)
    """
    if not _ACTIVE.acquire(blocking=False):
        raise RuntimeError("holoflow: allow_mutation_on_saved_tensors contexts cannot be nested")
    ctx = _AllowMutationOnSavedContext()
    try:
        saved.push(ctx.pack, ctx.unpack)
        try:
            with _CloneBeforeMutate(ctx):
                yield ctx
        finally:
            saved.pop()
    finally:
        ctx.clear()
        _ACTIVE.release()
