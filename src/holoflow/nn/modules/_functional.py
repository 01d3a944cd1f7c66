"""``F``: ``holoflow.nn.functional``, looked up at call time.

functional.py is written alongside this package; resolving names when a layer runs keeps
``import holoflow`` working while a function is still missing and names the missing one.
"""
from __future__ import annotations

import importlib
from typing import Any


class _Functional:
    def __getattr__(self, name: str) -> Any:
        mod = importlib.import_module("holoflow.nn.functional")
        try:
            return getattr(mod, name)
        except AttributeError:
            raise NotImplementedError(f"holoflow.nn.functional.{name} is not implemented yet; the "
                                      f"layer that called it needs it") from None


F = _Functional()
