"""``holoflow.utils.global_view``: the global view over nested containers of tensors.

Mirrors ``oneflow.utils.global_view``: :func:`to_global` and :func:`to_local` walk lists, tuples,
dicts (a state dict, a batch) and convert every tensor leaf; :func:`global_mode` is a scope that
supplies the default placement and SBP to those helpers (and to ``nn.Module.to_global``), read
back with :func:`current_global_mode`::

    sd = global_view.to_global(model.state_dict(), placement, flow.sbp.broadcast)
    with global_view.global_mode(True, placement=placement, sbp=flow.sbp.split(0)):
        batch = global_view.to_global({"x": x, "y": y})   # each rank's shard of the batch

A local leaf becomes global as ``Tensor.to_global`` does (this rank's shard; broadcast takes the
first rank's data); a global leaf is boxed. As in OneFlow, creation ops inside an enabled scope
(``arange``, ``zeros``, ``ones``, ``full``, ``randn``, ``tensor``, ...) make global tensors of
the scope's placement and SBP (the given size is the logical size), eagerly and inside
``nn.Graph.build``, so model code that builds position ids or masks runs unchanged.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..core import interpret
from ..core.errors import HoloflowError
from ..core.tensor import Tensor


@dataclass(frozen=True)
class GlobalMode:
    """What :func:`current_global_mode` returns: ``is_enabled``, ``placement``, ``sbp`` (a tuple)."""

    is_enabled: bool = False
    placement: Any = None
    sbp: tuple = ()


class _State(threading.local):
    stack: list


_STATE = _State()


def _stack() -> list:
    if not hasattr(_STATE, "stack"):
        _STATE.stack = []
    return _STATE.stack


def current_global_mode() -> GlobalMode:
    """The innermost :func:`global_mode` scope (disabled outside any)."""
    s = _stack()
    return s[-1] if s else GlobalMode()


@contextlib.contextmanager
def global_mode(enabled: bool, placement=None, sbp=None) -> Iterator[GlobalMode]:
    """A scope whose placement and SBP are the defaults of :func:`to_global` and
    ``nn.Module.to_global``; ``global_mode(False)`` turns an outer scope off. Both placement and
    sbp are required when enabled."""
    if enabled and (placement is None or sbp is None):
        raise HoloflowError("holoflow.utils.global_view.global_mode: both placement= and sbp= are "
                            "required when enabled")
    nd = tuple(sbp) if isinstance(sbp, (list, tuple)) else ((sbp,) if sbp is not None else ())
    mode = GlobalMode(bool(enabled), placement if enabled else None, nd if enabled else ())
    _stack().append(mode)
    try:
        with interpret.pushed(_CreationDefaults(mode)):
            yield mode
    finally:
        _stack().pop()


class _CreationDefaults(interpret.Interpreter):
    """What creation ops without ``placement=`` make inside a ``global_mode`` scope."""

    def __init__(self, mode: GlobalMode) -> None:
        super().__init__()
        self.mode = mode

    def creation_default(self) -> tuple | None:
        return (self.mode.placement, self.mode.sbp) if self.mode.is_enabled else None


def _map(tree: Any, fn: Callable[[Tensor], Tensor], warn: bool, what: str) -> Any:
    if isinstance(tree, Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return type(tree)((k, _map(v, fn, warn, what)) for k, v in tree.items())
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # namedtuple
        return type(tree)(*(_map(v, fn, warn, what) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map(v, fn, warn, what) for v in tree)
    if tree is not None and warn:
        warnings.warn(f"holoflow.utils.global_view.{what}: leaving a leaf of type "
                      f"{type(tree).__name__} unchanged (only tensors are converted)", stacklevel=3)
    return tree


def to_global(input: Any, placement=None, sbp=None, warn_on_non_tensor_leaf: bool = True,  # noqa: A002
              **kwargs: Any) -> Any:
    """Converts every tensor in ``input`` (a tensor, or lists/tuples/dicts of them) to global.

    ``sbp`` is one SBP, an nd-SBP tuple, or a function ``tensor -> sbp``. Missing placement/sbp
    come from the enclosing :func:`global_mode`; a local leaf needs both, a global one at least
    one. ``kwargs`` (``grad_sbp``, ``check_meta``, ``copy``) go to ``Tensor.to_global``.
    """
    mode = current_global_mode()
    if mode.is_enabled:
        placement = placement if placement is not None else mode.placement
        sbp = sbp if sbp is not None else mode.sbp

    def one(t: Tensor) -> Tensor:
        if not t.is_global and (placement is None or sbp is None):
            raise HoloflowError("holoflow.utils.global_view.to_global: a local tensor needs both "
                                "placement= and sbp= (or an enclosing global_mode)")
        if t.is_global and placement is None and sbp is None:
            raise HoloflowError("holoflow.utils.global_view.to_global: give placement= or sbp= "
                                "to convert a global tensor")
        return t.to_global(placement, sbp(t) if callable(sbp) else sbp, **kwargs)
    return _map(input, one, warn_on_non_tensor_leaf, "to_global")


def to_local(input: Any, *, copy: bool = False) -> Any:  # noqa: A002
    """This rank's shard of every global tensor in ``input``; local leaves are returned as they
    are (copied with ``copy=True``)."""
    def one(t: Tensor) -> Tensor:
        return t.to_local(copy=copy) if t.is_global else (t.clone() if copy else t)
    return _map(input, one, False, "to_local")


__all__ = ["to_global", "to_local", "global_mode", "current_global_mode", "GlobalMode"]
