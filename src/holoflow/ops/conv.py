"""Convolution, pooling and interpolation: primitives on ATen kernels with dedicated backward ops.

One ``convolution`` op serves conv1d/2d/3d and the transposed forms. Padding 'same' with an
even receptive field pads one extra element at the end (``extra``), as torch does; the kernels
apply it and slice it off the input gradient. The linear backward ops (avg pooling,
interpolation) get their own grad rules (double backward); the others' grads raise.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as TF

from ..core.dispatch import apply
from ..core.errors import ShapeError
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .family import empty_safe
from .reduction import mean


def _pad_extra(x: torch.Tensor, extra) -> torch.Tensor:
    if not extra or not any(extra):
        return x
    arg = []
    for e in reversed(extra):
        arg += [0, e]
    return TF.pad(x, arg)


def _unbatched(x: torch.Tensor, w: torch.Tensor) -> bool:
    return x.dim() == w.dim() - 1


# -- convolution ---------------------------------------------------------------------------------

def _conv_kernel(x, w, b, stride, padding, dilation, transposed, output_padding, groups, extra):
    unb = _unbatched(x, w)
    if unb:
        x = x.unsqueeze(0)
    out = torch.convolution(_pad_extra(x, extra), w, b, stride, padding, dilation, transposed,
                                     output_padding, groups)
    return out.squeeze(0) if unb else out


def _zeros(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device).expand(shape)


def _conv_bwd_kernel(dy, x, w, stride, padding, dilation, transposed, output_padding, groups, extra,
                     has_bias, output_mask):
    unb = _unbatched(x, w)
    x4, dy4 = (x.unsqueeze(0), dy.unsqueeze(0)) if unb else (x, dy)
    xp = _pad_extra(x4, extra)
    c_out = w.shape[1] * groups if transposed else w.shape[0]
    dx, dw, db = torch.ops.aten.convolution_backward.default(
        dy4, xp, w, [c_out] if has_bias else None, stride, padding, dilation, transposed, output_padding,
        groups, [output_mask[0], output_mask[1], has_bias and output_mask[2]])
    if dx is None:
        dx = _zeros(x.shape, x)
    else:
        if xp is not x4:
            for d, n in enumerate(x4.shape[2:]):
                dx = dx.narrow(d + 2, 0, n)
        dx = dx.squeeze(0) if unb else dx
    return dx, dw if dw is not None else _zeros(w.shape, w), db if db is not None else _zeros((c_out,), w)


def _conv_sbp(metas, attrs):
    """Batch split -> batch split (weight B); out-channel split of the weight -> channel split of
    the output; in-channel split of input and weight -> partial sum (the bias then must be P so
    it is added once). Both operands are linear: P in one (bias P too) -> P."""
    x, w = metas[0], metas[1]
    has_b = isinstance(metas[2], Meta)
    ws, wb = (1, 0) if attrs["transposed"] else (0, 1)      # weight axes: out-, in-channel
    cax = len(x.shape) - len(w.shape) + 1
    bias = lambda s: (s,) if has_b else ()
    sigs = [((B, B) + bias(B), (B,))]
    if cax == 1:
        sigs.append(((S(0), B) + bias(B), (S(0),)))
    if attrs["groups"] == 1:
        sigs.append(((B, S(ws)) + bias(S(0)), (S(cax),)))
        sigs.append(((S(cax), S(wb)) + bias(P), (P,)))
    sigs += [((P, B) + bias(P), (P,)), ((B, P) + bias(P), (P,))]
    return sigs


def _conv_bwd_sbp(metas, attrs):
    dy, x, w = metas
    ws, wb = (1, 0) if attrs["transposed"] else (0, 1)
    cax = len(x.shape) - len(w.shape) + 1
    sigs = [((B, B, B), (B, B, B)), ((P, B, B), (P, P, P))]
    if cax == 1:
        sigs.append(((S(0), S(0), B), (S(0), P, P)))
    if attrs["groups"] == 1:
        sigs.append(((S(cax), B, S(ws)), (P, S(ws), S(0))))
        sigs.append(((B, S(cax), S(wb)), (S(cax), S(wb), B)))
    return sigs


CONV_ATTRS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups", "extra")


def _conv_grad(c, dy):
    x, w, b = c.inputs
    mask = [c.needs_grad[0], c.needs_grad[1], b is not None and c.needs_grad[2]]
    attrs = {k: c.attrs[k] for k in CONV_ATTRS}
    dx, dw, db = apply(CONV_BWD, dy, x, w, has_bias=b is not None, output_mask=mask, **attrs)
    return dx if mask[0] else None, dw if mask[1] else None, db if mask[2] else None


def _conv_bwd_grad(c, ddx, ddw, ddb):
    """Double backward. The convolution is bilinear in (x, w), so with <.,.> the dot product and
    dx, dw, db the VJPs of ``<dy, conv(x, w) + b>``: <ddx, dx> + <ddw, dw> + <ddb, db> =
    <dy, conv(ddx, w) + conv(x, ddw) + ddb>, whose gradients are
    d/d dy = conv(ddx, w) + conv(x, ddw, ddb), d/dx = input-VJP of conv(., ddw) at dy,
    d/dw = weight-VJP of conv(ddx, .) at dy (all convolution ops again: triple backward works)."""
    dy, x, w = c.inputs
    attrs = {k: c.attrs[k] for k in CONV_ATTRS}
    g_dy = g_x = g_w = None
    if c.needs_grad[0]:
        if ddw is not None:
            g_dy = apply(CONV, x, ddw, ddb, **attrs)
        elif ddb is not None:                     # db = dy summed over all but the channel axis
            k = w.dim() - 2
            g_dy = ddb.reshape((-1,) + (1,) * k).expand(tuple(dy.shape)).contiguous()
        if ddx is not None:
            t = apply(CONV, ddx, w, None, **attrs)
            g_dy = t if g_dy is None else g_dy + t
    if c.needs_grad[1] and ddw is not None:
        g_x = apply(CONV_BWD, dy, x, ddw, has_bias=False, output_mask=[True, False, False], **attrs)[0]
    if c.needs_grad[2] and ddx is not None:
        g_w = apply(CONV_BWD, dy, ddx, w, has_bias=False, output_mask=[False, True, False], **attrs)[1]
    return g_dy, g_x, g_w


def _conv_flops(ins, outs, attrs) -> float:   # (x, w, ...) -> y: each output a dot of w[1:]
    return 2.0 * math.prod(outs[0]) * math.prod(ins[1][1:])


def _conv_bwd_flops(ins, outs, attrs) -> float:   # (dy, x, w, ...): the input and weight products
    return 4.0 * math.prod(ins[0]) * math.prod(ins[2][1:])


CONV_BWD = defop("convolution_backward", _conv_bwd_kernel, sbp=_conv_bwd_sbp, grad=_conv_bwd_grad,
                 save="inputs", grad_reads=(), family="conv", flops=_conv_bwd_flops)
CONV = defop("convolution", _conv_kernel, grad=_conv_grad, save="inputs", sbp=_conv_sbp, family="conv",
             layout=True, flops=_conv_flops)


def _tuple(v, n: int, what: str, name: str, expand_one: bool = False) -> tuple:
    """``v`` as ``n`` ints: an int repeated, or a sequence of ``n``; with ``expand_one`` (ATen's
    convolutions and max/avg pools) also a sequence of one, repeated."""
    if type(v) is int:   # the usual argument: nothing to check
        return (v,) * n
    t = tuple(v) if isinstance(v, (list, tuple)) else (v,) * n
    if expand_one and len(t) == 1:
        t = t * n
    if len(t) != n:
        raise ValueError(f"holoflow.{name}: {what} must be an int or {n} ints, got {v!r}")
    if not all(hasattr(i, "__index__") and not isinstance(i, bool) for i in t):   # (torch refuses bools)
        raise TypeError(f"holoflow.{name}: {what} must be an int or {n} ints, got {v!r} "
                        f"({', '.join(sorted({type(i).__name__ for i in t}))})")
    return tuple(int(i) for i in t)


def _check_conv(name: str, x: Tensor, w: Tensor, b, k: int, groups: int, transposed: bool) -> None:
    if w.dim() != k + 2 or x.dim() not in (k + 1, k + 2):
        raise ShapeError(f"holoflow.{name}: expected a {k + 1}-D (unbatched) or {k + 2}-D input and a "
                         f"{k + 2}-D weight, got input {tuple(x.shape)} and weight {tuple(w.shape)}")
    cax = x.dim() - k - 1
    want = w.shape[0] if transposed else w.shape[1] * groups
    if x.shape[cax] != want:
        raise ShapeError(f"holoflow.{name}: input of shape {tuple(x.shape)} has {x.shape[cax]} channels "
                         f"(dim {cax}), but weight of shape {tuple(w.shape)} with groups={groups} expects "
                         f"{want} input channels")
    c_out = w.shape[1] * groups if transposed else w.shape[0]
    if b is not None and tuple(b.shape) != (c_out,):
        raise ShapeError(f"holoflow.{name}: bias of shape {tuple(b.shape)} should be ({c_out},) for weight "
                         f"of shape {tuple(w.shape)}")


def _complex_conv(run, x: Tensor, w: Tensor, b) -> Tensor:
    """A convolution of complex ``x`` and ``w`` (and bias) as three real ones (Gauss's product, as
    torch's complex convolution): ``a = x_r*w_r + b_r``, ``m = x_i*w_i`` and
    ``c = (x_r + x_i)*(w_r + w_i) + b_r + b_i`` give ``(a - m) + i (c - a - m)``; gradients flow
    through the real and imaginary parts. ``run(x, w, b)`` is the real convolution."""
    from .complex_ops import complex as _complex
    from .complex_ops import imag, real
    xr, xi, wr, wi = real(x), imag(x), real(w), imag(w)
    br, bi = (None, None) if b is None else (real(b), imag(b))
    a = run(xr, wr, br)
    m = run(xi, wi, None)
    c = run(xr + xi, wr + wi, None if b is None else br + bi)
    return _complex(a - m, c - a - m)


def _conv(name: str, k: int, input: Tensor, weight: Tensor, bias, stride, padding, dilation, groups) -> Tensor:
    _check_conv(name, input, weight, bias, k, groups, False)
    if input.is_complex() and weight.is_complex() and (bias is None or bias.is_complex()):
        return _complex_conv(lambda x, w, b: _conv(name, k, x, w, b, stride, padding, dilation, groups),
                             input, weight, bias)
    stride, dilation = _tuple(stride, k, "stride", name, True), _tuple(dilation, k, "dilation", name, True)
    extra = None
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0,) * k
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"holoflow.{name}: padding='same' is not supported for strided convolutions")
            total = [d * (n - 1) for d, n in zip(dilation, weight.shape[2:])]
            padding = tuple(t // 2 for t in total)
            extra = tuple(t - 2 * (t // 2) for t in total)
            extra = extra if any(extra) else None
        else:
            raise RuntimeError(f"holoflow.{name}: padding must be 'valid', 'same' or ints, got {padding!r}")
    padding = _tuple(padding, k, "padding", name, True)
    return apply(CONV, input, weight, bias, stride=stride, padding=padding, dilation=dilation,
                 transposed=False, output_padding=(0,) * k, groups=groups, extra=extra)


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """1-D convolution over an ``(N, C, L)`` input, as ``torch.nn.functional.conv1d``."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """2-D convolution over an ``(N, C, H, W)`` input; ``padding`` may be 'same' or 'valid'."""
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    return _conv("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


def _conv_transpose(name: str, k: int, input, weight, bias, stride, padding, output_padding, groups,
                    dilation) -> Tensor:
    _check_conv(name, input, weight, bias, k, groups, True)
    if input.is_complex() and weight.is_complex() and (bias is None or bias.is_complex()):
        return _complex_conv(lambda x, w, b: _conv_transpose(name, k, x, w, b, stride, padding, output_padding,
                                                             groups, dilation), input, weight, bias)
    return apply(CONV, input, weight, bias, stride=_tuple(stride, k, "stride", name, True),
                 padding=_tuple(padding, k, "padding", name, True),
                 dilation=_tuple(dilation, k, "dilation", name, True), transposed=True,
                 output_padding=_tuple(output_padding, k, "output_padding", name, True),
                 groups=groups, extra=None)


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    return _conv_transpose("conv_transpose1d", 1, input, weight, bias, stride, padding, output_padding,
                           groups, dilation)


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """Transposed 2-D convolution (the gradient of conv2d w.r.t. its input); weight is
    ``(C_in, C_out / groups, kH, kW)``."""
    return _conv_transpose("conv_transpose2d", 2, input, weight, bias, stride, padding, output_padding,
                           groups, dilation)


# -- pooling --------------------------------------------------------------------------------------

def _lead_sbp(linear_in: Sequence[int] = (), n_out: int = 1):
    """Split on the non-spatial leading axes (N and C of a 4-D input, C of a 3-D one), every
    tensor operand alike; P through the operands in ``linear_in`` (others B)."""
    def rule(metas, attrs):
        tens = [m for m in metas if isinstance(m, Meta)]
        n = len(tens)
        lead = len(tens[-1].shape) - 2 if n > 1 else len(tens[0].shape) - 2
        sigs = [((B,) * n, (B,) * n_out)]
        sigs += [((S(a),) * n, (S(a),) * n_out) for a in range(lead)]
        for i in linear_in:
            sigs.append((tuple(P if j == i else B for j in range(n)), (P,) * n_out))
        return sigs
    return rule


def _max_pool_bwd_kernel(dy, x, idx, kernel_size, stride, padding, dilation, ceil_mode):
    return torch.ops.aten.max_pool2d_with_indices_backward.default(dy, x, kernel_size, stride, padding, dilation,
                                                           ceil_mode, idx)


def max_pool_double_backward(c, ddx, spatial: int) -> tuple:
    """The backward scatters ``dy`` into the picked positions: linear in ``dy`` (its derivative
    gathers ``ddx`` at the forward's indices, torch's ``max_pool_double_backward``), zero in ``x``."""
    dy, _, idx = c.inputs
    gdy = ddx.flatten(-spatial).gather(-1, idx.flatten(-spatial)).reshape(c.shapes[0])
    return gdy, None, None


POOL_ATTRS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
MAX_POOL2D_BWD = defop("max_pool2d_backward", _max_pool_bwd_kernel, sbp=_lead_sbp((0,)),
                       grad=lambda c, ddx: max_pool_double_backward(c, ddx, 2), save="inputs", saved_inputs=(2,),
                       family="pool")
MAX_POOL2D = defop("max_pool2d", lambda x, kernel_size, stride, padding, dilation, ceil_mode:
                   torch.ops.aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode),
                   grad=lambda c, dy, _di: (apply(MAX_POOL2D_BWD, dy, c.inputs[0], c.outs[1],
                                                  **{k: c.attrs[k] for k in POOL_ATTRS}),),
                   save="both", saved_outputs=(1,), sbp=_lead_sbp(n_out=2), outputs=("out", "indices"),
                   family="pool")


def _pool_args(name, kernel_size, stride, padding, dilation=1) -> dict:
    k = _tuple(kernel_size, 2, "kernel_size", name, True)
    s = k if stride is None or (isinstance(stride, (list, tuple)) and not stride) else \
        _tuple(stride, 2, "stride", name, True)
    return {"kernel_size": k, "stride": s, "padding": _tuple(padding, 2, "padding", name, True),
            "dilation": _tuple(dilation, 2, "dilation", name, True)}


def _check_pool(name: str, x: Tensor) -> None:
    if x.dim() not in (3, 4):
        raise ShapeError(f"holoflow.{name}: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got "
                         f"shape {tuple(x.shape)}")


def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """Max over ``kernel_size`` windows; with ``return_indices`` also the flat H*W argmax."""
    _check_pool("max_pool2d", input)
    out, idx = apply(MAX_POOL2D, input, ceil_mode=bool(ceil_mode),
                     **_pool_args("max_pool2d", kernel_size, stride, padding, dilation))
    return (out, idx) if return_indices else out


def _avg_bwd_grad(c, ddx):
    attrs = {k: c.attrs[k] for k in ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                                     "divisor_override")}
    return apply(AVG_POOL2D, ddx, **attrs), None


AVG_POOL2D_BWD = defop("avg_pool2d_backward",
                       lambda dy, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override:
                       torch.ops.aten.avg_pool2d_backward.default(dy, x, kernel_size, stride, padding, ceil_mode,
                                                          count_include_pad, divisor_override),
                       grad=_avg_bwd_grad, sbp=_lead_sbp((0,)), family="pool")
AVG_POOL2D = defop("avg_pool2d", lambda x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                   divisor_override: torch.ops.aten.avg_pool2d.default(x, kernel_size, stride, padding, ceil_mode,
                                                               count_include_pad, divisor_override),
                   grad=lambda c, dy: (apply(AVG_POOL2D_BWD, dy, c.inputs[0], **c.attrs),), save="inputs",
                   sbp=_lead_sbp((0,)), family="pool")


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """Mean over ``kernel_size`` windows, as ``torch.nn.functional.avg_pool2d``."""
    _check_pool("avg_pool2d", input)
    a = _pool_args("avg_pool2d", kernel_size, stride, padding)
    del a["dilation"]
    return apply(AVG_POOL2D, input, ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad),
                 divisor_override=divisor_override, **a)


ADAPTIVE_AVG_POOL2D_BWD = defop(
    "adaptive_avg_pool2d_backward", lambda dy, x: torch.ops.aten._adaptive_avg_pool2d_backward.default(dy, x),
    grad=lambda c, ddx: (apply(ADAPTIVE_AVG_POOL2D, ddx, output_size=tuple(c.shapes[0][-2:])), None),
    sbp=_lead_sbp((0,)), family="pool")
ADAPTIVE_AVG_POOL2D = defop(
    "adaptive_avg_pool2d", lambda x, output_size: torch.ops.aten._adaptive_avg_pool2d.default(x, output_size),
    grad=lambda c, dy: (apply(ADAPTIVE_AVG_POOL2D_BWD, dy, c.inputs[0]),), save="inputs",
    sbp=_lead_sbp((0,)), family="pool")


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """Mean pooling to a fixed ``output_size`` (None keeps that input size)."""
    _check_pool("adaptive_avg_pool2d", input)
    size = output_size if isinstance(output_size, (list, tuple)) else (output_size, output_size)
    size = tuple(int(input.shape[-2 + i]) if s is None else int(s) for i, s in enumerate(size))
    if size == (1, 1):   # torch's global average pooling is a mean (cheaper, in both directions)
        return mean(input, (-1, -2), keepdim=True)
    return apply(ADAPTIVE_AVG_POOL2D, input, output_size=size)


# -- interpolate ---------------------------------------------------------------------------------

_MODES = {("nearest", 1): "upsample_nearest1d", ("nearest", 2): "upsample_nearest2d",
          ("nearest", 3): "upsample_nearest3d", ("nearest-exact", 1): "_upsample_nearest_exact1d",
          ("nearest-exact", 2): "_upsample_nearest_exact2d", ("nearest-exact", 3): "_upsample_nearest_exact3d",
          ("linear", 1): "upsample_linear1d", ("bilinear", 2): "upsample_bilinear2d",
          ("bicubic", 2): "upsample_bicubic2d", ("trilinear", 3): "upsample_trilinear3d",
          ("area", 1): None, ("area", 2): None, ("area", 3): None}      # area: adaptive average pooling
_LINEAR_MODES = ("linear", "bilinear", "bicubic", "trilinear")
_NEEDS = {"linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5}


def _interp_kernel(x, size, scale_factor, mode, align_corners, antialias=False):
    return TF.interpolate(x, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners,
                          antialias=antialias)


def _interp_bwd_kernel(dy, x, size, scale_factor, mode, align_corners, antialias=False):
    k = x.dim() - 2
    if mode == "area":
        if k == 1:
            return torch.ops.aten._adaptive_avg_pool2d_backward.default(dy.unsqueeze(-2), x.unsqueeze(-2)).squeeze(-2)
        fn = torch.ops.aten._adaptive_avg_pool2d_backward if k == 2 else torch.ops.aten._adaptive_avg_pool3d_backward
        return fn(dy, x)
    name = _MODES[(mode, k)]
    fn = getattr(torch.ops.aten, ("_" + name + "_aa" if antialias else name) + "_backward")
    scales = list(scale_factor) if scale_factor is not None else [None] * k
    extra = [align_corners] if mode in _LINEAR_MODES else []
    return fn(dy, list(dy.shape[2:]), list(x.shape), *extra, *scales)


def _resize_sbp(metas, attrs):
    """An ``(N, C, *spatial)`` resize: split on N or C (every tensor operand alike), partial sums
    through the linear operand 0."""
    n = sum(isinstance(m, Meta) for m in metas)
    return [((B,) * n, (B,)), ((S(0),) * n, (S(0),)), ((S(1),) * n, (S(1),)),
            ((P,) + (B,) * (n - 1), (P,))]


INTERPOLATE_BWD = defop("interpolate_backward", _interp_bwd_kernel, sbp=_resize_sbp, family="resize",
                        grad=lambda c, ddx: (apply(INTERPOLATE, ddx, **c.attrs), None))
INTERPOLATE = defop("interpolate", _interp_kernel, save="inputs", sbp=_resize_sbp, family="resize",
                    grad=lambda c, dy: (apply(INTERPOLATE_BWD, dy, c.inputs[0], **c.attrs),))


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                recompute_scale_factor=None, antialias: bool = False) -> Tensor:
    """Resizes the spatial dims of an ``(N, C, *)`` input, as ``torch.nn.functional.interpolate``:
    modes 'nearest' and 'nearest-exact' and 'area' (3-D to 5-D inputs), 'linear' (3-D), 'bilinear'
    and 'bicubic' (4-D, optionally antialiased), 'trilinear' (5-D); to ``size`` or by ``scale_factor``."""
    k = input.dim() - 2
    if mode in _NEEDS and input.dim() != _NEEDS[mode]:
        raise NotImplementedError(f"holoflow.interpolate: Got {input.dim()}D input, but {mode} mode needs "
                                  f"{_NEEDS[mode]}D input")
    if (mode, k) not in _MODES:
        raise NotImplementedError(f"holoflow.interpolate: Input Error: Only 3D, 4D and 5D input Tensors supported "
                                  f"(got {input.dim()}D) for the modes: nearest | linear | bilinear | bicubic | "
                                  f"trilinear | area | nearest-exact (got {mode})")
    if antialias and not (mode in ("bilinear", "bicubic") and input.dim() == 4):
        raise ValueError("holoflow.interpolate: Anti-alias option is restricted to bilinear and bicubic modes and "
                         "requires a 4-D tensor as input")
    if size is not None and scale_factor is not None:
        raise ValueError("holoflow.interpolate: only one of size or scale_factor should be defined")
    if size is None and scale_factor is None:
        raise ValueError("holoflow.interpolate: either size or scale_factor should be defined")
    if mode not in _LINEAR_MODES and align_corners is not None:
        raise ValueError("holoflow.interpolate: align_corners option can only be set with the interpolating modes: "
                         "linear | bilinear | bicubic | trilinear")
    if recompute_scale_factor is not None and recompute_scale_factor and size is not None:
        raise ValueError("holoflow.interpolate: recompute_scale_factor is not meaningful with an explicit size.")
    if size is not None:
        size = _tuple(size, k, "size", "interpolate")
    else:
        scale_factor = tuple(float(s) for s in (scale_factor if isinstance(scale_factor, (list, tuple))
                                                else (scale_factor,) * k))
        if len(scale_factor) != k:
            raise ValueError(f"holoflow.interpolate: input and scale_factor must have the same number of spatial "
                             f"dimensions, but got input with spatial dimensions of {list(input.shape[2:])} and "
                             f"scale_factor of shape {list(scale_factor)}. Please provide input tensor in "
                             f"(N, C, d1, d2, ...,dK) format and scale_factor in (s1, s2, ...,sK) format.")
        if recompute_scale_factor or mode == "area":
            # the output size from the scale, then the kernels see only the size (torch does the same)
            size = tuple(int(math.floor(float(n) * s)) for n, s in zip(input.shape[2:], scale_factor))
            scale_factor = None
    ac = bool(align_corners) if mode in _LINEAR_MODES else None
    return apply(INTERPOLATE, input, size=size, scale_factor=scale_factor, mode=mode, align_corners=ac,
                 antialias=bool(antialias))


def upsample(input: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners=None) -> Tensor:
    return interpolate(input, size, scale_factor, mode, align_corners)


def conv_tbc(input: Tensor, weight: Tensor, bias: Tensor, pad: int = 0) -> Tensor:
    """``torch.conv_tbc``: a 1-d convolution over time of a ``(T, B, C_in)`` input with a
    ``(k, C_in, C_out)`` weight and ``pad`` zero steps at each end; returns ``(T', B, C_out)``."""
    if input.dim() != 3 or weight.dim() != 3 or bias.dim() != 1:
        raise RuntimeError(f"holoflow.conv_tbc: expected input (T, B, C_in), weight (k, C_in, C_out) and bias "
                           f"(C_out,), got {tuple(input.shape)}, {tuple(weight.shape)} and {tuple(bias.shape)}")
    if input.shape[2] != weight.shape[1] or bias.shape[0] != weight.shape[2]:
        raise RuntimeError(f"holoflow.conv_tbc: input channels {input.shape[2]} / bias size {bias.shape[0]} do not "
                           f"match weight of shape {tuple(weight.shape)} (k, C_in, C_out)")
    out = conv1d(input.permute(1, 2, 0), weight.permute(2, 1, 0), bias, padding=int(pad))
    return out.permute(2, 0, 1)


__all__ = ["conv1d", "conv_tbc", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "max_pool2d", "avg_pool2d",
           "adaptive_avg_pool2d", "interpolate", "upsample"]


# aten's pooling and resize kernels refuse empty channel/batch dims, which a split smaller than
# the mesh produces on some ranks: give them the empty-shard fallback
for _op in (MAX_POOL2D, MAX_POOL2D_BWD, AVG_POOL2D, AVG_POOL2D_BWD, ADAPTIVE_AVG_POOL2D,
            ADAPTIVE_AVG_POOL2D_BWD, INTERPOLATE, INTERPOLATE_BWD):
    _op.kernel = empty_safe(_op.kernel)
