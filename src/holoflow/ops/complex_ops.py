"""Complex numbers as LLaMA-style rotary embeddings use them: ``view_as_real``/``view_as_complex``
and ``real``/``imag`` (views, as in torch: writing through them changes the base, see
docs/architecture.md, "Views and in-place ops"), ``complex``/``polar`` and ``angle``.

Gradients follow torch's convention (the conjugate Wirtinger derivative, as in ops/fft.py): the
views are linear, so their gradients are the opposite views (``view_as_real``'s gradient is
``view_as_complex`` of the gradient, ``imag``'s is ``dy * 1j``); ``polar`` uses ATen's
derivative (ops/torch_vjp.py); ``angle``'s is ATen's formula in holoflow ops (0 at 0), so it is
differentiable again.
"""
from __future__ import annotations

import torch

from ..core import interpret
from ..core.dispatch import apply
from ..core.errors import DTypeError
from ..core.registry import defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .elementwise import ZEROS_LIKE
from .family import elementwise_sbp, needs, reduce_grad
from .fft import AS_COMPLEX
from .pointwise import _same_shape_bwd_sbp
from .torch_vjp import defop_vjp

__all__ = ["view_as_real", "view_as_complex", "complex", "polar", "real", "imag", "angle"]

_COMPLEX_OF = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}


def _torch_dtype(d) -> torch.dtype:
    return d if isinstance(d, torch.dtype) else d.torch


def _linear_sbp(split_axes):
    """A linear view: B -> B, P -> P, and a split of each axis in ``split_axes(nd)`` kept."""
    def rule(metas, attrs):
        return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(a),)) for a in split_axes(len(metas[0].shape))]
    return rule


def _pairs(x: torch.Tensor) -> torch.Tensor:
    """``x`` laid out so ``view_as_complex`` accepts it: itself when it already is (the public
    function checks user inputs, as torch; gradients may come in any layout)."""
    ok = x.dim() and x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(
        s % 2 == 0 for s in x.stride()[:-1])
    return x if ok else x.clone(memory_format=torch.contiguous_format)


VIEW_AS_REAL = defop("view_as_real", torch.view_as_real,
                     grad=lambda c, dy: (apply(VIEW_AS_COMPLEX, dy),),
                     sbp=_linear_sbp(range), family="shape", view=True)
VIEW_AS_COMPLEX = defop("view_as_complex", lambda x: torch.view_as_complex(_pairs(x)),
                        grad=lambda c, dy: (apply(VIEW_AS_REAL, dy),),
                        sbp=_linear_sbp(lambda nd: range(nd - 1)), family="shape", view=True)
REAL_VIEW = defop("real_view", torch.real,
                  grad=lambda c, dy: (apply(AS_COMPLEX, dy, dtype=_torch_dtype(c.dtypes[0])),),
                  sbp=_linear_sbp(range), family="shape", view=True)
IMAG_VIEW = defop("imag_view", torch.imag,
                  grad=lambda c, dy: (apply(COMPLEX, apply(ZEROS_LIKE, dy), dy),),
                  sbp=_linear_sbp(range), family="shape", view=True)


def _complex_grad(c, dy):
    return (reduce_grad(apply(REAL_VIEW, dy), c, 0) if needs(c, 0) else None,
            reduce_grad(apply(IMAG_VIEW, dy), c, 1) if needs(c, 1) else None)


COMPLEX = defop("complex", torch.complex, grad=_complex_grad, sbp=elementwise_sbp(("PP",)), family="elementwise")
POLAR = defop_vjp("polar", torch.polar, sbp=elementwise_sbp(), bwd_sbp=_same_shape_bwd_sbp, family="elementwise")


def _angle_grad(c, dy):
    """ATen's angle_backward (0 at 0, zeros for real inputs), written with holoflow ops so that it
    is itself differentiable (double backward)."""
    if not needs(c, 0):
        return (None,)
    z = c.inputs[0]
    if not z.is_complex():
        return (apply(ZEROS_LIKE, z),)
    from .elementwise import where
    g = dy * z / z.abs().pow(2) * 1j
    return (where(z == 0, apply(ZEROS_LIKE, g), g),)


ANGLE = defop("angle", torch.angle, grad=_angle_grad, save="inputs", sbp=elementwise_sbp(), family="elementwise")


def _tensor(name: str, x) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"holoflow.{name}(): argument 'input' must be Tensor, not {type(x).__name__}")
    return x


def view_as_real(input: Tensor) -> Tensor:
    """A real view of a complex tensor with a last dim of size 2 (real, imaginary), as
    ``torch.view_as_real``: writes through it change ``input``."""
    if not _tensor("view_as_real", input).is_complex():
        raise RuntimeError(f"holoflow.view_as_real is only supported for complex tensors, got {input.dtype}")
    return apply(VIEW_AS_REAL, input)


def view_as_complex(input: Tensor) -> Tensor:
    """A complex view of a float tensor whose last dim (size 2, stride 1) holds (real, imaginary)
    pairs, as ``torch.view_as_complex``."""
    x = _tensor("view_as_complex", input)
    if x._data.dtype not in (torch.float16, torch.float32, torch.float64):
        raise RuntimeError(f"holoflow.view_as_complex is only supported for float16, float32 and float64 "
                           f"tensors, but got a tensor of scalar type {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != 2:
        raise RuntimeError(f"holoflow.view_as_complex: tensor must have a last dimension of size 2, got shape "
                           f"{tuple(x.shape)}")
    d = x._data
    if d.stride(-1) != 1:
        raise RuntimeError(f"holoflow.view_as_complex: tensor must have a last dimension with stride 1, got "
                           f"strides {tuple(d.stride())}")
    if any(s % 2 for s in d.stride()[:-1]) or d.storage_offset() % 2:
        raise RuntimeError(f"holoflow.view_as_complex: tensor must have a stride divisible by 2 for all but "
                           f"last dimension and an even storage offset, got strides {tuple(d.stride())}")
    return apply(VIEW_AS_COMPLEX, x)


def complex(real: Tensor, imag: Tensor) -> Tensor:  # noqa: A001 - torch's name
    """``real + 1j * imag`` from two float tensors of one dtype (broadcast), as ``torch.complex``."""
    re, im = _tensor("complex", real), _tensor("complex", imag)
    if re._data.dtype != im._data.dtype or re._data.dtype not in _COMPLEX_OF:
        raise DTypeError(f"holoflow.complex: expected both inputs to be float16, float32 or float64 of one dtype, "
                         f"got {re.dtype} and {im.dtype}")
    return apply(COMPLEX, re, im)


def polar(abs: Tensor, angle: Tensor) -> Tensor:  # noqa: A002 - torch's names
    """``abs * (cos(angle) + 1j * sin(angle))``, as ``torch.polar``."""
    a, t = interpret.composite("polar", _tensor("polar", abs), _tensor("polar", angle))
    if a._data.dtype != t._data.dtype or a._data.dtype not in _COMPLEX_OF:
        raise DTypeError(f"holoflow.polar: expected both inputs to be float16, float32 or float64 of one dtype, got "
                         f"{a.dtype} and {t.dtype}")
    return apply(POLAR, a, t)


def real(input: Tensor) -> Tensor:
    """The real part of a complex tensor as a view (a real tensor is returned as is), as ``torch.real``."""
    x = _tensor("real", input)
    return apply(REAL_VIEW, x) if x.is_complex() else x


def imag(input: Tensor) -> Tensor:
    """The imaginary part of a complex tensor as a view, as ``torch.imag``."""
    if not _tensor("imag", input).is_complex():
        raise RuntimeError(f"holoflow.imag is not implemented for tensors with non-complex dtypes, got "
                           f"{input.dtype}")
    return apply(IMAG_VIEW, input)


def angle(input: Tensor) -> Tensor:
    """The elementwise argument (radians): ``atan2(imag, real)``; 0 or pi for real inputs (integers
    give float), as ``torch.angle``."""
    return apply(ANGLE, _tensor("angle", input))


def _set_part(part):
    def setter(self: Tensor, value) -> None:
        part(self).copy_(value)
    return setter


Tensor.real = property(real, _set_part(real), doc="The real part (a view for complex tensors).")
Tensor.imag = property(imag, _set_part(imag), doc="The imaginary part (a view; complex tensors only).")
Tensor.angle = angle
