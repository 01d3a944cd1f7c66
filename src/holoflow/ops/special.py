"""Special functions: the gamma family (``lgamma``, ``digamma``, ``polygamma``), ``i0``, ``sinc``
and torch.special's own kernels (``entr``, ``erfcx``, ``ndtri``, ``log_ndtr``, ``i0e``, ``i1``,
``i1e``, the Bessel functions, the orthogonal polynomials and the Hurwitz ``zeta``);
``holoflow.special`` exports them under torch's names (``mvlgamma`` is in ops/numeric.py).

The gamma family's gradients are the next member, written as ops (so higher derivatives compose);
the other gradients are torch's formulas written as ops. torch declares the Bessel functions and
the polynomials non-differentiable, and so does holoflow; ``zeta`` differentiates in ``q`` only.
SBP: elementwise.
"""
from __future__ import annotations

import math

import torch

from ..core.dispatch import apply, apply_inplace
from ..core.errors import UnsupportedError
from ..core.tensor import Tensor
from .elementwise import where
from .family import binary, needs, reduce_grad, unary
from .pointwise import _ew, _floating, _method_inplace, _tensor

__all__ = ["lgamma", "digamma", "polygamma", "i0", "sinc"]


# -- elementwise special functions ----------------------------------------------------------------------

# the gamma family's gradients are the next member, written as ops: double backward composes
LGAMMA = unary("lgamma", torch.lgamma, lambda c, dy: (dy * apply(DIGAMMA, c.inputs[0]),), "inputs")
DIGAMMA = unary("digamma", torch.digamma, lambda c, dy: (dy * apply(POLYGAMMA, c.inputs[0], n=1),), "inputs")
POLYGAMMA = unary("polygamma", lambda x, n: torch.polygamma(n, x),
                  lambda c, dy: (dy * apply(POLYGAMMA, c.inputs[0], n=c.n + 1),), "inputs")
I0 = _ew("i0", torch.i0)
def _sinc_grad(c, dy):
    """torch's formula, written with ops so it differentiates again: ``(pi x cos(pi x) - sin(pi x))
    / (pi x^2)``, 0 at x = 0."""
    x = c.inputs[0]
    px = x * math.pi
    pxx = px * x   # (torch's zero test is on pi x^2, which underflows for tiny x: 0 there too)
    d = (px * px.cos() - px.sin()) / pxx
    return (where(pxx == 0, 0.0, dy * (d.conj() if d.is_complex() else d)),)   # (selected: an infinite dy * 0 is NaN)


SINC = unary("sinc", torch.sinc, _sinc_grad, "inputs")
# torch.special's functions with kernels of their own; gradients are torch's formulas
_SQRT_2PI = math.sqrt(2 * math.pi)
ENTR = unary("entr", torch.special.entr, lambda c, dy: (dy * -(1 + c.inputs[0].log()),), "inputs")
ERFCX = unary("erfcx", torch.special.erfcx,
              lambda c, dy: (dy * (2 * c.inputs[0] * c.out - 2 / math.sqrt(math.pi)),), "both")
NDTRI = unary("ndtri", torch.special.ndtri, lambda c, dy: (dy * _SQRT_2PI * (c.out.square() / 2).exp(),), "output")
LOG_NDTR = unary("log_ndtr", torch.special.log_ndtr,
                 lambda c, dy: (dy / _SQRT_2PI * (-c.inputs[0].square() / 2 - c.out).exp(),), "both")
I0E = unary("i0e", torch.special.i0e, lambda c, dy: (dy * (apply(I1E, c.inputs[0]) - c.inputs[0].sgn() * c.out),),
            "both")
# i1'(x) = i0(x) - i1(x) / x and i1e'(x) = i0e(x) - i1e(x) (sgn(x) + 1 / x), both 1/2 at x = 0
I1 = unary("i1", torch.special.i1, lambda c, dy: (
    dy * where(c.inputs[0] == 0, 0.5, apply(I0, c.inputs[0]) - c.out / c.inputs[0]),), "both")
I1E = unary("i1e", torch.special.i1e, lambda c, dy: (
    dy * where(c.inputs[0] == 0, 0.5, apply(I0E, c.inputs[0]) - c.out * (c.inputs[0].sgn() + 1 / c.inputs[0])),),
    "both")


def lgamma(input: Tensor) -> Tensor:
    """``log(|gamma(x)|)`` elementwise, as ``torch.lgamma``."""
    _floating("lgamma", _tensor("lgamma", input))
    return apply(LGAMMA, input)


def digamma(input: Tensor) -> Tensor:
    """The logarithmic derivative of gamma, as ``torch.digamma``."""
    _floating("digamma", _tensor("digamma", input))
    return apply(DIGAMMA, input)


def polygamma(n: int, input: Tensor) -> Tensor:
    """The ``n``-th derivative of digamma, as ``torch.polygamma``."""
    _floating("polygamma", _tensor("polygamma", input))
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise RuntimeError(f"holoflow.polygamma(n, x) does not support negative or non-integer n, got n={n!r}")
    return apply(POLYGAMMA, input, n=n)


def i0(input: Tensor) -> Tensor:
    """The modified Bessel function of the first kind, order 0, as ``torch.i0``."""
    _floating("i0", _tensor("i0", input))
    return apply(I0, input)


def _special(op, name: str):
    def fn(input: Tensor) -> Tensor:
        _floating(name, _tensor(name, input))
        return apply(op, input)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``torch.special.{name}``, torch's kernel and derivative."
    return fn


entr, erfcx, ndtri, log_ndtr, i0e, i1, i1e = (_special(op, name) for op, name in (
    (ENTR, "entr"), (ERFCX, "erfcx"), (NDTRI, "ndtri"), (LOG_NDTR, "log_ndtr"), (I0E, "i0e"), (I1, "i1"),
    (I1E, "i1e")))


# -- torch.special's Bessel functions, orthogonal polynomials and Hurwitz zeta ---------------------------
# torch declares the Bessel functions and the polynomials non-differentiable (their outputs never
# require grad): declared without a grad rule, the same here. zeta has q's derivative only.

#: the one-argument functions, under torch.special's names (the op names too)
BESSEL_NAMES = ("airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0",
                "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k0",
                "scaled_modified_bessel_k1", "spherical_bessel_j0")
#: the ``(x, n)`` polynomials: n is truncated to an integer (negative n gives 0), as torch's kernels
POLYNOMIAL_NAMES = ("chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
                    "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
                    "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
                    "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p")
BESSEL_OPS = {name: unary(name, getattr(torch.special, name)) for name in BESSEL_NAMES}
POLYNOMIAL_OPS = {name: binary(name, getattr(torch.special, name), tensors_only=True) for name in POLYNOMIAL_NAMES}


def _zeta_grad(c, dy):
    """d/dq zeta(x, q) = -x zeta(x + 1, q), written with the op (so it differentiates again);
    torch has no derivative in x, and neither does holoflow."""
    x, q = c.inputs
    if needs(c, 0):
        raise UnsupportedError("holoflow.special.zeta: the derivative for 'zeta' with respect to x (the first "
                               "argument) is not implemented (nor in torch); only q can require grad: pass "
                               "x.detach()")
    if not needs(c, 1):
        return None, None
    return None, reduce_grad(dy * -x * apply(ZETA, x + 1, q), c, 1)


ZETA = binary("zeta", torch.special.zeta, _zeta_grad, "inputs", tensors_only=True)


def _real_args(name: str, a, b, first: str, second: str) -> None:
    """torch's two-argument special functions take (Tensor, Tensor), (Number, Tensor) or
    (Tensor, Number), of real dtypes."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError(f"holoflow.special.{name}(): expected a Tensor for {first!r} or {second!r}, got "
                        f"{type(a).__name__} and {type(b).__name__}")
    for arg, v in ((first, a), (second, b)):
        if isinstance(v, Tensor):
            if v.is_complex():
                raise UnsupportedError(f"holoflow.special.{name}: not implemented for complex tensors, got "
                                       f"{arg} of dtype {v.dtype}")
        elif isinstance(v, complex) or not isinstance(v, (int, float)):
            raise TypeError(f"holoflow.special.{name}(): argument {arg!r} must be a Tensor or a real number, "
                            f"not {type(v).__name__}")


def _bessel_fn(name: str):
    op = BESSEL_OPS[name]

    def fn(input: Tensor) -> Tensor:
        x = _tensor(f"special.{name}", input)
        if x.is_complex():
            raise UnsupportedError(f"holoflow.special.{name}: not implemented for complex tensors, got {x.dtype}")
        return apply(op, x)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"``torch.special.{name}`` elementwise (integer inputs give the default float dtype); "
                  f"not differentiable, as torch's.")
    return fn


def _polynomial_fn(name: str):
    op = POLYNOMIAL_OPS[name]

    def fn(input, n) -> Tensor:
        _real_args(name, input, n, "input", "n")
        return apply(op, input, n)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"``torch.special.{name}(input, n)``: the polynomial of degree ``n`` (a tensor or a number, "
                  f"truncated to an integer) at ``input`` (a tensor or a number), broadcast; not differentiable, "
                  f"as torch's.")
    return fn


SPECIAL_FUNCTIONS = {name: _bessel_fn(name) for name in BESSEL_NAMES} | {
    name: _polynomial_fn(name) for name in POLYNOMIAL_NAMES}


def zeta(input, other) -> Tensor:
    """The Hurwitz zeta function ``sum_k (k + other)^-input``, as ``torch.special.zeta``: either
    argument may be a number; differentiable in ``other`` (q) only, as torch's."""
    _real_args("zeta", input, other, "input", "other")
    return apply(ZETA, input, other)


def sinc(input: Tensor) -> Tensor:
    """The normalized sinc ``sin(pi x) / (pi x)`` (1 at 0), as ``torch.sinc``."""
    return apply(SINC, _tensor("sinc", input))


for _name in ("lgamma", "digamma", "i0", "sinc"):
    setattr(Tensor, _name, globals()[_name])

Tensor.polygamma = lambda self, n: polygamma(n, self)

for _name, _op in (("lgamma_", LGAMMA), ("digamma_", DIGAMMA), ("i0_", I0), ("sinc_", SINC)):
    setattr(Tensor, _name, _method_inplace(_op))

Tensor.polygamma_ = lambda self, n: apply_inplace(POLYGAMMA, self, n=n)
