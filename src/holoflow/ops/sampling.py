"""Sampling and patch ops: ``grid_sample``, ``unfold`` (im2col) and ``fold`` (col2im).

``grid_sample`` is a primitive with ATen's derivative (ops/torch_vjp.py), named ``grid_sampler``
as ATen's op, so autocast's op lists (amp/policy.py) apply to it as in torch. ``unfold`` and ``fold``
are linear and adjoint to each other, so each one's gradient is the other: double backward
composes. SBP: batch split (N) everywhere; the input's channel axis for ``grid_sample``; partial
sums through the linear ops.
"""
from __future__ import annotations

import torch.nn.functional as TF

from ..core.dispatch import apply
from ..core.errors import ShapeError
from ..core.registry import defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .conv import _tuple
from .torch_vjp import defop_vjp

__all__: list[str] = []   # nn.functional names only (torch has no top-level fold/unfold/grid_sample)

# -- grid_sample -----------------------------------------------------------------------------------


def _gs_sbp(metas, attrs):
    return [((B, B), (B,)), ((S(0), S(0)), (S(0),)), ((S(1), B), (S(1),))]


def _gs_bwd_sbp(metas, attrs):
    """``(input, grid, dy) -> grads``: batch split; a channel split of input and dy gives the
    input's gradient split and the grid's gradient partial (summed over channels)."""
    diff = attrs["diff"]
    pick = lambda per: tuple(per[i] for i in diff)  # noqa: E731
    return [((B, B, B), pick((B, B))), ((S(0), S(0), S(0)), pick((S(0), S(0)))),
            ((S(1), B, S(1)), pick((S(1), P)))]


GRID_SAMPLE = defop_vjp("grid_sampler", lambda x, grid, mode, padding_mode, align_corners:
                        TF.grid_sample(x, grid, mode, padding_mode, align_corners),
                        sbp=_gs_sbp, bwd_sbp=_gs_bwd_sbp, family="resize")


def grid_sample(input: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool | None = None) -> Tensor:
    """Samples ``input`` ``(N, C, H, W)`` (or 5-D) at the normalized ``grid`` ``(N, H', W', 2)``
    locations, as ``torch.nn.functional.grid_sample``."""
    if input.dim() not in (4, 5) or grid.dim() != input.dim() or grid.shape[-1] != input.dim() - 2 \
            or grid.shape[0] != input.shape[0]:
        raise ShapeError(f"holoflow.grid_sample: expected input (N, C, H, W) with grid (N, H', W', 2) (or 5-D "
                         f"with (N, D', H', W', 3)), got input {tuple(input.shape)} and grid {tuple(grid.shape)}")
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ValueError(f"holoflow.grid_sample: mode must be 'bilinear', 'nearest' or 'bicubic', got {mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"holoflow.grid_sample: padding_mode must be 'zeros', 'border' or 'reflection', "
                         f"got {padding_mode!r}")
    return apply(GRID_SAMPLE, input, grid, mode=mode, padding_mode=padding_mode,
                 align_corners=bool(align_corners))


# -- unfold / fold ----------------------------------------------------------------------------------

def _patch_sbp(metas, attrs):
    sigs = [((B,), (B,)), ((P,), (P,))]
    if len(metas[0].shape) == attrs["batched_dims"]:
        sigs.append(((S(0),), (S(0),)))
    return sigs


def _unfold_kernel(x, kernel_size, dilation, padding, stride, batched_dims):
    return TF.unfold(x, kernel_size, dilation, padding, stride)


def _fold_kernel(x, output_size, kernel_size, dilation, padding, stride, batched_dims):
    return TF.fold(x, output_size, kernel_size, dilation, padding, stride)


def _unfold_grad(c, dy):
    size = tuple(c.shapes[0][-2:])
    return (apply(FOLD, dy, output_size=size, kernel_size=c.kernel_size, dilation=c.dilation, padding=c.padding,
                  stride=c.stride, batched_dims=3),)


def _fold_grad(c, dy):
    return (apply(UNFOLD, dy, kernel_size=c.kernel_size, dilation=c.dilation, padding=c.padding, stride=c.stride,
                  batched_dims=4),)


UNFOLD = defop("im2col", _unfold_kernel, grad=_unfold_grad, sbp=_patch_sbp, family="conv")
FOLD = defop("col2im", _fold_kernel, grad=_fold_grad, sbp=_patch_sbp, family="conv")


def _patch_args(name: str, kernel_size, dilation, padding, stride) -> dict:
    return {"kernel_size": _tuple(kernel_size, 2, "kernel_size", name),
            "dilation": _tuple(dilation, 2, "dilation", name), "padding": _tuple(padding, 2, "padding", name),
            "stride": _tuple(stride, 2, "stride", name)}


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Sliding ``kernel_size`` patches of an ``(N, C, H, W)`` (or ``(C, H, W)``) input as columns:
    ``(N, C * prod(kernel_size), L)``, as ``torch.nn.functional.unfold``."""
    if input.dim() not in (3, 4):
        raise ShapeError(f"holoflow.unfold: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape "
                         f"{tuple(input.shape)}")
    return apply(UNFOLD, input, batched_dims=4, **_patch_args("unfold", kernel_size, dilation, padding, stride))


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Sums columns ``(N, C * prod(kernel_size), L)`` back into an ``(N, C, *output_size)``
    image (the adjoint of :func:`unfold`), as ``torch.nn.functional.fold``."""
    if input.dim() not in (2, 3):
        raise ShapeError(f"holoflow.fold: expected a 2-D (C * k, L) or 3-D (N, C * k, L) input, got shape "
                         f"{tuple(input.shape)}")
    return apply(FOLD, input, output_size=_tuple(output_size, 2, "output_size", "fold"), batched_dims=3,
                 **_patch_args("fold", kernel_size, dilation, padding, stride))

