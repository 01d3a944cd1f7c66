"""Elementwise ops: one line each; shape (broadcasting), SBP and in-place forms come from the
family (ops/family.py). Grad rules are written in holoflow ops."""
from __future__ import annotations

import cmath
import math

import torch

from ..core.dispatch import apply
from ..core.errors import ArgValueError, UnsupportedError
from ..core.registry import REGISTRY
from ..core.tensor import Tensor
from .family import (binary, holomorphic, needs, reads_other, reads_quotient, reduce_grad, refuse_complex_grad,
                     unary)


def _zeros(ctx, dy):
    return (apply(ZEROS_LIKE, dy),)


def _x(ctx):
    return ctx.inputs[0]


# -- unary math: name, kernel, grad (dy -> dx), what the grad reads --------------------------
ZEROS_LIKE = unary("zeros_like", torch.zeros_like, differentiable=False)
NEG = unary("neg", torch.neg, lambda c, dy: (-dy,), partial=("P",))
CONJ = unary("conj", torch.conj_physical, lambda c, dy: (apply(CONJ, dy),), partial=("P",))


def _conj(x):
    """``x``'s complex conjugate; real tensors are their own (no op recorded); a Python complex
    number (a scalar operand) is conjugated too."""
    if isinstance(x, complex):
        return x.conjugate()
    return apply(CONJ, x) if isinstance(x, Tensor) and x._data.is_complex() else x


def _abs_grad(c, dy):
    x = _x(c)
    if not x.is_complex():
        return (dy * x.sign(),)
    a = x.abs()  # complex: dy * sgn(x) = dy * x / |x| (0 at 0), as torch
    return (dy * (x / where(a == 0, 1.0, a)),)


def _logit_grad(c, dy):
    """torch's ``dy / (x (1 - x))``: NaN outside [0, 1] without eps (or a negative one), 0 outside
    [eps, 1 - eps] with it (the clamped region)."""
    x = _x(c)
    g = dy / (x * (1 - x))
    if c.eps is None or c.eps < 0:
        return (where((x < 0) | (x > 1), math.nan, g),)
    return (where((x < c.eps) | (x > 1 - c.eps), 0.0, g),)


def _sgn_grad(c, dy):
    """0 for real tensors (as sign); for complex ones torch's ``sgn_backward``,
    ``(dy - s^2 conj(dy)) / (2 |x|)`` with ``s = sgn(x)``, 0 where ``x`` is 0 (selected)."""
    x = _x(c)
    if not x.is_complex():
        return _zeros(c, dy)
    a = x.abs()
    s = c.out
    return (where(a == 0, 0.0, (dy - (s * s) * apply(CONJ, dy)) / (2.0 * a)),)


ABS = unary("abs", torch.abs, _abs_grad, "inputs")
SIGN = unary("sign", torch.sign, _zeros)
FLOOR = unary("floor", torch.floor, _zeros)
CEIL = unary("ceil", torch.ceil, _zeros)
TRUNC = unary("trunc", torch.trunc, _zeros)
FRAC = unary("frac", torch.frac, lambda c, dy: (dy,))
# (torch's integer round is a copy; its kernel with ``decimals`` has no integer version)
ROUND = unary("round", lambda x, decimals=0: torch.round(x) if decimals == 0 else torch.round(x, decimals=decimals),
              _zeros)
EXP = unary("exp", torch.exp, lambda c, dy: (dy * c.out,), "output")
EXP2 = unary("exp2", torch.exp2, lambda c, dy: (dy * c.out * math.log(2.0),), "output")
EXPM1 = unary("expm1", torch.expm1, lambda c, dy: (dy * (c.out + 1),), "output")
LOG = unary("log", torch.log, lambda c, dy: (dy / _x(c),), "inputs")
LOG2 = unary("log2", torch.log2, lambda c, dy: (dy / (_x(c) * math.log(2.0)),), "inputs")
LOG10 = unary("log10", torch.log10, lambda c, dy: (dy / (_x(c) * math.log(10.0)),), "inputs")
LOG1P = unary("log1p", torch.log1p, lambda c, dy: (dy / (_x(c) + 1),), "inputs")
SQRT = unary("sqrt", torch.sqrt, lambda c, dy: (dy / (2 * _conj(c.out)),), "output")   # torch's order
RSQRT = unary("rsqrt", torch.rsqrt, lambda c, dy: (dy * -0.5 * c.out ** 3,), "output")
SQUARE = unary("square", torch.square, lambda c, dy: (_pow_scalar_grad(dy, _x(c), 2),), "inputs")  # pow(x, 2)
RECIPROCAL = unary("reciprocal", torch.reciprocal, lambda c, dy: (-dy * _conj(c.out * c.out),), "output")
SIN = unary("sin", torch.sin, lambda c, dy: (dy * _x(c).cos(),), "inputs")
COS = unary("cos", torch.cos, lambda c, dy: (-dy * _x(c).sin(),), "inputs")
TAN = unary("tan", torch.tan, lambda c, dy: (dy * (1 + c.out * c.out),), "output")
ASIN = unary("asin", torch.asin, lambda c, dy: (dy * (1 - _x(c) ** 2).rsqrt(),), "inputs")
ACOS = unary("acos", torch.acos, lambda c, dy: (-dy * (1 - _x(c) ** 2).rsqrt(),), "inputs")
ATAN = unary("atan", torch.atan, lambda c, dy: (dy / (1 + _x(c) ** 2),), "inputs")
SINH = unary("sinh", torch.sinh, lambda c, dy: (dy * _x(c).cosh(),), "inputs")
COSH = unary("cosh", torch.cosh, lambda c, dy: (dy * _x(c).sinh(),), "inputs")
def _tanh_bwd_grad(c, ddx):
    """``tanh_backward(dy, y) = dy * conj(1 - y^2)``, torch's formulas: in dy
    ``tanh_backward(ddx, conj(y))``, in y ``conj(ddx) * conj(-2 conj(y) dy)``."""
    dy, y = c.inputs
    return (apply(TANH_BWD, ddx, _conj(y)) if needs(c, 0) else None,
            _conj(ddx) * _conj(-2 * _conj(y) * dy) if needs(c, 1) else None)


def _sigmoid_bwd_grad(c, ddx):
    """``sigmoid_backward(dy, y) = dy * conj((1 - y) y)``, torch's formulas: in dy
    ``sigmoid_backward(ddx, conj(y))``, in y ``conj(ddx) * dy * (1 - 2 conj(y))``."""
    dy, y = c.inputs
    return (apply(SIGMOID_BWD, ddx, _conj(y)) if needs(c, 0) else None,
            _conj(ddx) * dy * (-2 * _conj(y) + 1) if needs(c, 1) else None)


# aten's backward kernels, as torch's autograd calls them (bit for bit its gradients)
TANH_BWD = binary("tanh_backward", torch.ops.aten.tanh_backward.default, _tanh_bwd_grad, "inputs", partial=("PB",))
SIGMOID_BWD = binary("sigmoid_backward", torch.ops.aten.sigmoid_backward.default, _sigmoid_bwd_grad, "inputs",
                     partial=("PB",))
TANH = unary("tanh", torch.tanh, lambda c, dy: (apply(TANH_BWD, dy, c.out),), "output")
SIGMOID = unary("sigmoid", torch.sigmoid, lambda c, dy: (apply(SIGMOID_BWD, dy, c.out),), "output")
# (torch's formulas in torch's order: the constant times the exponential, then the gradient)
ERF = unary("erf", torch.erf,
            lambda c, dy: ((2.0 / math.sqrt(math.pi)) * (-(_x(c) * _x(c))).exp() * dy,), "inputs")
# (erfinv's of the input, as torch's formula: written in place into overlapping windows, the
# windows' values before the write, not those the kernel leaves)
ERFINV = unary("erfinv", torch.erfinv,
               lambda c, dy: ((0.5 * math.sqrt(math.pi)) * _x(c).erfinv().pow(2).exp() * dy,), "inputs")
ERFC = unary("erfc", torch.erfc,
             lambda c, dy: ((-2.0 / math.sqrt(math.pi)) * (-(_x(c) * _x(c))).exp() * dy,), "inputs")
def _acosh_grad(c, dy):
    """torch's two formulas: ``(x^2 - 1)^-1/2`` for real x (defined below -1 too), and ``(z + 1)^-1/2
    (z - 1)^-1/2`` for complex z (the branches differ from ``(z^2 - 1)^-1/2``)."""
    x = _x(c)
    return (dy * ((x + 1).rsqrt() * (x - 1).rsqrt() if x._data.is_complex() else (x * x - 1).rsqrt()),)


ACOSH = unary("acosh", torch.acosh, _acosh_grad, "inputs")
ASINH = unary("asinh", torch.asinh, lambda c, dy: (dy * (_x(c) ** 2 + 1).rsqrt(),), "inputs")
ATANH = unary("atanh", torch.atanh, lambda c, dy: (dy * 1 / _conj(1 - _x(c) ** 2),), "inputs")  # torch's order
DEG2RAD = unary("deg2rad", torch.deg2rad, lambda c, dy: (dy * (math.pi / 180),), partial=("P",))
RAD2DEG = unary("rad2deg", torch.rad2deg, lambda c, dy: (dy * (180 / math.pi),), partial=("P",))
LOGIT = unary("logit", lambda x, eps=None: torch.logit(x, eps), _logit_grad, "inputs")
SGN = unary("sgn", torch.sgn, _sgn_grad, "both")
SIGNBIT = unary("signbit", torch.signbit)
ISNEGINF = unary("isneginf", torch.isneginf)
ISPOSINF = unary("isposinf", torch.isposinf)
ISREAL = unary("isreal", torch.isreal)
LOGICAL_NOT = unary("logical_not", torch.logical_not)
BITWISE_NOT = unary("bitwise_not", torch.bitwise_not)
ISNAN = unary("isnan", torch.isnan)
ISINF = unary("isinf", torch.isinf)
ISFINITE = unary("isfinite", torch.isfinite)
NAN_TO_NUM = unary("nan_to_num", torch.nan_to_num,
                   lambda c, dy: (dy * _x(c).isfinite(),), "inputs")
CLAMP = unary("clamp", lambda x, min=None, max=None: torch.clamp(x, min, max),  # noqa: A002
              lambda c, dy: (where(_clamp_mask(_x(c), c.min, c.max), dy, 0.0),), "inputs")   # (inf * 0 is NaN)


# complex inputs: these rules are written as dy * f'(z); torch wants dy * conj(f'(z))
# (sqrt, square, reciprocal, sigmoid and atanh conjugate as torch's formulas do: where the conjugate
# sits decides which parts of an infinite product are NaN)
for _op in (EXP, EXP2, EXPM1, LOG, LOG2, LOG10, LOG1P, RSQRT, SIN, COS, TAN, ASIN,
            ACOS, ATAN, SINH, COSH, ACOSH, ASINH):
    holomorphic(_op)


def _clamp_mask(x, lo, hi):
    mask = None
    if lo is not None:
        mask = x >= lo
    if hi is not None:
        mask = (x <= hi) if mask is None else mask.logical_and(x <= hi)
    return mask


# -- binary math -------------------------------------------------------------------------------

def _add_grad(c, dy):   # (torch's: ``other``'s is ``dy * conj(alpha)``)
    return (reduce_grad(dy, c, 0) if needs(c, 0) else None,
            reduce_grad(dy if c.alpha == 1 else dy * c.alpha.conjugate(), c, 1) if needs(c, 1) else None)


def _sub_grad(c, dy):
    return (reduce_grad(dy, c, 0) if needs(c, 0) else None,
            reduce_grad(-dy if c.alpha == 1 else dy * -c.alpha.conjugate(), c, 1) if needs(c, 1) else None)


def _mul_grad(c, dy):   # complex: torch's convention, the gradient w.r.t. a is dy * conj(b)
    a, b = c.inputs
    return (reduce_grad(dy * _conj(b), c, 0) if needs(c, 0) else None,
            reduce_grad(dy * _conj(a), c, 1) if needs(c, 1) else None)


def _div_grad(c, dy):
    a, b = c.inputs
    if c.rounding_mode is not None:   # (zeros, as torch's: not dy * 0, NaN where dy is infinite)
        return (reduce_grad(apply(ZEROS_LIKE, dy), c, 0) if needs(c, 0) else None,
                reduce_grad(apply(ZEROS_LIKE, dy), c, 1) if needs(c, 1) else None)
    return (reduce_grad(dy / _conj(b), c, 0) if needs(c, 0) else None,     # torch's order
            reduce_grad(-dy * _conj((a / b) / b), c, 1) if needs(c, 1) else None)


def _pow_scalar_grad(dy, a, b):
    """torch's ``pow_backward`` for a number exponent: ``dy * conj(b a^(b-1))``, zeros at ``b = 0``."""
    if b == 0:
        return apply(ZEROS_LIKE, a)
    return dy * _conj(b * a ** (b - 1))


def _pow_grad(c, dy):
    """torch's ``pow_backward_self`` / ``pow_backward_exponent``: the base's gradient is
    ``dy * conj(b a^(b-1))``, 0 where the exponent is 0 (selected: 0 ** -1 is inf); the exponent's
    is ``dy * conj(result log a)`` (the log in the dtype the operands promote to; the result
    recomputed, or, written in place, as saved: the target's dtype and the kernel's values), 0
    where the base is 0 and the exponent is real and >= 0 (``0 * log 0``)."""
    a, b = c.inputs
    ga = gb = None
    if needs(c, 0):
        if isinstance(b, Tensor):
            ga = where(b == 0, 0.0, dy * _conj(b * a ** (b - 1)))
        else:
            ga = _pow_scalar_grad(dy, a, b)
        ga = reduce_grad(ga, c, 0)
    if needs(c, 1):
        out = c.out if c.op.saves_output else a ** b
        if b._data.is_complex():
            nonneg = (b.imag == 0) & (b.real >= 0)
        else:
            nonneg = b >= 0
        if isinstance(a, Tensor):   # (the log in the dtype the operands promote to)
            dt = torch.result_type(a._data, b._data)
            a = a if a._data.dtype == dt else a.to(dt)
            gb = dy * where((a == 0) & nonneg, 0.0, _conj(out * a.log()))
        else:
            if a == 0:   # (c10's Scalar log: -inf, complex -inf + 0j)
                log_a = complex(-math.inf, 0.0) if out._data.is_complex() else -math.inf
            elif out._data.is_complex():
                log_a = cmath.log(a)
            else:
                log_a = math.log(a) if a > 0 else math.nan
            if a == 0:
                gb = dy * where(nonneg, 0.0, _conj(out * log_a))
            else:
                gb = dy * _conj(out * log_a)
        gb = reduce_grad(gb, c, 1)
    return ga, gb


def _minmax_grad(pick):
    """torch's rule: a tie splits the gradient in halves, the loser gets zeros (selected, never
    multiplied: an infinite gradient stays out of the loser), and a NaN operand, which neither
    wins nor loses, passes the whole gradient to both."""
    def grad(c, dy):
        a, b = c.inputs
        share = where(a == b, dy / 2, dy)
        return (reduce_grad(where(pick(b, a), 0.0, share), c, 0) if needs(c, 0) else None,
                reduce_grad(where(pick(a, b), 0.0, share), c, 1) if needs(c, 1) else None)
    return grad


def _atan2_grad(c, dy):
    """torch's ``atan2_backward``, in its order (``dy * b * recip``: each product rounded, as in
    half precision), the reciprocal 0 where ``a^2 + b^2`` is (at the origin, or underflowing)."""
    a, b = c.inputs
    den = a * a + b * b
    recip = where(den == 0, 0.0, den.reciprocal())
    return (reduce_grad(dy * b * recip, c, 0) if needs(c, 0) else None,
            reduce_grad(dy * -a * recip, c, 1) if needs(c, 1) else None)


def _logaddexp2_grad(c, dy):
    a, b = c.inputs
    return (reduce_grad(dy / (1 + (b - a).exp2()), c, 0) if needs(c, 0) else None,
            reduce_grad(dy / (1 + (a - b).exp2()), c, 1) if needs(c, 1) else None)


def _logaddexp_grad(c, dy):
    a, b = c.inputs
    return (reduce_grad(dy / (1 + (b - a).exp()), c, 0) if needs(c, 0) else None,
            reduce_grad(dy / (1 + (a - b).exp()), c, 1) if needs(c, 1) else None)


def _igamma_grad(name: str, sign: int):
    """d/dx of the regularized incomplete gamma: ``sign * x^(a-1) e^(-x) / Gamma(a)``; torch has
    no derivative in ``a`` (input), so neither does holoflow."""
    def grad(c, dy):
        a, x = c.inputs
        if needs(c, 0):
            raise UnsupportedError(f"holoflow.{name}: the derivative for 'input' is not implemented (nor in "
                                   f"torch); only 'other' can require grad: pass input.detach()")
        lgamma = apply(REGISTRY["lgamma"], a)   # ops/special.py, which imports this module
        d = ((a - 1) * x.log() - x - lgamma).exp()
        return None, reduce_grad(dy * d if sign > 0 else -dy * d, c, 1)
    return grad


def _rem_grad(rounding):
    def grad(c, dy):
        a, b = c.inputs
        return (reduce_grad(dy, c, 0) if needs(c, 0) else None,
                reduce_grad(-dy * apply(DIV, a, b, rounding_mode=rounding), c, 1) if needs(c, 1) else None)
    return grad


def _add(a, b, alpha=1):   # (alpha=True: torch's check, which refuses it for a non-bool result)
    return a + b if alpha == 1 and alpha is not True else torch.add(a, b, alpha=alpha)


def _sub(a, b, alpha=1):
    return a - b if alpha == 1 and alpha is not True else torch.sub(a, b, alpha=alpha)


ADD = binary("add", _add, _add_grad, partial=("PP",), axpy=True,
             commutative=lambda attrs: attrs.get("alpha", 1) == 1)
SUB = binary("sub", _sub, _sub_grad, partial=("PP",))
MUL = binary("mul", torch.mul, _mul_grad, "inputs", partial=("PB", "BP", "P-", "-P"), saved_inputs=reads_other,
             commutative=True)
DIV = binary("div", lambda a, b, rounding_mode=None: torch.div(a, b, rounding_mode=rounding_mode),
             _div_grad, "inputs", partial=lambda attrs: ("PB", "P-") if attrs.get("rounding_mode") is None else (),
             saved_inputs=reads_quotient)
POW = binary("pow", torch.pow, _pow_grad, "inputs")
# ``x.pow_(t)`` by a tensor: torch's node saves the result, which the exponent's gradient reads
# (written into overlapping windows, the values the kernel leaves; into a complex64 target by a
# float64 exponent, complex64's); by a number (``x ** 2``, ``x **= 2``) it saves none, so POW
POW_ = binary("pow_", torch.pow, _pow_grad, "both", inplace_kernel=torch.Tensor.pow_)
MAXIMUM = binary("maximum", torch.maximum, _minmax_grad(lambda a, b: a > b), "inputs", tensors_only=True,
                 commutative=True)
MINIMUM = binary("minimum", torch.minimum, _minmax_grad(lambda a, b: a < b), "inputs", tensors_only=True,
                 commutative=True)
ATAN2 = binary("atan2", torch.atan2, _atan2_grad, "inputs", tensors_only=True)
def _rem_saves(needs: tuple) -> tuple[int, ...]:
    """``saved_inputs`` of fmod/remainder: only the divisor's gradient reads inputs (both), as
    torch's, so an in-place change of an operand after is legal when the divisor needs none."""
    return (0, 1) if needs[1] else ()


FMOD = binary("fmod", torch.fmod, _rem_grad("trunc"), "inputs", saved_inputs=_rem_saves)
REMAINDER = binary("remainder", torch.remainder, _rem_grad("floor"), "inputs", saved_inputs=_rem_saves)
EQ = binary("eq", torch.eq, inplace_zero_grad=True)
NE = binary("ne", torch.ne, inplace_zero_grad=True)
LT = binary("lt", torch.lt, inplace_zero_grad=True)
LE = binary("le", torch.le, inplace_zero_grad=True)
GT = binary("gt", torch.gt, inplace_zero_grad=True)
GE = binary("ge", torch.ge, inplace_zero_grad=True)
LOGICAL_AND = binary("logical_and", torch.logical_and)
LOGICAL_OR = binary("logical_or", torch.logical_or)
LOGICAL_XOR = binary("logical_xor", torch.logical_xor)
BITWISE_AND = binary("bitwise_and", torch.bitwise_and)
BITWISE_OR = binary("bitwise_or", torch.bitwise_or)
BITWISE_XOR = binary("bitwise_xor", torch.bitwise_xor)
BITWISE_LEFT_SHIFT = binary("bitwise_left_shift", torch.bitwise_left_shift)
BITWISE_RIGHT_SHIFT = binary("bitwise_right_shift", torch.bitwise_right_shift)
LCM = binary("lcm", torch.lcm, tensors_only=True)
LOGADDEXP = holomorphic(binary("logaddexp", torch.logaddexp, _logaddexp_grad, "inputs", tensors_only=True))
LOGADDEXP2 = binary("logaddexp2", torch.logaddexp2, _logaddexp2_grad, "inputs", tensors_only=True)
IGAMMA = binary("igamma", torch.igamma, _igamma_grad("igamma", 1), "inputs", tensors_only=True)
IGAMMAC = binary("igammac", torch.igammac, _igamma_grad("igammac", -1), "inputs", tensors_only=True)


def _where_grad(c, dy):
    cond = c.inputs[0]
    zero = apply(ZEROS_LIKE, dy)
    return (None,
            reduce_grad(where(cond, dy, zero), c, 1) if needs(c, 1) else None,
            reduce_grad(where(cond, zero, dy), c, 2) if needs(c, 2) else None)


def _where_kernel(cond, a, b):
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        a = torch.tensor(a, device=cond.device)
    return torch.where(cond, a, b)


from .family import defop, elementwise_shape, elementwise_sbp  # noqa: E402

WHERE = defop("where", _where_kernel, grad=_where_grad, save="inputs", saved_inputs=(0,), family="elementwise",
              shape=elementwise_shape("where", _where_kernel), sbp=elementwise_sbp(("BPP",)))


def _clamp_t_grad(c, dy):
    """torch's rule for tensor bounds: ``x`` gets ``dy`` inside ``[min, max]``; a bound gets it
    where it clamped (``max`` also wherever it is below ``min``, as it wins there); a NaN ``x``
    sends nothing anywhere. Selected, never multiplied by a mask (inf * 0 is NaN)."""
    x, lo, hi = c.inputs
    keep = _clamp_mask(x, lo, hi)
    below = None if lo is None else (x < lo) if hi is None else (x < lo) & (lo < hi)
    above = None if hi is None else (x > hi) if lo is None else (x > hi) | (hi < lo)
    return (reduce_grad(where(keep, dy, 0.0), c, 0) if needs(c, 0) else None,
            reduce_grad(where(below, dy, 0.0), c, 1) if needs(c, 1) else None,
            reduce_grad(where(above, dy, 0.0), c, 2) if needs(c, 2) else None)


def _xlogy_grad(c, dy):
    """torch's rule: ``d/dx = xlogy(dy, y)``, zero where ``x == 0`` and ``y <= 0`` (the value is 0
    there for any y); ``d/dy = dy * x / y``."""
    x, y = c.inputs   # (x needing a gradient is a tensor)
    return (reduce_grad(where((x == 0) & (y <= 0), 0.0, apply(XLOGY, dy, y)), c, 0) if needs(c, 0) else None,
            reduce_grad(dy * x / y, c, 1) if needs(c, 1) else None)


XLOGY = defop("xlogy", torch.xlogy, grad=_xlogy_grad, save="inputs", family="elementwise",
              shape=elementwise_shape("xlogy", torch.xlogy), sbp=elementwise_sbp())
def _xlog1py_grad(c, dy):
    """torch's rule: ``d/dx = xlog1py(dy, y)``, zero where ``x == 0`` and ``y <= -1``; ``d/dy = dy x / (y + 1)``."""
    x, y = c.inputs   # (x needing a gradient is a tensor)
    return (reduce_grad(where((x == 0) & (y <= -1), 0.0, apply(XLOG1PY, dy, y)), c, 0) if needs(c, 0) else None,
            reduce_grad(dy * x / (y + 1), c, 1) if needs(c, 1) else None)


XLOG1PY = defop("special_xlog1py", torch.special.xlog1py, grad=_xlog1py_grad, save="inputs", family="elementwise",
                shape=elementwise_shape("xlog1py", torch.special.xlog1py), sbp=elementwise_sbp())
CLAMP_T = defop("clamp_tensor", lambda x, lo, hi: torch.clamp(x, lo, hi), grad=_clamp_t_grad, save="inputs",
                family="elementwise", shape=elementwise_shape("clamp", lambda x, lo, hi: torch.clamp(x, lo, hi)),
                sbp=elementwise_sbp())


# -- public functions ----------------------------------------------------------------------------
def _unary_fn(op):
    def fn(input: Tensor) -> Tensor:
        return apply(op, input)
    fn.__name__ = fn.__qualname__ = op.name
    fn.__doc__ = f"Elementwise ``{op.name}``, as ``torch.{op.name}``."
    return fn


#: torch's functions that take a Python number only as ``other`` (mul, pow, remainder and the
#: bitwise ops take one as ``input`` too; add, sub and div have their own functions below)
_TENSOR_INPUT = {"eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum", "atan2", "fmod",
                 "logical_and", "logical_or", "logical_xor"}
#: ... and those that take no Python number at all
_TENSORS_ONLY = {"lcm", "logaddexp", "logaddexp2", "igamma", "igammac"}


def _expect_tensor(name: str, value, arg: str, position: int, hint: str = "") -> None:
    """torch's TypeError for a number where its signature wants a Tensor."""
    if not isinstance(value, Tensor):
        raise TypeError(f"holoflow.{name}(): argument '{arg}' (position {position}) must be Tensor, not "
                        f"{type(value).__name__}{hint}")


def _binary_fn(op):
    if op.name in _TENSOR_INPUT:
        hint = f" (a number goes second: holoflow.{op.name}(tensor, number))"

        def fn(input, other) -> Tensor:
            _expect_tensor(op.name, input, "input", 1, hint)
            return apply(op, input, other)
    elif op.name in _TENSORS_ONLY:
        def fn(input, other) -> Tensor:
            _expect_tensor(op.name, input, "input", 1)
            _expect_tensor(op.name, other, "other", 2)
            return apply(op, input, other)
    else:
        def fn(input, other) -> Tensor:
            return apply(op, input, other)
    fn.__name__ = fn.__qualname__ = op.name
    fn.__doc__ = f"Elementwise ``{op.name}`` with broadcasting, as ``torch.{op.name}``."
    return fn


UNARY = [NEG, CONJ, ABS, SIGN, FLOOR, CEIL, TRUNC, FRAC, EXP, EXP2, EXPM1, LOG, LOG2, LOG10, LOG1P,
         SQRT, RSQRT, SQUARE, RECIPROCAL, SIN, COS, TAN, ASIN, ACOS, ATAN, SINH, COSH, TANH,
         SIGMOID, ERF, ERFINV, LOGICAL_NOT, BITWISE_NOT, ISNAN, ISINF, ISFINITE,
         ERFC, ACOSH, ASINH, ATANH, DEG2RAD, RAD2DEG, SGN, SIGNBIT, ISNEGINF, ISPOSINF, ISREAL]
BINARY = [MUL, POW, MAXIMUM, MINIMUM, ATAN2, FMOD, REMAINDER, EQ, NE, LT, LE, GT, GE,
          LOGICAL_AND, LOGICAL_OR, LOGICAL_XOR, BITWISE_AND, BITWISE_OR, BITWISE_XOR,
          BITWISE_LEFT_SHIFT, BITWISE_RIGHT_SHIFT, LCM, LOGADDEXP, LOGADDEXP2, IGAMMA, IGAMMAC]
_FUNCS = {op.name: _unary_fn(op) for op in UNARY} | {op.name: _binary_fn(op) for op in BINARY}
globals().update(_FUNCS)


def add(input, other, *, alpha=1) -> Tensor:
    """``input + alpha * other`` with broadcasting."""
    return apply(ADD, input, other) if alpha == 1 and alpha is not True else apply(ADD, input, other, alpha=alpha)


def sub(input, other, *, alpha=1) -> Tensor:
    """``input - alpha * other`` with broadcasting."""
    return apply(SUB, input, other) if alpha == 1 and alpha is not True else apply(SUB, input, other, alpha=alpha)


def rsub(input, other, *, alpha=1) -> Tensor:
    """``other - alpha * input`` (torch.rsub)."""
    return sub(other, input, alpha=alpha)


def div(input, other, *, rounding_mode: str | None = None) -> Tensor:
    """True division (or ``"trunc"``/``"floor"`` rounding), with broadcasting."""
    return apply(DIV, input, other, rounding_mode=rounding_mode)


def floor_divide(input, other) -> Tensor:
    return apply(DIV, input, other, rounding_mode="floor")


def round(input: Tensor, *, decimals: int = 0) -> Tensor:  # noqa: A001 - torch's name
    return apply(ROUND, input, decimals=decimals)


def nan_to_num(input: Tensor, nan: float = 0.0, posinf=None, neginf=None) -> Tensor:
    refuse_complex_grad("nan_to_num", input)
    return apply(NAN_TO_NUM, input, nan=nan, posinf=posinf, neginf=neginf)


def clamp(input: Tensor, min=None, max=None) -> Tensor:  # noqa: A002
    """Clamps into ``[min, max]``; ``min``/``max`` may be numbers or tensors."""
    if min is None and max is None:   # torch: RuntimeError (a ValueError too, as holoflow raised before)
        raise ArgValueError("holoflow.clamp: at least one of min and max must be given")
    for bound, other in ((min, max), (max, min)):   # (torch's parser: such a bound becomes a number)
        if isinstance(bound, Tensor) and bound.requires_grad and other is not None and not isinstance(other, Tensor):
            raise TypeError(f"holoflow.clamp(): a tensor bound beside a number is taken as a number, as torch's "
                            f"(0-d, not requiring grad); got one of shape {tuple(bound.shape)} requiring grad: "
                            f"pass both bounds as tensors, or detach() it")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        # (a number beside a tensor bound goes to torch as a number: it promotes as one, so
        # clamp(uint8, 0.5, t) is float32 there, not 0.5 cast to uint8)
        return apply(CLAMP_T, input, min, max)
    return apply(CLAMP, input, min=min, max=max)


def clamp_min(input: Tensor, min) -> Tensor:  # noqa: A002
    return clamp(input, min=min)


def clamp_max(input: Tensor, max) -> Tensor:  # noqa: A002
    return clamp(input, max=max)


def where(condition: Tensor, input=None, other=None):
    """``input`` where ``condition`` else ``other``; ``where(cond)`` is ``nonzero(as_tuple=True)``."""
    if input is None and other is None:
        return condition.nonzero(as_tuple=True)
    return apply(WHERE, condition, input, other)


def _lerp_grad(c, dy):
    a, b, w = c.inputs
    return (reduce_grad(dy * _conj(1 - w), c, 0) if needs(c, 0) else None,
            reduce_grad(dy * _conj(w), c, 1) if needs(c, 1) else None,
            reduce_grad(dy * _conj(b - a), c, 2) if needs(c, 2) else None)


# torch's kernel, not ``input + weight * (end - input)``: it computes ``end - (end - input) * (1 -
# weight)`` where ``|weight| >= 0.5``, so the composite differed in the last bit for half the values
# (and optimizers' lerp-based updates with them). Linear in (input, end) jointly for a fixed weight
LERP = defop("lerp", torch.lerp, grad=_lerp_grad, save="inputs", family="elementwise",
             shape=elementwise_shape("lerp", torch.lerp), sbp=elementwise_sbp(("PPB", "PP-")),
             # (as torch's: the weight for input's and end's gradients, input and end for the weight's)
             saved_inputs=lambda needs: ((2,) if needs[0] or needs[1] else ()) + ((0, 1) if needs[2] else ()))


def lerp(input: Tensor, end: Tensor, weight) -> Tensor:
    """``input + weight * (end - input)``, as ``torch.lerp`` (its kernel, so its rounding, and its
    dtype rules: integer tensors with a 0-d floating weight promote, other integer cases are
    refused by the kernel, NotImplementedError)."""
    return apply(LERP, input, end, weight)


def _float_power_dtype(input, exponent) -> torch.dtype:
    """The dtype ``float_power`` computes in: float64, or complex128 if an operand is complex."""
    cplx = any(v.is_complex() if isinstance(v, Tensor) else isinstance(v, complex) for v in (input, exponent))
    return torch.complex128 if cplx else torch.float64


def _cast(v, dtype: torch.dtype):
    return v.to(dtype) if isinstance(v, Tensor) else v


def float_power(input, exponent) -> Tensor:
    """``input ** exponent`` in double precision (complex128 for complex operands), as torch."""
    dt = _float_power_dtype(input, exponent)
    return apply(POW, _cast(input, dt), _cast(exponent, dt))


def logit(input: Tensor, eps: float | None = None) -> Tensor:
    """``log(x / (1 - x))``, with ``x`` clamped to ``[eps, 1 - eps]`` when ``eps`` is given."""
    return apply(LOGIT, input, eps=eps)


def positive(input: Tensor) -> Tensor:
    """``input`` itself (``+x``); refused for bool tensors, as torch."""
    _expect_tensor("positive", input, "input", 1)
    if input._data.dtype == torch.bool:
        raise RuntimeError("holoflow.positive: the `+` operator on a bool tensor is not supported (as in "
                           "torch); use logical ops, or convert it first")
    return input


def xlogy(input, other) -> Tensor:
    """``input * log(other)``; 0 where ``input`` is 0 unless ``other`` is NaN (as torch). Either
    argument may be a Python number."""
    if not isinstance(other, Tensor):
        if not isinstance(input, Tensor):
            raise TypeError(f"holoflow.xlogy: expected a tensor argument, got {type(input).__name__} and "
                            f"{type(other).__name__}")
        dt = torch.result_type(input._data, other)   # (in the floating dtype computed in: -1 isn't uint8's 255)
        other = input.new_full((), other, dtype=dt if dt.is_floating_point or dt.is_complex else
                               torch.get_default_dtype())
    # torch's result dtype: the operands' promoted one, made floating (int and half: half)
    dt = torch.result_type(input._data if isinstance(input, Tensor) else input, other._data)
    if not (dt.is_floating_point or dt.is_complex):
        dt = torch.get_default_dtype()
    other = other if other._data.dtype == dt else other.to(dt)
    if isinstance(input, Tensor) and input._data.dtype != dt:
        input = input.to(dt)
    return apply(XLOGY, input, other)


#: torch's second names: the same function (its method and in-place form follow, ops/methods.py)
_ALIASES = {"negative": "neg", "absolute": "abs", "multiply": "mul", "greater": "gt", "less": "lt",
           "greater_equal": "ge", "less_equal": "le", "not_equal": "ne", "arctan2": "atan2",
           "subtract": "sub", "divide": "div", "true_divide": "div", "clip": "clamp", "fix": "trunc",
           "arccos": "acos", "arcsin": "asin", "arctan": "atan", "arccosh": "acosh", "arcsinh": "asinh",
           "arctanh": "atanh"}
globals().update({alias: globals()[name] for alias, name in _ALIASES.items()})


def equal(input: Tensor, other: Tensor) -> bool:
    """Whether two tensors have the same shape and elements (a Python bool; NaN is unequal to
    itself), as ``torch.equal``: different shapes are False, not an error."""
    for name, x in (("input", input), ("other", other)):
        if not isinstance(x, Tensor):
            raise TypeError(f"holoflow.equal: argument {name!r} must be a Tensor, not {type(x).__name__}")
    if tuple(input.shape) != tuple(other.shape):
        return False
    return bool(apply(EQ, input, other).all())
