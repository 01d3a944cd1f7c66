"""Modules that forward to a torch module: settings of torch's kernels, which holoflow runs on.

``torch.backends.cudnn.benchmark = True`` or ``torch.cuda.max_memory_allocated()`` act on the
kernels holoflow calls, so holoflow's modules of those names read and write torch's own.
"""
from __future__ import annotations

import sys
import types
from typing import Any


class ForwardingModule(types.ModuleType):
    """A module whose missing attributes are read from (and written to) ``_torch_target``."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_torch_target"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__ or name.startswith("_"):
            super().__setattr__(name, value)
        else:
            setattr(self.__dict__["_torch_target"], name, value)

    def __delattr__(self, name: str) -> None:
        # where __setattr__ set: unittest.mock.patch deletes what it set before restoring
        if name in self.__dict__ or name.startswith("_"):
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
