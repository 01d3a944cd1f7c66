"""Elementwise math beyond the one-line members of ops/elementwise.py: torch's fused pointwise
kernels ``addcmul``/``addcdiv``, the NaN-ignoring ``fmax``/``fmin``, and the binary float functions
``hypot``, ``copysign``, ``heaviside``, ``ldexp``, ``gcd``, ``nextafter`` and ``frexp``; with their
Tensor methods and in-place forms.

Each is a primitive on its ATen kernel: ``addcmul``/``addcdiv``, ``hypot``, ``copysign`` and ``ldexp``
with torch's derivatives written as ops (the last three read the result, as torch's: written in
place into overlapping windows, the values the kernel leaves), ``fmax``/``fmin`` and ``frexp`` with
ATen's derivative (ops/torch_vjp.py), so values, ties and NaN rules are torch's.
``heaviside``'s output requires grad and its backward raises, as torch's; ``gcd`` is not
differentiable. SBP: elementwise (the backward on equal shapes). The argument checks
``_tensor``/``_floating`` here are shared by ops/special.py, histogram.py, calculus.py,
products.py, stacking.py, flat_index.py and the index_copy/scatter_reduce, renorm and
isin/bucketize parts of scatter.py, norm.py and sorting.py.
"""
from __future__ import annotations

import math
from collections import namedtuple

import torch

from ..core.dispatch import apply, apply_inplace
from ..core.errors import UnsupportedError
from ..core.registry import defop
from ..core.sbp import B, S
from ..core.tensor import Tensor
from .elementwise import POW, ZEROS_LIKE, _conj, where
from .family import binary, elementwise_sbp, elementwise_shape, needs, reduce_grad
from .torch_vjp import defop_vjp

__all__ = ["fmax", "fmin", "addcmul", "addcdiv", "hypot", "copysign", "heaviside", "gcd", "nextafter", "ldexp", "frexp"]


def _same_shape_bwd_sbp(metas, attrs):
    """Backward of an elementwise op: all broadcast, or (equal shapes) all split alike."""
    shapes = [tuple(m.shape) for m in metas if hasattr(m, "shape")]
    sigs = [((B,) * len(shapes), (B,) * len(attrs["diff"]))]
    if len(set(shapes)) == 1:
        sigs += [((S(a),) * len(shapes), (S(a),) * len(attrs["diff"])) for a in range(len(shapes[0]))]
    return sigs


FMAX = defop_vjp("fmax", torch.fmax, sbp=elementwise_sbp(), bwd_sbp=_same_shape_bwd_sbp, family="elementwise")
FMIN = defop_vjp("fmin", torch.fmin, sbp=elementwise_sbp(), bwd_sbp=_same_shape_bwd_sbp, family="elementwise")


def _tensors(name: str, a, b) -> tuple[Tensor, Tensor]:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"holoflow.{name}: expected two tensors, got {type(a).__name__} and {type(b).__name__}")
    return a, b


def fmax(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise maximum that ignores NaN (NaN only where both are NaN), as ``torch.fmax``."""
    return apply(FMAX, *_tensors("fmax", input, other))


def fmin(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise minimum that ignores NaN (NaN only where both are NaN), as ``torch.fmin``."""
    return apply(FMIN, *_tensors("fmin", input, other))


# -- torch's fused pointwise kernels --------------------------------------------------------------------

def _addcmul_grad(c, dy):
    """torch's derivatives: ``dy``; ``dy * conj(t2 * value)``; ``dy * conj(t1 * value)`` (the
    products with ``value`` even when it is 1: a complex infinity times 1 has a NaN part)."""
    _, t1, t2 = c.inputs
    return (reduce_grad(dy, c, 0) if needs(c, 0) else None,
            reduce_grad(dy * _conj(t2 * c.value), c, 1) if needs(c, 1) else None,
            reduce_grad(dy * _conj(t1 * c.value), c, 2) if needs(c, 2) else None)


def _addcdiv_grad(c, dy):
    """torch's derivatives: ``dy``; ``dy * conj(value / t2)`` (``value`` filled in t2's dtype);
    ``-dy * conj(value * t1 / (t2 * t2))``."""
    _, t1, t2 = c.inputs
    return (reduce_grad(dy, c, 0) if needs(c, 0) else None,
            reduce_grad(dy * _conj(t2.new_full((), c.value) / t2), c, 1) if needs(c, 1) else None,
            reduce_grad(-dy * _conj(t1 * c.value / (t2 * t2)), c, 2) if needs(c, 2) else None)


def _addcmul_kernel(x, t1, t2, value=1):
    return torch.addcmul(x, t1, t2, value=value)


def _addcdiv_kernel(x, t1, t2, value=1):
    return torch.addcdiv(x, t1, t2, value=value)


# one kernel each (``self + value * t1 * t2`` in torch's order: a composite differed at complex
# infinities); linear in (input, tensor1) jointly for a fixed tensor2, and addcmul in (input, tensor2)
ADDCMUL = defop("addcmul", _addcmul_kernel, grad=_addcmul_grad, save="inputs", saved_inputs=(1, 2),
                family="elementwise", shape=elementwise_shape("addcmul", _addcmul_kernel),
                sbp=elementwise_sbp(("PPB", "PBP")), inplace_kernel=torch.Tensor.addcmul_)
ADDCDIV = defop("addcdiv", _addcdiv_kernel, grad=_addcdiv_grad, save="inputs", saved_inputs=(1, 2),
                family="elementwise", shape=elementwise_shape("addcdiv", _addcdiv_kernel),
                sbp=elementwise_sbp(("PPB",)), inplace_kernel=torch.Tensor.addcdiv_)


def _addc_args(name: str, tensors: tuple, value) -> int | float | complex | bool:
    for arg, t in zip(("input", "tensor1", "tensor2"), tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"holoflow.{name}(): argument '{arg}' must be Tensor, not {type(t).__name__}")
    if isinstance(value, Tensor):   # (torch takes a one-element tensor as the Scalar)
        if value.numel() != 1:
            raise TypeError(f"holoflow.{name}(): argument 'value' must be a Number or a one-element tensor, "
                            f"got shape {tuple(value.shape)}")
        value = value.item()
    if name == "addcdiv" and not any(t.is_floating_point() or t.is_complex() for t in tensors[1:]):
        raise RuntimeError(f"holoflow.addcdiv: integer division with addcdiv is not supported (tensor1 is "
                           f"{tensors[1].dtype}, tensor2 {tensors[2].dtype}, as torch); use a floating point "
                           f"tensor1 or tensor2")
    return value


def addcmul(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """``input + value * tensor1 * tensor2`` with broadcasting, torch's kernel (its rounding and
    special values)."""
    value = _addc_args("addcmul", (input, tensor1, tensor2), value)
    return apply(ADDCMUL, input, tensor1, tensor2, value=value)


def addcdiv(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """``input + value * tensor1 / tensor2``, torch's kernel; as torch, not for two integer tensors."""
    value = _addc_args("addcdiv", (input, tensor1, tensor2), value)
    return apply(ADDCDIV, input, tensor1, tensor2, value=value)


def _ew(name: str, fn, outputs: tuple | None = None):
    one = elementwise_sbp()

    def sbp(metas, attrs):  # every output laid out like the (single) elementwise output
        return [(ins, outs * len(outputs or "x")) for ins, outs in one(metas, attrs)]
    # (two outputs of two dtypes: not a member of the fusible, in-place-able elementwise family)
    return defop_vjp(name, fn, sbp=sbp, bwd_sbp=_same_shape_bwd_sbp, outputs=outputs,
                     family="other" if outputs else "elementwise",
                     inplace_kernel=None if outputs else getattr(torch.Tensor, name + "_", None))


def _tensor(name: str, x, arg: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"holoflow.{name}(): argument '{arg}' must be Tensor, not {type(x).__name__}")
    return x


def _floating(name: str, x: Tensor) -> None:
    if x.is_complex():
        raise UnsupportedError(f"holoflow.{name}: not implemented for complex tensors, got {x.dtype}")


# -- torch's formulas that read the result: written in place into overlapping windows (unfold's), the
# values the kernel leaves there (an element written twice: its last write), as torch's saved result.
# As torch's nodes, they save the result whichever gradient is wanted, and an input only for a
# gradient that reads it


def _hypot_grad(c, dy):
    """torch's: ``dy * input / result``, ``dy * other / result``."""
    a, b = c.inputs
    out = c.out
    return (reduce_grad(dy * a / out, c, 0) if needs(c, 0) else None,
            reduce_grad(dy * b / out, c, 1) if needs(c, 1) else None)


def _copysign_grad(c, dy):
    """torch's: ``dy * (result / input)``, 0 where the input is 0; ``other``'s is zeros (its rule
    reads no input, so none is saved for it)."""
    out = c.out   # (read whichever gradient: a result written in place since is refused, as torch's)
    gb = dy.detach().new_zeros(c.shapes[1], dtype=c.dtypes[1]) if needs(c, 1) else None
    if not needs(c, 0):
        return None, gb
    a = c.inputs[0]
    return reduce_grad(dy * where(a == 0, 0.0, out / a), c, 0), gb


def _ldexp_grad(c, dy):
    """torch's: ``dy * 2**other`` (in the exponent's dtype: 0 where an integer one is negative);
    ``dy * result * ln 2``, which torch's engine refuses for a real exponent of a complex result."""
    ga = gb = None
    out = c.out
    if needs(c, 0):
        ga = reduce_grad(dy * apply(POW, 2, c.inputs[1]), c, 0)
    if needs(c, 1):
        if out._data.is_complex() and not c.dtypes[1].is_complex:
            raise RuntimeError(f"holoflow.ldexp: the gradient of the real exponent ({c.dtypes[1]}) would be "
                               f"complex ({out.dtype}, the result's), which torch's engine refuses as well")
        gb = reduce_grad(dy * out * math.log(2), c, 1)
    return ga, gb


def _own_saves(needs: tuple) -> tuple[int, ...]:
    """Each input's gradient reads that input (hypot's; copysign's of input 0)."""
    return tuple(i for i, n in enumerate(needs) if n)


HYPOT = binary("hypot", torch.hypot, _hypot_grad, "both", tensors_only=True, saved_inputs=_own_saves)
COPYSIGN = binary("copysign", torch.copysign, _copysign_grad, "both", saved_inputs=lambda needs: _own_saves(needs[:1]))
FREXP = _ew("frexp", torch.frexp, outputs=("mantissa", "exponent"))


def _no_derivative(name: str):
    """torch's outputs of these require grad, and backward raises: the same here."""
    def grad(ctx, dy):
        raise UnsupportedError(f"holoflow.{name}: the derivative for '{name}' is not implemented (nor in torch)")
    return grad


HEAVISIDE = binary("heaviside", torch.heaviside, _no_derivative("heaviside"), tensors_only=True)
GCD = binary("gcd", torch.gcd, tensors_only=True)


def _nextafter_grad(c, dy):
    """ATen's derivative (torch 2.13 has it; 2.11 raises): the step is one ulp, d/dinput = 1
    except where ``input == other`` (the output is ``other`` there: 0), d/dother = 0."""
    zero = apply(ZEROS_LIKE, dy)
    if not needs(c, 0):
        return None, reduce_grad(zero, c, 1) if needs(c, 1) else None
    a, b = c.inputs
    return reduce_grad(where(a != b, dy, zero), c, 0), reduce_grad(zero, c, 1) if needs(c, 1) else None


NEXTAFTER = binary("nextafter", torch.nextafter, _nextafter_grad, "inputs", tensors_only=True)

_Frexp = namedtuple("frexp", ["mantissa", "exponent"])


def hypot(input: Tensor, other: Tensor) -> Tensor:
    """``sqrt(input**2 + other**2)`` elementwise, as ``torch.hypot``."""
    return apply(HYPOT, _tensor("hypot", input), _tensor("hypot", other, "other"))


def copysign(input: Tensor, other) -> Tensor:
    """``|input|`` with the sign of ``other`` (a tensor or a number), as ``torch.copysign``."""
    return apply(COPYSIGN, _tensor("copysign", input), other)


def heaviside(input: Tensor, values: Tensor) -> Tensor:
    """0 where ``input < 0``, ``values`` where it is 0, 1 where it is positive, as ``torch.heaviside``."""
    return apply(HEAVISIDE, _tensor("heaviside", input), _tensor("heaviside", values, "values"))


def gcd(input: Tensor, other: Tensor) -> Tensor:
    """The greatest common divisor of integer tensors, as ``torch.gcd``."""
    return apply(GCD, _tensor("gcd", input), _tensor("gcd", other, "other"))


def nextafter(input: Tensor, other: Tensor) -> Tensor:
    """The next representable float after ``input`` towards ``other``, as ``torch.nextafter``."""
    return apply(NEXTAFTER, _tensor("nextafter", input), _tensor("nextafter", other, "other"))


LDEXP = binary("ldexp", torch.ldexp, _ldexp_grad, "both", tensors_only=True,
               saved_inputs=lambda needs: (1,) if needs[0] else ())


def ldexp(input: Tensor, other: Tensor) -> Tensor:
    """``input * 2**other``, as ``torch.ldexp``; its gradient is ATen's, ``dy * pow(2, other)`` in
    the exponent's dtype (so 0 where an integer exponent is negative, as torch gives)."""
    return apply(LDEXP, _tensor("ldexp", input), _tensor("ldexp", other, "other"))


def frexp(input: Tensor):
    """Mantissa in [0.5, 1) and integer exponent with ``input = mantissa * 2**exponent``, as ``torch.frexp``."""
    if not _tensor("frexp", input).is_floating_point():
        raise RuntimeError(f"holoflow.frexp only supports floating-point dtypes, got {input.dtype}")
    return _Frexp(*apply(FREXP, input))


# -- Tensor methods -------------------------------------------------------------------------------------

def _method_inplace(op):
    """``x.op_(...)``: the op written into ``x`` (torch's in-place autograd, core/dispatch.py)."""
    def method(self, *args, **kwargs):
        return apply_inplace(op, self, *args, **kwargs)
    return method


for _name in ("hypot", "copysign", "heaviside", "frexp", "ldexp", "gcd", "nextafter"):
    setattr(Tensor, _name, globals()[_name])

def _tensor_method_inplace(op):
    """``x.op_(t)`` of an op taking tensors only (a number ``t``: torch's TypeError)."""
    def method(self, other):
        return apply_inplace(op, self, _tensor(op.name + "_", other, "other"))
    return method


for _name, _op in (("copysign_", COPYSIGN), ("heaviside_", HEAVISIDE), ("gcd_", GCD), ("nextafter_", NEXTAFTER)):
    setattr(Tensor, _name, _method_inplace(_op))

Tensor.hypot_ = _tensor_method_inplace(HYPOT)
Tensor.ldexp_ = _tensor_method_inplace(LDEXP)
