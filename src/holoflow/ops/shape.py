"""Shape ops: views (reshape, permute, squeeze, ...), expand/repeat, cat/stack/split (the layout
ops tril/triu, roll, flip, diagonal, pad live in ops/layout.py and are re-exported here).

Every public function resolves its arguments (``-1`` sizes, negative dims, tuples) into concrete
attrs before ``apply`` so kernels, grad rules and SBP rules see plain data.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ..core import device as _device
from ..core import dtype as _dtype
from ..core import grad_mode
from ..core.forward_ad import alias as _alias
from ..core.dispatch import apply, check_inplace_target
from ..core.errors import ShapeError, UnsupportedError, int_sizes, normalize_dim
from ..core.interpret import is_lazy
from ..core.registry import REGISTRY, Meta
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .family import CAST, EXPAND, SUM_TO, defop, tensor_metas

__all__ = ["reshape", "view", "view_as", "reshape_as", "permute", "transpose", "swapaxes", "swapdims",
           "t", "movedim", "moveaxis", "flatten", "unflatten", "squeeze", "unsqueeze", "expand",
           "expand_as", "broadcast_to", "repeat", "tile", "repeat_interleave", "cat", "concat",
           "concatenate", "stack", "hstack", "vstack", "split", "chunk", "tensor_split", "unbind",
           "split_with_sizes", "hsplit", "vsplit", "dsplit", "unsafe_split", "unsafe_chunk",
           "unsafe_split_with_sizes", "narrow_copy", "unique_consecutive", "adjoint"]


def _sizes(args: tuple) -> tuple:
    """``f(2, 3)`` and ``f((2, 3))`` alike."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        args = tuple(args[0])
    for s in args:   # plain ints (the usual case) need no conversion
        if type(s) is not int:
            return int_sizes("reshape/view/expand", args)   # 3.7 raises TypeError (torch), never truncates
    return args


def _fmt(shape) -> str:
    return str(tuple(shape))


# -- reshape / view ---------------------------------------------------------------------------

def infer_shape(op: str, src: Sequence[int], shape: Sequence[int]) -> tuple:
    """Resolves one ``-1`` in ``shape``; raises a clear error when the sizes can't match."""
    numel = math.prod(src)
    shape = tuple(shape)
    low = min(shape) if shape else 0   # the usual valid cases first; the rest is checked below
    if low >= 0:
        if math.prod(shape) == numel:
            return shape
    elif low == -1 and shape.count(-1) == 1:
        known = -math.prod(shape)
        if known and not numel % known:
            i = shape.index(-1)
            return shape[:i] + (numel // known,) + shape[i + 1:]
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        raise ShapeError(f"holoflow.{op}: invalid target shape {_fmt(shape)}: sizes must be >= 0 "
                         f"with at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if known == 0 or numel % known:
            raise ShapeError(f"holoflow.{op}: cannot reshape a tensor of shape {_fmt(src)} ({numel} "
                             f"elements) into {_fmt(shape)}: {numel} is not a multiple of {known}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    elif known != numel:
        raise ShapeError(f"holoflow.{op}: cannot reshape a tensor of shape {_fmt(src)} ({numel} "
                         f"elements) into {_fmt(shape)} ({known} elements)")
    return shape


def reshape_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list, list]]:
    """Minimal groups of input/output dims with equal products (both shapes without zeros)."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
            groups.append(([], [j]))
            j += 1
            continue
        ins, outs, pi, pj = [i], [j], src[i], dst[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                ins.append(i)
                pi *= src[i]
                i += 1
            else:
                outs.append(j)
                pj *= dst[j]
                j += 1
        groups.append((ins, outs))
    return groups


def _reshape_splits(src: tuple, dst: tuple) -> dict[int, int]:
    """Input axis -> output axis that can carry its split: the axis leads its group and its
    output axis is made of whole units of it (unchanged, or the first dim of a merge) or divides
    it (the first dim of a split: (2048,) -> (32, 64), a merge's gradient); shards that are not
    balanced pieces of the output are refused per rank by ``global_dispatch.choose``."""
    if 0 in src:
        return {}
    out = {}
    for ins, outs in reshape_groups(src, dst):
        a, b = (src[ins[0]], dst[outs[0]]) if ins and outs else (1, 1)
        if a != 1 and (b % a == 0 or a % b == 0):
            out[ins[0]] = outs[0]
    return out


def _reshape_sbp(metas, attrs):
    src, dst = metas[0].shape, tuple(attrs["shape"])
    sigs = [((B,), (B,)), ((P,), (P,))]
    sigs += [((S(a),), (S(b),)) for a, b in _reshape_splits(src, dst).items()]
    return sigs


def _reshape_local(attrs, metas, local_metas, in_sbps):
    s = in_sbps[0]
    if not isinstance(s, S):
        return attrs
    src, dst = metas[0].shape, list(attrs["shape"])
    b = _reshape_splits(src, tuple(dst))[s.axis]
    dst[b] = local_metas[0].shape[s.axis] * dst[b] // src[s.axis]
    return {**attrs, "shape": tuple(dst)}


RESHAPE = defop("reshape", lambda x, shape: x.reshape(shape),
                grad=lambda ctx, dy: (apply(RESHAPE, dy, shape=tuple(ctx.shapes[0])),),
                sbp=_reshape_sbp, local_attrs=_reshape_local, family="shape", view=True)


def _given(op: str, sizes: tuple, arg: str) -> None:
    """torch's TypeError for a shape argument left out (``x.reshape()``; a 0-d target is ``()``)."""
    if not sizes:
        raise TypeError(f"holoflow.{op}() missing 1 required positional argument: '{arg}' (the target; () for a "
                        f"0-d one)")


def reshape(input: Tensor, *shape) -> Tensor:
    """Same data with a new shape (a view when possible); one size may be -1."""
    _given("reshape", shape, "shape")
    return apply(RESHAPE, input, shape=infer_shape("reshape", input.shape, _sizes(shape)))


def _view_dtype_sbp(metas, attrs):
    nd = len(metas[0].shape)
    same = metas[0].dtype.itemsize == attrs["dtype"].itemsize
    return [((B,), (B,))] + [((S(a),), (S(a),)) for a in range(nd) if same or a != nd - 1]


VIEW_DTYPE = defop("view_dtype", lambda x, dtype: x.view(dtype), sbp=_view_dtype_sbp, family="shape",
                   view=True, differentiable=False)


def view(input: Tensor, *shape) -> Tensor:
    """A view with a new shape; fails (suggesting reshape) when the strides don't allow one.
    ``view(dtype)`` reinterprets the bits as another dtype (not differentiable)."""
    _given("view", shape, "shape")
    if len(shape) == 1 and _is_dtype(shape[0]):
        return apply(VIEW_DTYPE, input, dtype=_dtype.to_torch(shape[0]))
    target = infer_shape("view", input.shape, _sizes(shape))
    g = input._global
    if g is None and not input._data.is_contiguous():  # (a contiguous tensor takes any view)
        _check_viewable(input._data, target)
    elif g is not None and getattr(g, "strides", None) is not None:   # a global view: torch's strides
        _check_viewable(torch.empty_strided(tuple(input.shape), g.strides, dtype=input._data.dtype,
                                            device="meta"), target)
    return apply(RESHAPE, input, shape=target)


def _check_viewable(d: torch.Tensor, target: tuple) -> None:
    try:
        d.view(target)
    except RuntimeError:
        raise RuntimeError(f"holoflow.view: a tensor of shape {_fmt(tuple(d.shape))} with strides "
                           f"{tuple(d.stride())} is not contiguous enough to view as "
                           f"{_fmt(target)}; use .reshape(...) (which copies) instead") from None


def _is_dtype(x) -> bool:
    return isinstance(x, (torch.dtype, _dtype.dtype))


def view_as(input: Tensor, other: Tensor) -> Tensor:
    return view(input, tuple(other.shape))


def reshape_as(input: Tensor, other: Tensor) -> Tensor:
    return reshape(input, tuple(other.shape))


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merges dims ``start_dim..end_dim`` into one (a 0-d tensor becomes 1-d)."""
    shape = tuple(input.shape)
    if not shape:
        return apply(RESHAPE, input, shape=(1,))
    s, e = normalize_dim("flatten", start_dim, len(shape)), normalize_dim("flatten", end_dim, len(shape))
    if s > e:
        raise ShapeError(f"holoflow.flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return apply(RESHAPE, input, shape=shape[:s] + (math.prod(shape[s:e + 1]),) + shape[e + 1:])


def unflatten(input: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
    """Splits dim ``dim`` into ``sizes`` (one may be -1)."""
    shape = tuple(input.shape)
    d = normalize_dim("unflatten", dim, len(shape))
    inner = infer_shape("unflatten", (shape[d],), tuple(sizes))
    return apply(RESHAPE, input, shape=shape[:d] + inner + shape[d + 1:])


def squeeze(input: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
    """Removes size-1 dims (all, or those among ``dim``)."""
    shape = tuple(input.shape)
    if dim is None:
        dims = set(range(len(shape)))
    else:
        dims = {normalize_dim("squeeze", d, len(shape)) for d in ((dim,) if isinstance(dim, int) else dim)}
    return apply(RESHAPE, input, shape=tuple(s for i, s in enumerate(shape) if not (i in dims and s == 1)))


def unsqueeze(input: Tensor, dim: int) -> Tensor:
    """Inserts a size-1 dim at ``dim``."""
    shape = tuple(input.shape)
    d = normalize_dim("unsqueeze", dim, len(shape) + 1)
    return apply(RESHAPE, input, shape=shape[:d] + (1,) + shape[d:])


# -- permute ----------------------------------------------------------------------------------

def _permute_sbp(metas, attrs):
    dims = attrs["dims"]
    return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(j),)) for j, a in enumerate(dims)]


def _permute_grad(ctx, dy):
    inv = [0] * len(ctx.dims)
    for j, a in enumerate(ctx.dims):
        inv[a] = j
    return (apply(PERMUTE, dy, dims=tuple(inv)),)


PERMUTE = defop("permute", lambda x, dims: x.permute(dims), grad=_permute_grad, sbp=_permute_sbp,
                family="shape", view=True)


def permute(input: Tensor, *args, dims=None) -> Tensor:
    """Reorders dims: output dim j is input dim ``dims[j]`` (positional, a sequence, or ``dims=``)."""
    if dims is not None:
        if args:
            raise TypeError("permute() got multiple values for argument 'dims'")
        args = (dims,)
    elif not args:
        raise TypeError('permute() missing 1 required positional arguments: "dims"')
    dims = _sizes(args)
    nd = input.dim()
    norm = tuple([d + nd if d < 0 else d for d in dims])
    if len(norm) == nd and sorted(norm) == list(range(nd)):   # a permutation of in-range dims
        return apply(PERMUTE, input, dims=norm)
    norm = tuple(normalize_dim("permute", d, nd) for d in dims)   # out of range: IndexError
    if len(dims) != nd or sorted(norm) != list(range(nd)):
        raise ShapeError(f"holoflow.permute: dims {dims} are not a permutation of the {nd} dims of a "
                         f"tensor of shape {_fmt(input.shape)}")
    return apply(PERMUTE, input, dims=norm)


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swaps two dims."""
    nd = input._data.dim() if input._global is None else input.dim()
    if type(dim0) is int and type(dim1) is int and -nd <= dim0 < nd and -nd <= dim1 < nd:
        dims = list(range(nd))
        a, b = dim0 % nd, dim1 % nd
        dims[a], dims[b] = b, a
        return apply(PERMUTE, input, dims=tuple(dims))
    for d in (dim0, dim1):
        if not isinstance(d, int) and not hasattr(d, "__index__"):
            raise TypeError(f"holoflow.transpose: dims must be ints, got {d!r} of type {type(d).__name__}")
    nd = input.dim()
    a, b = normalize_dim("transpose", dim0, nd), normalize_dim("transpose", dim1, nd)
    dims = list(range(nd))
    if nd:   # (a 0-d tensor takes dims 0 and -1, as torch's, and stays as it is)
        dims[a], dims[b] = dims[b], dims[a]
    return apply(PERMUTE, input, dims=tuple(dims))


swapaxes = swapdims = transpose


def t(input: Tensor) -> Tensor:
    """Transpose of a matrix; 0-d and 1-d tensors are returned as they are."""
    nd = input._data.dim() if input._global is None else input.dim()
    if nd > 2:
        raise ValueError(f"holoflow.t: expects a tensor with <= 2 dims, got shape {_fmt(input.shape)}")
    return apply(PERMUTE, input, dims=(1, 0)) if nd == 2 else input


def movedim(input: Tensor, source, destination) -> Tensor:
    """Moves dims ``source`` to positions ``destination`` (ints or sequences)."""
    nd = input.dim()
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    if len(src) != len(dst):
        raise ValueError(f"holoflow.movedim: source {source} and destination {destination} differ in length")
    src = [normalize_dim("movedim", d, nd) for d in src]
    dst = [normalize_dim("movedim", d, nd) for d in dst]
    if nd == 0:   # (dim 0 and -1 of a 0-d tensor name no dim: nothing moves)
        return apply(PERMUTE, input, dims=())
    dims = [-1] * nd
    for s, d in zip(src, dst):
        dims[d] = s
    rest = iter(a for a in range(nd) if a not in src)
    return apply(PERMUTE, input, dims=tuple(d if d != -1 else next(rest) for d in dims))


moveaxis = movedim


# -- expand / repeat ---------------------------------------------------------------------------

def expand(input: Tensor, *sizes) -> Tensor:
    """Broadcasts size-1 dims to ``sizes`` (-1 keeps a dim) without copying."""
    _given("expand", sizes, "size")
    sizes, shape = _sizes(sizes), tuple(input.shape)
    lead = len(sizes) - len(shape)
    if lead < 0:
        raise ShapeError(f"holoflow.expand: target {sizes} has fewer dims than the tensor's shape {_fmt(shape)}")
    out = []
    for i, s in enumerate(sizes):
        cur = shape[i - lead] if i >= lead else None
        if s == -1:
            if cur is None:
                raise ShapeError(f"holoflow.expand: -1 is not allowed for the new leading dim {i} in {sizes}")
            s = cur
        if cur is not None and cur != s and cur != 1:
            raise ShapeError(f"holoflow.expand: cannot expand shape {_fmt(shape)} to {sizes}: dim {i} "
                             f"has size {cur}, which is neither 1 nor {s}")
        out.append(s)
    return apply(EXPAND, input, shape=tuple(out))


def expand_as(input: Tensor, other: Tensor) -> Tensor:
    return expand(input, tuple(other.shape))


def broadcast_to(input: Tensor, size: Sequence[int]) -> Tensor:
    return expand(input, tuple(size))


def _repeat_grad(ctx, dy):
    reps, shape = ctx.sizes, tuple(ctx.shapes[0])
    full = (1,) * (len(reps) - len(shape)) + shape
    pairs = tuple(v for r, s in zip(reps, full) for v in (r, s))
    g = apply(RESHAPE, dy, shape=pairs)
    g = apply(SUM_TO, g, shape=tuple(v for s in full for v in (1, s)))
    return (apply(RESHAPE, g, shape=shape),)


def _repeat_sbp(metas, attrs):
    reps, nd = attrs["sizes"], len(metas[0].shape)
    lead = len(reps) - nd
    return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(a + lead),)) for a in range(nd) if reps[a + lead] == 1]


REPEAT = defop("repeat", lambda x, sizes: x.repeat(sizes), grad=_repeat_grad, sbp=_repeat_sbp, family="shape")


def repeat(input: Tensor, *sizes) -> Tensor:
    """Tiles the tensor ``sizes[i]`` times along each dim (``len(sizes) >= ndim``)."""
    _given("repeat", sizes, "repeats")
    sizes = _sizes(sizes)
    if len(sizes) < input.dim():
        raise ShapeError(f"holoflow.repeat: {len(sizes)} repeat sizes for a tensor of shape "
                         f"{_fmt(input.shape)}; give at least one per dim")
    return apply(REPEAT, input, sizes=sizes)


def tile(input: Tensor, dims: Sequence[int]) -> Tensor:
    """Like repeat; missing leading repeat counts are 1."""
    dims = _sizes((dims,))
    return apply(REPEAT, input, sizes=(1,) * (input.dim() - len(dims)) + dims)


def _repeat_interleave_grad(ctx, dy):
    shape, r, d = tuple(ctx.shapes[0]), ctx.repeats, ctx.dim
    if d is None:
        g = apply(SUM_TO, apply(RESHAPE, dy, shape=(math.prod(shape), r)), shape=(math.prod(shape), 1))
    else:
        g = apply(RESHAPE, dy, shape=shape[:d] + (shape[d], r) + shape[d + 1:])
        g = apply(SUM_TO, g, shape=shape[:d] + (shape[d], 1) + shape[d + 1:])
    return (apply(RESHAPE, g, shape=shape),)


def _repeat_interleave_sbp(metas, attrs):
    nd = len(metas[0].shape)
    axes = range(nd) if attrs["dim"] is not None else range(min(nd, 1))
    return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(a),)) for a in axes]


REPEAT_INTERLEAVE = defop("repeat_interleave", lambda x, repeats, dim: torch.repeat_interleave(x, repeats, dim),
                          grad=_repeat_interleave_grad, sbp=_repeat_interleave_sbp, family="shape")


# the index that repeats position i ``repeats[i]`` times (data-dependent length, like nonzero)
def _repeats_index_kernel(repeats: torch.Tensor, output_size) -> torch.Tensor:
    if repeats.device.type == "meta" and output_size is None:   # as nonzero's meta kernel says
        raise NotImplementedError("repeat_interleave of a tensor of repeats: its length is the repeats' sum")
    return torch.repeat_interleave(repeats, output_size=output_size)


REPEAT_INTERLEAVE_INDEX = defop("repeat_interleave_index", _repeats_index_kernel,
                                sbp=lambda metas, attrs: [((B,), (B,))], family="indexing", differentiable=False)


def _repeats_index(repeats: Tensor, output_size) -> Tensor:
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (_dtype.int32, _dtype.int64):
        raise RuntimeError(f"repeat_interleave only accept int32 and int64 tensor as repeats, got {repeats.dtype}")
    if not bool((repeats >= 0).all()):
        raise RuntimeError("repeats can not be negative")
    index = apply(REPEAT_INTERLEAVE_INDEX, repeats, output_size=output_size)
    if output_size is not None and index.shape[0] != output_size:
        raise RuntimeError("allocated size does not match required size")
    return index


def repeat_interleave(input: Tensor, repeats: int | Tensor | None = None, dim: int | None = None, *,
                      output_size=None) -> Tensor:
    """Repeats each element ``repeats`` times along ``dim`` (of the flattened tensor if None);
    ``repeats`` an int or a tensor of per-element counts (one, or one per element along ``dim``).
    ``repeat_interleave(repeats)`` alone gives ``arange(len(repeats))`` repeated by ``repeats``."""
    if repeats is None:
        if not isinstance(input, Tensor):
            raise TypeError(f"holoflow.repeat_interleave: repeats must be a tensor, got {type(input).__name__}")
        return _repeats_index(input, output_size)
    if isinstance(repeats, Tensor):
        if repeats.dim() > 1:
            raise RuntimeError("repeats must be 0-dim or 1-dim tensor")
        x = input.reshape(-1) if dim is None else input
        d = 0 if dim is None else normalize_dim("repeat_interleave", dim, input.dim())
        n = x.shape[d]
        if repeats.numel() == 1:
            repeats = repeats.reshape(1).expand(n)
        elif repeats.shape[0] != n:
            raise RuntimeError(f"repeats must have the same size as input along dim, but got repeats.size(0) = "
                               f"{repeats.shape[0]} and input.size({d}) = {n}")
        from .scatter import index_select
        return index_select(x, d, _repeats_index(repeats, output_size))
    if isinstance(repeats, bool) or not isinstance(repeats, int):
        raise TypeError(f"holoflow.repeat_interleave: repeats must be an int or a tensor, got "
                        f"{type(repeats).__name__}")
    if repeats < 0:
        raise RuntimeError("Repeats must be non-negative")
    d = None if dim is None else normalize_dim("repeat_interleave", dim, input.dim())
    out = apply(REPEAT_INTERLEAVE, input, repeats=repeats, dim=d)
    if output_size is not None and out.shape[0 if d is None else d] != output_size:
        raise RuntimeError(f"repeat_interleave: Invalid output_size, expected {out.shape[0 if d is None else d]} "
                           f"but got {output_size}")
    return out


# -- cat / stack / split / unbind ----------------------------------------------------------------

def _legacy_empty(m: Meta) -> bool:
    return tuple(m.shape) == (0,)


def _cat_shape(metas, attrs):
    tens, d = tensor_metas(metas), attrs["dim"]
    real = [(i, m) for i, m in enumerate(tens) if not _legacy_empty(m)]
    if real:
        i0, ref = real[0]
        for i, m in real[1:]:
            bad = len(m.shape) != len(ref.shape) or any(
                a != b for k, (a, b) in enumerate(zip(m.shape, ref.shape)) if k != d)
            if bad:
                raise ShapeError(f"holoflow.cat: tensor {i} has shape {_fmt(m.shape)} but tensor {i0} has "
                                 f"shape {_fmt(ref.shape)}; all sizes must match except in dim {d}")
    out = torch.cat([m.empty() for m in tens], d)
    return [Meta(tuple(out.shape), out.dtype, tens[0].device)]


def _cat_sbp(metas, attrs):
    tens, d = tensor_metas(metas), attrs["dim"]
    n = len(tens)
    sigs = [((B,) * n, (B,)), ((P,) * n, (P,))]
    if not any(_legacy_empty(m) for m in tens):
        sigs += [((S(a),) * n, (S(a),)) for a in range(len(tens[0].shape)) if a != d]
    return sigs


def _grad_to_dtype(g: Tensor, dtype: torch.dtype) -> Tensor:
    """An input's share of a promoted output's gradient in the input's dtype, as torch's autograd
    gives it: the real part for a real input of a complex result (no cast warning), then a cast."""
    if g._data.dtype == dtype or not (dtype.is_floating_point or dtype.is_complex):
        return g
    if g._data.is_complex() and not dtype.is_complex:
        g = apply(REGISTRY["real"], g)
    return g if g._data.dtype == dtype else apply(CAST, g, dtype=dtype)


def _cat_grad(ctx, dy):
    d = ctx.dim
    sizes = [0 if tuple(s) == (0,) and dy.dim() != 1 else s[d] for s in ctx.shapes]
    parts = apply(SPLIT, dy, sizes=tuple(sizes), dim=d)
    return tuple(_grad_to_dtype(p if tuple(p.shape) == tuple(s) else apply(RESHAPE, p, shape=tuple(s)), dt)
                 for p, s, dt in zip(parts, ctx.shapes, ctx.dtypes))


CAT = defop("cat", lambda *xs, dim: torch.cat(xs, dim), grad=_cat_grad, shape=_cat_shape, sbp=_cat_sbp,
            family="shape", fresh=True)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenates tensors along an existing dim."""
    if isinstance(tensors, Tensor):
        raise TypeError(f"holoflow.cat: expects a sequence of tensors, got a tensor of shape {_fmt(tensors.shape)}; "
                        f"wrap it in a list: cat([x, ...])")
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("holoflow.cat: expected a non-empty list of tensors")
    ref = next((x for x in tensors if tuple(x.shape) != (0,)), tensors[0])
    d = normalize_dim("cat", dim, ref.dim())
    return apply(CAT, *tensors, dim=d)


concat = concatenate = cat


def _stack_sbp(metas, attrs):
    tens, d = tensor_metas(metas), attrs["dim"]
    n = len(tens)
    return [((B,) * n, (B,)), ((P,) * n, (P,))] + \
        [((S(a),) * n, (S(a if a < d else a + 1),)) for a in range(len(tens[0].shape))]


def _stack_grad(ctx, dy):
    return tuple(_grad_to_dtype(g, dt) for g, dt in zip(apply(UNBIND, dy, dim=ctx.dim), ctx.dtypes))


# its own node, as torch's StackBackward0: each input is one edge of it, so the inputs' hooks fire
# in torch's order (an unsqueeze per input would put a node of its own before each of them)
STACK = defop("stack", lambda *xs, dim: torch.stack(xs, dim), grad=_stack_grad, sbp=_stack_sbp, family="shape",
              fresh=True)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Joins equally shaped tensors along a new dim."""
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("holoflow.stack: expected a non-empty list of tensors")
    ref = tuple(tensors[0].shape)
    for i, x in enumerate(tensors[1:], 1):
        if tuple(x.shape) != ref:
            raise ShapeError(f"holoflow.stack: tensor {i} has shape {_fmt(x.shape)} but tensor 0 has shape "
                             f"{_fmt(ref)}; stack needs equal shapes")
    d = normalize_dim("stack", dim, len(ref) + 1)
    return apply(STACK, *tensors, dim=d)


def hstack(tensors: Sequence[Tensor]) -> Tensor:
    tensors = [x if x.dim() else reshape(x, 1) for x in tensors]
    return cat(tensors, 0 if tensors[0].dim() == 1 else 1)


def vstack(tensors: Sequence[Tensor]) -> Tensor:
    return cat([x if x.dim() >= 2 else reshape(x, 1, -1) for x in tensors], 0)


def _split_sbp(metas, attrs):
    nd, d, n = len(metas[0].shape), attrs["dim"], len(attrs["sizes"])
    return [((B,), (B,) * n), ((P,), (P,) * n)] + [((S(a),), (S(a),) * n) for a in range(nd) if a != d]


SPLIT = defop("split", lambda x, sizes, dim: x.split_with_sizes(list(sizes), dim),
              grad=lambda ctx, *dys: (apply(CAT, *dys, dim=ctx.dim),), sbp=_split_sbp, family="shape",
              view=True)


def _split_by(input: Tensor, dim: int, parts: tuple) -> tuple:
    d = normalize_dim("split", dim, input.dim())
    sizes = tuple(p.shape[d] for p in parts)
    return tuple(apply(SPLIT, input, sizes=sizes, dim=d))


def split(tensor: Tensor, split_size_or_sections, dim: int = 0) -> tuple:
    """Pieces of ``split_size`` along ``dim`` (the last may be smaller), or of the given sizes."""
    if tensor.dim() == 0:   # (normalize_dim takes dim 0 of a 0-d tensor, which has no size)
        raise ShapeError("holoflow.split: split expects at least a 1-dimensional tensor")
    d = normalize_dim("split", dim, tensor.dim())
    if isinstance(split_size_or_sections, int):
        size = tensor.shape[d]
        step = split_size_or_sections
        if step <= 0 and size:
            raise ShapeError(f"holoflow.split: split_size must be positive, got {step}")
        sizes = tuple([min(step, size - i) for i in range(0, size, step)]) if size else (0,)
    else:
        sizes = tuple(int(s) for s in split_size_or_sections)
        if sum(sizes) != tensor.shape[d]:
            raise ShapeError(f"holoflow.split: sizes {list(sizes)} sum to {sum(sizes)}, but dim {d} of "
                             f"shape {_fmt(tensor.shape)} has size {tensor.shape[d]}")
    return tuple(apply(SPLIT, tensor, sizes=sizes, dim=d))


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple:
    """At most ``chunks`` pieces of equal size (the last may be smaller), as ``torch.chunk``."""
    d = normalize_dim("chunk", dim, input.dim())
    return _split_by(input, d, torch.empty(tuple(input.shape), device="meta").chunk(chunks, d))


def tensor_split(input: Tensor, indices_or_sections, dim: int = 0) -> tuple:
    """``sections`` nearly equal pieces, or pieces cut at ``indices``, as ``torch.tensor_split``:
    each a slice of its own (torch's are), not one of several outputs of one view op, so a piece
    stays usable by autograd after its base is written in place, and may be written itself."""
    d = normalize_dim("tensor_split", dim, input.dim())
    arg = indices_or_sections
    arg = arg.tolist() if isinstance(arg, Tensor) else arg
    whole = torch.empty(tuple(input.shape), device="meta")
    lead, step = (slice(None),) * d, whole.stride(d)   # (where each piece starts: its offset)
    return tuple(input[lead + (slice(p.storage_offset() // step, p.storage_offset() // step + p.shape[d]),)]
                 for p in whole.tensor_split(arg, d))


def _unbind_sbp(metas, attrs):
    nd, d = len(metas[0].shape), attrs["dim"]
    n = metas[0].shape[d]
    sigs = [((B,), (B,) * n), ((P,), (P,) * n)]
    return sigs + [((S(a),), (S(a if a < d else a - 1),) * n) for a in range(nd) if a != d]


UNBIND = defop("unbind", lambda x, dim: torch.unbind(x, dim), sbp=_unbind_sbp, family="shape", view=True,
               grad=lambda ctx, *dys: (stack(list(dys), ctx.dim),))


def unbind(input: Tensor, dim: int = 0) -> tuple:
    """The slices along ``dim``, with that dim removed."""
    return tuple(apply(UNBIND, input, dim=normalize_dim("unbind", dim, input.dim())))


def split_with_sizes(input: Tensor, split_sizes: Sequence[int], dim: int = 0) -> tuple:
    """Pieces of the given sizes along ``dim`` (views), as ``torch.split_with_sizes``."""
    if not isinstance(split_sizes, (list, tuple, torch.Size)):
        raise TypeError(f"holoflow.split_with_sizes: split_sizes must be a sequence of ints, got "
                        f"{type(split_sizes).__name__}")
    sizes = int_sizes("split_with_sizes", tuple(split_sizes))
    d = normalize_dim("split_with_sizes", dim, input.dim())
    if any(s < 0 for s in sizes) or sum(sizes) != input.shape[d]:
        raise ShapeError(f"holoflow.split_with_sizes: split_sizes {list(sizes)} must be non-negative and sum to "
                         f"{input.shape[d]} (the size of dim {d} of shape {_fmt(input.shape)})")
    return tuple(apply(SPLIT, input, sizes=sizes, dim=d))


def _directional_split(name: str, min_dims: int, dim_of: Callable[[int], int]) -> Callable:
    """``hsplit``/``vsplit``/``dsplit``: ``tensor_split`` along a fixed dim; a number of sections
    must divide it exactly."""
    def fn(input: Tensor, indices_or_sections) -> tuple:
        nd = input.dim()
        if nd < min_dims:
            raise ShapeError(f"holoflow.{name}: needs a tensor with at least {min_dims} dimension(s), got "
                             f"shape {_fmt(input.shape)}")
        d = dim_of(nd)
        k = indices_or_sections
        if isinstance(k, int) and (k <= 0 or input.shape[d] % k):
            raise ShapeError(f"holoflow.{name}: attempted to split dim {d} of size {input.shape[d]} into {k} "
                             f"equal sections")
        return tensor_split(input, k, d)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``tensor_split`` along a fixed dim (views), as ``torch.{name}``."
    return fn


hsplit = _directional_split("hsplit", 1, lambda nd: 0 if nd == 1 else 1)
vsplit = _directional_split("vsplit", 2, lambda nd: 0)
dsplit = _directional_split("dsplit", 3, lambda nd: 2)


def _untracked(pieces: tuple) -> tuple:
    """Pieces that share the input's storage without being tracked as its views: torch's
    ``unsafe_*`` splits, whose outputs may be written in place while autograd records."""
    for p in pieces:
        p.__dict__.pop("_view", None)
        p._data = _alias(p._data)   # not a torch view either (same storage and version counter)
    return pieces


def unsafe_split(tensor: Tensor, split_size: int, dim: int = 0) -> tuple:
    """``split`` whose pieces are not tracked as views (``torch.unsafe_split``)."""
    return _untracked(split(tensor, split_size, dim))


def unsafe_chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple:
    """``chunk`` whose pieces are not tracked as views (``torch.unsafe_chunk``)."""
    return _untracked(chunk(input, chunks, dim))


def unsafe_split_with_sizes(input: Tensor, split_sizes: Sequence[int], dim: int = 0) -> tuple:
    """``split_with_sizes`` whose pieces are not tracked as views (``torch.unsafe_split_with_sizes``)."""
    return _untracked(split_with_sizes(input, split_sizes, dim))


def narrow_copy(input: Tensor, dim: int, start: int, length: int) -> Tensor:
    """A contiguous copy of ``input.narrow(dim, start, length)``."""
    return input.narrow(dim, start, length).clone(memory_format=torch.contiguous_format)


def sum_to_size(self: Tensor, *size) -> Tensor:
    """Sums this tensor down to ``size`` (a shape it broadcasts from), as ``torch.Tensor.sum_to_size``."""
    shape, cur = _sizes(size), tuple(self.shape)
    lead = len(cur) - len(shape)
    if lead < 0 or any(s not in (1, c) for s, c in zip(shape, cur[lead:])):
        raise ShapeError(f"holoflow.sum_to_size: size {list(shape)} is not expandable to size {list(cur)}")
    return apply(SUM_TO, self, shape=shape)


# -- unique_consecutive -----------------------------------------------------------------------------

UNIQUE_CONSECUTIVE = defop("unique_consecutive", lambda x, dim: torch.unique_consecutive(
    x, return_inverse=True, return_counts=True, dim=dim), sbp=lambda metas, attrs: [((B,), (B, B, B))],
    family="sorting", differentiable=False)   # (a run may cross a shard's edge: no split)


def unique_consecutive(input: Tensor, return_inverse: bool = False, return_counts: bool = False,
                       dim: int | None = None):
    """The values (or slices along ``dim``) with consecutive repeats collapsed, optionally with
    the inverse map and the run lengths, as ``torch.unique_consecutive``."""
    d = None if dim is None else normalize_dim("unique_consecutive", dim, input.dim())
    values, inverse, counts = apply(UNIQUE_CONSECUTIVE, input, dim=d)
    out = (values,) + ((inverse,) if return_inverse else ()) + ((counts,) if return_counts else ())
    return out[0] if len(out) == 1 else out


# -- conjugate transposes ---------------------------------------------------------------------------

def _conj_transpose(x: Tensor, name: str, matrices_only: bool) -> Tensor:
    """The conjugate transpose of the last two dims (a view of a real tensor; complex ones are
    conjugated into a copy: holoflow has no lazy conjugate bit); a 0-d tensor is conjugated."""
    nd = x.dim()
    if nd == 1 or (matrices_only and nd > 2):
        want = "matrices (2-D tensors)" if matrices_only else "matrices or batches of matrices"
        raise ShapeError(f"holoflow.{name}: only supported on {want}, got a {nd}-D tensor of shape {_fmt(x.shape)}")
    t = transpose(x, -2, -1) if nd else x
    return t.conj() if t.is_complex() else t


def adjoint(input: Tensor) -> Tensor:
    """The conjugate transpose of the last two dims, as ``torch.adjoint`` (``x.mH``)."""
    return _conj_transpose(input, "adjoint", False)


# -- in-place shape changes, resize_ -------------------------------------------------------------------

def _local_eager(self: Tensor, name: str) -> None:
    if self._global is not None or is_lazy():
        raise UnsupportedError(f"holoflow.{name}: changing a tensor's shape in place is supported on local "
                               f"tensors outside nn.Graph only; use the out-of-place form")


def _has_views(data: torch.Tensor) -> bool:
    """Whether torch views of ``data``'s storage other than ``data`` are alive (each one holds a
    reference to the storage's root tensor)."""
    root = data._base if data._base is not None else data
    return root._use_count() > (1 if root is data else 2)


def _shape_inplace(name: str, fn: Callable) -> Callable:
    """``x.<name>(...)``, torch's in-place shape change: ``x`` takes the storage view and autograd
    history of the view ``fn(x, ...)`` (a view of a base stays one, its chain one op longer). The
    storage's version moves, as torch's does, so a backward reading ``x``'s old value fails.

    holoflow derives a view from its base by ops, not strides: views taken of a non-view ``x``
    before the change would be re-derived from its new shape once its history changes, so that
    is refused while autograd records (without it, their values stay right: they alias the
    storage, and their history does not move)."""
    def method(self: Tensor, *args, **kwargs) -> Tensor:
        _local_eager(self, name)
        if self._rg and grad_mode.is_grad_enabled():
            check_inplace_target(self, name[:-1])
            if self._view is None and _has_views(self._data):
                raise RuntimeError(f"holoflow.{name}: this tensor has views, which holoflow would re-derive "
                                   f"from its new shape (views follow their base by ops, not strides); change "
                                   f"the shape before taking views, or use the out-of-place {name[:-1]}()")
        y = fn(self, *args, **kwargs)
        torch.autograd.graph.increment_version(self._data)
        if self._view is not None:
            self._data, self._view = y._data, y._view
        else:   # a root alias of the storage (same version counter): its own views stay countable
            self._data = _alias(y._data)
        if y._grad_fn is not None:   # (the node just recorded: the version moved by this method, not by a write)
            self.grad_fn, self._out_idx = y._grad_fn, y._out_idx
        return self
    method.__name__ = method.__qualname__ = name
    return method


def _t_inplace(self: Tensor) -> Tensor:
    if self.dim() > 2:
        raise ShapeError(f"holoflow.t_: expects a tensor with <= 2 dims, got shape {_fmt(self.shape)}")
    return t(self)


def resize_(self: Tensor, *sizes, memory_format=None) -> Tensor:
    """Gives this tensor the shape ``sizes`` over its storage (contiguous from its offset), growing
    the storage if needed (new elements are uninitialised), as ``torch.Tensor.resize_``. Views
    share the storage and see the same memory."""
    shape = int_sizes("resize_", _sizes(sizes), allow_negative=False)
    if self._rg:
        raise RuntimeError("holoflow.resize_: cannot resize a tensor that requires grad (as torch); resize a "
                           ".detach()ed tensor")
    _local_eager(self, "resize_")
    if shape == tuple(self.shape) and (memory_format is None or self._data.is_contiguous(memory_format=memory_format)):
        return self   # (a memory format the tensor is not in restrides it, as torch's, even at its shape)
    if self._view is not None:
        raise UnsupportedError(f"holoflow.resize_: cannot resize a view (shape {_fmt(self.shape)}) to "
                               f"{_fmt(shape)}: holoflow derives views from their base by ops, not strides; "
                               f"resize the base, or a clone")
    data = self._data.detach()   # a new alias of the storage: other tensors keep their shapes
    try:
        data.resize_(shape, **({} if memory_format is None else {"memory_format": memory_format}))
    except RuntimeError as e:
        raise RuntimeError(f"holoflow.resize_({_fmt(shape)}): {str(e).splitlines()[0]}") from e
    self._data = data
    return self


def resize_as_(self: Tensor, the_template: Tensor, memory_format=None) -> Tensor:
    """``resize_`` to ``the_template``'s shape."""
    return resize_(self, tuple(the_template.shape), memory_format=memory_format)


def new_empty_strided(self: Tensor, size: Sequence[int], stride: Sequence[int], *, dtype=None, device=None,
                      requires_grad: bool = False, layout=None, pin_memory: bool = False) -> Tensor:
    """An uninitialised tensor with the given sizes and strides (this tensor's dtype and device
    by default), as ``torch.Tensor.new_empty_strided``."""
    if is_lazy():   # a trace's values are symbolic: strides don't matter there
        return self.new_empty(tuple(size), dtype=dtype, device=device, requires_grad=requires_grad)
    data = torch.empty_strided(tuple(size), tuple(stride), dtype=_dtype.to_torch(dtype) or self._data.dtype,
                               device=_device.to_torch(device) or self._data.device)
    return Tensor._make(data).requires_grad_(requires_grad)


# -- Tensor methods ---------------------------------------------------------------------------------

for _name in ("reshape", "view", "permute", "expand", "repeat", "view_as", "reshape_as", "transpose", "swapaxes",
              "swapdims", "t", "movedim", "moveaxis", "flatten", "unflatten", "squeeze", "unsqueeze", "expand_as",
              "tile", "repeat_interleave", "split", "chunk", "tensor_split", "unbind", "broadcast_to",
              "split_with_sizes", "hsplit", "vsplit", "dsplit", "unsafe_split", "unsafe_chunk",
              "unsafe_split_with_sizes", "narrow_copy", "unique_consecutive", "adjoint",
              "sum_to_size", "resize_", "resize_as_", "new_empty_strided"):
    setattr(Tensor, _name, globals()[_name])
for _name, _fn in (("squeeze_", squeeze), ("unsqueeze_", unsqueeze), ("t_", _t_inplace), ("transpose_", transpose),
                   ("swapaxes_", transpose), ("swapdims_", transpose)):
    setattr(Tensor, _name, _shape_inplace(_name, _fn))


def _function_form(method: Callable, name: str, param: str) -> Callable:
    """torch's function form of a method that also takes its sizes as several ints
    (``x.reshape(2, 3)``): ``torch.reshape(x, (2, 3))`` takes them as one sequence only."""
    def function(input: Tensor, *args, **kwargs) -> Tensor:
        if param in kwargs and not args:
            args = (kwargs.pop(param),)
        if len(args) > 1:
            raise TypeError(f"holoflow.{name}() takes 2 positional arguments but {len(args) + 1} were given: "
                            f"pass the {param} as one sequence, {name}(input, {tuple(args)})")
        if args and not isinstance(args[0], (tuple, list, torch.Size)):
            raise TypeError(f"holoflow.{name}(): argument '{param}' must be tuple of ints, not "
                            f"{type(args[0]).__name__}")
        return method(input, *args, **kwargs)
    function.__name__ = function.__qualname__ = name
    function.__doc__ = method.__doc__
    return function


# the package's reshape/permute (the methods, and this module's own callers, take varargs)
FUNCTION_FORMS = {"reshape": _function_form(reshape, "reshape", "shape"),
                  "permute": _function_form(permute, "permute", "dims")}
Tensor.T = property(lambda self: apply(PERMUTE, self, dims=tuple(range(self.dim() - 1, -1, -1))))
Tensor.mT = property(lambda self: transpose(self, -2, -1))
Tensor.mH = property(lambda self: _conj_transpose(self, "mH", False))
Tensor.H = property(lambda self: _conj_transpose(self, "H", True))

from . import layout as _layout  # noqa: E402  (tril/triu, roll, flip, diagonal, pad: their own module)
from .layout import *  # noqa: E402,F401,F403

__all__ += _layout.__all__

