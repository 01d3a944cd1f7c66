"""Wires the global view into Tensor: ``to_global``/``to_local`` methods. Importing this module
also brings in the global interpreter (global_dispatch.py), which global tensors and placements
point at."""
from __future__ import annotations

from . import global_dispatch  # noqa: F401  (defines the global interpreter)
from . import global_tensor


def install() -> None:
    global_tensor.install()
