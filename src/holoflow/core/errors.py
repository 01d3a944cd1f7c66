"""Error helpers: every user mistake names the op, what it got, and what would be legal."""
from __future__ import annotations

import operator

from .dtype import from_torch


class HoloflowError(RuntimeError):
    """Base class for holoflow's own errors (a RuntimeError, as torch raises)."""


class ShapeError(HoloflowError, ValueError):
    """Shapes that an op cannot take."""


class DTypeError(HoloflowError, TypeError):
    """Dtypes that an op cannot take."""


class UnsupportedError(HoloflowError, NotImplementedError):
    """Something holoflow does not implement (yet)."""


def describe(x) -> str:
    """A short description of an argument for error messages: shape and dtype for tensors."""
    from .tensor import Tensor
    if isinstance(x, Tensor):
        s = f"Tensor(shape={tuple(x.shape)}, dtype={x.dtype}"
        if x.is_global:
            s += f", sbp={x.sbp}"
        return s + ")"
    if isinstance(x, (list, tuple)) and len(x) <= 8:
        inner = ", ".join(describe(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    return repr(x) if len(repr(x)) < 60 else type(x).__name__


def describe_layout(t) -> str:
    """``local, shape (4,)`` or ``global, shape (4,), sbp (...) on placement(...)``: where a tensor lives."""
    g = t._global
    if g is None:
        return f"(local, shape {tuple(t.shape)})"
    return f"(global, shape {tuple(t.shape)}, sbp {tuple(g.sbp)} on {g.placement})"


def normalize_dim(op: str, dim: int, ndim: int) -> int:
    """Wraps a negative dim; raises a clear IndexError when out of range (a bool, which torch's
    parser refuses as a dim: TypeError)."""
    if dim is True or dim is False:
        raise TypeError(f"holoflow.{op}: dim must be an int, not bool ({dim})")
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    if not lo <= dim <= hi:
        raise IndexError(f"holoflow.{op}: dim {dim} is out of range for a tensor with {ndim} "
                         f"dimension(s); legal dims are {lo}..{hi}")
    return dim % max(ndim, 1)


class ArgValueError(HoloflowError, ValueError):
    """A bad argument value that torch reports as RuntimeError (a bad device string, ...)."""


class ArgTypeError(TypeError, ValueError):
    """An argument of the wrong type: torch raises TypeError (also a ValueError, which holoflow
    raised before, so older ``except ValueError`` clauses keep working)."""


def int_sizes(op: str, sizes: tuple, allow_negative: bool = True) -> tuple[int, ...]:
    """Sizes as ints, as torch reads them: anything with ``__index__`` (ints, numpy ints, integer
    0-d tensors); a float (``reshape(3.7)``) or a string is an :class:`ArgTypeError` naming the op,
    not truncated. ``allow_negative=False`` (creation): a negative size is a :class:`ShapeError`
    (torch: RuntimeError)."""
    out = []
    for i, s in enumerate(sizes):
        if isinstance(s, bool):
            raise ArgTypeError(f"holoflow.{op}(): size must be a tuple of ints, but found a bool at pos {i}")
        try:
            out.append(operator.index(s))
        except TypeError:
            raise ArgTypeError(f"holoflow.{op}(): size must be a tuple of ints, but found element of type "
                               f"{type(s).__name__} at pos {i} (got {describe(tuple(sizes))})") from None
        if not allow_negative and out[-1] < 0:
            raise ShapeError(f"holoflow.{op}(): trying to create a tensor with negative dimension {out[-1]} "
                             f"(size {tuple(out)}...); sizes must be >= 0")
    return tuple(out)


def check_grad_assignment(t, g) -> None:
    """What torch checks on ``t.grad = g``: None or a tensor of ``t``'s shape, dtype and device
    type (RuntimeError otherwise; TypeError for a non-tensor). Call it from the ``grad`` setter."""
    if g is None:
        return
    from .tensor import Tensor
    if not isinstance(g, Tensor):
        raise TypeError(f"holoflow: assigned grad expected to be a Tensor or None but got grad of type "
                        f"{type(g).__name__}")
    if (g._global is None) != (t._global is None) or \
            (t._global is not None and g._global.placement != t._global.placement):
        raise RuntimeError(f"holoflow: assigned grad {describe_layout(g)} doesn't match the tensor "
                           f"{describe_layout(t)}; a gradient has its tensor's placement: "
                           f"grad.to_global(placement, sbp) (or .to_local() for a local tensor)")
    if tuple(g.shape) != tuple(t.shape):
        raise RuntimeError(f"holoflow: assigned grad has data of a different size: grad {tuple(g.shape)}, "
                           f"tensor {tuple(t.shape)}")
    want = t.__dict__.get("_grad_dtype", t._data.dtype)   # (Tensor.grad_dtype; None: any dtype)
    if want is not None and g._data.dtype != want:
        raise RuntimeError(f"holoflow: attempting to assign a gradient with dtype {g.dtype} to a tensor with "
                           f"grad_dtype {from_torch(want)}. The gradient must match the tensor's grad_dtype "
                           f"(defaults to the tensor's dtype). You can set the tensor's grad_dtype attribute with a "
                           f"specific dtype, or None to allow any dtype.")
    if g._data.device.type != t._data.device.type:
        raise RuntimeError(f"holoflow: assigned grad has data located on a different device: grad on "
                           f"{g._data.device}, tensor on {t._data.device}")
