"""Tensor metadata and global switches: the default device, inference/anomaly/warn-always modes;
the predicates ``is_conj``/``is_neg``/``is_signed``/``is_inference``, ``resolve_conj``/
``resolve_neg``, ``conj_physical``, ``get_device``, ``typename``; and torch's legacy and
local-only Tensor methods (``new``, ``resize``/``resize_as``, the Python callbacks ``apply_``/
``map_``/``map2_``, ``dim_order``, ``is_set_to``, ``record_stream``, ``module_load``,
``storage_type``, ``output_nr``, ``layout``, ``cfloat``/``cdouble``).

The argument check ``_tensor`` here (its TypeError reads "must be a Tensor") is shared by
ops/spectral.py, copies.py, control_flow.py and numeric.py.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from ..core import grad_mode, interpret
from ..core import device as _device
from ..core import dtype as _dtype
from ..core.anomaly import is_anomaly_check_nan_enabled, is_anomaly_enabled, set_anomaly_enabled
from ..core.errors import UnsupportedError
from ..core.tensor import Tensor, is_inference_tensor
from . import creation as _creation

__all__ = ["set_default_device", "get_default_device", "is_inference_mode_enabled", "set_warn_always",
           "is_warn_always_enabled", "resolve_conj", "resolve_neg", "is_conj", "is_neg", "is_signed", "is_inference",
           "get_device", "typename", "conj_physical", "conj_physical_", "is_anomaly_enabled", "set_anomaly_enabled",
           "is_anomaly_check_nan_enabled"]


def _tensor(name: str, x: Any, arg: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"holoflow.{name}(): argument '{arg}' must be a Tensor, not {type(x).__name__}")
    return x


def _local(name: str, x: Tensor) -> None:
    if x._global is not None or interpret.is_lazy():
        raise UnsupportedError(f"holoflow.{name}: runs on local tensors outside nn.Graph only (it reads or writes "
                               f"values in Python); call .to_local() first, or use tensor ops")


# -- state switches -----------------------------------------------------------------------------------------

def set_default_device(device: Any) -> None:
    """The device creation functions use when none is given, as ``torch.set_default_device``
    (holoflow's creation functions call torch's factories, which honour it)."""
    torch.set_default_device(None if device is None else _device.to_torch(device))


def get_default_device() -> _device.device:
    """The device creation functions use when none is given, as ``torch.get_default_device``."""
    return _device.from_torch(torch.get_default_device())


def is_inference_mode_enabled() -> bool:
    """Whether an ``inference_mode()`` region is active (holoflow's, like torch's)."""
    return bool(getattr(grad_mode.STATE, "inference", False))


set_warn_always, is_warn_always_enabled = torch.set_warn_always, torch.is_warn_always_enabled


# -- predicates and metadata -----------------------------------------------------------------------------

def resolve_conj(input: Tensor) -> Tensor:
    return _tensor("resolve_conj", input).resolve_conj()


def resolve_neg(input: Tensor) -> Tensor:
    return _tensor("resolve_neg", input).resolve_neg()


def is_conj(input: Tensor) -> bool:
    return _tensor("is_conj", input).is_conj()


def is_neg(input: Tensor) -> bool:
    return _tensor("is_neg", input).is_neg()


def is_signed(input: Tensor) -> bool:
    return _tensor("is_signed", input).is_signed()


def _is_inference(self: Tensor) -> bool:
    """Whether the tensor is an inference tensor: made in holoflow's ``inference_mode`` (or a
    view of one), or a torch inference tensor taken as storage."""
    return is_inference_tensor(self) or bool(self._data.is_inference())


def is_inference(input: Tensor) -> bool:
    return _is_inference(_tensor("is_inference", input))


def get_device(input: Tensor) -> int:
    return _tensor("get_device", input).get_device()


def typename(obj: Any) -> str:
    """``'holoflow.FloatTensor'`` for a tensor (``torch.`` under mock_torch), else the
    object's qualified name, as ``torch.typename``."""
    if isinstance(obj, Tensor):
        return obj.type()
    return torch.typename(obj)


def conj_physical(input: Tensor) -> Tensor:
    """The conjugate, materialised; a real tensor is returned as is (as torch)."""
    _tensor("conj_physical", input)
    return input.conj() if input.is_complex() else input


def conj_physical_(input: Tensor) -> Tensor:
    _tensor("conj_physical_", input)
    if input.is_complex():
        input.copy_(input.conj())
    return input


# -- Tensor methods -----------------------------------------------------------------------------------------

def _new(self: Tensor, *args: Any, device: Any = None, **kwargs: Any) -> Tensor:
    """torch's legacy constructor: ``x.new()`` (empty), ``x.new(2, 3)``/``x.new(size)``
    (uninitialised), ``x.new(data)`` (a copy in ``x``'s dtype), ``x.new(tensor)`` (an alias of a
    tensor of ``x``'s dtype)."""
    if kwargs:
        raise TypeError(f"holoflow.Tensor.new: unexpected keyword arguments {sorted(kwargs)} (the legacy "
                        f"constructor takes only device; use new_empty/new_tensor for a dtype)")
    kw = {"dtype": self.dtype, "device": device if device is not None else self.device}
    if not args:
        return _creation.empty(0, **kw)
    if len(args) == 1 and isinstance(args[0], Tensor):
        other = args[0]
        if other.dtype is not self.dtype:
            raise TypeError(f"holoflow.Tensor.new: expected a tensor of {self.dtype}, got {other.dtype}")
        return other.detach()
    if len(args) == 1 and isinstance(args[0], torch.Size):
        return _creation.empty(*args[0], **kw)
    if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return _creation.empty(*args, **kw)
    if len(args) == 1 and not isinstance(args[0], (int, float, complex, bool)):
        return _creation.tensor(args[0], **kw)
    raise TypeError(f"holoflow.Tensor.new: data must be a sequence (got {type(args[0]).__name__})")


def _autograd_resize(self: Tensor, sizes: tuple, what: str) -> Tensor:
    numel = 1
    for s in sizes:
        numel *= s
    if numel != self.numel():
        raise RuntimeError(f"holoflow.{what}: requested resize to {'x'.join(map(str, sizes))} ({numel} elements "
                           f"in total), but the given tensor has a size of {'x'.join(map(str, self.shape))} "
                           f"({self.numel()} elements). autograd's resize can only change the shape of a given "
                           f"tensor, while preserving the number of elements.")
    return self.contiguous().view(tuple(sizes))


def _resize(self: Tensor, *sizes: Any) -> Tensor:
    """Deprecated out-of-place resize (torch's autograd form): the same elements in a new shape."""
    warnings.warn("non-inplace resize is deprecated", stacklevel=2)
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple, torch.Size)):
        sizes = tuple(sizes[0])
    return _autograd_resize(self, tuple(int(s) for s in sizes), "resize")


def _resize_as(self: Tensor, tensor: Tensor) -> Tensor:
    """Deprecated out-of-place ``resize_as`` (torch's autograd form)."""
    warnings.warn("non-inplace resize_as is deprecated", stacklevel=2)
    return _autograd_resize(self, tuple(tensor.shape), "resize_as")


def _callback_target(self: Tensor, name: str) -> None:
    _local(name, self)
    if self._rg:
        raise RuntimeError(f"holoflow.{name}: can't call {name}() on a tensor that requires grad. "
                           f"Use t.detach().{name}() instead.")
    if self._data.device.type != "cpu":
        raise TypeError(f"holoflow.{name}: {name}() is only implemented on CPU tensors")


def _apply_(self: Tensor, callable: Callable) -> Tensor:  # noqa: A002
    """Replaces each element by ``callable(element)`` (a Python call per element, CPU only)."""
    _callback_target(self, "apply_")
    self._data.apply_(callable)
    return self


def _map_(self: Tensor, tensor: Tensor, callable: Callable) -> Tensor:  # noqa: A002
    """``self[i] = callable(self[i], tensor[i])`` with ``tensor`` broadcast (CPU only)."""
    _callback_target(self, "map_")
    _tensor("map_", tensor, "tensor")
    if tensor._rg:
        raise RuntimeError("holoflow.map_: can't call map_() on a tensor argument that requires grad")
    self._data.map_(tensor._local_full(), callable)
    return self


def _map2_(self: Tensor, x: Tensor, y: Tensor, callable: Callable) -> Tensor:  # noqa: A002
    """``self[i] = callable(self[i], x[i], y[i])`` with ``x`` and ``y`` broadcast (CPU only)."""
    _callback_target(self, "map2_")
    for t, arg in ((x, "x"), (y, "y")):
        _tensor("map2_", t, arg)
        if t._rg:
            raise RuntimeError("holoflow.map2_: can't call map2_() on a tensor argument that requires grad")
    self._data.map2_(x._local_full(), y._local_full(), callable)
    return self


def _dim_order(self: Tensor, *, ambiguity_check: Any = False) -> tuple:
    return self._data.dim_order(ambiguity_check=ambiguity_check)


def _is_set_to(self: Tensor, tensor: Tensor) -> bool:
    """Whether both tensors view the same storage with the same offset, sizes and strides."""
    return isinstance(tensor, Tensor) and self._global is None and tensor._global is None and \
        self._data.is_set_to(tensor._data)


def _record_stream(self: Tensor, stream: Any) -> None:
    """Marks the tensor as used by ``stream`` (CUDA memory reuse), as torch: on the CPU torch has no
    kernel for it and raises NotImplementedError, and so does holoflow."""
    try:
        self._data.record_stream(stream)
    except NotImplementedError:
        raise UnsupportedError(f"holoflow.record_stream: not available for {self._data.device.type} tensors "
                               f"(torch has no kernel for it there); it is for CUDA tensors") from None
    except (RuntimeError, TypeError) as e:
        raise type(e)(f"holoflow.record_stream: {str(e).splitlines()[0]}") from None


def _module_load(self: Tensor, other: Tensor, assign: bool = False) -> Tensor:
    """How ``load_state_dict`` loads ``other`` into this tensor, as torch's default."""
    if assign:
        return other.detach()
    with grad_mode.no_grad():
        self.copy_(other)
    return self.detach()


def _storage_type(self: Tensor) -> type:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # TypedStorage's deprecation warning is torch's business
        return self._data.storage_type()


def _output_nr(self: Tensor) -> int:
    return self._out_idx if self.grad_fn is not None else 0


for _name, _fn in {"new": _new, "resize": _resize, "resize_as": _resize_as, "apply_": _apply_,
                   "map_": _map_, "map2_": _map2_, "dim_order": _dim_order, "is_set_to": _is_set_to,
                   "record_stream": _record_stream, "module_load": _module_load,
                   "storage_type": _storage_type, "is_inference": _is_inference,
                   "conj_physical": conj_physical, "conj_physical_": conj_physical_}.items():
    if not hasattr(Tensor, _name):
        setattr(Tensor, _name, _fn)

Tensor.cfloat = lambda self, memory_format=torch.preserve_format: self.to(_dtype.complex64, memory_format=memory_format)
Tensor.cdouble = lambda self, memory_format=torch.preserve_format: self.to(_dtype.complex128,
                                                                         memory_format=memory_format)
Tensor.layout = property(lambda self: torch.strided, doc="Always ``torch.strided`` (dense tensors).")
Tensor.output_nr = property(_output_nr, doc="Which output of its grad_fn this tensor is (0 for leaves).")
