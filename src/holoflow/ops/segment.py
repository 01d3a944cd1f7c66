"""``segment_reduce``: reductions over consecutive segments of one axis, as
``torch.segment_reduce`` (sum, mean, max, min, prod; segments given by ``lengths`` or
``offsets``). A primitive on ATen's kernel with ATen's derivative (ops/torch_vjp.py), so empty
segments, ties in max/min and ``initial`` get torch's values and gradients. SBP: broadcast.
"""
from __future__ import annotations

from typing import Any

import torch

from ..core.dispatch import apply
from ..core.sbp import B
from ..core.tensor import Tensor
from .torch_vjp import defop_vjp

__all__ = ["segment_reduce"]

_REDUCTIONS = ("sum", "mean", "max", "min", "prod")


def _kernel(data, index, reduce, axis, unsafe, initial, by_offsets):
    where = {"offsets" if by_offsets else "lengths": index}
    try:
        return torch.segment_reduce(data, reduce, axis=axis, unsafe=unsafe, initial=initial, **where)
    except RuntimeError as e:
        raise type(e)(f"holoflow.segment_reduce: {str(e).splitlines()[0]}") from None


SEGMENT_REDUCE = defop_vjp("segment_reduce", _kernel,
                           sbp=lambda metas, attrs: [((B, B), (B,))],
                           bwd_sbp=lambda metas, attrs: [((B,) * len(metas), (B,) * len(attrs["diff"]))],
                           family="reduce")


def segment_reduce(data: Tensor, reduce: str, *, lengths: Tensor | None = None, indices: Tensor | None = None,
                   offsets: Tensor | None = None, axis: int = 0, unsafe: bool = False,
                   initial: Any = None) -> Tensor:
    """Reduces ``data`` along ``axis`` over consecutive segments, as ``torch.segment_reduce``:
    segment ``i`` has ``lengths[..., i]`` elements (or spans ``offsets[..., i]:offsets[..., i+1]``).
    ``reduce`` is ``'sum'``, ``'mean'``, ``'max'``, ``'min'`` or ``'prod'``; an empty segment gives
    ``initial`` if given, else the reduction's identity (NaN for mean). Differentiable in ``data``."""
    if not isinstance(data, Tensor):
        raise TypeError(f"holoflow.segment_reduce(): argument 'data' must be a Tensor, not {type(data).__name__}")
    if reduce not in _REDUCTIONS:
        raise RuntimeError(f"holoflow.segment_reduce: reduce must be one of {', '.join(_REDUCTIONS)}; got {reduce!r}")
    if indices is not None:
        raise RuntimeError("holoflow.segment_reduce: indices are not supported (as in torch); pass lengths or "
                           "offsets")
    if (lengths is None) == (offsets is None):
        raise RuntimeError("holoflow.segment_reduce: pass exactly one of lengths and offsets")
    index = lengths if lengths is not None else offsets
    if not isinstance(index, Tensor):
        raise TypeError(f"holoflow.segment_reduce: lengths/offsets must be a Tensor, not {type(index).__name__}")
    axis = int(axis) + (data.dim() if axis < 0 else 0)
    return apply(SEGMENT_REDUCE, data, index, reduce=reduce, axis=axis, unsafe=bool(unsafe),
                 initial=initial, by_offsets=offsets is not None)
