"""``nn.utils.stateless``: running a module with other tensors in place of its parameters and
buffers (``functional_call``, torch's deprecated spelling of ``torch.func.functional_call``).

:func:`swapped` is the machinery both spellings share (``holoflow.func.functional_call`` sits in
the facade and imports it from here)."""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

from ...core.tensor import Tensor
from ..module import Module
from ..modules.compat import DataParallel

__all__ = ["functional_call"]


def _owner(module: Module, name: str) -> tuple[Module, str]:
    *path, leaf = name.split(".")
    m = module
    for p in path:
        m = getattr(m, p)
    return m, leaf


_MISSING = object()


def _attr_owner(module: Module, name: str, who: str) -> tuple[Module, str]:
    """The module holding ``name`` (a dotted path) for a key that names no parameter or buffer:
    every module on the path must exist, as torch's."""
    *path, leaf = name.split(".")
    m = module
    for p in path:
        if not isinstance(getattr(m, p, None), Module):
            raise AttributeError(f"holoflow.{who}: {type(m).__name__} has no attribute `{p}` (key {name!r})")
        m = getattr(m, p)
    return m, leaf


def _check_strict(module: Module, names: dict, values: dict, plan: dict, who: str) -> None:
    unexpected = sorted(k for k in values if k not in names)
    missing = sorted(k for k in names if k not in plan)   # (a tied alias of a given key is given)
    errors = ([f"Unexpected key(s): {', '.join(map(repr, unexpected))}."] if unexpected else []) + \
             ([f"Missing key(s): {', '.join(map(repr, missing))}."] if missing else [])
    if errors:
        raise RuntimeError(f"holoflow.{who}: Error(s) in reparametrizing for {type(module).__name__}:\n\t"
                           + "\n\t".join(errors))


@contextlib.contextmanager
def swapped(module: Module, values: dict, tie_weights: bool, strict: bool,
            who: str = "func.functional_call") -> Iterator[None]:
    """``module`` with the parameters/buffers named in ``values`` replaced for the block (tied
    ones too when ``tie_weights``), restored afterwards whatever happens; errors name
    ``holoflow.<who>``. A key naming no parameter or buffer sets that attribute (a plain tensor
    attribute, or a new one) for the block, as torch's; ``strict=True`` refuses such keys and
    requires every parameter and buffer (tied aliases count as given)."""
    names = dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers(remove_duplicate=False))
    by_id: dict = {}
    for k, v in values.items():
        if k in names:
            by_id.setdefault(id(names[k]), []).append((k, v))
    if tie_weights:   # one tensor under several names takes one value (torch's ValueError)
        for given in by_id.values():
            if len({id(v) for _, v in given}) > 1:
                raise ValueError(f"holoflow.{who}: functional_call got multiple values for keys "
                                 f"{sorted(k for k, _ in given)}, which are tied. Consider using "
                                 f"tie_weights=False")
    plan = {k: by_id[id(t)][0][1] if tie_weights and id(t) in by_id else values[k]
            for k, t in names.items() if k in values or (tie_weights and id(t) in by_id)}
    if strict:
        _check_strict(module, names, values, plan, who)
    attrs = []
    for k in values:
        if k not in names:
            m, leaf = _attr_owner(module, k, who)
            old = m.__dict__.get(leaf, _MISSING)
            if old is not _MISSING and not isinstance(old, Tensor):
                raise TypeError(f"holoflow.{who}: attribute `{k}`: {type(old).__name__} is not a Tensor")
            attrs.append((m, leaf, old, values[k]))
    saved, set_attrs = [], []
    try:
        for k, v in plan.items():
            m, leaf = _owner(module, k)
            store = m._parameters if leaf in m._parameters else m._buffers
            saved.append((store, leaf, store[leaf]))
            store[leaf] = v
        for m, leaf, old, v in attrs:
            m.__dict__[leaf] = v
            set_attrs.append((m, leaf, old))
        yield
    finally:
        for store, leaf, old in reversed(saved):
            store[leaf] = old
        for m, leaf, old in reversed(set_attrs):
            if old is _MISSING:
                m.__dict__.pop(leaf, None)
            else:
                m.__dict__[leaf] = old


def functional_call(module: Module, parameters_and_buffers: dict[str, Tensor], args: Any = None,
                    kwargs: dict[str, Any] | None = None, *, tie_weights: bool = True, strict: bool = False) -> Any:
    """``module(*args, **kwargs)`` with its parameters and buffers replaced by the tensors of
    ``parameters_and_buffers`` (by qualified name), as torch's deprecated
    ``torch.nn.utils.stateless.functional_call``: use ``holoflow.func.functional_call``."""
    warnings.warn("`holoflow.nn.utils.stateless.functional_call` is deprecated (as torch's is since PyTorch "
                  "2.0) and will be removed in a future version. Please use `holoflow.func.functional_call` "
                  "instead which is a drop-in replacement.", FutureWarning, stacklevel=2)
    if isinstance(module, DataParallel):
        raise RuntimeError("holoflow.nn.utils.stateless.functional_call: The stateless API can't be used with "
                           "nn.DataParallel module; call it on the wrapped module (.module)")
    args = () if args is None else args if isinstance(args, tuple) else (args,)
    with swapped(module, parameters_and_buffers, tie_weights, strict, "nn.utils.stateless.functional_call"):
        return module(*args, **(kwargs or {}))
