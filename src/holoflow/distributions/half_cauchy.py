"""``HalfCauchy(scale)``: ``|X|`` for ``X ~ Cauchy(0, scale)``."""
from __future__ import annotations

import math
from typing import Any

from ..core.tensor import Tensor
from ..ops.creation import full
from .cauchy import Cauchy
from .folded import FoldedAtZero
from .transforms import AbsTransform

__all__ = ["HalfCauchy"]


class HalfCauchy(FoldedAtZero):
    """A Cauchy folded at 0: density ``2 / (pi scale (1 + (x / scale)^2))`` on x >= 0."""

    def __init__(self, scale: Any, validate_args: bool | None = None) -> None:
        super().__init__(Cauchy(0, scale, validate_args=False), AbsTransform(), validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "HalfCauchy":
        new = self._get_checked_instance(HalfCauchy, _instance)
        return super().expand(batch_shape, _instance=new)

    @property
    def mean(self) -> Tensor:
        return full(self._extended_shape(), math.inf, dtype=self.scale.dtype, device=self.scale.device)

    @property
    def variance(self) -> Tensor:
        return self.base_dist.variance
