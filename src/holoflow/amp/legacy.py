"""``torch.cuda.amp`` / ``torch.cpu.amp``: the legacy per-device ``autocast`` and ``GradScaler``
spellings, as holoflow's ``autocast(device_type, ...)`` and ``GradScaler(device_type, ...)``."""
from __future__ import annotations

from typing import Any

from .autocast import autocast as _autocast
from .grad_scaler import GradScaler as _GradScaler


def device_amp(device_type: str, default_dtype: Any) -> tuple[type, type]:
    """The ``autocast`` and ``GradScaler`` classes of ``torch.<device_type>.amp`` (autocast's
    default dtype ``default_dtype``), bound to ``device_type``."""

    class autocast(_autocast):
        __doc__ = (f"``torch.{device_type}.amp.autocast(enabled=True, dtype=torch.{default_dtype.name}, "
                   f"cache_enabled=True)``.")

        def __init__(self, enabled: bool = True, dtype: Any = default_dtype, cache_enabled: bool = True) -> None:
            super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    class GradScaler(_GradScaler):
        __doc__ = f"``torch.{device_type}.amp.GradScaler(...)``: holoflow's GradScaler on ``{device_type!r}``."

        def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                     backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
            super().__init__(device_type, init_scale=init_scale, growth_factor=growth_factor,
                             backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)

    autocast.__qualname__, GradScaler.__qualname__ = "autocast", "GradScaler"   # (module-level names)
    return autocast, GradScaler
