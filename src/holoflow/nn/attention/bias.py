"""``holoflow.nn.attention.bias``, as ``torch.nn.attention.bias``: causal masks described by
their variant (``CausalVariant.UPPER_LEFT``: ``tril`` of the (L, S) scores, ``is_causal``'s;
``LOWER_RIGHT``: aligned to the last row, ``tril(diagonal=S - L)``), passed as ``attn_mask``."""
from __future__ import annotations

from typing import Any

from ...ops.attention import CausalBias, causal_variant

__all__ = ["CausalBias", "CausalVariant", "causal_upper_left", "causal_lower_right"]  # noqa: F822 (__getattr__)


def __getattr__(name: str) -> Any:
    if name == "CausalVariant":   # (torch's enum, imported at first use: ops/attention.py says why)
        return causal_variant()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _size(name: str, size: tuple) -> tuple[int, int]:
    if len(size) != 2:
        raise AssertionError(f"{name} only supports 2D tensors")
    return size[0], size[1]


def causal_upper_left(*size: int) -> CausalBias:
    """The upper-left causal bias of ``size`` = (L, S): ``tril(ones(L, S))``."""
    return CausalBias(causal_variant().UPPER_LEFT, *_size("causal_upper_left", size))


def causal_lower_right(*size: int) -> CausalBias:
    """The lower-right causal bias of ``size`` = (L, S): ``tril(ones(L, S), diagonal=S - L)``."""
    return CausalBias(causal_variant().LOWER_RIGHT, *_size("causal_lower_right", size))
