"""Layout ops: tril/triu, roll, flip, diagonal/diag and pad (nn.functional-compatible),
``Tensor.unfold`` (sliding windows as a view) and pixel_shuffle/pixel_unshuffle. Imported by
ops/shape.py, which re-exports them."""
from __future__ import annotations

import math

from typing import Sequence

import torch
import torch.nn.functional as F

from ..core import interpret
from ..core.dispatch import apply, apply_inplace
from ..core.errors import ShapeError, normalize_dim
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .family import defop

__all__ = ["tril", "triu", "roll", "flip", "fliplr", "flipud", "diagonal", "diag", "pad", "as_strided"]


def _fmt(shape) -> str:
    return str(tuple(shape))


def _sizes(args: tuple) -> tuple:
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        args = tuple(args[0])
    return tuple(int(a) for a in args)


# -- triangles, roll, flip, diagonal ---------------------------------------------------------------

def _batch_sbp(keep: int):
    """Splits on the leading dims except the last ``keep``; linear (P passes)."""
    def rule(metas, attrs):
        nd = len(metas[0].shape)
        return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(a),)) for a in range(nd - keep)]
    return rule


TRIL = defop("tril", lambda x, diagonal: torch.tril(x, diagonal), sbp=_batch_sbp(2), family="shape",
             inplace_kernel=lambda x, diagonal: x.tril_(diagonal),
             grad=lambda ctx, dy: (apply(TRIL, dy, diagonal=ctx.diagonal),))
TRIU = defop("triu", lambda x, diagonal: torch.triu(x, diagonal), sbp=_batch_sbp(2), family="shape",
             inplace_kernel=lambda x, diagonal: x.triu_(diagonal),
             grad=lambda ctx, dy: (apply(TRIU, dy, diagonal=ctx.diagonal),))


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    """Lower triangle of the last two dims (the rest zero)."""
    if input.dim() < 2:
        raise ShapeError(f"holoflow.tril: needs at least 2 dims, got shape {_fmt(input.shape)}")
    return apply(TRIL, input, diagonal=diagonal)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    """Upper triangle of the last two dims (the rest zero)."""
    if input.dim() < 2:
        raise ShapeError(f"holoflow.triu: needs at least 2 dims, got shape {_fmt(input.shape)}")
    return apply(TRIU, input, diagonal=diagonal)


def _untouched_sbp(key: str):
    """Splits on every axis not in ``attrs[key]`` (None means all axes are touched)."""
    def rule(metas, attrs):
        nd, dims = len(metas[0].shape), attrs[key]
        sigs = [((B,), (B,)), ((P,), (P,))]
        if dims is not None:
            sigs += [((S(a),), (S(a),)) for a in range(nd) if a not in dims]
        return sigs
    return rule


ROLL = defop("roll", lambda x, shifts, dims: torch.roll(x, shifts, dims if dims is not None else ()),
             sbp=_untouched_sbp("dims"), family="shape",
             grad=lambda ctx, dy: (apply(ROLL, dy, shifts=tuple(-s for s in ctx.shifts), dims=ctx.dims),))
FLIP = defop("flip", lambda x, dims: torch.flip(x, dims), sbp=_untouched_sbp("dims"), family="shape",
             grad=lambda ctx, dy: (apply(FLIP, dy, dims=ctx.dims),))


def roll(input: Tensor, shifts, dims=None) -> Tensor:
    """Rolls elements along ``dims`` (of the flattened tensor when None)."""
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    if dims is not None:
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        dims = tuple(normalize_dim("roll", d, input.dim()) for d in dims)
        if len(dims) != len(shifts):
            raise RuntimeError(f"holoflow.roll: shifts and dims must align: {len(shifts)} shifts {list(shifts)} "
                               f"for {len(dims)} dims {list(dims)}")
    return apply(ROLL, input, shifts=shifts, dims=dims)


def _dims_arg(op: str, args: tuple, dims) -> tuple:
    """``f(0, 1)``, ``f((0, 1))`` and torch's keyword form ``f(dims=(0, 1))`` alike."""
    if dims is not None:
        if args:
            raise TypeError(f"{op}() got multiple values for argument 'dims'")
        args = (dims,)
    elif not args:
        raise TypeError(f'{op}() missing 1 required positional arguments: "dims"')
    flat = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    if any(d is True or d is False for d in flat):   # (torch's parser refuses a bool as a dim)
        raise TypeError(f"holoflow.{op}: dims must be ints, got {tuple(flat)}")
    return _sizes(args)


def flip(input: Tensor, *args, dims=None) -> Tensor:
    """Reverses the order of elements along ``dims`` (positional, a sequence, or ``dims=``)."""
    dims = _dims_arg("flip", args, dims)
    return apply(FLIP, input, dims=tuple(normalize_dim("flip", d, input.dim()) for d in dims))


def fliplr(input: Tensor) -> Tensor:
    return flip(input, 1)


def flipud(input: Tensor) -> Tensor:
    return flip(input, 0)


def _rest_axes(nd: int, d1: int, d2: int) -> list[int]:
    return [a for a in range(nd) if a not in (d1, d2)]


def _diagonal_sbp(metas, attrs):
    rest = _rest_axes(len(metas[0].shape), attrs["dim1"], attrs["dim2"])
    return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(k),)) for k, a in enumerate(rest)]


def _diagonal_backward_kernel(dy, shape, offset, dim1, dim2):
    z = dy.new_zeros(shape)
    torch.diagonal(z, offset, dim1, dim2).copy_(dy)
    return z


def _diagonal_backward_sbp(metas, attrs):
    rest = _rest_axes(len(attrs["shape"]), attrs["dim1"], attrs["dim2"])
    return [((B,), (B,)), ((P,), (P,))] + [((S(k),), (S(a),)) for k, a in enumerate(rest)]


def _diagonal_backward_local(attrs, metas, local_metas, in_sbps):
    s = in_sbps[0]
    if not isinstance(s, S):
        return attrs
    shape = list(attrs["shape"])
    shape[_rest_axes(len(shape), attrs["dim1"], attrs["dim2"])[s.axis]] = local_metas[0].shape[s.axis]
    return {**attrs, "shape": tuple(shape)}


_DIAG_ATTRS = ("offset", "dim1", "dim2")
DIAGONAL = defop("diagonal", lambda x, offset, dim1, dim2: torch.diagonal(x, offset, dim1, dim2),
                 sbp=_diagonal_sbp, family="shape", view=True,
                 grad=lambda ctx, dy: (apply(DIAGONAL_BACKWARD, dy, shape=tuple(ctx.shapes[0]),
                                             **{k: getattr(ctx, k) for k in _DIAG_ATTRS}),))
DIAGONAL_BACKWARD = defop("diagonal_backward", _diagonal_backward_kernel, sbp=_diagonal_backward_sbp,
                          local_attrs=_diagonal_backward_local, family="shape",
                          grad=lambda ctx, dy: (apply(DIAGONAL, dy, **{k: getattr(ctx, k) for k in _DIAG_ATTRS}),))


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of the (dim1, dim2) planes, appended as the last dim."""
    nd = input.dim()
    d1, d2 = normalize_dim("diagonal", dim1, nd), normalize_dim("diagonal", dim2, nd)
    if d1 == d2:
        raise RuntimeError(f"holoflow.diagonal: dim1 and dim2 are the same dim {d1}; they must differ")
    return apply(DIAGONAL, input, offset=offset, dim1=d1, dim2=d2)


DIAG = defop("diag", lambda x, diagonal: torch.diag(x, diagonal), family="shape",
             sbp=lambda metas, attrs: [((B,), (B,)), ((P,), (P,))],
             grad=lambda ctx, dy: (apply(DIAGONAL, dy, offset=ctx.diagonal, dim1=0, dim2=1),))


def diag(input: Tensor, diagonal: int = 0) -> Tensor:
    """A 1-d tensor -> a square matrix with it on a diagonal; a matrix -> that diagonal."""
    if input.dim() == 1:
        return apply(DIAG, input, diagonal=diagonal)
    if input.dim() == 2:   # (a copy, as torch's: not diagonal()'s view, which writes to the matrix reach)
        return apply(DIAGONAL, input, offset=diagonal, dim1=0, dim2=1).clone()
    raise ShapeError(f"holoflow.diag: expects a 1-d or 2-d tensor, got shape {_fmt(input.shape)}")


# -- pad ------------------------------------------------------------------------------------------

def _pad_pairs(pad: tuple, nd: int) -> dict[int, tuple[int, int]]:
    """{dim: (before, after)} from torch's last-dim-first pad list."""
    return {nd - 1 - k: (pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)}


def _pad_sbp(metas, attrs):
    nd = len(metas[0].shape)
    padded = {d for d, p in _pad_pairs(attrs["pad"], nd).items() if p != (0, 0)}
    sigs = [((B,), (B,))]
    if attrs["mode"] != "constant" or attrs["value"] == 0:
        sigs.append(((P,), (P,)))
    return sigs + [((S(a),), (S(a),)) for a in range(nd) if a not in padded]


def _source_index(n: int, lo: int, hi: int, mode: str, device) -> torch.Tensor:
    """For each padded position along a dim, the input position it copies (non-constant modes)."""
    src = torch.arange(-lo, n + hi, device=device)
    if mode == "reflect":
        src = src.abs()
        return torch.where(src >= n, 2 * (n - 1) - src, src)
    if mode == "replicate":
        return src.clamp(0, n - 1)
    # circular: torch crops negative pads first, then wraps within what is left
    off, m = max(-lo, 0), n - max(-lo, 0) - max(-hi, 0)
    return torch.arange(-max(lo, 0), m + max(hi, 0), device=device).remainder(m) + off


def _pad_backward_kernel(dy, pad, mode):
    g = dy
    for d, (lo, hi) in _pad_pairs(pad, dy.dim()).items():
        n = g.shape[d] - lo - hi
        shape = list(g.shape)
        shape[d] = n
        g = g.new_zeros(shape).index_add_(d, _source_index(n, lo, hi, mode, g.device), g)
    return g


def _pad_grad(ctx, dy):
    if ctx.mode == "constant":
        return (apply(PAD, dy, pad=tuple(-p for p in ctx.pad), mode="constant", value=0.0),)
    return (apply(PAD_BACKWARD, dy, pad=ctx.pad, mode=ctx.mode),)


def _pad_kernel(x, pad, mode, value):
    if x.numel() == 0 and mode != "constant":   # torch refuses empty non-batch dims (an empty shard)
        shape = list(x.shape)
        for d, (lo, hi) in _pad_pairs(pad, x.dim()).items():
            shape[d] += lo + hi
        return x.new_empty(shape)
    return F.pad(x, pad, mode, value if mode == "constant" else None)


PAD = defop("pad", _pad_kernel,
            grad=_pad_grad, sbp=_pad_sbp, family="shape")
PAD_BACKWARD = defop("pad_backward", _pad_backward_kernel, family="shape",
                     sbp=lambda metas, attrs: _pad_sbp(metas, {**attrs, "value": 0}),
                     grad=lambda ctx, dy: (apply(PAD, dy, pad=ctx.pad, mode=ctx.mode, value=0.0),))


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """Pads the last ``len(pad) // 2`` dims, as ``torch.nn.functional.pad``: ``pad`` lists
    (before, after) pairs starting from the last dim; modes constant/reflect/replicate/circular."""
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2 or len(pad) // 2 > input.dim():
        raise RuntimeError(f"holoflow.pad: pad {list(pad)} must have an even length of at most 2 * ndim "
                         f"for a tensor of shape {_fmt(input.shape)}")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise ValueError(f"holoflow.pad: unknown mode {mode!r}; use constant, reflect, replicate or circular")
    if mode != "constant" and value not in (None, 0, 0.0):
        raise ValueError(f"holoflow.pad: value={value} only applies to mode='constant'")
    if mode in ("reflect", "replicate"):   # torch's reflection_pad2d etc. (autocast lists them by these names)
        kind = "reflection" if mode == "reflect" else "replication"
        (input,) = interpret.composite(f"{kind}_pad{len(pad) // 2}d", input)
    return apply(PAD, input, pad=pad, mode=mode, value=0.0 if value is None else value)


# -- as_strided: a view with explicit sizes and strides --------------------------------------------

def _strided_index(shape: tuple, size: tuple, stride: tuple, offset: int, device) -> torch.Tensor:
    """For each element of the strided view, its flat position in a contiguous ``shape``."""
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, device=device).as_strided(size, stride, offset)


def _as_strided_backward_kernel(dy, shape, size, stride, offset):
    idx = _strided_index(shape, size, stride, offset, dy.device)
    flat = dy.new_zeros(math.prod(shape))
    flat.index_add_(0, idx.reshape(-1), dy.reshape(-1))  # overlapping windows add up, as torch
    return flat.view(shape)


def _as_strided_grad(ctx, dy):
    return (apply(AS_STRIDED_BACKWARD, dy, shape=tuple(ctx.shapes[0]), size=ctx.size, stride=ctx.stride,
                  offset=ctx.offset),)


def _broadcast_only(metas, attrs):
    return [((B,), (B,))]


def _as_strided_kernel(x, size, stride, offset):
    return x.as_strided(size, stride, x.storage_offset() + offset)   # offset from the input's start


AS_STRIDED = defop("as_strided", _as_strided_kernel, grad=_as_strided_grad, sbp=_broadcast_only, family="shape",
                   view=True)
AS_STRIDED_BACKWARD = defop("as_strided_backward", _as_strided_backward_kernel, sbp=_broadcast_only,
                            family="shape",
                            grad=lambda ctx, dy: (apply(AS_STRIDED, dy, size=ctx.size, stride=ctx.stride,
                                                        offset=ctx.offset),))


def as_strided(input: Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> Tensor:
    """A view of ``input``'s elements with the given sizes and strides, as ``torch.as_strided``.
    Offsets and strides are counted in elements of ``input`` laid out contiguously (holoflow
    requires a contiguous input, so the view and its gradient mean the same thing everywhere)."""
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if len(size) != len(stride):
        raise RuntimeError(f"holoflow.as_strided: size {list(size)} and stride {list(stride)} must have the "
                           f"same length")
    if not input.is_contiguous():
        raise RuntimeError(f"holoflow.as_strided: needs a contiguous input (this one has shape "
                           f"{_fmt(input.shape)} and strides {tuple(input.stride())}); call .contiguous() first")
    offset = 0 if storage_offset is None else int(storage_offset) - input._data.storage_offset()
    last = offset + sum((n - 1) * st for n, st in zip(size, stride) if n > 0)
    if offset < 0 or (all(size) and last >= input.numel()):
        raise RuntimeError(f"holoflow.as_strided: size {list(size)}, stride {list(stride)} and offset "
                           f"{storage_offset} reach outside the {input.numel()} elements of the input")
    return apply(AS_STRIDED, input, size=size, stride=stride, offset=offset)


for _name in ("tril", "triu", "roll", "flip", "fliplr", "flipud", "diagonal", "diag", "as_strided"):
    setattr(Tensor, _name, globals()[_name])
Tensor.tril_ = lambda self, diagonal=0: apply_inplace(TRIL, self, diagonal=diagonal)
Tensor.triu_ = lambda self, diagonal=0: apply_inplace(TRIU, self, diagonal=diagonal)


# -- Tensor.unfold: sliding windows as a view ---------------------------------------------------------------

def _unfold_sbp(metas, attrs):
    """A split on any axis but ``dimension`` stays (the window axis is appended last); linear."""
    return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(a),)) for a in range(len(metas[0].shape))
                                           if a != attrs["dimension"]]


def _unfold_backward_sbp(metas, attrs):
    return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(a),)) for a in range(len(attrs["shape"]))
                                           if a != attrs["dimension"]]


def _unfold_backward_local(attrs, metas, local_metas, in_sbps):
    """The input's shape follows the gradient's split."""
    s = in_sbps[0]
    if not isinstance(s, S):
        return attrs
    shape = list(attrs["shape"])
    shape[s.axis] = local_metas[0].shape[s.axis]
    return {**attrs, "shape": tuple(shape)}


_WINDOW = ("dimension", "size", "step")
UNFOLD = defop("unfold", lambda x, dimension, size, step: x.unfold(dimension, size, step), sbp=_unfold_sbp,
               family="shape", view=True,
               grad=lambda c, dy: (apply(UNFOLD_BACKWARD, dy, shape=tuple(c.shapes[0]),
                                         **{k: getattr(c, k) for k in _WINDOW}),))
UNFOLD_BACKWARD = defop("unfold_backward", lambda dy, shape, dimension, size, step: torch.ops.aten.unfold_backward(
    dy, shape, dimension, size, step), sbp=_unfold_backward_sbp, local_attrs=_unfold_backward_local, family="shape",
    grad=lambda c, g: (apply(UNFOLD, g, **{k: getattr(c, k) for k in _WINDOW}),))


def _unfold(self: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """``Tensor.unfold``: a view of every ``size``-long window along ``dimension``, ``step`` apart,
    as a new last dim (writes through it reach ``self``, as torch's)."""
    d = normalize_dim("unfold", dimension, self.dim())
    return apply(UNFOLD, self, dimension=d, size=int(size), step=int(step))


Tensor.unfold = _unfold


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


__all__ += ["pixel_shuffle", "pixel_unshuffle"]
