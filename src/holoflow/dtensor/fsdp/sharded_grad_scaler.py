"""torch's ``ShardedGradScaler`` (``torch.distributed.fsdp.sharded_grad_scaler``): holoflow's
``GradScaler`` already checks sharded (global) gradients for inf/nan across their ranks, so every
rank skips the same steps; this is it under torch's FSDP name and arguments."""
from __future__ import annotations

from typing import Any

from ...amp.grad_scaler import GradScaler

__all__ = ["ShardedGradScaler"]


class ShardedGradScaler(GradScaler):
    """``GradScaler`` for FSDP's sharded gradients (``process_group`` is accepted: each gradient's
    own ranks are the ones its inf/nan count is summed over)."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16, backoff_factor: float = 0.5,
                 growth_factor: float = 2.0, growth_interval: int = 2000, enabled: bool = True,
                 process_group: Any = None) -> None:
        super().__init__(device, init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)
        self.process_group = process_group
