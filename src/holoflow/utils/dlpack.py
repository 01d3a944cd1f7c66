"""``holoflow.utils.dlpack``: zero-copy exchange with other array libraries through DLPack."""
from __future__ import annotations

from typing import Any

import torch

from ..core.tensor import Tensor

__all__ = ["to_dlpack", "from_dlpack"]


def to_dlpack(tensor: Tensor) -> Any:
    """A DLPack capsule sharing ``tensor``'s memory (a global tensor is gathered first)."""
    return torch.utils.dlpack.to_dlpack(tensor.to_torch())


def from_dlpack(ext: Any) -> Tensor:
    """A holoflow tensor sharing memory with ``ext`` (an object with ``__dlpack__`` or a capsule)."""
    return Tensor._make(torch.utils.dlpack.from_dlpack(ext))
