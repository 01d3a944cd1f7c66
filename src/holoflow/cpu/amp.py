"""``holoflow.cpu.amp``: the legacy ``torch.cpu.amp.autocast``/``GradScaler`` spellings, as
holoflow's ``autocast("cpu", ...)`` and ``GradScaler("cpu", ...)``."""
from __future__ import annotations

from typing import Any

from ..amp.autocast import autocast as _autocast
from ..amp.grad_scaler import GradScaler as _GradScaler
from ..core.dtype import bfloat16

__all__ = ["autocast", "GradScaler"]


class autocast(_autocast):
    """``torch.cpu.amp.autocast(enabled=True, dtype=torch.bfloat16, cache_enabled=True)``."""

    def __init__(self, enabled: bool = True, dtype: Any = bfloat16, cache_enabled: bool = True) -> None:
        super().__init__("cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(_GradScaler):
    """``torch.cpu.amp.GradScaler(...)``: holoflow's GradScaler on ``"cpu"``."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        super().__init__("cpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
