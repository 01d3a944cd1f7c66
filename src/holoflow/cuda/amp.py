"""``holoflow.cuda.amp``: the legacy ``torch.cuda.amp.autocast``/``GradScaler`` spellings, as
holoflow's ``autocast("cuda", ...)`` and ``GradScaler("cuda", ...)``."""
from __future__ import annotations

from ..amp.legacy import device_amp
from ..core.dtype import float16

__all__ = ["autocast", "GradScaler"]

autocast, GradScaler = device_amp("cuda", float16)
autocast.__module__ = GradScaler.__module__ = __name__
