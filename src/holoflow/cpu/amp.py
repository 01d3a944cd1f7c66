"""``holoflow.cpu.amp``: the legacy ``torch.cpu.amp.autocast``/``GradScaler`` spellings, as
holoflow's ``autocast("cpu", ...)`` and ``GradScaler("cpu", ...)``."""
from __future__ import annotations

from ..amp.legacy import device_amp
from ..core.dtype import bfloat16

__all__ = ["autocast", "GradScaler"]

autocast, GradScaler = device_amp("cpu", bfloat16)
autocast.__module__ = GradScaler.__module__ = __name__
