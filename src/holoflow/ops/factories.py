"""Creation functions beyond ops/creation.py: the deprecated end-inclusive ``range``,
``frombuffer`` (a tensor over a Python buffer), ``from_file`` (over a memory-mapped file) and
``empty_permuted``.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch

from ..core import device as _device
from ..core import dtype as _dtype
from ..core.tensor import Tensor
from . import creation as _creation

__all__ = ["range", "from_file", "frombuffer", "empty_permuted"]


# -- top-level functions -----------------------------------------------------------------------------

def _range_kernel(start: Any, end: Any, step: Any, **kw: Any) -> torch.Tensor:
    with warnings.catch_warnings():   # (holoflow.range warned already)
        warnings.simplefilter("ignore", UserWarning)
        return torch.range(start, end, step, **kw)


def range(start: Any, end: Any, step: Any = 1, *, out: Any = None, dtype: Any = None,  # noqa: A001
          layout: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """The deprecated ``torch.range``: ``start, start + step, ...`` up to and *including* ``end``
    (numbers or 0-d tensors), in the default float dtype unless ``dtype`` is given (``arange``
    excludes ``end``). Warns, as torch does."""
    _creation._check_options("range", layout, out)
    warnings.warn("holoflow.range is deprecated and will be removed, as torch.range, because its behavior is "
                  "inconsistent with Python's range builtin. Instead, use holoflow.arange, which produces values "
                  "in [start, end).", UserWarning, stacklevel=2)
    num = _creation._number
    return _creation._factory("range", _range_kernel, num(start), num(end), num(step), dtype=dtype, device=device,
                              requires_grad=requires_grad)


def from_file(filename: str, shared: bool | None = None, size: int = 0, *, dtype: Any = None, layout: Any = None,
              device: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> Tensor:
    """A 1-D CPU tensor of ``size`` elements over a memory-mapped file, as ``torch.from_file``
    (``shared=True``: writes go to the file)."""
    try:
        data = torch.from_file(filename, shared, size, dtype=_dtype.to_torch(dtype), device=_device.to_torch(device),
                               pin_memory=pin_memory)
    except (RuntimeError, ValueError) as e:
        raise type(e)(f"holoflow.from_file({filename!r}): {str(e).splitlines()[0]}") from None
    return Tensor._make(data).requires_grad_(requires_grad)


# -- creation -------------------------------------------------------------------------------------------

def frombuffer(buffer: Any, *, dtype: Any, count: int = -1, offset: int = 0, requires_grad: bool = False) -> Tensor:
    """A 1-D tensor over the memory of a Python buffer (shared, not copied), as ``torch.frombuffer``."""
    try:
        data = torch.frombuffer(buffer, dtype=_dtype.to_torch(dtype), count=count, offset=offset)
    except (ValueError, TypeError, RuntimeError) as e:
        raise type(e)(f"holoflow.frombuffer: {e}") from None
    out = Tensor._make(data)
    if requires_grad:
        out.requires_grad_(True)
    return out


def empty_permuted(size: Sequence[int], physical_layout: Sequence[int], *, dtype: Any = None, layout: Any = None,
                   device: Any = None, requires_grad: bool = False, pin_memory: bool = False) -> Tensor:
    """An uninitialised tensor of ``size`` whose memory runs in ``physical_layout``'s dim order,
    as ``torch.empty_permuted``."""
    return _creation._factory("empty_permuted", torch.empty_permuted, tuple(size), tuple(physical_layout),
                              dtype=dtype, device=device, requires_grad=requires_grad, layout=layout,
                              pin_memory=pin_memory)
