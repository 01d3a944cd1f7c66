"""Copies and conversions: ``to`` (dtype/device), ``clone``, ``contiguous`` and the dtype methods."""
from __future__ import annotations

import torch

from ..core import device as _device
from ..core import dtype as _dtype
from ..core import grad_mode, interpret
from ..core.autograd import GradNode
from ..core.dispatch import apply, assign, check_inplace_target, check_view_target, distinct_elements
from ..core.errors import HoloflowError
from ..core.registry import REGISTRY
from ..core.sbp import B
from ..core.views import VIEW_SCATTER
from ..core.tensor import Tensor
from .family import cast_sbp, defop, elementwise_sbp


def _to_grad(ctx, dy):
    if dy._data.is_complex() and not ctx.dtypes[0].is_complex:
        # a real input's gradient is the real part, as torch's (casting would warn that it drops it)
        dy = apply(REGISTRY["real"], dy)
    return (apply(TO, dy, dtype=ctx.dtypes[0], device=ctx.src_device, src_device=ctx.device),)


TO = defop("to", lambda x, dtype, device, src_device: x.to(device=device, dtype=dtype),
           grad=_to_grad, sbp=cast_sbp, family="elementwise", view=True,
           elementwise=False, fresh=False)  # may move devices; x.to(x.dtype) is x
CLONE = defop("clone", lambda x, memory_format=torch.preserve_format: x.clone(memory_format=memory_format),
              grad=lambda ctx, dy: (dy,), sbp=elementwise_sbp(("P",)), family="elementwise")


def _parse_to(self: Tensor, args, kwargs):
    """``(device, dtype)`` of ``Tensor.to``'s forms; positional bools after them are
    ``non_blocking`` then ``copy`` (torch's order), a positional ``copy`` moved into ``kwargs``."""
    dev, dt = kwargs.pop("device", None), kwargs.pop("dtype", None)
    flags = []
    for a in args:
        if isinstance(a, Tensor):
            dev, dt = a.device, a.dtype
        elif type(a) is bool:
            flags.append(a)
        elif isinstance(a, (_dtype.dtype, torch.dtype)) or a in (float, int, bool):
            dt = a
        elif a is not None:
            dev = a
    if len(flags) > 2:
        raise TypeError(f"holoflow.Tensor.to: too many positional arguments {args!r}")
    if len(flags) == 2:
        kwargs["copy"] = flags[1]
    for k in ("non_blocking", "memory_format"):
        kwargs.pop(k, None)
    copy = kwargs.pop("copy", False)
    if kwargs:
        raise TypeError(f"holoflow.Tensor.to: unexpected arguments {sorted(kwargs)}")
    return _device.to_torch(dev), _dtype.to_torch(dt), bool(copy)


def to(self: Tensor, *args, **kwargs) -> Tensor:
    """Returns this tensor on another device and/or dtype, and in ``memory_format``'s layout when
    one is given (itself when nothing changes)."""
    fmt = kwargs.get("memory_format")
    if fmt is not None and fmt != torch.preserve_format:
        kwargs = {k: v for k, v in kwargs.items() if k != "memory_format"}
        out = to(self, *args, **kwargs)
        return contiguous(out, memory_format=fmt)
    dev, dt, copy = _parse_to(self, args, dict(kwargs))
    cur = self._data
    if dev is not None and dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else dev
    g = self._global
    if g is not None and dev is not None and dev.type != g.placement.type:
        raise HoloflowError(f"holoflow.to: a global tensor (shape {tuple(self.shape)}, sbp {g.sbp}) on {g.placement} "
                            f"changes device type with .to_global(placement=holoflow.placement({dev.type!r}, "
                            f"ranks={g.placement.ranks.tolist()})); .to() of a global tensor takes only a dtype "
                            f"or a device of its placement's type ({g.placement.type!r}), got {dev}")
    same_dev = dev is None or dev == cur.device
    same_dt = dt is None or dt == cur.dtype
    # a trace whose values the AMP pass retypes afterwards (nn.Graph config.enable_amp) records an
    # explicit dtype even when it changes nothing yet: ``x.float()`` stays float32 there, as under
    # autocast
    if same_dev and same_dt and copy:   # (TO's kernel would return the input's storage)
        return clone(self)
    if same_dev and same_dt and (dt is None or not getattr(interpret._CURRENT.get(), "amp", False)):
        return self
    return apply(TO, self, dtype=dt or cur.dtype, device=dev or cur.device, src_device=cur.device)


def clone(input: Tensor, *, memory_format=torch.preserve_format) -> Tensor:
    return apply(CLONE, input, memory_format=memory_format)


def contiguous(self: Tensor, memory_format=torch.contiguous_format) -> Tensor:
    if self._data.is_contiguous(memory_format=memory_format):
        return self
    return apply(CLONE, self, memory_format=memory_format)


def _cast(dt):
    def method(self: Tensor, memory_format=torch.preserve_format) -> Tensor:
        return to(self, dt, memory_format=memory_format)
    return method


def type_as(self: Tensor, other: Tensor) -> Tensor:
    return to(self, other.dtype)


def cpu(self: Tensor) -> Tensor:
    return to(self, "cpu")


def cuda(self: Tensor, device=None, non_blocking: bool = False) -> Tensor:
    return to(self, "cuda" if device is None else _device.to_torch(device if not isinstance(device, int) else device))


for _name, _dt in [("float", _dtype.float32), ("double", _dtype.float64), ("half", _dtype.float16),
                   ("bfloat16", _dtype.bfloat16), ("long", _dtype.int64), ("int", _dtype.int32),
                   ("short", _dtype.int16), ("char", _dtype.int8), ("byte", _dtype.uint8),
                   ("bool", _dtype.bool)]:
    setattr(Tensor, _name, _cast(_dt))
Tensor.to, Tensor.clone, Tensor.contiguous, Tensor.type_as = to, clone, contiguous, type_as
Tensor.cpu, Tensor.cuda = cpu, cuda   # (Tensor.type: holoflow/compat.py)


def copy_(self: Tensor, src, non_blocking: bool = False) -> Tensor:
    """Copies ``src`` (broadcast, cast to this tensor's dtype and device) into this tensor; the
    gradient flows to ``src``, as ``torch.Tensor.copy_``."""
    check_view_target(self, "copy")   # before reading src re-derives a view (x.copy_(x))
    if not isinstance(src, Tensor):
        src = Tensor._make(torch.as_tensor(src, dtype=self._data.dtype, device=self.device.torch))
        if self._global is not None:   # a number: the same constant on every rank of the placement
            place = self._global.placement
            src = place.interpreter.from_full(src._data, place, (B,) * place.ndim)
    out = to(src, device=self.device.torch, dtype=self._data.dtype)
    if tuple(out.shape) != tuple(self.shape):
        try:
            torch.broadcast_shapes(tuple(out.shape), tuple(self.shape))
        except RuntimeError:
            raise RuntimeError(f"holoflow.copy_: the source of shape {tuple(src.shape)} can't be broadcast "
                               f"to the destination's shape {tuple(self.shape)}") from None
    out = out.expand(tuple(self.shape))  # always an op: even a leaf source is linked into the history
    if src is not self and self._global is None and 0 in self._data.stride() and \
            distinct_elements(self._data) is not None and not _same_memory(self._data, src._data):
        raise RuntimeError("holoflow.copy_: unsupported operation: more than one element of the written-to "
                           "tensor refers to a single memory location (it is expanded); clone() it first")
    if grad_mode.is_grad_enabled() and (self._rg or out._rg):
        check_inplace_target(self, "copy")
        if self.grad_fn is not None and out.grad_fn is not None and self._view is None:
            out = _overwriting(self, out)
    return assign(self, out, "copy")


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same elements laid out alike (torch's copy_ then does nothing)."""
    return (a.data_ptr() == b.data_ptr() and a.stride() == b.stride() and a.shape == b.shape
            and a.dtype == b.dtype)


def _overwriting(x: Tensor, out: Tensor) -> Tensor:
    """``out`` with torch's CopyBackwards history for writing it over all of ``x``: ``out``'s
    gradient goes to ``out``'s history and ``x``'s old history gets zeros, not None (the grad rule
    of a whole-tensor ``view_scatter``; a view's base gets it from ``take_history``). A node on the
    shared storage, not an op: eager copies once. Global tensors pair shards of one layout (boxed as
    ``assign`` would box), and a trace keeps the tensor's lazy value and global meta, so the node
    holds everywhere."""
    if x._global is not None and out._global is not None and out._global.sbp != x._global.sbp:
        out = out.to_global(sbp=x._global.sbp)
    node = GradNode(VIEW_SCATTER, ((x.grad_fn, x._out_idx), (out.grad_fn, out._out_idx)),
                    {"chain": ()}, (x._data.shape, out._data.shape), (x._data.dtype, out._data.dtype))
    t = Tensor._make(out._data, node)
    t._global = out._global
    return t


Tensor.copy_ = copy_
