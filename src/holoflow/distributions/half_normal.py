"""``HalfNormal(scale)``: ``|X|`` for ``X ~ Normal(0, scale)``."""
from __future__ import annotations

import math
from typing import Any

from ..core.tensor import Tensor
from .normal import Normal
from .folded import FoldedAtZero
from .transforms import AbsTransform

__all__ = ["HalfNormal"]


class HalfNormal(FoldedAtZero):
    """A Normal folded at 0: density ``2 N(x; 0, scale)`` on x >= 0."""

    def __init__(self, scale: Any, validate_args: bool | None = None) -> None:
        super().__init__(Normal(0, scale, validate_args=False), AbsTransform(), validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "HalfNormal":
        new = self._get_checked_instance(HalfNormal, _instance)
        return super().expand(batch_shape, _instance=new)

    @property
    def mean(self) -> Tensor:
        return self.scale * math.sqrt(2 / math.pi)

    @property
    def variance(self) -> Tensor:
        return self.scale.pow(2) * (1 - 2 / math.pi)
