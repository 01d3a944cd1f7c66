"""The compiled part of the core, if built: ``FAST`` is core/_fast.c's module (the eager per-op
path and the backward loop) or None, where the extension was not built or
``HOLOFLOW_PURE_PYTHON=1`` asks for the Python reference (dispatch._eager_py, autograd._drain)."""
from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("HOLOFLOW_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _fast
    except ImportError:
        return None
    return _fast


FAST = _load()
