"""Python operators and the elementwise methods of Tensor (other op modules bind their own)."""
from __future__ import annotations

import torch

from ..core.dispatch import apply, apply_inplace
from ..core.tensor import Tensor
from . import elementwise as E


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
    return lambda self, other: apply(op, self, other)


def _rtruediv(self, other):
    """``other / self`` as torch's ``Tensor.__rtruediv__``: ``self.reciprocal() * other``."""
    return apply(E.MUL, apply(E.RECIPROCAL, self), other)


def _forward(op, **attrs):
    return lambda self, other: apply(op, self, other, **attrs)


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
    "__pow__": _forward(E.POW), "__rpow__": _reflect(E.POW), "__ipow__": _inplace(E.POW),
    "__and__": _forward(E.BITWISE_AND), "__rand__": _reflect(E.BITWISE_AND),
    "__iand__": _inplace(E.BITWISE_AND),
    "__or__": _forward(E.BITWISE_OR), "__ror__": _reflect(E.BITWISE_OR), "__ior__": _inplace(E.BITWISE_OR),
    "__xor__": _forward(E.BITWISE_XOR), "__rxor__": _reflect(E.BITWISE_XOR),
    "__ixor__": _inplace(E.BITWISE_XOR),
    "__eq__": _equality(E.EQ, False), "__ne__": _equality(E.NE, True), "__lt__": _forward(E.LT),
    "__le__": _forward(E.LE), "__gt__": _forward(E.GT), "__ge__": _forward(E.GE),
    "__neg__": lambda self: apply(E.NEG, self), "__pos__": lambda self: self,
    "__abs__": lambda self: apply(E.ABS, self), "__invert__": lambda self: apply(E.BITWISE_NOT, self),
}
for _name, _fn in OPERATORS.items():
    setattr(Tensor, _name, _fn)

for _op in E.UNARY + E.BINARY:
    setattr(Tensor, _op.name, E._FUNCS[_op.name])
    if _op.inplace_kernel is not None:
        setattr(Tensor, _op.name + "_", _inplace(_op))
for _name in ("add", "sub", "div", "clamp", "clamp_min", "clamp_max", "clip", "nan_to_num", "round",
              "lerp", "addcmul", "addcdiv", "logaddexp", "xlogy", "float_power", "where",
              "negative", "absolute", "multiply", "subtract", "divide", "true_divide",
              "floor_divide", "greater", "less", "equal", "greater_equal", "less_equal",
              "not_equal", "arctan2"):
    setattr(Tensor, _name, getattr(E, _name))
Tensor.add_ = _inplace(E.ADD)
Tensor.sub_ = _inplace(E.SUB)
Tensor.div_ = _inplace(E.DIV)
Tensor.round_ = _inplace(E.ROUND)
Tensor.clamp_ = lambda self, min=None, max=None: apply_inplace(E.CLAMP, self, min=min, max=max)  # noqa: A002
Tensor.clip_ = Tensor.clamp_
Tensor.zero_ = lambda self: apply_inplace(E.MUL, self, 0)
Tensor.nan_to_num_ = _inplace(E.NAN_TO_NUM)
Tensor.where = lambda self, condition, other: E.where(condition, self, other)
