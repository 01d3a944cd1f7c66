"""torch's ``out=`` parameter, for every function whose torch twin takes one.

``holoflow.add(a, b, out=c)`` computes the result as the function always does, then writes it
into ``c`` as torch does: ``c`` is resized when its shape differs (with torch's warning unless it
was empty), the result is cast to ``c``'s dtype where torch's function takes it (asked of torch on
stand-in tensors first: some functions refuse any other dtype) and ``c`` is returned (a tuple of
them for functions of several results: ``torch.max(x, 0, out=(v, i))``). As in torch, autograd
does not record through ``out=``: it is refused where the result would need a gradient (grad mode
on, an argument requiring grad, a differentiable function). compat.install_torch_arguments wraps
the functions.
"""
from __future__ import annotations

import re
import warnings
from typing import Any, Callable

import torch

from ..core.device import device
from ..core.dtype import dtype, scalar_name, to_torch
from ..core.grad_mode import is_grad_enabled
from ..core.tensor import Tensor


def takes_out(twin: Any, name: str) -> bool:
    """Whether torch's function ``twin`` (holoflow's ``name``) takes ``out=``: an ATen operator
    with an out overload, or a Python one whose docstring's signatures show ``out=None``."""
    module = (getattr(twin, "__module__", None) or "").replace("._C._", ".")   # (torch._C._linalg)
    prefix = {"torch.linalg": "linalg_", "torch.special": "special_", "torch.fft": "fft_"}.get(module, "")
    try:
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{prefix}{name}")
    except RuntimeError:
        schemas = []
    if any(a.is_out for s in schemas for a in s.arguments):
        return True
    doc = getattr(twin, "__doc__", None) or ""
    return re.search(r"^\s*[\w.]+\([^\n]*\bout=None", doc, re.MULTILINE) is not None


def check_out(label: str, twin: Any, out: Any, args: tuple, kwargs: dict) -> torch.dtype | bool | None:
    """torch's refusals of ``out=`` before anything is computed: where torch's own function
    refuses this ``out`` for these arguments (a dtype some functions cast to and others refuse:
    ``mm``'s must be the result's; a tensor where a tuple goes), asked of ``twin`` where it takes
    the arguments without ``out=``: on CPU tensors of one element each (torch's kernels), else
    (they can't take such arguments) on meta tensors of the same shapes and dtypes (whose
    kernels don't check every dtype rule: ``softmax``'s, and promote some differently).
    Returns None where it can't tell (holoflow casts where torch's casting rule allows), else that
    torch took this ``out``: the dtype of its one result without ``out=`` (or True): a function
    with a ``dtype`` parameter computes in out's dtype then (``sum`` of floats into an integer out
    sums the integers)."""
    for make, make_out in ((_tiny_tensor, _cpu_empty), (_meta_tensor, _meta_empty)):
        took = _probe(label, twin, out, args, kwargs, make, make_out)
        if took is not None:
            return took
    return None


def _probe(label: str, twin: Any, out: Any, args: tuple, kwargs: dict, make: Callable,
           make_out: Callable) -> torch.dtype | bool | None:
    """Whether torch's ``twin`` takes ``out`` for these arguments (each tensor made by ``make``,
    ``out``'s by ``make_out``): the dtype of its one result without ``out=`` (True: several);
    None when it can't tell (the call fails without ``out=`` too); raises torch's refusal."""
    try:
        t_args, t_kwargs = [_torch_args(a, make) for a in args], {k: _torch_args(v, make) for k, v in kwargs.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = twin(*t_args, **t_kwargs)
    except Exception:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            twin(*t_args, **t_kwargs, out=_torch_args(out, make_out))
    except Exception as e:   # (only out= makes it fail)
        reason = str(e).split("\n")[0]
        cls = type(e) if type(e) in (TypeError, ValueError, IndexError, NotImplementedError) else RuntimeError
        raise cls(f"{label}: {reason} (out=)") from None
    return result.dtype if isinstance(result, torch.Tensor) else True


def _recording(t: Tensor, s: torch.Tensor) -> torch.Tensor:
    """``s`` standing for ``t``, requiring grad as ``t`` does (where autograd records): torch
    refuses ``out=`` where autograd would record the result, save for functions without a
    derivative (``floor_divide``: out requires grad then, with torch's error in backward)."""
    if t.requires_grad and is_grad_enabled() and (s.is_floating_point() or s.is_complex()):
        s.requires_grad_(True)
    return s


def _meta_tensor(t: Tensor) -> torch.Tensor:
    return _recording(t, torch.empty(tuple(t.shape), dtype=t._data.dtype, device="meta"))


def _tiny_tensor(t: Tensor) -> torch.Tensor:
    """One element per dim, or none where ``t`` has none: torch's kernels skip an empty input (a
    ``nansum`` of an empty float tensor into a uint8 ``out`` computes, where one element would not)."""
    return _recording(t, torch.zeros(tuple(min(n, 1) for n in t.shape), dtype=t._data.dtype))


def _meta_empty(t: Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=t._data.dtype, device="meta")


def _cpu_empty(t: Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=t._data.dtype)


def _torch_args(v: Any, make: Callable) -> Any:
    """``v`` with ``make(t)`` for each holoflow tensor, and torch's dtypes and devices."""
    if isinstance(v, Tensor):
        return make(v)
    if isinstance(v, (list, tuple)):
        items = [_torch_args(e, make) for e in v]
        return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)
    if isinstance(v, dtype):
        return to_torch(v)
    if isinstance(v, device):
        return None
    return v


def records(args: tuple, kwargs: dict) -> bool:
    """Whether autograd may record a function of these arguments (one requires grad)."""
    if not is_grad_enabled():
        return False
    values = [*args, *kwargs.values()]
    values += [v for v in list(values) if isinstance(v, (list, tuple)) for v in v]
    return any(isinstance(v, Tensor) and v.requires_grad for v in values)


def write_out(label: str, result: Any, out: Any, torch_took: bool = False) -> Any:
    """Writes ``result`` (a tensor, or a tuple of them) into ``out`` and returns ``out``
    (``torch_took``: torch's function took this ``out``, whatever the casting rule says, and
    arguments requiring grad as these do). As torch, refused where autograd recorded the result
    (an argument requires grad and the function is differentiable) unless torch took it."""
    results = result if isinstance(result, tuple) else (result,)
    if not torch_took and is_grad_enabled() and any(isinstance(r, Tensor) and r.requires_grad for r in results):
        raise RuntimeError(f"{label}: functions with out=... arguments don't support automatic differentiation, "
                           f"but one of the arguments requires grad; compute without out= (autograd records "
                           f"then), or under holoflow.no_grad()")
    if isinstance(result, Tensor):
        if not isinstance(out, Tensor):
            raise TypeError(f"{label}: argument 'out' must be Tensor, not {type(out).__name__}")
        _write(label, result, out, torch_took)
        return out
    if isinstance(result, tuple) and all(isinstance(r, Tensor) for r in result):
        if not isinstance(out, (tuple, list)) or len(out) != len(result) or \
                not all(isinstance(o, Tensor) for o in out):
            raise TypeError(f"{label}: argument 'out' must be a tuple of {len(result)} Tensors, not "
                            f"{type(out).__name__}" + (f" of {len(out)}" if isinstance(out, (tuple, list)) else ""))
        for r, o in zip(result, out):
            _write(label, r, o, torch_took)
        return type(result)(*out) if hasattr(result, "_fields") else tuple(out)
    raise TypeError(f"{label}: out= takes the function's tensor results; it returned {type(result).__name__}")


def _write(label: str, result: Tensor, out: Tensor, torch_took: bool) -> None:
    r, o = result._data, out._data
    if r.device != o.device:
        raise RuntimeError(f"{label}: expected out tensor to have device {r.device}, but got {o.device} instead")
    if not torch_took and not torch.can_cast(r.dtype, o.dtype):
        raise RuntimeError(f"{label}: result type {scalar_name(r.dtype)} can't be cast to the desired output type "
                           f"{scalar_name(o.dtype)} (out's)")
    if tuple(out.shape) != tuple(result.shape):
        if out.numel() != 0:
            warnings.warn(f"{label}: an output with one or more elements was resized since it had shape "
                          f"{list(out.shape)}, which does not match the required output shape "
                          f"{list(result.shape)} (as torch, which deprecates it: pass an empty out tensor, or "
                          f"one of the right shape)", UserWarning, stacklevel=4)
        out.resize_(tuple(result.shape))
    out.copy_(result)
