"""Wires the global view into the core: the dispatch hook, creation with placement/sbp, Tensor
methods, and the autograd seeding of global outputs."""
from __future__ import annotations

from ..core.dispatch import Hooks
from ..ops import creation
from . import global_tensor
from .global_dispatch import global_apply


def install() -> None:
    Hooks.global_apply = global_apply
    creation.GLOBAL_MAKER[0] = global_tensor.from_full
    global_tensor.install()
