"""Fake quantization for quantization-aware training, as torch's ``fake_quantize_per_tensor_affine``
and ``fake_quantize_per_channel_affine``: each value rounded onto the integer grid of a scale and
zero point, clamped to ``[quant_min, quant_max]`` and mapped back, by torch's kernels (their
rounding: ``nearbyint(x * (1 / scale))``). The gradient is the straight-through one: the output
gradient where the value fell inside the range, zero where it was clamped (the mask the forward
kernel returns). A scale or zero point that requires grad is refused, as torch refuses it.
"""
from __future__ import annotations

import torch

from ..core import grad_mode
from ..core.dispatch import apply
from ..core.errors import ShapeError
from ..core.registry import Meta, defop
from ..core.sbp import B, S
from ..core.tensor import Tensor

__all__ = ["fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine"]


def _on_meta(x):
    """The (output, mask) of a meta input: ATen's cachemask kernels have no meta kernel."""
    return torch.empty_like(x), torch.empty(x.shape, dtype=torch.bool, device=x.device)


def _per_tensor_kernel(x, scale, zero_point, quant_min, quant_max):
    if x.is_meta:
        return _on_meta(x)
    if isinstance(scale, torch.Tensor):
        on = torch.ones((), dtype=torch.long, device=x.device)
        return torch.ops.aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default(
            x, scale, zero_point, on, quant_min, quant_max)
    return torch.ops.aten.fake_quantize_per_tensor_affine_cachemask.default(x, scale, zero_point, quant_min, quant_max)


def _per_channel_kernel(x, scale, zero_point, axis, quant_min, quant_max):
    if x.is_meta:
        return _on_meta(x)
    return torch.ops.aten.fake_quantize_per_channel_affine_cachemask.default(x, scale, zero_point, axis, quant_min,
                                                                               quant_max)


def _no_grad_qparams(name: str, scale, zero_point) -> None:
    """torch refuses a scale or zero point that requires grad (these functions do not learn them)."""
    for arg, t in (("scale", scale), ("zero_point", zero_point)):
        if isinstance(t, Tensor) and t.requires_grad and grad_mode.is_grad_enabled():
            raise RuntimeError(f"holoflow.{name}: not differentiable with respect to argument {arg!r}; it cannot "
                               f"have requires_grad=True (pass {arg}.detach())")


def _straight_through(c, dy, _dmask):
    return (dy * c.outs[1],) + (None,) * (len(c.edges) - 1)


def _shape(metas, attrs):
    x = metas[0]
    return [Meta(tuple(x.shape), x.dtype, x.device), Meta(tuple(x.shape), torch.bool, x.device)]


def _per_tensor_sbp(metas, attrs):
    """Elementwise in the input (the scale and zero point broadcast): any split, or broadcast."""
    qparams = (B, B) if isinstance(metas[1], Meta) else ()
    return [((B,) + qparams, (B, B))] + [((S(a),) + qparams, (S(a), S(a))) for a in range(len(metas[0].shape))]


def _per_channel_sbp(metas, attrs):
    """A split of the channel axis splits the scales and zero points with it; other axes split
    alone."""
    axis = attrs["axis"]
    sigs = [((B, B, B), (B, B))]
    for a in range(len(metas[0].shape)):
        q = S(0) if a == axis else B
        sigs.append(((S(a), q, q), (S(a), S(a))))
    return sigs


# two ops for torch's two overloads: autocast casts the one with a number scale to float32 on the
# CPU (its list names that overload), the one with tensor qparams runs in the input's dtype
FAKE_QUANT = defop("fake_quantize_per_tensor_affine", _per_tensor_kernel, grad=_straight_through, save="output",
                   saved_outputs=(1,), outputs=("out", "mask"), grad_reads=(0,), shape=_shape, sbp=_per_tensor_sbp)
FAKE_QUANT_T = defop("fake_quantize_per_tensor_affine_tensor_qparams", _per_tensor_kernel, grad=_straight_through,
                     save="output", saved_outputs=(1,), outputs=("out", "mask"), grad_reads=(0,), shape=_shape,
                     sbp=_per_tensor_sbp)
FAKE_QUANT_CHANNEL = defop("fake_quantize_per_channel_affine", _per_channel_kernel, grad=_straight_through,
                           save="output", saved_outputs=(1,), outputs=("out", "mask"), grad_reads=(0,), shape=_shape,
                           sbp=_per_channel_sbp)


def fake_quantize_per_tensor_affine(input: Tensor, scale: float | Tensor, zero_point: int | Tensor, quant_min: int,
                                    quant_max: int) -> Tensor:
    """``(clamp(round(input / scale) + zero_point, quant_min, quant_max) - zero_point) * scale``;
    ``scale`` and ``zero_point`` are numbers or one-element tensors.

    >>> fake_quantize_per_tensor_affine(holoflow.tensor([0.26, -1.0, 9.0]), 0.1, 0, -5, 50).tolist()
    [0.30000001192092896, -0.5, 5.0]
    """
    if isinstance(scale, Tensor) != isinstance(zero_point, Tensor):
        raise TypeError("holoflow.fake_quantize_per_tensor_affine: scale and zero_point must both be tensors or "
                        f"both be numbers, got {type(scale).__name__} and {type(zero_point).__name__}")
    if isinstance(scale, Tensor):
        _no_grad_qparams("fake_quantize_per_tensor_affine", scale, zero_point)
        return apply(FAKE_QUANT_T, input, scale, zero_point, quant_min=int(quant_min), quant_max=int(quant_max)).out
    return apply(FAKE_QUANT, input, float(scale), int(zero_point), quant_min=int(quant_min),
                 quant_max=int(quant_max)).out


def fake_quantize_per_channel_affine(input: Tensor, scale: Tensor, zero_point: Tensor, axis: int, quant_min: int,
                                     quant_max: int) -> Tensor:
    """Fake quantization with one scale and zero point per index of ``axis``."""
    if axis < 0:   # (torch takes no negative axis here)
        raise RuntimeError(f"holoflow.fake_quantize_per_channel_affine: `axis` must be between 0 and number of "
                           f"dimensions of input, got {axis} for an input of shape {tuple(input.shape)}")
    if axis >= input.dim():
        raise IndexError(f"holoflow.fake_quantize_per_channel_affine: axis {axis} is out of range for an input "
                         f"of shape {tuple(input.shape)}")
    if scale.dim() != 1 or zero_point.dim() != 1 or scale.shape[0] != input.shape[axis] \
            or zero_point.shape[0] != input.shape[axis]:
        raise ShapeError(f"holoflow.fake_quantize_per_channel_affine: scale {tuple(scale.shape)} and zero_point "
                         f"{tuple(zero_point.shape)} must be 1-D with input.shape[{axis}] = {input.shape[axis]} "
                         f"entries")
    _no_grad_qparams("fake_quantize_per_channel_affine", scale, zero_point)
    return apply(FAKE_QUANT_CHANNEL, input, scale, zero_point, axis=axis, quant_min=int(quant_min),
                 quant_max=int(quant_max)).out
