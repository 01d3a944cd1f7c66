"""Distances between rows: nn.functional's ``pairwise_distance`` and ``pdist`` (``cdist`` is a
primitive in ops/decomp.py).

Composites of norms and index_select: their gradients and SBP rules come from the parts.
"""
from __future__ import annotations

import torch

from ..core.tensor import Tensor
from .reduction import norm

__all__ = ["pairwise_distance", "pdist"]


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """``||x1 - x2 + eps||_p`` along the last dim, as torch defines it."""
    return norm(x1 - x2 + eps, p, dim=max(x1.dim(), x2.dim()) - 1, keepdim=keepdim)


def pdist(input: Tensor, p: float = 2.0) -> Tensor:
    """The ``p``-norm distances between the rows of ``input`` (N, M), pairs ``i < j`` in row
    order, as ``torch.pdist``."""
    if input.dim() != 2:
        raise RuntimeError(f"holoflow.pdist: only supports 2D tensors, got {input.dim()}D")
    if not input.is_floating_point():
        raise RuntimeError(f"holoflow.pdist: only supports floating-point dtypes, got {input.dtype}")
    if p < 0:
        raise RuntimeError(f"holoflow.pdist: only supports non-negative p values, got {p}")
    n = input.shape[0]
    i, j = (Tensor._make(t) for t in torch.triu_indices(n, n, 1, device=input._data.device))
    return (input.index_select(0, i) - input.index_select(0, j)).norm(p, dim=1)
