"""Modules that forward to a torch module: settings of torch's kernels, which holoflow runs on.

``torch.backends.cudnn.benchmark = True`` or ``torch.cuda.max_memory_allocated()`` act on the
kernels holoflow calls, so holoflow's modules of those names read and write torch's own.
"""
from __future__ import annotations

import sys
import types
from typing import Any


class ForwardingModule(types.ModuleType):
    """A module whose missing attributes are read from (and written to) ``_torch_target``.

    A name holoflow overrides (:func:`override`) is the module's own function, yet a write through
    the module reaches torch's too: ``unittest.mock.patch("torch.cuda.set_rng_state", f)`` under
    mock_torch (AOTAutograd's, while Inductor compiles) must patch what torch's code calls, and
    restoring holoflow's function (or deleting the patch) restores torch's original."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_torch_target"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        own = self.__dict__.get("_overrides", {}).get(name)
        if own is not None:
            super().__setattr__(name, value)
            setattr(self.__dict__["_torch_target"], name, own[1] if value is own[0] else value)
        elif name in self.__dict__ or name.startswith("_"):
            super().__setattr__(name, value)
        else:
            setattr(self.__dict__["_torch_target"], name, value)

    def __delattr__(self, name: str) -> None:
        # where __setattr__ set: unittest.mock.patch deletes what it set before restoring
        own = self.__dict__.get("_overrides", {}).get(name)
        if own is not None:
            self.__setattr__(name, own[0])
        elif name in self.__dict__ or name.startswith("_"):
            super().__delattr__(name)
        else:
            delattr(self.__dict__["_torch_target"], name)

    def __dir__(self) -> list[str]:
        return sorted(set(self.__dict__) | set(dir(self.__dict__["_torch_target"])))


def forward_module(name: str, target: types.ModuleType) -> None:
    """Turns the already-imported module ``name`` into a forwarder to ``target``."""
    mod = sys.modules[name]
    mod.__class__ = ForwardingModule
    mod.__dict__["_torch_target"] = target


def override(name: str, fns: dict[str, Any]) -> None:
    """Makes ``fns`` (attribute name -> function) the forwarding module ``name``'s own, in place of
    its torch target's functions of those names (see :class:`ForwardingModule`)."""
    mod = sys.modules[name]
    target = mod.__dict__["_torch_target"]
    mod.__dict__.setdefault("_overrides", {}).update((k, (f, getattr(target, k))) for k, f in fns.items())
    mod.__dict__.update(fns)
