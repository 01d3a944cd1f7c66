"""``nn.utils.memory_format``: the weights of (transposed) convolutions restrided to a memory
format (``channels_last`` for NHWC kernels), as ``torch.nn.utils.memory_format``."""
from __future__ import annotations

from typing import TypeVar

import torch

from ...core.tensor import Tensor
from ..module import Module
from ..modules.conv import Conv2d, Conv3d, ConvTranspose2d, ConvTranspose3d

__all__ = ["convert_conv2d_weight_memory_format", "convert_conv3d_weight_memory_format"]

_M = TypeVar("_M", bound=Module)


def _restride(who: str, weight: Tensor, memory_format: torch.memory_format, legal: str) -> None:
    """``weight``'s values in ``memory_format``'s strides, as torch's ``clone`` then ``resize_``
    (the shard of a global weight: strides are each rank's own), set through ``.data``."""
    try:
        data = weight._data.detach().clone(memory_format=memory_format)
        data = data.resize_(data.size(), memory_format=memory_format)
    except RuntimeError as e:
        raise RuntimeError(f"holoflow.nn.utils.{who}: {e} (memory_format={memory_format}); use {legal}") from e
    new = weight.detach()   # (keeps a global weight's placement and SBP)
    new._data = data
    weight.data = new


def convert_conv2d_weight_memory_format(module: _M, memory_format: torch.memory_format) -> _M:
    """Restrides the weight of every ``Conv2d`` / ``ConvTranspose2d`` in ``module`` (itself
    included, recursively) to ``memory_format``; returns ``module``."""
    if isinstance(module, (Conv2d, ConvTranspose2d)):
        _restride("convert_conv2d_weight_memory_format", module.weight, memory_format,
                  "holoflow.channels_last or holoflow.contiguous_format")
    for child in module.children():
        convert_conv2d_weight_memory_format(child, memory_format)
    return module


def convert_conv3d_weight_memory_format(module: _M, memory_format: torch.memory_format) -> _M:
    """Restrides the weight of every ``Conv3d`` / ``ConvTranspose3d`` in ``module`` (itself
    included, recursively) to ``memory_format``; returns ``module``."""
    if isinstance(module, (Conv3d, ConvTranspose3d)):
        _restride("convert_conv3d_weight_memory_format", module.weight, memory_format,
                  "holoflow.channels_last_3d or holoflow.contiguous_format")
    for child in module.children():
        convert_conv3d_weight_memory_format(child, memory_format)
    return module
