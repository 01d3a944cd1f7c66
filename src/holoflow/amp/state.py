"""torch's autocast state functions on holoflow's autocast regions: ``set_autocast_enabled``,
``set_autocast_dtype``, the ``*_cpu_*`` forms, and the cast cache's switches.

The state is the innermost autocast region (the interpreter ``autocast`` pushes). Inside a region a
change lasts until it exits, as torch restores its state there; outside any region, enabling pushes
a region that stays until disabled (torch's thread-local switch), and a dtype set becomes the
default of later regions.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from ..core import dtype as _dtype
from ..core import interpret
from .autocast import _BASE_REGION, Autocast, _CastCache, _current, get_autocast_dtype, is_autocast_enabled
from .policy import DEFAULT_DTYPE

__all__ = ["is_autocast_cpu_enabled", "set_autocast_enabled", "set_autocast_dtype", "get_autocast_cpu_dtype",
           "set_autocast_cpu_enabled", "set_autocast_cpu_dtype", "clear_autocast_cache",
           "is_autocast_cache_enabled", "set_autocast_cache_enabled"]




def _dev_type(device_type: Any) -> str:
    if not isinstance(device_type, str):
        raise TypeError(f"holoflow: device_type must be a string such as 'cpu' or 'cuda', got {device_type!r}")
    return torch.device(device_type).type


def set_autocast_enabled(device_type: Any, enabled: bool | None = None) -> None:
    """Turns autocast on or off for ``device_type`` (``set_autocast_enabled(flag)``: CUDA, torch's
    legacy form), as ``torch.set_autocast_enabled``. Inside an ``autocast`` region the change
    lasts until the region exits (as torch restores its state there)."""
    if enabled is None:
        device_type, enabled = "cuda", device_type
    dev = _dev_type(device_type)
    region = _current()
    if region is None:
        if not enabled:
            return
        ctx = interpret.pushed(Autocast({}, _CastCache() if is_autocast_cache_enabled() else None))
        region = ctx.__enter__()
        _BASE_REGION.ctx, _BASE_REGION.region = ctx, region   # kept referenced: its exit pops it
    region.modes[dev] = _dtype.to_torch(get_autocast_dtype(dev)) if enabled else None
    region.idle = all(m is None for m in region.modes.values())
    if region.idle and region is _BASE_REGION.region:   # all off again: nothing left on the stack
        ctx, _BASE_REGION.ctx, _BASE_REGION.region = _BASE_REGION.ctx, None, None
        ctx.__exit__(None, None, None)


def set_autocast_dtype(device_type: str, dtype: Any) -> None:
    """The low-precision dtype of autocast on ``device_type``, as ``torch.set_autocast_dtype``:
    the dtype of the active region, else the default of later ``autocast(device_type)`` regions."""
    dev, dt = _dev_type(device_type), _dtype.to_torch(dtype)
    region = _current()
    if region is not None and region.modes.get(dev) is not None:
        region.modes[dev] = dt
    else:
        DEFAULT_DTYPE[dev] = str(dt).replace("torch.", "")


def is_autocast_cpu_enabled() -> bool:
    return is_autocast_enabled("cpu")


def set_autocast_cpu_enabled(enabled: bool) -> None:
    set_autocast_enabled("cpu", enabled)


def get_autocast_cpu_dtype() -> _dtype.dtype:
    return get_autocast_dtype("cpu")


def set_autocast_cpu_dtype(dtype: Any) -> None:
    set_autocast_dtype("cpu", dtype)


class _CacheSwitch(threading.local):
    enabled = True


_CACHE = _CacheSwitch()


def is_autocast_cache_enabled() -> bool:
    """Whether autocast reuses the casts of leaf parameters (the active region's, else the switch)."""
    region = _current()
    return _CACHE.enabled if region is None else region.cache is not None


def set_autocast_cache_enabled(enabled: bool) -> None:
    _CACHE.enabled = bool(enabled)
    region = _current()
    if region is not None and (region.cache is not None) != bool(enabled):
        region.cache = _CastCache() if enabled else None


def clear_autocast_cache() -> None:
    """Drops the cached casts of every active autocast region, as ``torch.clear_autocast_cache``."""
    for it in interpret.stack():
        if isinstance(it, Autocast) and it.cache is not None:
            it.cache.entries.clear()
