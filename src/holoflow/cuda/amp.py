"""``holoflow.cuda.amp``: the legacy ``torch.cuda.amp.autocast``/``GradScaler`` spellings, as
holoflow's ``autocast("cuda", ...)`` and ``GradScaler("cuda", ...)``."""
from __future__ import annotations

from ..amp.autocast import autocast as _autocast
from ..amp.grad_scaler import GradScaler as _GradScaler
from ..core.dtype import float16

__all__ = ["autocast", "GradScaler"]


class autocast(_autocast):
    """``torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True)``."""

    def __init__(self, enabled: bool = True, dtype=float16, cache_enabled: bool = True) -> None:
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(_GradScaler):
    """``torch.cuda.amp.GradScaler(...)``: holoflow's GradScaler on ``"cuda"``."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)

