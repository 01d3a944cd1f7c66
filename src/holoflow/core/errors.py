"""Error helpers: every user mistake names the op, what it got, and what would be legal."""
from __future__ import annotations


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


def normalize_dim(op: str, dim: int, ndim: int) -> int:
    """Wraps a negative dim; raises a clear IndexError when out of range."""
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    if not lo <= dim <= hi:
        raise IndexError(f"holoflow.{op}: dim {dim} is out of range for a tensor with {ndim} "
                         f"dimension(s); legal dims are {lo}..{hi}")
    return dim % max(ndim, 1)
