"""Indexing: ``Tensor.__getitem__``/``__setitem__`` (basic and advanced), narrow/select, gather,
masked_fill/masked_select, nonzero. Gather/scatter/index_* live in ops/scatter.py and sort/topk/unique
in ops/sorting.py; both are re-exported here.

An index is split in two: its tensors (positional op inputs, so graph tracing sees them) and a
``spec`` attr, the index with each tensor replaced by the placeholder ``"T"``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..core.dispatch import apply, apply_inplace
from ..core.errors import ShapeError, normalize_dim
from ..core.registry import Meta
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from . import elementwise as E
from .family import broadcast_shapes, defop, elementwise_sbp, needs, reduce_grad
from .range_index import expand_ranges
from .shape import RESHAPE

__all__ = ["narrow", "select", "masked_fill", "masked_select", "nonzero"]

T = "T"  # placeholder for a tensor inside an index spec


# -- index specs --------------------------------------------------------------------------------

def _as_index_tensor(v, device: torch.device | None = None) -> Tensor:
    """A tensor index as is; a list / array made into one on ``device`` (the indexed tensor's)."""
    if isinstance(v, Tensor):
        t = v
    elif isinstance(v, torch.Tensor):
        t = Tensor._make(v)
    elif isinstance(v, (list, tuple)) and len(v) == 0:
        t = Tensor._make(torch.zeros(0, dtype=torch.int64, device=device))
    else:
        t = Tensor._make(torch.as_tensor(v, device=device))
    if t._data.is_floating_point() or t._data.is_complex():
        raise IndexError("holoflow.getitem: tensors used as indices must be long, int, byte or bool "
                         f"tensors, got {t.dtype}")
    return t


def parse_index(index, shape: tuple, device: torch.device | None = None) -> tuple[tuple, list]:
    """(spec, index tensors) of a Python index; checks int bounds with a clear IndexError. Lists
    and arrays in it become tensors on ``device``, as torch makes them on the indexed tensor's."""
    items = index if isinstance(index, tuple) else (index,)
    spec, tensors = [], []
    for it in items:
        raw = it._data if isinstance(it, Tensor) else it
        if isinstance(raw, torch.Tensor) and raw.dim() == 0 and not raw.is_floating_point() and raw.dtype != torch.bool:
            spec.append(int(raw))                     # a 0-d integer tensor indexes like an int
        elif isinstance(it, (Tensor, torch.Tensor, list, tuple, np.ndarray)):
            tensors.append(_as_index_tensor(it, device))
            spec.append(T)
        elif isinstance(it, bool) or it is None or it is Ellipsis:
            spec.append(it)
        elif isinstance(it, slice):
            spec.append(slice(*(None if v is None else int(v) for v in (it.start, it.stop, it.step))))
        elif hasattr(it, "__index__"):
            spec.append(int(it))
        else:   # torch's classes: a str is a TypeError, a float an IndexError
            cls = TypeError if isinstance(it, (str, bytes)) else IndexError
            raise cls(f"holoflow.getitem: unsupported index {it!r} of type {type(it).__name__}; use ints, "
                      f"slices, None, ..., bool masks or integer tensors")
    _check_bounds(tuple(spec), [t for t in tensors], shape)
    return tuple(spec), tensors


def _consumed(item, tensor_ndim: int) -> int:
    if item is T:
        return tensor_ndim
    return 0 if item is None or item is Ellipsis or isinstance(item, bool) else 1


def _tensor_ndims(tensors) -> list[int]:
    return [t.dim() if _is_bool(t) else 1 for t in tensors]


def _is_bool(t) -> bool:
    d = t._data.dtype if isinstance(t, Tensor) else t.dtype
    return d in (torch.bool, torch.uint8)


def _start_dims(spec: tuple, ndims: list[int], ndim: int) -> list[int]:
    """The input dim at which each spec item starts."""
    if sum(1 for s in spec if s is Ellipsis) > 1:
        raise IndexError("holoflow.getitem: an index can only have a single ellipsis ('...')")
    k, used = 0, 0
    for s in spec:
        used += _consumed(s, ndims[k] if s is T else 0)
        k += s is T
    if used > ndim:
        raise IndexError(f"holoflow.getitem: too many indices for a tensor of dimension {ndim} "
                         f"(the index uses {used} dims)")
    starts, d, k = [], 0, 0
    for s in spec:
        starts.append(d)
        d += (ndim - used) if s is Ellipsis else _consumed(s, ndims[k] if s is T else 0)
        k += s is T
    return starts


def _check_bounds(spec: tuple, tensors: list, shape: tuple) -> None:
    starts = _start_dims(spec, _tensor_ndims(tensors), len(shape))
    for s, d in zip(spec, starts):
        if isinstance(s, int) and not isinstance(s, bool) and not -shape[d] <= s < shape[d]:
            raise IndexError(f"holoflow.getitem: index {s} is out of bounds for dim {d} with size {shape[d]}")


def _check_tensor_bounds(spec: tuple, tensors: tuple, shape: tuple) -> None:
    starts = _start_dims(spec, _tensor_ndims(tensors), len(shape))
    k = 0
    for s, d in zip(spec, starts):
        if s is not T:
            continue
        t = tensors[k]
        k += 1
        if _is_bool(t) or t.device.type == "meta" or t.numel() == 0:
            continue
        n = shape[d]
        bad = t[(t >= n) | (t < -n)]
        if bad.numel():
            raise IndexError(f"holoflow.getitem: index {int(bad[0])} is out of bounds for dim {d} with size {n}")


def build_index(spec: tuple, tensors: Sequence) -> tuple:
    it = iter(tensors)
    return tuple(next(it) if s is T else s for s in spec)


def axis_map(spec: tuple, tensors: Sequence, ndim: int) -> tuple[dict, int, int, int] | None:
    """Where the untouched (full-slice) input dims land in the result, as torch lays it out
    (ints select first; advanced dims go where the first index tensor is when the index tensors
    are adjacent, else in front): ({input dim: output dim}, position of the advanced dims, their
    count, the result's ndim). None when the index holds a Python bool or a 0-d mask."""
    ndims = [len(m.shape) if _is_bool_meta(m) else 1 for m in tensors]
    if any(isinstance(s, bool) for s in spec) or any(_is_bool_meta(m) and not m.shape for m in tensors):
        return None
    used = _used(spec, ndims)
    entries, k, d = [], 0, 0
    for s in spec:
        if s is Ellipsis:
            entries += [("s", a, True) for a in range(d, d + ndim - used)]
            d += ndim - used
        elif s is None:
            entries.append(("n",))
        elif isinstance(s, slice):
            entries.append(("s", d, s == slice(None)))
            d += 1
        elif s is T:
            entries += [("a",)] * ndims[k]
            d += ndims[k]
            k += 1
        else:
            d += 1
    entries += [("s", a, True) for a in range(d, ndim)]
    adv = [i for i, e in enumerate(entries) if e[0] == "a"]
    nb = max((len(m.shape) if not _is_bool_meta(m) else 1 for m in tensors), default=0)
    if adv and adv == list(range(adv[0], adv[0] + len(adv))):
        start, rest = adv[0], entries[:adv[0]] + entries[adv[-1] + 1:]
    else:
        start, rest = 0, [e for e in entries if e[0] != "a"]
    out = {}
    for i, e in enumerate(rest):
        if e[0] == "s" and e[2]:
            out[e[1]] = i + (nb if adv and i >= start else 0)
    return out, start, nb, len(rest) + nb


def _used(spec: tuple, ndims: list[int]) -> int:
    k, used = 0, 0
    for s in spec:
        used += _consumed(s, ndims[k] if s is T else 0)
        k += s is T
    return used


def _is_bool_meta(m) -> bool:
    return m.dtype in (torch.bool, torch.uint8)


# -- getitem (basic) -----------------------------------------------------------------------------

def _split_sigs(mapping: dict, n_idx: int, reverse: bool = False) -> list:
    return [(((S(b),) if reverse else (S(a),)) + (B,) * n_idx, ((S(a),) if reverse else (S(b),)))
            for a, b in mapping.items()]


def _getitem_sbp(metas, attrs):
    m = axis_map(attrs["spec"], [], len(metas[0].shape))
    return [((B,), (B,)), ((P,), (P,))] + (_split_sigs(m[0], 0) if m else [])


def _getitem_backward_kernel(dy, spec, shape):
    z = dy.new_zeros(shape)
    z[spec] = dy
    return z


def _getitem_backward_sbp(metas, attrs):
    m = axis_map(attrs["spec"], [], len(attrs["shape"]))
    return [((B,), (B,)), ((P,), (P,))] + (_split_sigs(m[0], 0, reverse=True) if m else [])


def _backward_local(attrs, metas, local_metas, in_sbps):
    """The grad ops' ``shape`` attr follows the split of dy (input 0) back to the input dim."""
    s = in_sbps[0]
    if not isinstance(s, S):
        return attrs
    idx_metas = [m for m in metas[1:] if isinstance(m, Meta)]
    mapping = axis_map(attrs["spec"], idx_metas, len(attrs["shape"]))[0]
    shape = list(attrs["shape"])
    for a, b in mapping.items():
        if b == s.axis:
            shape[a] = local_metas[0].shape[b]
    return {**attrs, "shape": tuple(shape)}


GETITEM = defop("getitem", lambda x, spec: x[spec], sbp=_getitem_sbp, family="indexing", view=True,
                grad=lambda ctx, dy: (apply(GETITEM_BACKWARD, dy, spec=ctx.spec, shape=tuple(ctx.shapes[0])),))
GETITEM_BACKWARD = defop("getitem_backward", _getitem_backward_kernel, sbp=_getitem_backward_sbp,
                         local_attrs=_backward_local, family="indexing",
                         grad=lambda ctx, dy: (apply(GETITEM, dy, spec=ctx.spec),))


# -- index (advanced) -----------------------------------------------------------------------------

def _index_kernel(x, *tensors, spec):
    _check_tensor_bounds(spec, tensors, tuple(x.shape))
    return x[build_index(spec, tensors)]


def _index_sbp(metas, attrs):
    x, idx = metas[0], list(metas[1:])
    n = len(idx)
    sigs = [((B,) * (n + 1), (B,)), ((P,) + (B,) * n, (P,))]
    m = axis_map(attrs["spec"], idx, len(x.shape))
    if m is None:
        return sigs
    sigs += _split_sigs(m[0], n)
    if n == 1 and not _is_bool_meta(idx[0]):   # embedding-like: split the index itself
        sigs += [((B, S(k)), (S(m[1] + k),)) for k in range(len(idx[0].shape))]
    return sigs


def _index_backward_kernel(dy, *tensors, spec, shape):
    numel = 1
    for s in shape:
        numel *= s
    pos = torch.arange(numel, device=dy.device).view(shape)[build_index(spec, tensors)]
    flat = dy.new_zeros(numel).index_add_(0, pos.reshape(-1), dy.reshape(-1))
    return flat.view(shape)


def _index_backward_sbp(metas, attrs):
    idx = list(metas[1:])
    n = len(idx)
    sigs = [((B,) * (n + 1), (B,)), ((P,) + (B,) * n, (P,))]
    m = axis_map(attrs["spec"], idx, len(attrs["shape"]))
    if m is None:
        return sigs
    sigs += _split_sigs(m[0], n, reverse=True)
    if n == 1 and not _is_bool_meta(idx[0]):
        sigs += [((S(m[1] + k), S(k)), (P,)) for k in range(len(idx[0].shape))]
    return sigs


INDEX = defop("index", _index_kernel, sbp=_index_sbp, save="inputs", family="indexing",
              saved_inputs=lambda needs: tuple(range(1, len(needs))),   # the indices, not x (as torch)
              grad=lambda ctx, dy: (apply(INDEX_BACKWARD, dy, *ctx.inputs[1:], spec=ctx.spec,
                                          shape=tuple(ctx.shapes[0])),) + (None,) * (len(ctx.edges) - 1))
INDEX_BACKWARD = defop("index_backward", _index_backward_kernel, sbp=_index_backward_sbp, save="inputs",
                       saved_inputs=lambda needs: tuple(range(1, len(needs))),
                       local_attrs=_backward_local, family="indexing",
                       grad=lambda ctx, dy: (apply(INDEX, dy, *ctx.inputs[1:], spec=ctx.spec),)
                       + (None,) * (len(ctx.edges) - 1))


def getitem(input: Tensor, index) -> Tensor:
    """``input[index]`` with torch's semantics: ints, slices (with steps), None, ``...``, bool
    masks and integer tensors/lists (advanced indexing)."""
    # input.device, not input._data.device: inside nn.Graph's trace the data is meta, the device real
    spec, tensors = parse_index(expand_ranges(index), tuple(input.shape), input.device.torch)
    if tensors:
        if input._global is not None:
            tensors = [_like_global(t, input) for t in tensors]
        return apply(INDEX, input, *tensors, spec=spec)
    return apply(GETITEM, input, spec=spec)


# -- setitem (index_put) -----------------------------------------------------------------------------

def _index_put_kernel(x, v, *tensors, spec):
    out = x.clone()
    _index_put_inplace(out, v, *tensors, spec=spec)
    return out


def _index_put_inplace(x, v, *tensors, spec):
    _check_tensor_bounds(spec, tensors, tuple(x.shape))
    x[build_index(spec, tensors)] = v
    return x


def _index_put_grad(ctx, dy):
    spec, idx = ctx.spec, ctx.inputs[2:]
    gx = apply(INDEX_PUT, dy, 0.0, *idx, spec=spec) if needs(ctx, 0) else None
    gv = None
    if needs(ctx, 1):
        gv = apply(INDEX, dy, *idx, spec=spec) if idx else apply(GETITEM, dy, spec=spec)
        vshape = tuple(ctx.shapes[1])
        if len(vshape) > gv.dim():   # a value with extra leading 1s, as torch allows
            gv = apply(RESHAPE, gv, shape=(1,) * (len(vshape) - gv.dim()) + tuple(gv.shape))
        gv = reduce_grad(gv, ctx, 1)
    return (gx, gv) + (None,) * len(idx)


def _index_put_sbp(metas, attrs):
    x, v, idx = metas[0], metas[1], [m for m in metas[2:]]
    vt = isinstance(v, Meta)
    n = len(idx)
    sigs = [((B,) * (n + 1 + vt), (B,))]
    if vt:
        sigs.append(((P, P) + (B,) * n, (P,)))
    m = axis_map(attrs["spec"], idx, len(x.shape))
    if m is None:
        return sigs
    mapping, n_res = m[0], m[3]
    for a, r in mapping.items():
        vs = ()
        if vt:
            k = r - (n_res - len(v.shape))
            if k >= 0 and v.shape[k] == x.shape[a]:
                vs = (S(k),)
            elif k < 0 or v.shape[k] == 1:
                vs = (B,)
            else:
                continue
        sigs.append(((S(a),) + vs + (B,) * n, (S(a),)))
    return sigs


INDEX_PUT = defop("index_put", _index_put_kernel, grad=_index_put_grad, sbp=_index_put_sbp, save="inputs",
                  saved_inputs=lambda needs: tuple(range(2, len(needs))),   # the indices: not x, not the value
                  inplace_kernel=_index_put_inplace, family="indexing")


def _like_global(t, like: Tensor):
    """Index tensors and values built from Python data on a global tensor's ranks are the same
    everywhere: they join its placement as broadcast constants (no communication)."""
    if like._global is None or not isinstance(t, Tensor) or t._global is not None:
        return t
    place = like._global.placement
    return place.interpreter.from_full(t._data, place, (B,) * place.ndim)


def setitem(input: Tensor, index, value) -> None:
    """``input[index] = value`` (a number or a tensor broadcast to the indexed shape)."""
    spec, tensors = parse_index(expand_ranges(index), tuple(input.shape), input.device.torch)
    if isinstance(value, (list, tuple, np.ndarray)):
        value = Tensor._make(torch.as_tensor(value, dtype=input._data.dtype, device=input.device.torch))
    strides = input._data.stride()
    if input._global is not None:
        tensors = [_like_global(t, input) for t in tensors]
        value = _like_global(value, input)
        strides = getattr(input._global, "strides", None) or strides   # (torch's, for a boxed view)
    if not tensors and (input._view is not None or any(st == 0 and n > 1 for st, n in zip(strides, input.shape))):
        # basic indexing writes the temporary view input[index], as torch's (input itself for an
        # index of whole slices): a view input is a sibling of it, untouched (its history
        # re-derived at its next use, so a base detach_()ed in between leaves it none; one with
        # no history yet keeps none); an expanded tensor
        # (elements shared) has the indexed region alone written (one that still shares elements
        # is refused by copy_, as torch's)
        _write_region(input if _whole(spec, tuple(input.shape)) else getitem(input, index), value)
        return
    apply_inplace(INDEX_PUT, input, value, *tensors, spec=spec)


def _whole(spec: tuple, shape: tuple) -> bool:
    """Whether basic index ``spec`` is full slices with step 1 and ``...`` only, each slice from 0
    as written (``x[-3:]`` is not one) to the end or past it: torch's ``x[spec] = v`` then
    writes ``x`` itself, not a view of it."""
    if not all(it is Ellipsis or isinstance(it, slice) for it in spec):
        return False
    k = spec.index(Ellipsis) if Ellipsis in spec else len(spec)
    dims = list(range(k)) + list(range(len(shape) - (len(spec) - k - 1), len(shape)))
    items = [it for it in spec if it is not Ellipsis]
    return all(s.start in (None, 0) and s.step in (None, 1) and (s.stop is None or s.stop >= shape[d])
               for s, d in zip(items, dims))


def _write_region(region: Tensor, value) -> None:
    """``region.copy_(value)`` where ``value`` may have extra leading dims of size 1 (as torch's
    ``x[idx] = value`` drops them)."""
    if isinstance(value, Tensor) and value.dim() > region.dim() and \
            all(n == 1 for n in value.shape[:value.dim() - region.dim()]):
        value = value.reshape(tuple(value.shape[value.dim() - region.dim():]))
    region.copy_(value)


Tensor.__getitem__ = getitem
Tensor.__setitem__ = setitem


def narrow(input: Tensor, dim: int, start, length: int) -> Tensor:
    """The ``length`` entries of dim ``dim`` from ``start`` (a view)."""
    if input.dim() == 0:   # (normalize_dim takes dim 0 of a 0-d tensor, which has no size)
        raise ShapeError("holoflow.narrow: narrow() cannot be applied to a 0-dim tensor")
    d = normalize_dim("narrow", dim, input.dim())
    n, start = input.shape[d], int(start)
    start = start + n if start < 0 else start
    if not (0 <= start <= n and 0 <= length and start + length <= n):
        raise ShapeError(f"holoflow.narrow: start {start} + length {length} exceeds dim {d} of size {n}")
    return apply(GETITEM, input, spec=(slice(None),) * d + (slice(start, start + length),))


def select(input: Tensor, dim: int, index: int) -> Tensor:
    """The slice at ``index`` of dim ``dim``, with that dim removed."""
    if input.dim() == 0:
        raise IndexError("holoflow.select: select() cannot be applied to a 0-dim tensor")
    d = normalize_dim("select", dim, input.dim())
    n, index = input.shape[d], int(index)
    if not -n <= index < n:
        raise IndexError(f"holoflow.select: index {index} is out of range for dim {d} of size {n}")
    return getitem(input, (slice(None),) * d + (index,))


# -- masked ops ---------------------------------------------------------------------------------------

def _masked_fill_grad(ctx, dy):
    mask = ctx.inputs[1]
    gx = reduce_grad(apply(MASKED_FILL, dy, mask, 0.0), ctx, 0) if needs(ctx, 0) else None
    gv = reduce_grad(E.where(mask, dy, 0.0), ctx, 2) if len(ctx.edges) > 2 and needs(ctx, 2) else None
    return gx, None, gv


def _masked_fill_kernel(x, mask, value):
    if isinstance(value, torch.Tensor) and value.dim() != 0:
        raise ValueError(f"holoflow.masked_fill: value must be a number or a 0-d tensor, got a tensor of "
                         f"shape {tuple(value.shape)}")
    return torch.masked_fill(x, mask, value)


MASKED_FILL = defop("masked_fill", _masked_fill_kernel, grad=_masked_fill_grad, save="inputs", saved_inputs=(1,),
                    sbp=elementwise_sbp(("PBP",)), family="elementwise",
                    inplace_kernel=lambda x, mask, value: x.masked_fill_(mask, value))


def masked_fill(input: Tensor, mask: Tensor, value) -> Tensor:
    """``value`` (a number or 0-d tensor) where ``mask`` is true, ``input`` elsewhere."""
    return apply(MASKED_FILL, input, mask, value)


def _masked_select_sbp(metas, attrs):
    x, mask = metas
    sigs = [((B, B), (B,)), ((P, B), (P,))]
    if len(x.shape) == len(mask.shape) >= 1 and x.shape[0] == mask.shape[0]:
        sigs.append(((S(0), S(0)), (S(0),)))
    return sigs


def _masked_select_backward_kernel(dy, mask, shape):
    return dy.new_zeros(shape).masked_scatter_(mask.expand(shape), dy)


MASKED_SELECT = defop("masked_select", lambda x, mask: torch.masked_select(x, mask), sbp=_masked_select_sbp,
                      save="inputs", family="indexing",
                      grad=lambda ctx, dy: (reduce_grad(apply(
                          MASKED_SELECT_BACKWARD, dy, ctx.inputs[1],
                          shape=broadcast_shapes("masked_select", ctx.shapes[:2])), ctx, 0), None))
MASKED_SELECT_BACKWARD = defop("masked_select_backward", _masked_select_backward_kernel, save="inputs",
                               sbp=lambda metas, attrs: [((B, B), (B,)), ((P, B), (P,))], family="indexing",
                               grad=lambda ctx, dy: (apply(MASKED_SELECT, dy, ctx.inputs[1]), None))


def masked_select(input: Tensor, mask: Tensor) -> Tensor:
    """The 1-d tensor of ``input``'s entries where ``mask`` (broadcast) is true."""
    return apply(MASKED_SELECT, input, mask)


# -- nonzero ---------------------------------------------------------------------------------------------

NONZERO = defop("nonzero", lambda x: torch.nonzero(x), sbp=lambda metas, attrs: [((B,), (B,))],
                family="indexing", differentiable=False)


def nonzero(input: Tensor, *, as_tuple: bool = False):
    """Indices of the non-zero entries: an (n, ndim) tensor, or one 1-d tensor per dim."""
    out = apply(NONZERO, input)
    if not as_tuple:
        return out
    if input.dim() == 0:   # (out is (n, 0): no column to take; torch gives n zeros: the sum of
        return (out.sum(1),)   # each empty row, an op, so a global input gives a global result)
    return out.unbind(1)


# -- Tensor methods -----------------------------------------------------------------------------------------

for _name in ("narrow", "select", "masked_fill", "masked_select", "nonzero"):
    setattr(Tensor, _name, globals()[_name])
Tensor.masked_fill_ = lambda self, mask, value: apply_inplace(MASKED_FILL, self, mask, value)

from . import scatter as _scatter  # noqa: E402  (gather/scatter/index_*: their own module)
from . import sorting as _sorting  # noqa: E402  (sort/topk/unique: kept in their own module)
from .scatter import *  # noqa: E402,F401,F403
from .sorting import *  # noqa: E402,F401,F403

__all__ += _scatter.__all__ + _sorting.__all__
