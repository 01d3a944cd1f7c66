"""Dense layout, storage and device queries: ``to_dense``, ``dense_dim``/``sparse_dim``,
``const_data_ptr``, ``untyped_storage``/``storage``, ``set_``, ``as_strided_``, ``resize_as_``,
``addmv_``, ``chalf``, ``nbytes``/``itemsize``/``storage_offset``, the ``is_xla``-style device
queries, ``is_distributed``, ``xpu``/``ipu``/``mtia`` and ``hash_tensor`` (an xor of the elements'
bit patterns, torch 2.13).

holoflow tensors are dense (strided), so the sparse-layout queries give torch's answers for dense
tensors. Storage access works on local tensors only: a global tensor's data is spread over ranks.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..core import grad_mode
from ..core import dtype as _dtype
from ..core.dispatch import apply
from ..core.errors import UnsupportedError
from ..core.interpret import is_lazy
from ..core.registry import defop
from ..core.tensor import Tensor
from .layout import as_strided
from .reduction import reduce_dims, reduce_sbp
from .shape import _shape_inplace

__all__ = ["is_distributed", "addmv_", "as_strided_", "resize_as_", "hash_tensor"]


_COMPLEX32 = next(d for d in _dtype.RARE if d.name == "complex32")


def _local(self: Tensor, name: str) -> None:
    if self._global is not None or is_lazy():
        raise UnsupportedError(f"holoflow.Tensor.{name}: needs a local tensor outside nn.Graph (a global "
                               f"tensor's data lives on several ranks); call .to_local() first")


# -- layout queries: holoflow tensors are dense ---------------------------------------------------

def to_dense(self: Tensor, dtype: Any = None, *, masked_grad: bool | None = None) -> Tensor:
    """This tensor itself (it is already dense), cast when ``dtype`` differs, as torch's
    ``to_dense`` on a strided tensor."""
    if dtype is None or _dtype.to_torch(dtype) == self._data.dtype:
        return self
    return self.to(dtype)


def dense_dim(self: Tensor) -> int:
    """The number of dense dims: all of them for a dense tensor, as torch."""
    return self.dim()


def sparse_dim(self: Tensor) -> int:
    """The number of sparse dims: 0 for a dense tensor, as torch."""
    return 0


def const_data_ptr(self: Tensor) -> int:
    """The address of the first element (``data_ptr``; the caller promises not to write)."""
    return self.data_ptr()


def is_distributed(input: Tensor) -> bool:
    """False, as torch's ``is_distributed`` (a legacy THD flag; holoflow's global tensors are
    ``is_global``)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"holoflow.is_distributed(): argument 'input' must be a Tensor, not {type(input).__name__}")
    return False


def _device_query(kind: str) -> property:
    return property(lambda self: self._data.device.type == kind, doc=f"Whether the tensor is on a {kind} device.")


# -- storage ---------------------------------------------------------------------------------------

def untyped_storage(self: Tensor) -> torch.UntypedStorage:
    """The torch ``UntypedStorage`` holding this local tensor's elements (shared, not copied)."""
    _local(self, "untyped_storage")
    return self._data.untyped_storage()


def storage(self: Tensor) -> Any:
    """The (deprecated) torch ``TypedStorage`` of this local tensor's elements; prefer
    ``untyped_storage()``. torch warns that TypedStorage is deprecated."""
    _local(self, "storage")
    return self._data.storage()


def set_(self: Tensor, source: Any = None, storage_offset: int = 0, size: Sequence[int] | None = None,
         stride: Sequence[int] | None = None) -> Tensor:
    """Makes this tensor use ``source``'s memory, as ``torch.Tensor.set_``: another tensor (its
    storage, offset, size and strides), a storage (with ``storage_offset``, ``size``, ``stride``),
    or nothing (an empty tensor). Writes through either are then seen by both. Local tensors
    only; refused while this tensor requires grad (torch refuses it for leaves)."""
    _local(self, "set_")
    if self._rg and grad_mode.is_grad_enabled():
        raise RuntimeError("holoflow.Tensor.set_: cannot change the memory of a tensor that requires grad; "
                           "call it on a .detach()ed tensor or under no_grad()")
    if isinstance(source, Tensor):
        _local(source, "set_")
        src: Any = source._data
    else:
        src = source
    new = torch.empty(0, dtype=self._data.dtype, device=self._data.device)
    try:
        if src is None:
            pass
        elif isinstance(src, torch.Tensor):
            new.set_(src)
        else:
            if size is None:
                size = (src.nbytes() // self._data.element_size() - storage_offset,) \
                    if isinstance(src, torch.UntypedStorage) else (len(src) - storage_offset,)
            new.set_(src, storage_offset, tuple(size), *(() if stride is None else (tuple(stride),)))
    except (RuntimeError, TypeError) as e:
        raise type(e)(f"holoflow.Tensor.set_: {str(e).splitlines()[0]}") from None
    torch.autograd.graph.increment_version(self._data)
    self._data = new
    self.__dict__.pop("_view", None)   # the tensor now owns its alias of the new memory: no view of a base
    return self


# -- dtype and device conversions ------------------------------------------------------------------

def chalf(self: Tensor, memory_format: torch.memory_format = torch.preserve_format) -> Tensor:
    """This tensor as ``complex32`` (``self.to(holoflow.complex32)``), as ``torch.Tensor.chalf``."""
    return self.to(_COMPLEX32, memory_format=memory_format)


def _backend_move(kind: str, exc: type[BaseException], message: str):
    def move(self: Tensor, device: Any = None, non_blocking: bool = False,
             memory_format: torch.memory_format = torch.preserve_format) -> Tensor:
        mod = getattr(torch, kind, None)
        if mod is None or not getattr(mod, "is_available", lambda: False)():
            raise exc(f"holoflow.Tensor.{kind}: {message}")
        index = device.index if isinstance(device, torch.device) else device
        target = torch.device(kind) if index is None else torch.device(kind, int(index))
        return self.to(target, non_blocking=non_blocking)
    move.__name__ = move.__qualname__ = kind
    move.__doc__ = f"A copy on the {kind} device ``device`` (its current one by default), as ``torch.Tensor.{kind}``."
    return move


def addmv_(input: Tensor, mat: Tensor, vec: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """``input = beta * input + alpha * (mat @ vec)`` in place, as ``torch.addmv_``."""
    return input.addmv_(mat, vec, beta=beta, alpha=alpha)


def as_strided_(input: Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> Tensor:
    """``input.as_strided_(size, stride, storage_offset)``, as ``torch.as_strided_``."""
    return input.as_strided_(size, stride, storage_offset)


def resize_as_(input: Tensor, the_template: Tensor, *, memory_format: Any = None) -> Tensor:
    """``input.resize_as_(the_template)``, as ``torch.resize_as_``."""
    return input.resize_as_(the_template, memory_format=memory_format)


def _hash_kernel(x, dim, keepdim, mode):
    return torch.hash_tensor(x, keepdim=keepdim, mode=mode) if dim is None else \
        torch.hash_tensor(x, dim, keepdim=keepdim, mode=mode)


# an xor of the elements' 64-bit patterns: a split kept axis stays split; a split reduced axis is
# gathered first (an xor of shards is no SBP value holoflow has)
HASH_TENSOR = defop("hash_tensor", _hash_kernel, sbp=reduce_sbp(), family="reduction")


def hash_tensor(input: Tensor, dim=None, *, keepdim: bool = False, mode: int = 0) -> Tensor:
    """The xor of ``input``'s elements over ``dim`` (all by default), each upcast to 64 bits and
    read as uint64, as ``torch.hash_tensor`` (torch 2.13; not differentiable)."""
    dims = None if dim is None else reduce_dims("hash_tensor", dim, input.dim())
    return apply(HASH_TENSOR, input, dim=dims, keepdim=keepdim, mode=mode)


for _name, _fn in (("to_dense", to_dense), ("dense_dim", dense_dim), ("sparse_dim", sparse_dim),
                   ("const_data_ptr", const_data_ptr), ("untyped_storage", untyped_storage),
                   ("storage", storage), ("set_", set_), ("chalf", chalf), ("hash_tensor", hash_tensor)):
    setattr(Tensor, _name, _fn)
Tensor.is_distributed = lambda self: False
Tensor.is_distributed.__doc__ = "False, as torch's (a legacy flag; see ``is_global``)."
Tensor.as_strided_ = _shape_inplace("as_strided_", as_strided)
for _kind in ("xla", "ipu", "mtia", "maia", "vulkan"):
    if not hasattr(Tensor, f"is_{_kind}"):
        setattr(Tensor, f"is_{_kind}", _device_query(_kind))
if not hasattr(Tensor, "is_sparse_csr"):
    Tensor.is_sparse_csr = property(lambda self: False, doc="Always False: holoflow tensors are dense.")
Tensor.xpu = _backend_move("xpu", AssertionError, "holoflow runs on a torch not compiled with XPU enabled (no XPU "
                                                  "device is available)")
Tensor.ipu = _backend_move("ipu", RuntimeError, "holoflow runs on a torch not linked with support for ipu devices")
Tensor.mtia = _backend_move("mtia", AssertionError, "holoflow runs on a torch not compiled with MTIA enabled (no "
                                                    "MTIA device is available)")

Tensor.nbytes = property(lambda self: self.numel() * self.element_size(), doc="Bytes of the elements.")
Tensor.itemsize = property(lambda self: self.element_size(), doc="Bytes of one element.")
Tensor.storage_offset = lambda self: self._data.storage_offset()
