"""More of ``torch.nn.functional``: channel/alpha dropout, small activations, 1-D and adaptive
pooling, pixel (un)shuffle, bilinear, distances, margin/NLL losses, local response norm.

Nearly everything is a composite of existing ops, so it needs no gradient code and takes its SBP
rules from its parts; 1-D pooling runs the 2-D primitives on an input with a unit H axis.
``adaptive_max_pool2d`` is the one primitive (windows of varying size have no cheap composite):
an ATen kernel with indices, whose gradient is a ``scatter_add`` of ``dy`` at those indices, so it
has a double backward and an SBP from scatter's rule.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import torch
import torch.nn.functional as TF

from ..core import interpret
from ..core.grad_mode import no_grad
from ..core.dispatch import apply, assign
from ..core.errors import ShapeError, normalize_dim
from ..core.registry import defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from . import elementwise as E
from .conv import _check_pool, _lead_sbp, _tuple, adaptive_avg_pool2d, avg_pool2d, max_pool2d
from .creation import empty_like, ones_like, zeros_like
from .linalg import trilinear
from .loss import _reduction, reduce_loss
from .nn_ops import ELU, GLU, piecewise_linear, write_into
from .reduction import norm
from .reduction import sum as _sum
from .shape import pad

# -- dropout variants ------------------------------------------------------------------------------

_SELU_ALPHA_PRIME = 1.7580993408473766  # -selu_scale * selu_alpha: the value alpha dropout drops to


def _check_p(name: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"holoflow.{name}: p must be in [0, 1], got {p}")


def _noise(input: Tensor, lead: int | None, p: float) -> Tensor:
    """0/1 draws of probability ``1 - p`` like the input (``lead=None``) or one per leading
    (batch, channel) entry with unit trailing dims, drawn as torch draws them."""
    x = input.detach()
    if lead is not None:
        for d in range(lead, x.dim()):
            x = x.narrow(d, 0, 1)
    return empty_like(x).bernoulli_(1.0 - p)


def _dropout_impl(name: str, input: Tensor, p: float, training: bool, inplace: bool, lead: int | None,
                  alpha: bool) -> Tensor:
    """torch's ``_dropout_impl``: ``x * noise / (1 - p)``, or for alpha dropout the affine map
    keeping SELU's zero mean and unit variance."""
    _check_p(name, p)
    if p == 0.0 or not training or input.numel() == 0:
        return input
    if p == 1.0:
        out = input * 0.0
    elif alpha:
        noise = _noise(input, lead, p)
        a = 1.0 / math.sqrt((_SELU_ALPHA_PRIME ** 2 * p + 1) * (1 - p))
        b = (noise - 1) * (_SELU_ALPHA_PRIME * a) + _SELU_ALPHA_PRIME * a * p
        out = input * (noise * a) + b
    else:
        out = input * (_noise(input, lead, p) / (1.0 - p))
    return assign(input, out, name) if inplace else out


def _feature_lead(name: str, input: Tensor, spatial: int) -> int:
    """Leading dims that get their own draw: (C,) unbatched, (N, C) batched, as torch reads them."""
    nd = input.dim()
    if name == "dropout1d" and nd not in (2, 3):
        raise ShapeError(f"holoflow.dropout1d: expected a 2-D (C, L) or 3-D (N, C, L) input, got shape "
                         f"{tuple(input.shape)}")
    if nd < 2:
        raise ShapeError(f"holoflow.{name}: expected an input with a channel dim, got shape {tuple(input.shape)}")
    if nd not in (spatial + 1, spatial + 2):
        warnings.warn(f"holoflow.{name}: a {nd}-D input is read as (N, C, *), as torch does", stacklevel=3)
    return 1 if nd == spatial + 1 and spatial != 2 else 2  # torch reads a 3-D dropout2d input as (N, C, L)


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zeroes whole channels of an ``(N, C, L)`` or ``(C, L)`` input with probability ``p``."""
    return _dropout_impl("dropout1d", input, p, training, inplace, _feature_lead("dropout1d", input, 1), False)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zeroes whole channels of an ``(N, C, H, W)`` input (a 3-D input is read as ``(N, C, L)``)."""
    return _dropout_impl("dropout2d", input, p, training, inplace, _feature_lead("dropout2d", input, 2), False)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zeroes whole channels of an ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input."""
    return _dropout_impl("dropout3d", input, p, training, inplace, _feature_lead("dropout3d", input, 3), False)


def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """Dropout for SELU networks: dropped elements take SELU's negative saturation value and an
    affine map restores the input's mean and variance."""
    return _dropout_impl("alpha_dropout", input, p, training, inplace, None, True)


def feature_alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """:func:`alpha_dropout` of whole channels (one draw per ``(N, C)`` entry)."""
    if input.dim() < 2:
        raise ShapeError(f"holoflow.feature_alpha_dropout: expected an (N, C, *) input, got shape "
                         f"{tuple(input.shape)}")
    return _dropout_impl("feature_alpha_dropout", input, p, training, inplace, 2, True)


# -- activations -----------------------------------------------------------------------------------

def _prelu_weight_shape(n: int, nd: int) -> tuple:
    """How prelu's 1-D weight of ``n`` entries broadcasts over an ``nd``-dim input: one entry
    everywhere, or one per channel (dim 1)."""
    return () if n == 1 else (n,) + (1,) * (nd - 2)


def _prelu_backward_kernel(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor):
    """``(dL/dx, dL/dweight)``: ``dy`` where ``x > 0`` else ``weight * dy``; the weight's is
    ``x * dy`` where ``x <= 0``, summed over everything but the channels."""
    wb = w.reshape(_prelu_weight_shape(w.numel(), x.dim()))
    pos = x > 0
    gx = torch.where(pos, dy, wb * dy)
    gw = torch.where(pos, 0, x * dy)
    gw = gw.sum() if wb.dim() == 0 else gw.sum_to_size(wb.shape)
    return gx, gw.reshape(w.shape)


def _prelu_sbp(metas, attrs):
    """Elementwise in ``x``: any split of it, the weight broadcast, except a split of the channels
    (dim 1) of a per-channel weight, which splits the weight alike."""
    x, w = metas
    per_channel = math.prod(w.shape) != 1
    sigs = [((B, B), (B,))]
    sigs += [((S(a), B), (S(a),)) for a in range(len(x.shape)) if not (per_channel and a == 1)]
    if per_channel:
        sigs.append(((S(1), S(0)), (S(1),)))
    return sigs


def _prelu_backward_sbp(metas, attrs):
    """Like prelu's, the weight's gradient a partial sum where the batch/spatial dims are split;
    linear in ``dy``."""
    dy, x, w = metas
    per_channel = math.prod(w.shape) != 1
    sigs = [((B, B, B), (B, B)), ((P, B, B), (P, P))]
    sigs += [((S(a), S(a), B), (S(a), P)) for a in range(len(x.shape)) if not (per_channel and a == 1)]
    if per_channel:
        sigs.append(((S(1), S(1), S(0)), (S(1), S(0))))
    return sigs


def _prelu_grad(c, dy):
    x, w = c.inputs
    gx, gw = apply(PRELU_BACKWARD, dy, x, w)
    return gx if c.needs_grad[0] else None, gw if c.needs_grad[1] else None


def _prelu_backward_grad(c, ggx, ggw):
    """prelu's double backward: the backward is linear in ``dy`` (its grad: ``ggx`` through
    prelu's slopes plus ``ggw`` times ``x`` where ``x < 0``), piecewise constant in ``x`` (d2/dx2
    is zero) and linear in the weight; the cross terms are ``ggw * dy`` (for ``x``) and the sum of
    ``ggx * dy`` (for the weight), each where ``x < 0``. At ``x == 0`` torch's double backward
    takes the positive side (slope 1, no cross terms) while its backward takes the weight's slope:
    both are followed. Written with ops: it differentiates again."""
    dy, x, w = c.inputs
    wshape = _prelu_weight_shape(w.numel(), x.dim())
    wb, ggw_b = w.reshape(wshape), ggw.reshape(wshape)
    pos = x >= 0
    g_dy = E.where(pos, ggx, ggx * wb + ggw_b * x) if c.needs_grad[0] else None
    g_x = E.where(pos, 0.0, ggw_b * dy) if c.needs_grad[1] else None
    g_w = None
    if c.needs_grad[2]:
        t = E.where(pos, 0.0, ggx * dy)
        t = t.sum() if not wshape else t.sum([d for d in range(x.dim()) if d != 1])
        g_w = t.reshape(tuple(w.shape))
    return g_dy, g_x, g_w


def _same_dtypes(x, w) -> None:
    """torch's prelu doesn't promote (checked after autocast has cast both, as torch checks)."""
    if x.dtype != w.dtype:
        raise RuntimeError(f"holoflow.prelu: type promoting is not supported (as in torch): input is "
                           f"{str(x.dtype).replace('torch.', '')} and weight {str(w.dtype).replace('torch.', '')}; "
                           f"cast one of them")


def _prelu_kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    _same_dtypes(x, w)
    return torch.prelu(x, w)


def _prelu_shape(metas, attrs):
    _same_dtypes(*metas)
    return [metas[0]]


PRELU = defop("prelu", _prelu_kernel, grad=_prelu_grad, save="inputs", sbp=_prelu_sbp, shape=_prelu_shape)
PRELU_BACKWARD = defop("prelu_backward", _prelu_backward_kernel, grad=_prelu_backward_grad, save="inputs",
                       sbp=_prelu_backward_sbp, outputs=("grad_input", "grad_weight"),
                       shape=lambda metas, attrs: [metas[1], metas[2]])


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """``x`` if ``x > 0`` else ``weight * x``; ``weight`` has one entry, or one per channel (dim 1;
    inputs of fewer than 2 dims have one channel). Its backward is an op with a double backward
    (torch's: zero in ``x`` twice, the cross terms with the weight)."""
    n = weight.numel()
    if weight.dim() > 1:
        raise ShapeError(f"holoflow.prelu: weight must be 1-D, got shape {tuple(weight.shape)}")
    if n != 1 and (input.dim() < 2 or input.shape[1] != n):
        raise ShapeError(f"holoflow.prelu: weight of {n} entries needs {n} channels in dim 1 of the "
                         f"input, got input of shape {tuple(input.shape)}")
    return apply(PRELU, input, weight)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """Gated linear unit: ``a * sigmoid(b)`` for the two halves ``a, b`` of ``input`` along ``dim``."""
    d = normalize_dim("glu", dim, input.dim())
    if input.shape[d] % 2:
        raise ShapeError(f"holoflow.glu: halving dimension must be even, but dim {dim} of input shape "
                         f"{tuple(input.shape)} has size {input.shape[d]}")
    return apply(GLU, input, dim=d)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``, i.e. ``alpha * elu(x / alpha)``."""
    if alpha == 0:
        raise ValueError("holoflow.celu: alpha must not be 0 (it divides the input)")
    def compute(x: Tensor) -> Tensor:   # (torch's: aten's elu with an input scale)
        return apply(ELU, x, alpha=alpha, scale=1.0, input_scale=1.0 / alpha,
                     grad_input_scale=1.0 / float(np.float32(alpha)))   # (torch: 1.0 / alpha.toFloat())
    return write_into(input, "celu", compute) if inplace else compute(input)


def softsign(input: Tensor) -> Tensor:
    """``x / (1 + |x|)``."""
    return input / (input.abs() + 1)


def tanhshrink(input: Tensor) -> Tensor:
    """``x - tanh(x)``."""
    return input - input.tanh()


def _check_lambd(name: str, lambd: float) -> None:
    if lambd < 0:
        raise ValueError(f"holoflow.{name}: lambd must be non-negative, got {lambd}")


SOFTSHRINK = piecewise_linear(
    "softshrink", lambda x, lambd=0.5: TF.softshrink(x, lambd),
    lambda dy, x, lambd=0.5: torch.ops.aten.softshrink_backward.default(dy, x, lambd))
HARDSHRINK = piecewise_linear(
    "hardshrink", lambda x, lambd=0.5: TF.hardshrink(x, lambd),
    lambda dy, x, lambd=0.5: torch.ops.aten.hardshrink_backward.default(dy, x, lambd))


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0."""
    _check_lambd("softshrink", lambd)
    return apply(SOFTSHRINK, input, lambd=float(lambd))


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0 (a negative ``lambd`` keeps every ``x``, as torch's)."""
    return apply(HARDSHRINK, input, lambd=float(lambd))


# -- 1-D and adaptive pooling ------------------------------------------------------------------------

def _check_1d(name: str, x: Tensor) -> None:
    if x.dim() not in (2, 3):
        raise ShapeError(f"holoflow.{name}: expected a 2-D (C, L) or 3-D (N, C, L) input, got shape "
                         f"{tuple(x.shape)}")


def _one(v, what: str, name: str) -> int:
    return _tuple(v, 1, what, name)[0]


def max_pool1d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """Max over windows of an ``(N, C, L)`` input (max_pool2d over a unit H axis); indices index L."""
    _check_1d("max_pool1d", input)
    k = _one(kernel_size, "kernel_size", "max_pool1d")
    s = k if stride is None or (isinstance(stride, (list, tuple)) and not stride) else _one(stride, "stride",
                                                                                           "max_pool1d")
    out, idx = max_pool2d(input.unsqueeze(-2), (1, k), (1, s), (0, _one(padding, "padding", "max_pool1d")),
                          (1, _one(dilation, "dilation", "max_pool1d")), ceil_mode, return_indices=True)
    out = out.squeeze(-2)
    return (out, idx.squeeze(-2)) if return_indices else out


def avg_pool1d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """Mean over windows of an ``(N, C, L)`` input (avg_pool2d over a unit H axis)."""
    _check_1d("avg_pool1d", input)
    k = _one(kernel_size, "kernel_size", "avg_pool1d")
    s = k if stride is None or (isinstance(stride, (list, tuple)) and not stride) else _one(stride, "stride",
                                                                                           "avg_pool1d")
    return avg_pool2d(input.unsqueeze(-2), (1, k), (1, s), (0, _one(padding, "padding", "avg_pool1d")),
                      ceil_mode, count_include_pad).squeeze(-2)


def adaptive_avg_pool1d(input: Tensor, output_size) -> Tensor:
    """Mean pooling of an ``(N, C, L)`` input to ``output_size`` positions."""
    _check_1d("adaptive_avg_pool1d", input)
    size = _one(output_size, "output_size", "adaptive_avg_pool1d")
    return adaptive_avg_pool2d(input.unsqueeze(-2), (1, size)).squeeze(-2)


def _amp2d_grad(c, dy, _didx) -> tuple:
    """Scatter-add ``dy`` into the flat H*W positions the forward picked (linear in dy, so it is
    differentiable again and sharded by scatter_add's rule)."""
    x, idx = c.inputs[0], c.outs[1]
    dx = zeros_like(x).flatten(-2).scatter_add(-1, idx.flatten(-2), dy.flatten(-2))
    return (dx.reshape(c.shapes[0]),)


def _amp2d_kernel(x: torch.Tensor, output_size: tuple) -> tuple:
    if 0 in x.shape[:-2]:  # aten rejects an empty channel dim, which an uneven shard can have
        shape = tuple(x.shape[:-2]) + tuple(output_size)
        return x.new_empty(shape), torch.empty(shape, dtype=torch.int64, device=x.device)
    return torch.ops.aten.adaptive_max_pool2d.default(x, output_size)


ADAPTIVE_MAX_POOL2D = defop("adaptive_max_pool2d", _amp2d_kernel, grad=_amp2d_grad, save="both",
                            saved_outputs=(1,),
                            sbp=_lead_sbp(n_out=2), outputs=("out", "indices"), family="pool")


def adaptive_max_pool2d(input: Tensor, output_size, return_indices: bool = False):
    """Max pooling to a fixed ``output_size`` (None keeps that size); with ``return_indices``
    also the flat H*W argmax of each window."""
    _check_pool("adaptive_max_pool2d", input)
    size = output_size if isinstance(output_size, (list, tuple)) else (output_size, output_size)
    size = tuple(int(input.shape[-2 + i]) if s is None else int(s) for i, s in enumerate(size))
    out, idx = apply(ADAPTIVE_MAX_POOL2D, input, output_size=size)
    return (out, idx) if return_indices else out


def adaptive_max_pool1d(input: Tensor, output_size, return_indices: bool = False):
    """Max pooling of an ``(N, C, L)`` input to ``output_size`` positions; indices index L."""
    _check_1d("adaptive_max_pool1d", input)
    size = _one(output_size, "output_size", "adaptive_max_pool1d")
    out, idx = adaptive_max_pool2d(input.unsqueeze(-2), (1, size), return_indices=True)
    out = out.squeeze(-2)
    return (out, idx.squeeze(-2)) if return_indices else out


# -- pixel shuffle, bilinear, distances, local response norm ---------------------------------------------

def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """``(*, C r^2, H, W) -> (*, C, H r, W r)``: moves channel blocks into space."""
    r = int(upscale_factor)
    if input.dim() < 3 or r <= 0 or input.shape[-3] % (r * r):
        raise ShapeError(f"holoflow.pixel_shuffle: expected a (*, C * {r}^2, H, W) input, got shape "
                         f"{tuple(input.shape)}")
    *lead, c, h, w = input.shape
    n = len(lead)
    x = input.reshape(*lead, c // (r * r), r, r, h, w).permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return x.reshape(*lead, c // (r * r), h * r, w * r)


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """``(*, C, H r, W r) -> (*, C r^2, H, W)``: the inverse of :func:`pixel_shuffle`."""
    r = int(downscale_factor)
    if input.dim() < 3 or r <= 0 or input.shape[-2] % r or input.shape[-1] % r:
        raise ShapeError(f"holoflow.pixel_unshuffle: expected a (*, C, H, W) input with H and W divisible by "
                         f"{r}, got shape {tuple(input.shape)}")
    *lead, c, h, w = input.shape
    n = len(lead)
    x = input.reshape(*lead, c, h // r, r, w // r, r).permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return x.reshape(*lead, c * r * r, h // r, w // r)


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y_o = x1 W_o x2 + b_o``: one einsum over ``(*, I1)``, ``(O, I1, I2)`` and ``(*, I2)``."""
    if (weight.dim() != 3 or input1.shape[-1] != weight.shape[1] or input2.shape[-1] != weight.shape[2]
            or tuple(input1.shape[:-1]) != tuple(input2.shape[:-1])):
        raise ShapeError(f"holoflow.bilinear: inputs {tuple(input1.shape)} and {tuple(input2.shape)} need equal "
                         f"leading dims and last dims matching weight (O, I1, I2) = {tuple(weight.shape)}")
    input1, input2, weight, bias = interpret.composite("bilinear", input1, input2, weight, bias)
    out = trilinear("...i,oij,...j->...o", input1, weight, input2)
    return out + bias if bias is not None else out


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """``||x1 - x2 + eps||_p`` along the last dim, as torch defines it."""
    return norm(x1 - x2 + eps, p, dim=max(x1.dim(), x2.dim()) - 1, keepdim=keepdim)


def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Tensor:
    """``x / (k + alpha * mean of x^2 over `size` neighbouring channels)^beta``, the window
    zero-padded as torch pads it. The window sum is ``size`` shifted slices of the channel axis
    (an average pool over it would fail on a shard with an empty leading dim)."""
    if input.dim() < 3:
        raise ShapeError(f"holoflow.local_response_norm: expected a 3-D or higher input, got shape "
                         f"{tuple(input.shape)}")
    if input.numel() == 0:
        return input
    c = input.shape[1]
    sq = pad(input * input, [0, 0] * (input.dim() - 2) + [size // 2, (size - 1) // 2])
    div = sq.narrow(1, 0, c)
    for i in range(1, size):
        div = div + sq.narrow(1, i, c)
    return input / (div / size * alpha + k) ** beta


# -- losses ------------------------------------------------------------------------------------------

def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0, size_average=None,
                        reduce=None, reduction: str = "mean") -> Tensor:
    """``max(0, -target * (input1 - input2) + margin)``, reduced."""
    red = _reduction("margin_ranking_loss", reduction, size_average, reduce)
    input1, input2, target = interpret.composite("margin_ranking_loss", input1, input2, target)
    if not input1.dim() == input2.dim() == target.dim():
        raise ShapeError(f"holoflow.margin_ranking_loss: all inputs need the same number of dims, got "
                         f"{tuple(input1.shape)}, {tuple(input2.shape)} and target {tuple(target.shape)}")
    return reduce_loss((-target * (input1 - input2) + margin).clamp_min(0.0), red)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0, size_average=None,
                          reduce=None, reduction: str = "mean") -> Tensor:
    """``1 - cos(x1, x2)`` where ``target == 1``, ``max(0, cos - margin)`` where ``target == -1``."""
    red = _reduction("cosine_embedding_loss", reduction, size_average, reduce)
    input1, input2 = interpret.composite("cosine_embedding_loss", input1, input2)
    if target.dim() not in (0, 1) or input1.dim() != target.dim() + 1 or input2.dim() != target.dim() + 1:
        raise ShapeError(f"holoflow.cosine_embedding_loss: expected a 1-D target with 2-D inputs or a 0-D target "
                         f"with 1-D inputs, got {tuple(input1.shape)}, {tuple(input2.shape)} and target "
                         f"{tuple(target.shape)}")
    d = target.dim()
    eps = 1e-12  # torch's EPSILON
    prod = _sum(input1 * input2, d)
    den = ((_sum(input1 * input1, d) + eps) * (_sum(input2 * input2, d) + eps)).sqrt()
    cos = prod / den
    zero = zeros_like(cos)
    loss = E.where(target == 1, 1 - cos, zero) + E.where(target == -1, (cos - margin).clamp_min(0.0), zero)
    return reduce_loss(loss, red)


def _gaussian_var(input: Tensor, var) -> Tensor:
    if not isinstance(var, Tensor):
        if var < 0:
            raise ValueError("holoflow.gaussian_nll_loss: var has negative entry/entries")
        return ones_like(input) * float(var)   # (torch's; 0 * x would be NaN at an infinite x)
    if bool((var < 0).any()):
        raise ValueError("holoflow.gaussian_nll_loss: var has negative entry/entries")
    vs, xs = tuple(var.shape), tuple(input.shape)
    if vs == xs:
        return var
    if xs[:-1] == vs:
        return var.unsqueeze(-1)
    if len(vs) == len(xs) and sum(v for x, v in zip(xs, vs) if x != v) == 1:
        return var  # one broadcast dim of size 1: homoscedastic along it
    raise ShapeError(f"holoflow.gaussian_nll_loss: var of shape {vs} is of incorrect size for input of shape {xs} "
                     f"(same shape, the input's shape without its last dim, or one dim of size 1)")


def gaussian_nll_loss(input: Tensor, target: Tensor, var, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> Tensor:
    """``0.5 (log var + (input - target)^2 / var)`` (+ ``0.5 log 2 pi`` if ``full``), reduced.
    ``var`` is clamped to ``eps`` for the value only: its gradient passes the clamp unchanged, as
    torch's: an in-place clamp of a clone under ``no_grad`` (the straight-through sum
    ``clamp(v) + (v - v)`` was NaN at an infinite variance)."""
    red = _reduction("gaussian_nll_loss", reduction)
    var = _gaussian_var(input, var).clone()
    with no_grad():
        var.clamp_(min=eps)
    d = input - target
    loss = (var.log() + d * d / var) * 0.5
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return reduce_loss(loss, red)


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False, size_average=None,
                     eps: float = 1e-8, reduce=None, reduction: str = "mean") -> Tensor:
    """Poisson negative log-likelihood: ``exp(input) - target * input`` for log-rates (else
    ``input - target * log(input + eps)``), plus Stirling's term for ``target > 1`` if ``full``."""
    red = _reduction("poisson_nll_loss", reduction, size_average, reduce)
    input, target = interpret.composite("poisson_nll_loss", input, target)
    loss = input.exp() - target * input if log_input else input - target * (input + eps).log()
    if full:
        stirling = target * target.log() - target + (target * (2 * math.pi)).log() * 0.5
        loss = loss + stirling.masked_fill(target <= 1, 0.0)
    return reduce_loss(loss, red)


__all__ = ["dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "prelu", "glu", "celu",
           "softsign", "tanhshrink", "softshrink", "hardshrink", "max_pool1d", "avg_pool1d", "adaptive_avg_pool1d",
           "adaptive_max_pool1d", "adaptive_max_pool2d", "pixel_shuffle", "pixel_unshuffle", "bilinear",
           "pairwise_distance", "local_response_norm", "margin_ranking_loss", "cosine_embedding_loss",
           "gaussian_nll_loss", "poisson_nll_loss"]
