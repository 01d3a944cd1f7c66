"""What kernels ask about torch's forward-mode AD (autograd/forward_ad.py): a dual tensor's
storage is a torch dual tensor, whose tangent every torch op carries on, except the few calls a
kernel makes for its own bookkeeping (an alias by ``detach``, a private fused kernel without a
forward formula)."""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as _torch_fw


def any_level() -> bool:
    """Whether a forward-AD level is entered (dual tensors may exist)."""
    return _torch_fw._current_level >= 0


def tangent_of(data: torch.Tensor) -> torch.Tensor | None:
    """The forward-AD tangent ``data`` carries at the current level (None outside any level)."""
    if _torch_fw._current_level < 0:
        return None
    return _torch_fw.unpack_dual(data).tangent


def any_dual(*datas: torch.Tensor | None) -> bool:
    """Whether any of ``datas`` carries a tangent (a kernel then takes a path torch differentiates
    in forward mode)."""
    return _torch_fw._current_level >= 0 and any(d is not None and tangent_of(d) is not None for d in datas)


def alias(data: torch.Tensor) -> torch.Tensor:
    """``data.detach()``, a new alias of the storage that is no torch view, keeping ``data``'s
    tangent (torch's detach drops it): the tangent follows the storage as torch's in-place and
    unsafe ops make it."""
    out = data.detach()
    tangent = tangent_of(data)
    return out if tangent is None else _torch_fw.make_dual(out, tangent)
