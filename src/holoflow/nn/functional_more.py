"""More of ``torch.nn.functional``, written from holoflow ops (so autograd, SBP and nn.Graph come
from the parts): in-place activations, gumbel_softmax, affine_grid, the ``*_with_indices`` pooling
forms, max unpooling, power-average pooling, 3-d transposed convolution, margin and triplet
losses, channel shuffle and the deprecated upsampling names. The primitives without a cheap
composite (3-d adaptive and fractional max pooling) are in ops/pooling.py.

``holoflow.nn.functional`` re-exports every name of ``__all__``.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable

from ..core import dtype as _dtype
from ..core import interpret
from ..core.errors import HoloflowError, ShapeError
from ..core.tensor import Tensor
from ..ops import elementwise as E
from ..ops.conv import _conv_transpose, _tuple, avg_pool2d, interpolate, max_pool2d
from ..ops.creation import empty_like, linspace, ones, zeros, zeros_like
from ..ops.linalg import matmul
from ..ops.loss import _reduction, reduce_loss
from ..ops.activation import celu
from ..ops.distance import pairwise_distance
from ..ops.pooling import (adaptive_max_pool1d, adaptive_max_pool2d, adaptive_max_pool3d,
                           adaptive_max_pool3d_with_indices, avg_pool1d, fractional_max_pool2d,
                           fractional_max_pool2d_with_indices, fractional_max_pool3d,
                           fractional_max_pool3d_with_indices, max_pool1d)
from ..ops.nn_ops import elu, hardtanh, leaky_relu, logsigmoid, one_hot, relu, selu, softmax
from ..ops.pool3d import avg_pool3d, max_pool3d

from ..ops.shape import stack

__all__ = ["elu_", "selu_", "celu_", "leaky_relu_", "hardtanh_", "gumbel_softmax", "affine_grid",
           "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
           "adaptive_max_pool1d_with_indices", "adaptive_max_pool2d_with_indices", "adaptive_max_pool3d_with_indices",
           "adaptive_max_pool3d", "max_unpool1d", "max_unpool2d", "max_unpool3d", "lp_pool1d", "lp_pool2d",
           "lp_pool3d", "conv_transpose3d", "hinge_embedding_loss", "multi_margin_loss", "multilabel_margin_loss",
           "multilabel_soft_margin_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss",
           "channel_shuffle", "native_channel_shuffle", "upsample_bilinear", "upsample_nearest",
           "fractional_max_pool2d", "fractional_max_pool2d_with_indices", "fractional_max_pool3d",
           "fractional_max_pool3d_with_indices"]


# -- in-place activations ----------------------------------------------------------------------------

def elu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    """In-place :func:`elu`."""
    return elu(input, alpha, inplace=True)


def selu_(input: Tensor) -> Tensor:
    """In-place :func:`selu`."""
    return selu(input, inplace=True)


def celu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    """In-place :func:`celu`."""
    return celu(input, alpha, inplace=True)


def leaky_relu_(input: Tensor, negative_slope: float = 0.01) -> Tensor:
    """In-place :func:`leaky_relu`."""
    return leaky_relu(input, negative_slope, inplace=True)


def hardtanh_(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """In-place :func:`hardtanh`."""
    return hardtanh(input, min_val, max_val, inplace=True)


# -- sampling --------------------------------------------------------------------------------------

def gumbel_softmax(logits: Tensor, tau: float = 1, hard: bool = False, eps: float = 1e-10, dim: int = -1) -> Tensor:
    """A sample of the Gumbel-softmax distribution (torch's draw: ``-log(Exp(1))`` noise); with
    ``hard`` a one-hot of its argmax whose gradient is the soft sample's (straight through)."""
    if eps != 1e-10:
        warnings.warn("`eps` parameter is deprecated and has no effect.", stacklevel=2)
    gumbels = -empty_like(logits).exponential_().log()
    y_soft = softmax((logits + gumbels) / tau, dim)
    if not hard:
        return y_soft
    index = y_soft.argmax(dim, keepdim=True)
    y_hard = zeros_like(logits).scatter(dim, index, value=1.0)
    return y_hard - y_soft.detach() + y_soft


def _base_coords(n: int, align_corners: bool, like: Tensor) -> Tensor:
    """torch's ``linspace_from_neg_one``: ``n`` points over [-1, 1] (pixel centres unless
    ``align_corners``); a single point is 0."""
    if n <= 1:
        return zeros(max(n, 0), dtype=like.dtype, device=like.device)
    r = linspace(-1.0, 1.0, n, dtype=like.dtype, device=like.device)
    return r if align_corners else r * (n - 1) / n   # ATen's two roundings (not r * ((n-1)/n))


def affine_grid(theta: Tensor, size: list, align_corners: bool | None = None) -> Tensor:
    """The sampling grid of a batch of affine maps ``theta`` (``(N, 2, 3)`` for a 4-D ``size``,
    ``(N, 3, 4)`` for a 5-D one): the base grid of normalised coordinates times ``theta^T``."""
    if align_corners is None:
        warnings.warn("Default grid_sample and affine_grid behavior has changed to align_corners=False since "
                      "1.3.0. Please specify align_corners=True if the old behavior is desired. See the "
                      "documentation of grid_sample for details.", stacklevel=2)
        align_corners = False
    if not theta.is_floating_point():
        raise ValueError(f"holoflow.affine_grid: expected theta to have floating point type, but got {theta.dtype}")
    size = [int(s) for s in size]
    if len(size) == 4:
        if theta.dim() != 3 or theta.shape[-2] != 2 or theta.shape[-1] != 3:
            raise ValueError(f"holoflow.affine_grid: expected a batch of 2D affine matrices of shape Nx2x3 for "
                             f"size {size}, got {tuple(theta.shape)}")
        spatial = size[-2:]
    elif len(size) == 5:
        if theta.dim() != 3 or theta.shape[-2] != 3 or theta.shape[-1] != 4:
            raise ValueError(f"holoflow.affine_grid: expected a batch of 3D affine matrices of shape Nx3x4 for "
                             f"size {size}, got {tuple(theta.shape)}")
        spatial = size[-3:]
    else:
        raise NotImplementedError(f"holoflow.affine_grid only supports 4D and 5D sizes, for 2D and 3D affine "
                                  f"transforms, respectively. Got size {size}.")
    if align_corners and min(spatial) == 1:
        warnings.warn("Since version 1.3.0, affine_grid behavior has changed for unit-size grids when "
                      "align_corners=True. This is not an intended use case of affine_grid. See the "
                      "documentation of affine_grid for details.", stacklevel=2)
    elif min(size) <= 0:
        raise ValueError(f"holoflow.affine_grid: expected non-zero, positive output size. Got {size}")
    n = size[0]
    axes = [_base_coords(s, align_corners, theta) for s in reversed(spatial)]   # x over W, y over H, (z over D)
    k = len(spatial)
    cols = []
    for i, a in enumerate(axes):   # axis i varies along spatial dim k-1-i
        shape = [1] * k
        shape[k - 1 - i] = spatial[k - 1 - i]
        cols.append(a.reshape(shape).expand(*spatial))
    cols.append(ones(*spatial, dtype=theta.dtype, device=theta.device))
    # one base grid per sample, as ATen builds it: its bmm (and the backward's) round as torch's
    base = stack(cols, -1).reshape(1, -1, k + 1).expand(n, -1, -1).contiguous()
    grid = matmul(base, theta.transpose(1, 2))
    return grid.reshape(n, *spatial, k)


# -- pooling -----------------------------------------------------------------------------------------

def max_pool1d_with_indices(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
                            return_indices: bool = False):
    """``(values, indices)`` of :func:`max_pool1d` whatever ``return_indices`` says (torch's)."""
    return max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)


def max_pool2d_with_indices(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
                            return_indices: bool = False):
    """``(values, flat H*W indices)`` of :func:`max_pool2d`."""
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)


def max_pool3d_with_indices(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
                            return_indices: bool = False):
    """``(values, flat D*H*W indices)`` of :func:`max_pool3d`."""
    return max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)


def adaptive_max_pool1d_with_indices(input: Tensor, output_size, return_indices: bool = False):
    return adaptive_max_pool1d(input, output_size, return_indices=True)


def adaptive_max_pool2d_with_indices(input: Tensor, output_size, return_indices: bool = False):
    return adaptive_max_pool2d(input, output_size, return_indices=True)


def _unpool_output_size(name: str, input: Tensor, kernel_size: tuple, stride: tuple, padding: tuple,
                        output_size) -> list:
    """torch's ``_unpool_output_size``: the default ``(in - 1) * stride + kernel - 2 * padding``,
    or ``output_size`` (optionally with N and C) strictly within one stride of it."""
    k = len(kernel_size)
    default = [(input.shape[-k + d] - 1) * stride[d] + kernel_size[d] - 2 * padding[d] for d in range(k)]
    if output_size is None:
        ret = default
    else:
        output_size = [int(s) for s in output_size]
        if len(output_size) == k + 2:
            output_size = output_size[2:]
        if len(output_size) != k:
            raise ValueError(f"holoflow.{name}: output_size should be a sequence containing {k} or {k + 2} "
                             f"elements, but it has a length of '{len(output_size)}'")
        for d in range(k):
            lo, hi = default[d] - stride[d], default[d] + stride[d]
            if not lo < output_size[d] < hi:
                raise ValueError(f'holoflow.{name}: invalid output_size "{output_size}" (dim {d} must be between '
                                 f"{lo} and {hi})")
        ret = output_size
    for d in range(k):
        if ret[d] < 0:
            raise ValueError(f"holoflow.{name}: output_size must contain non-negative spatial dimensions, but "
                             f"got output_size[{d}]={ret[d]}")
    return ret


def _max_unpool(k: int, input: Tensor, indices: Tensor, kernel_size, stride, padding, output_size) -> Tensor:
    """Each input value written at its flat spatial index of a zero ``(N, C, *output)`` tensor
    (a scatter: its gradient is a gather of the output gradient at those indices)."""
    name = f"max_unpool{k}d"
    ks = _tuple(kernel_size, k, "kernel_size", name)
    st = ks if stride is None else _tuple(stride, k, "stride", name)
    pd = _tuple(padding, k, "padding", name)
    if input.dim() not in (k + 1, k + 2):
        raise ShapeError(f"holoflow.{name}: expected a {k + 1}-D or {k + 2}-D input, got shape "
                         f"{tuple(input.shape)}")
    if indices.dtype != _dtype.int64:
        raise HoloflowError(f"holoflow.{name}: expected indices to have dtype int64, got {indices.dtype}")
    if tuple(indices.shape) != tuple(input.shape):
        raise HoloflowError(f"holoflow.{name}: expected indices of the input's shape {tuple(input.shape)}, got "
                            f"{tuple(indices.shape)}")
    out = _unpool_output_size(name, input, ks, st, pd, output_size)
    (input,) = interpret.composite(name, input)
    lead = tuple(input.shape[:-k])
    flat = zeros(*lead, math.prod(out), dtype=input.dtype, device=input.device)
    flat = flat.scatter(-1, indices.reshape(*lead, -1), input.reshape(*lead, -1))
    return flat.reshape(*lead, *out)


def max_unpool1d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of :func:`max_pool1d`: values at their indices, zeros elsewhere."""
    return _max_unpool(1, input, indices, kernel_size, stride, padding, output_size)


def max_unpool2d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of :func:`max_pool2d`."""
    return _max_unpool(2, input, indices, kernel_size, stride, padding, output_size)


def max_unpool3d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of :func:`max_pool3d`."""
    return _max_unpool(3, input, indices, kernel_size, stride, padding, output_size)


def _lp_pool(k: int, input: Tensor, norm_type: float, kernel_size, stride, ceil_mode: bool) -> Tensor:
    """torch's power-average pooling: ``(sum over the window of x^p)^(1/p)`` as an average pool
    of ``x^p`` times the window size; ``p = +-inf`` is a max pool of ``|x|`` (or min)."""
    maxp = {1: max_pool1d, 2: max_pool2d, 3: max_pool3d}[k]
    if norm_type == float("inf"):
        return maxp(input.abs(), kernel_size, stride, 0, 1, ceil_mode)
    if norm_type == -float("inf"):
        return -maxp(-input.abs(), kernel_size, stride, 0, 1, ceil_mode)
    ks = _tuple(kernel_size, k, "kernel_size", f"lp_pool{k}d")
    x = input.pow(norm_type)
    if k == 1:
        out = avg_pool1d(x, kernel_size, stride, 0, ceil_mode)
    elif k == 2:
        out = avg_pool2d(x, kernel_size, stride, 0, ceil_mode)
    else:
        out = avg_pool3d(x, kernel_size, stride, 0, ceil_mode)
    return (out.sign() * relu(out.abs())).mul(math.prod(ks)).pow(1.0 / norm_type)


def lp_pool1d(input: Tensor, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False) -> Tensor:
    return _lp_pool(1, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool2d(input: Tensor, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False) -> Tensor:
    return _lp_pool(2, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool3d(input: Tensor, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False) -> Tensor:
    return _lp_pool(3, input, norm_type, kernel_size, stride, ceil_mode)


def conv_transpose3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """Transposed 3-d convolution; weight ``(C_in, C_out / groups, kD, kH, kW)``."""
    return _conv_transpose("conv_transpose3d", 3, input, weight, bias, stride, padding, output_padding,
                           groups, dilation)


# -- losses --------------------------------------------------------------------------------------------

def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0, size_average=None, reduce=None,
                         reduction: str = "mean") -> Tensor:
    """``x`` where ``target == 1``, ``max(0, margin - x)`` where ``target == -1`` (torch's: both
    terms where the target is neither)."""
    red = _reduction("hinge_embedding_loss", reduction, size_average, reduce)
    (input,) = interpret.composite("hinge_embedding_loss", input)
    zero = zeros_like(input)
    out = E.where(target != 1, (margin - input).clamp_min(0.0), zero) + E.where(target != -1, input, zero)
    return reduce_loss(out, red)


def _values_readable(target: Tensor) -> bool:
    """Whether a target's range is checked here: on the CPU in eager mode only, as ATen checks it
    (its CUDA kernels assert on the device: no host sync; a meta tensor or a trace has no values)."""
    return target._data.device.type == "cpu" and not interpret.is_lazy()


def _class_rows(name: str, input: Tensor, target: Tensor) -> tuple:
    """``input`` as ``(N, C)`` rows and ``target`` as ``(N,)`` class indices, checked as torch's
    multi_margin_loss checks them."""
    nd = input.dim()
    if not (nd == 0 or (nd == 1 and input.shape[0] != 0) or (nd == 2 and input.shape[1] != 0)):
        raise HoloflowError(f"holoflow.{name}: expected a non-empty vector or matrix with optional 0-dim batch "
                            f"size, but got {tuple(input.shape)}")
    c = 1 if nd == 0 else input.shape[-1]
    n = input.shape[0] if nd == 2 else 1
    if target.dim() > 1 or target.numel() != n:
        raise HoloflowError(f"holoflow.{name}: inconsistent target size, expected {n} but got {tuple(target.shape)}")
    if target.dtype != _dtype.int64:
        raise HoloflowError(f"holoflow.{name}: expected a target of dtype int64, got {target.dtype}")
    t = target.reshape(n)
    if n and _values_readable(t) and bool(((t < 0) | (t >= c)).any()):
        raise HoloflowError(f"holoflow.{name}: target out of range [0, {c})")
    return input.reshape(n, c), t, c


def multi_margin_loss(input: Tensor, target: Tensor, p: int = 1, margin: float = 1.0, weight: Tensor | None = None,
                      size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """Multi-class hinge loss: ``sum_{i != y} w_y max(0, margin - x_y + x_i)^p / C`` per row."""
    red = _reduction("multi_margin_loss", reduction, size_average, reduce)
    input, weight = interpret.composite("multi_margin_loss", input, weight)
    if p not in (1, 2):
        raise ValueError("holoflow.multi_margin_loss: only p == 1 and p == 2 supported")
    if weight is not None and weight.dim() != 1:
        raise ValueError("holoflow.multi_margin_loss: weight must be one-dimensional")
    x, t, c = _class_rows("multi_margin_loss", input, target)
    if weight is not None and weight.numel() != c:
        raise HoloflowError(f"holoflow.multi_margin_loss: inconsistent weight size, expected {c} but got "
                            f"{tuple(weight.shape)}")
    idx = t.unsqueeze(1)
    z = x - x.gather(1, idx) + margin
    z = E.where(z > 0, z, 0.0)   # (torch's kernel adds only positive terms: a NaN one is skipped)
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * weight.index_select(0, t).unsqueeze(1)
    z = z.masked_fill(one_hot(idx.squeeze(1), c).bool(), 0.0)
    loss = z.sum(1) / c
    if red == "none" and input.dim() < 2:
        loss = loss.reshape(target.shape)
    return reduce_loss(loss, red)


def multilabel_margin_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
                           reduction: str = "mean") -> Tensor:
    """``sum_j sum_{i not a target} max(0, 1 - (x_{y_j} - x_i)) / C`` per row, the targets ``y_j``
    being the entries of ``target`` before its first ``-1``."""
    red = _reduction("multilabel_margin_loss", reduction, size_average, reduce)
    (input,) = interpret.composite("multilabel_margin_loss", input)
    nd = input.dim()
    if not (nd == 0 or (nd == 1 and input.shape[0] != 0) or (nd == 2 and input.shape[1] != 0)):
        raise HoloflowError(f"holoflow.multilabel_margin_loss: expected a non-empty vector or matrix with optional "
                            f"0-dim batch size, but got {tuple(input.shape)}")
    if tuple(target.shape) != tuple(input.shape):
        raise HoloflowError(f"holoflow.multilabel_margin_loss: inconsistent target size {tuple(target.shape)} for "
                            f"input of size {tuple(input.shape)}")
    if target.dtype != _dtype.int64:
        raise HoloflowError(f"holoflow.multilabel_margin_loss: expected a target of dtype int64, got {target.dtype}")
    c = 1 if nd == 0 else input.shape[-1]
    x, t = input.reshape(-1, c), target.reshape(-1, c)
    valid = (t >= 0).long().cumprod(1).bool()            # the entries before the first -1
    if _values_readable(t):
        tv = t.masked_fill(~valid, 0)
        if bool(((tv >= c) | (tv < -1)).any()):
            raise HoloflowError(f"holoflow.multilabel_margin_loss: target index out of range [-1, {c})")
    tc = t.clamp_min(0)
    is_target = (one_hot(tc, c) * valid.long().unsqueeze(-1)).sum(1) > 0      # (N, C): class i is a target
    z = x.unsqueeze(1) - x.gather(1, tc).unsqueeze(2) + 1.0   # (N, j, i)
    z = E.where(z > 0, z, 0.0)   # (torch's kernel adds only positive terms: a NaN one is skipped)
    z = z.masked_fill(~(valid.unsqueeze(2) & ~is_target.unsqueeze(1)), 0.0)
    loss = z.sum((1, 2)) / c
    if red == "none" and nd < 2:
        loss = loss.reshape(())
    return reduce_loss(loss, red)


def multilabel_soft_margin_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
                                reduce=None, reduction: str = "mean") -> Tensor:
    """Per-class logistic loss averaged over classes (the last dim), then reduced."""
    red = _reduction("multilabel_soft_margin_loss", reduction, size_average, reduce)
    loss = -(target * logsigmoid(input) + (1 - target) * logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    cdim = input.dim() - 1
    loss = loss.sum(cdim) / input.shape[cdim]
    return reduce_loss(loss, red)


def _check_triplet(name: str, anchor: Tensor, positive: Tensor, negative: Tensor, margin: float) -> None:
    if margin <= 0:
        raise ValueError(f"holoflow.{name}: margin must be greater than 0, got {margin}")
    a, p, n = anchor.dim(), positive.dim(), negative.dim()
    if not a == p == n:
        raise HoloflowError(f"holoflow.{name}: the anchor, positive, and negative tensors are expected to have "
                            f"the same number of dimensions, but got: anchor {a}D, positive {p}D, and negative "
                            f"{n}D inputs")


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, size_average=None, reduce=None,
                        reduction: str = "mean") -> Tensor:
    """``max(0, margin + d(a, p) - d(a, n))`` with the p-norm pairwise distance (``swap``: the
    smaller of ``d(a, n)`` and ``d(p, n)``)."""
    red = _reduction("triplet_margin_loss", reduction, size_average, reduce)
    _check_triplet("triplet_margin_loss", anchor, positive, negative, margin)
    anchor, positive, negative = interpret.composite("triplet_margin_loss", anchor, positive, negative)
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = E.minimum(d_neg, pairwise_distance(positive, negative, p, eps))
    return reduce_loss((d_pos - d_neg + margin).clamp_min(0.0), red)


def triplet_margin_with_distance_loss(anchor: Tensor, positive: Tensor, negative: Tensor, *,
                                      distance_function: Callable | None = None, margin: float = 1.0,
                                      swap: bool = False, reduction: str = "mean") -> Tensor:
    """:func:`triplet_margin_loss` with any ``distance_function(x1, x2)`` (default
    :func:`pairwise_distance`)."""
    red = _reduction("triplet_margin_with_distance_loss", reduction)
    _check_triplet("triplet_margin_with_distance_loss", anchor, positive, negative, margin)
    dist = pairwise_distance if distance_function is None else distance_function
    d_pos, d_neg = dist(anchor, positive), dist(anchor, negative)
    if swap:
        d_neg = E.minimum(d_neg, dist(positive, negative))
    loss = (d_pos - d_neg + margin).clamp_min(0.0)
    return reduce_loss(loss, red)


# -- shape ------------------------------------------------------------------------------------------

def channel_shuffle(input: Tensor, groups: int) -> Tensor:
    """``(N, g * c, *) -> (N, c * g, *)``: channel ``i * c + j`` moves to ``j * g + i``."""
    if input.dim() < 3:
        raise HoloflowError(f"holoflow.channel_shuffle: expects input to have at least 3 dimensions, but got "
                            f"input with sizes {tuple(input.shape)}")
    if groups <= 0:
        raise HoloflowError(f"holoflow.channel_shuffle: number of groups to divide channels in must be positive. "
                            f"Value of groups:{groups}")
    n, c, *rest = input.shape
    if c % groups:
        raise HoloflowError(f"holoflow.channel_shuffle: number of channels must be divisible by groups. Got {c} "
                            f"channels and {groups} groups.")
    return input.reshape(n, groups, c // groups, *rest).transpose(1, 2).reshape(n, c, *rest)


native_channel_shuffle = channel_shuffle


def upsample_nearest(input: Tensor, size=None, scale_factor=None) -> Tensor:
    """Deprecated: ``interpolate(input, size, scale_factor, mode='nearest')``."""
    warnings.warn("`nn.functional.upsample_nearest` is deprecated. Use `nn.functional.interpolate` instead.",
                  stacklevel=2)
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input: Tensor, size=None, scale_factor=None) -> Tensor:
    """Deprecated: ``interpolate(..., mode='bilinear', align_corners=True)``."""
    warnings.warn("`nn.functional.upsample_bilinear` is deprecated. Use `nn.functional.interpolate` instead.",
                  stacklevel=2)
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)

