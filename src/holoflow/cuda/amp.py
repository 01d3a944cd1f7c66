"""``holoflow.cuda.amp``: the legacy ``torch.cuda.amp.autocast``/``GradScaler``/``custom_fwd``/
``custom_bwd`` spellings, as holoflow's ``autocast("cuda", ...)``, ``GradScaler("cuda", ...)`` and
``holoflow.amp.custom_fwd(device_type="cuda")`` (deprecated, with torch's FutureWarning)."""
from __future__ import annotations

import warnings
from typing import Any, Callable

from ..amp import custom as _custom
from ..amp.legacy import device_amp
from ..core.dtype import float16

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]

autocast, GradScaler = device_amp("cuda", float16)
autocast.__module__ = GradScaler.__module__ = __name__


def custom_fwd(fwd: Callable | None = None, *, cast_inputs: Any = None) -> Callable:
    """``torch.cuda.amp.custom_fwd``: ``holoflow.amp.custom_fwd(..., device_type="cuda")``."""
    warnings.warn("`torch.cuda.amp.custom_fwd(args...)` is deprecated. Please use "
                  "`torch.amp.custom_fwd(args..., device_type='cuda')` instead.", FutureWarning, stacklevel=2)
    return _custom.custom_fwd(fwd, device_type="cuda", cast_inputs=cast_inputs)


def custom_bwd(bwd: Callable | None = None) -> Callable:
    """``torch.cuda.amp.custom_bwd``: ``holoflow.amp.custom_bwd(..., device_type="cuda")``."""
    warnings.warn("`torch.cuda.amp.custom_bwd(args...)` is deprecated. Please use "
                  "`torch.amp.custom_bwd(args..., device_type='cuda')` instead.", FutureWarning, stacklevel=2)
    return _custom.custom_bwd(bwd, device_type="cuda")
