"""Python operators and the elementwise methods of Tensor (other op modules bind their own)."""
from __future__ import annotations

from typing import Callable

import torch

from ..core.dispatch import (apply, apply_inplace, binary_method, check_inplace_target, holds_elements_twice,
                             read_for_write, written_as_torch)
from ..core.dtype import from_torch
from ..core.grad_mode import is_grad_enabled
from ..core.tensor import Tensor
from . import elementwise as E
from .pointwise import ADDCDIV, ADDCMUL, _addc_args, addcdiv, addcmul, fmax, fmin
from .random_ops import FILL_
from .nn_ops import hardshrink   # (nn_ops re-exports ops/activation.py, which imports nn_ops)


def _inplace(op, **fixed):
    def method(self, *args, **attrs):
        return apply_inplace(op, self, *args, **fixed, **attrs)
    method.__name__ = op.name + "_"
    return method


def _reflect(op, **attrs):
    """``scalar OP self``. A Python float meeting a float64/complex128 tensor is wrapped at that
    precision (the binary kernels wrap a leading scalar at the default float32 otherwise); at
    lower precisions the kernel's wrapping already rounds as torch's wrapped numbers do."""
    def method(self, other):
        if isinstance(other, (float, complex)) and self._global is None:
            dt = torch.result_type(self._data, other)
            if dt in (torch.float64, torch.complex128):
                other = Tensor._make(torch.tensor(other, dtype=dt, device=self.device.torch))
        return apply(op, other, self, **attrs)
    return method


def _commute(op):
    """``scalar OP self`` for a commutative op computes ``self OP scalar``, as torch's
    ``__radd__``/``__rmul__`` do (the scalar stays a wrapped number: bf16 rounds as torch)."""
    return binary_method(op)


def _rtruediv(self, other):
    """``other / self`` as torch's ``Tensor.__rtruediv__``: ``self.reciprocal() * other``."""
    return apply(E.MUL, apply(E.RECIPROCAL, self), other)


def _forward(op, **attrs):
    return binary_method(op, **attrs)


def _equality(op, unequal: bool):
    """``==``/``!=``: against something that is neither a tensor nor a number (a str, None, a
    list of strs) torch answers False/True instead of raising."""
    def compare(self, other):
        if isinstance(other, (str, bytes, type(None))):
            return unequal
        return apply(op, self, other)
    return compare


OPERATORS = {
    "__add__": _forward(E.ADD), "__radd__": _commute(E.ADD), "__iadd__": _inplace(E.ADD),
    "__sub__": _forward(E.SUB), "__rsub__": _reflect(E.SUB), "__isub__": _inplace(E.SUB),
    "__mul__": _forward(E.MUL), "__rmul__": _commute(E.MUL), "__imul__": _inplace(E.MUL),
    "__truediv__": _forward(E.DIV), "__rtruediv__": _rtruediv, "__itruediv__": _inplace(E.DIV),
    "__floordiv__": _forward(E.DIV, rounding_mode="floor"),
    "__rfloordiv__": _reflect(E.DIV, rounding_mode="floor"),
    "__ifloordiv__": _inplace(E.DIV, rounding_mode="floor"),
    "__mod__": _forward(E.REMAINDER), "__rmod__": _reflect(E.REMAINDER), "__imod__": _inplace(E.REMAINDER),
    "__pow__": _forward(E.POW), "__rpow__": _reflect(E.POW),
    "__and__": _forward(E.BITWISE_AND), "__rand__": _reflect(E.BITWISE_AND),
    "__iand__": _inplace(E.BITWISE_AND),
    "__or__": _forward(E.BITWISE_OR), "__ror__": _reflect(E.BITWISE_OR), "__ior__": _inplace(E.BITWISE_OR),
    "__xor__": _forward(E.BITWISE_XOR), "__rxor__": _reflect(E.BITWISE_XOR),
    "__ixor__": _inplace(E.BITWISE_XOR),
    "__eq__": _equality(E.EQ, False), "__ne__": _equality(E.NE, True), "__lt__": _forward(E.LT),
    "__le__": _forward(E.LE), "__gt__": _forward(E.GT), "__ge__": _forward(E.GE),
    "__lshift__": _forward(E.BITWISE_LEFT_SHIFT), "__rlshift__": _reflect(E.BITWISE_LEFT_SHIFT),
    "__ilshift__": _inplace(E.BITWISE_LEFT_SHIFT),
    "__rshift__": _forward(E.BITWISE_RIGHT_SHIFT), "__rrshift__": _reflect(E.BITWISE_RIGHT_SHIFT),
    "__irshift__": _inplace(E.BITWISE_RIGHT_SHIFT),
    "__neg__": lambda self: apply(E.NEG, self), "__pos__": E.positive,
    "__abs__": lambda self: apply(E.ABS, self), "__invert__": lambda self: apply(E.BITWISE_NOT, self),
}
for _name, _fn in OPERATORS.items():
    setattr(Tensor, _name, _fn)


def _records(*values) -> bool:
    """Whether autograd records an op on these values (a composite in-place write clones first)."""
    return is_grad_enabled() and any(isinstance(v, Tensor) and v.requires_grad for v in values)


def _composite_inplace(fn: Callable, name: str) -> Callable:
    """``x.<name>_(...)`` for a function composed of several ops: computed out of place (from a
    copy of ``x`` when autograd records, so what its ops saved is not overwritten) and written
    with ``copy_``, so views, autograd and global tensors behave as for any in-place write.
    torch's checks first: the result keeps ``x``'s shape, and its dtype casts to ``x``'s."""
    def method(self, *args, **kwargs):
        recording = _records(self, *args, *kwargs.values())
        if recording:
            check_inplace_target(self, name)
        out = fn(read_for_write(self) if recording else self, *args, **kwargs)
        if tuple(out.shape) != tuple(self.shape):
            raise RuntimeError(f"holoflow.{name}_: output with shape {list(self.shape)} doesn't match the "
                               f"broadcast shape {list(out.shape)}")
        if not torch.can_cast(out._data.dtype, self._data.dtype):
            raise RuntimeError(f"holoflow.{name}_: result type {out.dtype} can't be cast to the desired "
                               f"output type {self.dtype}")
        if holds_elements_twice(self):   # (overlapping windows: the values torch's kernel leaves)
            try:
                out = written_as_torch(getattr(torch.Tensor, name + "_"), name, self, out, args, kwargs)
            except Exception as e:
                raise e if str(e).startswith("holoflow") else RuntimeError(f"holoflow.{name}_: {e}") from e
        return self.copy_(out)
    method.__name__ = name + "_"
    return method


_clamp_composite = _composite_inplace(E.clamp, "clamp")


def _clamp_(self, min=None, max=None):  # noqa: A002
    """``clamp_``: one op for number bounds; tensor bounds (or none: clamp's error) as composites."""
    if min is None and max is None or isinstance(min, Tensor) or isinstance(max, Tensor):
        return _clamp_composite(self, min, max)
    return apply_inplace(E.CLAMP, self, min=min, max=max)


def _float_power_(self, exponent):
    """``float_power_``: ``self`` must already have the dtype the power computes in, as torch."""
    dt = E._float_power_dtype(self, exponent)
    if self._data.dtype != dt:
        raise RuntimeError(f"holoflow.float_power_: the base has dtype {self.dtype} but the operation's "
                           f"result requires dtype {from_torch(dt)} (as torch); convert the base first")
    return _pow_(self, E._cast(exponent, dt))


def _pow_(self, exponent):
    """``pow_``: by a tensor, the op whose node saves the result (torch's PowBackward1)."""
    return apply_inplace(E.POW_ if isinstance(exponent, Tensor) else E.POW, self, exponent)


def _addcmul_(self, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """``addcmul_``: torch's in-place kernel (the function's checks first)."""
    value = _addc_args("addcmul", (self, tensor1, tensor2), value)
    return apply_inplace(ADDCMUL, self, tensor1, tensor2, value=value)


def _addcdiv_(self, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """``addcdiv_``: torch's in-place kernel (integer division refused first, as torch)."""
    value = _addc_args("addcdiv", (self, tensor1, tensor2), value)
    return apply_inplace(ADDCDIV, self, tensor1, tensor2, value=value)


for _op in E.UNARY + E.BINARY:
    setattr(Tensor, _op.name, E._FUNCS[_op.name])
    if _op.inplace_kernel is not None:
        setattr(Tensor, _op.name + "_", _inplace(_op))
for _name in ("add", "sub", "div", "clamp", "clamp_min", "clamp_max", "nan_to_num", "round", "lerp",
              "logaddexp", "xlogy", "float_power", "where", "floor_divide",
              "logit", "positive"):
    setattr(Tensor, _name, getattr(E, _name))
Tensor.fmax, Tensor.fmin, Tensor.hardshrink = fmax, fmin, hardshrink
Tensor.addcmul, Tensor.addcdiv = addcmul, addcdiv
Tensor.add_ = _inplace(E.ADD)
Tensor.sub_ = _inplace(E.SUB)
Tensor.div_ = _inplace(E.DIV)
Tensor.floor_divide_ = _inplace(E.DIV, rounding_mode="floor")
Tensor.round_ = _inplace(E.ROUND)
Tensor.clamp_ = _clamp_
Tensor.clamp_min_ = lambda self, min: _clamp_(self, min=min)  # noqa: A002
Tensor.clamp_max_ = lambda self, max: _clamp_(self, max=max)  # noqa: A002
Tensor.zero_ = lambda self: apply_inplace(FILL_, self, value=0)   # (not a multiply by 0: NaN and inf become 0)
Tensor.nan_to_num_ = _inplace(E.NAN_TO_NUM)
Tensor.logit_ = lambda self, eps=None: apply_inplace(E.LOGIT, self, eps=eps)
Tensor.float_power_ = _float_power_
Tensor.pow_ = Tensor.__ipow__ = _pow_
Tensor.addcmul_, Tensor.addcdiv_ = _addcmul_, _addcdiv_
for _name in ("lerp", "xlogy"):
    setattr(Tensor, _name + "_", _composite_inplace(getattr(E, _name), _name))
for _alias, _name in E._ALIASES.items():   # torch's second names, in place too where torch has them
    setattr(Tensor, _alias, getattr(Tensor, _name))
    if hasattr(torch.Tensor, _alias + "_"):
        setattr(Tensor, _alias + "_", getattr(Tensor, _name + "_"))
Tensor.where = lambda self, condition, other: E.where(condition, self, other)
Tensor.equal = E.equal
