"""``autocast``: mixed precision as an interpreter that casts op inputs, then binds on.

Entering an autocast region pushes an :class:`Autocast` interpreter (core/interpret.py) that
looks each op up by name in the policy table of the input's device type (amp/policy.py) and casts
its floating inputs with holoflow's own ``to``, so the cast is an op on the autograd tape and
gradients come back in the input's original dtype. Nested regions shadow the outer region (their
modes start from its modes) and restore it on exit; a graph traced inside a region keeps casting
(``above_trace``)::

    with flow.autocast("cpu"):                  # bfloat16
        y = model(x)                            # matmuls in bf16, losses in fp32
        with flow.autocast("cpu", enabled=False):
            z = head(y.float())                 # fp32 again
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import torch

from ..core import dtype as _dtype
from ..core import grad_mode
from ..core import interpret
from ..core.interpret import Interpreter
from ..core.tensor import Tensor
from .policy import DEFAULT_DTYPE, FP32, FP32_ATTR, LOWER, NATIVE, OPT_DTYPE, POLICIES, PROMOTE

_LOW = (torch.float16, torch.bfloat16)
_ALLOWED = {"cpu": (torch.bfloat16, torch.float16), "cuda": (torch.float16, torch.bfloat16)}


class _CastCache:
    """Casts of leaf parameters, reused within the outermost autocast region (torch's cache):
    a weight used by several matmuls is cast once per forward. A traced call (holoflow.compile,
    nn.Graph) in the region casts apart: its casts are symbolic values of the trace, which eager
    code after it must not read, and an eager cast is a value the trace must not capture as a
    constant (the plan would keep that weight's value after the optimizer changes it)."""

    def __init__(self) -> None:
        self.entries: dict[tuple, tuple[Tensor, Tensor]] = {}

    def cast(self, x: Tensor, dt: torch.dtype) -> Tensor:
        if not (x._rg and x.grad_fn is None) or interpret.is_lazy():
            return x.to(dt)
        key = (id(x), dt, grad_mode.STATE.enabled)
        hit = self.entries.get(key)
        if hit is not None and hit[0] is x:
            return hit[1]
        out = x.to(dt)
        self.entries[key] = (x, out)  # holds x so its id is not reused while cached
        return out


class Autocast(Interpreter):
    """The interpreter of an autocast region: per device type, the low dtype (or None when
    disabled). An inner region shadows the outer one (its modes already include the outer's)."""

    def __init__(self, modes: dict[str, torch.dtype | None], cache: _CastCache | None) -> None:
        super().__init__()
        self.modes, self.cache, self.shadowed = modes, cache, False
        # a region disabled on every device type (``autocast(enabled=False)`` with no enabled
        # region around it) casts nothing: its ops go straight on, no policy lookup per op
        self.idle = all(m is None for m in modes.values())

    def bind(self, op, inputs: tuple, attrs: dict):
        if not (self.shadowed or self.idle):
            inputs, attrs = self.cast(op, inputs, attrs)
        return self.parent.bind(op, inputs, attrs)

    def composite(self, name: str, inputs: tuple) -> tuple:
        """The policy of a composite op (mse_loss, l1_loss, ...): the name torch lists it under."""
        if not (self.shadowed or self.idle):
            inputs, _ = self.cast(_Named(name), inputs, {})
        return self.parent.composite(name, inputs)

    def above_trace(self, device_type: str) -> "Autocast | None":
        return None if self.shadowed else Autocast(self.modes, self.cache)

    def cast(self, op, inputs: tuple, attrs: dict) -> tuple[tuple, dict]:
        """The inputs and attrs ``op`` runs with under this region's policy (one policy lookup:
        the device type of its first tensor input)."""
        for x in inputs:
            if isinstance(x, Tensor):
                devtype = self.parent.device_type_of(x)
                break
        else:
            return inputs, attrs
        low = self.modes.get(devtype)
        if low is None:
            return inputs, attrs
        kind = POLICIES.get(devtype, POLICIES["cuda"]).get(op.name)
        if kind is None:
            return inputs, attrs
        if kind == LOWER:
            keep = getattr(op, "amp_keep", ())
            return tuple(x if i in keep else self._to(x, low, devtype, _eligible_for_lower)
                         for i, x in enumerate(inputs)), attrs
        if kind == FP32:
            if op.name in OPT_DTYPE and attrs.get("dtype") is not None:
                return inputs, attrs
            return tuple(self._to(x, torch.float32, devtype, _is_low) for x in inputs), attrs
        if kind == FP32_ATTR:   # low-precision inputs stay; the op computes in float32
            if attrs.get("dtype") is None and any(isinstance(x, Tensor) and _is_low(x._data.dtype) for x in inputs):
                return inputs, {**attrs, "dtype": torch.float32}
            return inputs, attrs
        if kind == NATIVE:   # the kernel casts as torch.autocast does inside it
            return inputs, {**attrs, "autocast": low}
        assert kind == PROMOTE
        return self._promote(inputs, devtype), attrs

    def _to(self, x, dt: torch.dtype, devtype: str, eligible: Callable) -> Any:
        if not isinstance(x, Tensor):
            return x
        d = x._data
        if d.dtype == dt or not eligible(d.dtype) or self.parent.device_type_of(x) != devtype:
            return x
        return self.cache.cast(x, dt) if self.cache is not None else x.to(dt)

    def _promote(self, inputs: tuple, devtype: str) -> tuple:
        def mine(x) -> bool:
            return isinstance(x, Tensor) and x._data.dtype.is_floating_point and \
                self.parent.device_type_of(x) == devtype
        floats = [x._data.dtype for x in inputs if mine(x)]
        if len(set(floats)) < 2:
            return inputs
        wide = functools.reduce(torch.promote_types, floats)
        return tuple(x.to(wide) if mine(x) else x for x in inputs)


class _Named:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _eligible_for_lower(dt: torch.dtype) -> bool:
    return dt.is_floating_point and dt != torch.float64  # float64 is never lowered, as in torch


def _is_low(dt: torch.dtype) -> bool:
    return dt in _LOW


class _BaseRegion(threading.local):
    ctx = None      # the ``pushed`` context of the region enabling outside any region pushed
    region = None   # (amp/state.py: set_autocast_enabled)


_BASE_REGION = _BaseRegion()


def _current() -> Autocast | None:
    """The autocast region in force in this context (the innermost unshadowed one)."""
    for it in interpret.stack():
        if isinstance(it, Autocast) and not it.shadowed:
            return it
    return None


class autocast:
    """Runs ops of a region in mixed precision, like ``torch.autocast``.

    ``device_type`` is ``"cpu"`` (default dtype bfloat16) or ``"cuda"`` (default float16;
    bfloat16 also allowed). Works as a context manager and as a decorator; regions nest, and
    ``enabled=False`` turns casting off inside an enabled region. ``cache_enabled`` reuses the
    cast of each parameter within the outermost region.

    >>> with flow.autocast("cpu"):
    ...     y = x @ w            # bfloat16
    """

    def __init__(self, device_type: str, dtype=None, enabled: bool = True, cache_enabled: bool = True) -> None:
        if not isinstance(device_type, str):
            raise ValueError(f"holoflow.autocast: device_type must be a string such as 'cpu' or 'cuda', "
                             f"got {device_type!r}")
        self.device_type = torch.device(device_type).type
        dt = _dtype.to_torch(dtype) if dtype is not None else getattr(
            torch, DEFAULT_DTYPE.get(self.device_type, "float16"))
        allowed = _ALLOWED.get(self.device_type, _LOW)
        if enabled and dt not in allowed:
            raise ValueError(f"holoflow.autocast({self.device_type!r}): dtype {dt} is not supported; "
                             f"use one of {[str(a).replace('torch.', 'holoflow.') for a in allowed]}")
        self.fast_dtype, self.enabled, self.cache_enabled = dt, bool(enabled), bool(cache_enabled)
        self._prev = None

    def __enter__(self) -> "autocast":
        outer = _current()
        self._outer, self._ctx = outer, None
        if outer is None and not self.enabled:
            # a disabled region inside none: nothing to shadow, so nothing pushed (its ops take
            # eager's direct path); one that set_autocast_enabled() turns on inside ends with it
            self._base = _BASE_REGION.region
            return self
        modes = dict(outer.modes) if outer else {}
        modes[self.device_type] = self.fast_dtype if self.enabled else None
        cache = (outer.cache if outer else _CastCache()) if self.cache_enabled else None
        if outer is not None:
            outer.shadowed = True
        self._ctx = interpret.pushed(Autocast(modes, cache))
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._ctx is None:
            if _BASE_REGION.region is not None and _BASE_REGION.region is not self._base:
                ctx, _BASE_REGION.ctx, _BASE_REGION.region = _BASE_REGION.ctx, None, None
                ctx.__exit__(*exc)
            return
        self._ctx.__exit__(*exc)
        if self._outer is not None:
            self._outer.shadowed = False

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.device_type, self.fast_dtype, self.enabled, self.cache_enabled):
                return fn(*args, **kwargs)
        return wrapper


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """Whether ops on ``device_type`` tensors are autocast right now."""
    region = _current()
    return region is not None and region.modes.get(torch.device(device_type).type) is not None


def get_autocast_dtype(device_type: str) -> _dtype.dtype:
    """The low-precision dtype autocast uses for ``device_type`` (its default when inactive)."""
    region = _current()
    dt = region.modes.get(torch.device(device_type).type) if region else None
    if dt is None:
        dt = getattr(torch, DEFAULT_DTYPE.get(torch.device(device_type).type, "float16"))
    return _dtype.from_torch(dt)
