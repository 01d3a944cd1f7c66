"""Copying forms of views and of in-place writes: the ``*_copy`` functions (``view_copy``,
``permute_copy``, ..., ``view_as_real_copy``/``view_as_complex_copy``: the view, cloned
contiguous), ``as_strided_scatter``, ``fill`` and ``constant_pad_nd``.

Composites of existing ops: gradients, SBP rules and nn.Graph come from the parts.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..core import dtype as _dtype
from ..core.errors import normalize_dim
from ..core.tensor import Tensor
from . import creation as _creation
from .complex_ops import view_as_complex, view_as_real
from .tensor_meta import _tensor

__all__ = ["constant_pad_nd", "fill", "as_strided_scatter", "view_copy", "permute_copy", "transpose_copy",
           "expand_copy", "squeeze_copy", "unsqueeze_copy", "t_copy", "select_copy", "slice_copy", "diagonal_copy",
           "detach_copy", "alias_copy", "unbind_copy", "split_copy", "split_with_sizes_copy", "unfold_copy",
           "as_strided_copy", "view_as_real_copy", "view_as_complex_copy"]


def constant_pad_nd(input: Tensor, pad: Sequence[int], value: float = 0) -> Tensor:
    """Pads (or, with negative amounts, crops) the last dims with ``value``, as ``torch.constant_pad_nd``."""
    from .layout import pad as _pad
    _tensor("constant_pad_nd", input)
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2 or len(pad) // 2 > input.dim():
        raise RuntimeError(f"holoflow.constant_pad_nd: length of pad must be even and at most twice the "
                           f"input's dims ({input.dim()}), got {len(pad)}")
    return _pad(input, pad, "constant", value)


def fill(input: Tensor, value: Any) -> Tensor:
    """A tensor like ``input`` filled with ``value`` (a number or a 0-d tensor, which receives
    the gradient; ``input``'s is zero), as ``torch.fill``."""
    _tensor("fill", input)
    if isinstance(value, Tensor):
        if value.dim() != 0:
            raise RuntimeError(f"holoflow.fill: fill only supports 0-dimension value tensor but got tensor with "
                               f"{value.dim()} dimensions.")
    mask = _creation.ones_like(input, dtype=_dtype.bool)   # (global like a global input)
    return input.masked_fill(mask, value)   # input's gradient: zeros, as torch's


def as_strided_scatter(input: Tensor, src: Tensor, size: Sequence[int], stride: Sequence[int],
                       storage_offset: int | None = None) -> Tensor:
    """``input`` with the elements of its ``as_strided`` view replaced by ``src`` (a new tensor;
    gradients flow to both), as ``torch.as_strided_scatter``."""
    _tensor("as_strided_scatter", input)
    _tensor("as_strided_scatter", src, "src")
    out = input.contiguous().clone()
    view = out.as_strided(size, stride, storage_offset)
    if tuple(view.shape) != tuple(src.shape):
        raise RuntimeError(f"holoflow.as_strided_scatter: expected src to have a size equal to the slice of self. "
                           f"src size = {list(src.shape)}, slice size = {list(view.shape)}")
    view.copy_(src)
    return out


def _copy(name: str, view_fn: Callable) -> Callable:
    def fn(input: Tensor, *args, **kwargs):
        out = view_fn(_tensor(name, input), *args, **kwargs)
        if isinstance(out, Tensor):
            return out.clone(memory_format=torch.contiguous_format)
        return tuple(o.clone(memory_format=torch.contiguous_format) for o in out)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"As ``torch.{name}``: the view ``{name[:-5]}`` as a new tensor."
    return fn


def _view_like(input, *args):
    if len(args) == 1 and isinstance(args[0], (_dtype.dtype, torch.dtype)):
        return input.view(args[0])
    return input.view(*args)


def _slice(input, dim: int = 0, start=None, end=None, step: int = 1):
    d = normalize_dim("slice_copy", dim, input.dim())
    return input[(slice(None),) * d + (slice(start, end, step),)]


view_copy = _copy("view_copy", _view_like)
permute_copy = _copy("permute_copy", lambda x, dims: x.permute(tuple(dims)))
transpose_copy = _copy("transpose_copy", lambda x, dim0, dim1: x.transpose(dim0, dim1))
expand_copy = _copy("expand_copy", lambda x, size, *, implicit=False: x.expand(tuple(size)))
squeeze_copy = _copy("squeeze_copy", lambda x, dim=None: x.squeeze() if dim is None else x.squeeze(dim))
unsqueeze_copy = _copy("unsqueeze_copy", lambda x, dim: x.unsqueeze(dim))
t_copy = _copy("t_copy", lambda x: x.t())
select_copy = _copy("select_copy", lambda x, dim, index: x.select(dim, index))
slice_copy = _copy("slice_copy", _slice)
diagonal_copy = _copy("diagonal_copy", lambda x, offset=0, dim1=0, dim2=1: x.diagonal(offset, dim1, dim2))
detach_copy = _copy("detach_copy", lambda x: x.detach())
alias_copy = _copy("alias_copy", lambda x: x)
unbind_copy = _copy("unbind_copy", lambda x, dim=0: x.unbind(dim))
split_copy = _copy("split_copy", lambda x, split_size, dim=0: x.split(split_size, dim))
split_with_sizes_copy = _copy("split_with_sizes_copy", lambda x, split_sizes, dim=0: x.split(list(split_sizes), dim))
unfold_copy = _copy("unfold_copy", lambda x, dimension, size, step: x.unfold(dimension, size, step))
as_strided_copy = _copy("as_strided_copy",
                        lambda x, size, stride, storage_offset=None: x.as_strided(size, stride, storage_offset))


def view_as_real_copy(input: Tensor) -> Tensor:
    """``view_as_real(input)`` as a new contiguous tensor (differentiable), as ``torch.view_as_real_copy``."""
    return view_as_real(input).clone(memory_format=torch.contiguous_format)


def view_as_complex_copy(input: Tensor) -> Tensor:
    """``view_as_complex(input)`` as a new contiguous tensor (differentiable), as ``torch.view_as_complex_copy``."""
    return view_as_complex(input).clone(memory_format=torch.contiguous_format)


for _name, _fn in {"as_strided_scatter": as_strided_scatter}.items():
    if not hasattr(Tensor, _name):
        setattr(Tensor, _name, _fn)
