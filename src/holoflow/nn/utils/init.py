"""``nn.utils.init``: ``skip_init``, a module built without running its initialisation, as
``torch.nn.utils.init``."""
from __future__ import annotations

import inspect
from typing import Any, TypeVar

from ..module import Module

__all__ = ["skip_init"]

_M = TypeVar("_M", bound=Module)


def skip_init(module_cls: type[_M], *args: Any, **kwargs: Any) -> _M:
    """``module_cls(*args, **kwargs)`` with uninitialised parameters and buffers: built on the
    meta device (no memory, no initialiser runs), then given empty storage on ``device`` (default
    "cpu"). The class must take a ``device`` argument."""
    if not issubclass(module_cls, Module):
        raise RuntimeError(f"holoflow.nn.utils.skip_init: Expected a Module; got {module_cls} (pass a "
                           f"subclass of holoflow.nn.Module)")
    if "device" not in inspect.signature(module_cls).parameters:
        raise RuntimeError(f"holoflow.nn.utils.skip_init: Module must support a 'device' arg to skip "
                           f"initialization; {module_cls.__name__}'s constructor has none")
    final_device = kwargs.pop("device", "cpu")
    kwargs["device"] = "meta"
    return module_cls(*args, **kwargs).to_empty(device=final_device)
