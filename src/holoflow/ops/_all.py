"""Imports every op module so the registry is full and their public functions are exported."""
from __future__ import annotations

import importlib

_MODULES = ["reduction", "linalg", "shape", "indexing", "nn_ops", "loss", "random_ops"]
__all__: list[str] = []
for _m in _MODULES:
    try:
        _mod = importlib.import_module(f"holoflow.ops.{_m}")
    except ModuleNotFoundError as e:
        if e.name != f"holoflow.ops.{_m}":
            raise
        continue
    for _name in getattr(_mod, "__all__", ()):
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)
