"""Dropout layers: active in training mode, the identity in eval mode."""
from __future__ import annotations

from ...core.tensor import Tensor

from ..module import Module
from .. import functional as F


class _DropoutNd(Module):
    _fn = "dropout"

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input: Tensor) -> Tensor:
        return getattr(F, self._fn)(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    """Zeroes each element with probability ``p`` and scales the rest by ``1 / (1 - p)``."""

    _fn = "dropout"


class Dropout1d(_DropoutNd):
    """Zeroes whole channels of ``(N, C, L)`` input."""

    _fn = "dropout1d"


class Dropout2d(_DropoutNd):
    """Zeroes whole channels of ``(N, C, H, W)`` input."""

    _fn = "dropout2d"


class Dropout3d(_DropoutNd):
    """Zeroes whole channels of ``(N, C, D, H, W)`` input."""

    _fn = "dropout3d"


class AlphaDropout(_DropoutNd):
    """Dropout that keeps SELU's self-normalising mean and variance."""

    _fn = "alpha_dropout"
