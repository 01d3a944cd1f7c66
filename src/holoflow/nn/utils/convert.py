"""``parameters_to_vector`` / ``vector_to_parameters``."""
from __future__ import annotations

from typing import Iterable

from ...core.tensor import Tensor
from ...ops.shape import cat


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """All parameters flattened and concatenated into one 1-D tensor."""
    return cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copies consecutive slices of ``vec`` into ``parameters`` (their storage is replaced)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected Tensor, but got: {type(vec).__name__}")
    pointer = 0
    for param in parameters:
        n = param.numel()
        param.data = vec[pointer:pointer + n].reshape(tuple(param.shape)).data
        pointer += n
