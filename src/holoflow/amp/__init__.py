"""Automatic mixed precision: ``autocast`` (casts at dispatch) and ``GradScaler`` (loss scaling)."""
from .autocast import autocast, get_autocast_dtype, is_autocast_enabled
from .custom import custom_bwd, custom_fwd
from .grad_scaler import GradScaler
from .policy import POLICIES

__all__ = ["autocast", "GradScaler", "get_autocast_dtype", "is_autocast_enabled", "POLICIES", "custom_fwd",
           "custom_bwd"]
