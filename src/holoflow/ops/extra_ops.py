"""torch's math and shape functions that were missing: special functions (``lgamma``, ``digamma``,
``polygamma``, ``i0``, ``sinc``), binary ones (``hypot``, ``copysign``, ``heaviside``, ``ldexp``,
``gcd``, ``nextafter``), ``frexp``, and ``isin``, ``diff``, ``kron``, ``tensordot``, ``rot90``,
``diag_embed``, ``block_diag``, ``cartesian_prod``, ``bucketize``, ``histc``, ``trapezoid``,
``vander``, ``cov``/``corrcoef``, ``renorm``, ``index_copy``, ``masked_scatter``,
``scatter_reduce``, ``unravel_index``, ``take``/``put`` (flat indexing), ``argwhere``, ``diagflat``,
``histogram`` and ``Tensor.unfold`` (a view); with their Tensor methods (and in-place forms).
torch.special's own kernels are here too (``entr``, ``erfcx``, ..., the Bessel functions, the
orthogonal polynomials and ``zeta``); ``holoflow.special`` exports them under torch's names.

Where composing existing ops is exact (``diff``, ``kron``, ``tensordot``, ``rot90``,
``trapezoid``, ``vander``), they are composites and need no gradient code; ``lgamma``/``digamma``/
``polygamma`` have gradients written as ops (the next member of the family, so higher derivatives
compose); the rest are primitives on their ATen kernel whose backward is ATen's derivative
(ops/torch_vjp.py, no double backward). Integer-valued results
(``isin``, ``bucketize``, ``histc``, ``unravel_index``, ``gcd``) are not differentiable;
``heaviside``'s output requires grad and its backward raises, as torch's. ``take``/``put`` and
``unfold`` have grad rules written as ops (each other's, or a backward op whose grad is the forward),
so double backward composes.
"""
from __future__ import annotations

import math
from collections import namedtuple
from typing import Sequence

import torch

from ..core import interpret
from ..core.dispatch import apply, apply_inplace
from ..core.errors import ArgValueError, UnsupportedError, normalize_dim
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .elementwise import ZEROS_LIKE, where
from .family import binary, elementwise_sbp, needs, reduce_grad, unary
from .indexing import nonzero
from .layout import diag
from .linalg import matmul
from .more_ops import _same_shape_bwd_sbp
from .shape import cat, permute, reshape
from .torch_vjp import defop_vjp

__all__ = ["lgamma", "digamma", "polygamma", "i0", "sinc", "hypot", "copysign", "heaviside", "ldexp", "gcd",
           "nextafter", "frexp", "isin", "diff", "kron", "tensordot", "rot90", "diag_embed", "block_diag",
           "cartesian_prod", "bucketize", "histc", "trapezoid", "trapz", "vander", "cov", "corrcoef", "renorm",
           "index_copy", "masked_scatter", "scatter_reduce", "unravel_index", "take", "put", "argwhere", "diagflat",
           "histogram"]


def _ew(name: str, fn, outputs: tuple | None = None):
    one = elementwise_sbp()

    def sbp(metas, attrs):  # every output laid out like the (single) elementwise output
        return [(ins, outs * len(outputs or "x")) for ins, outs in one(metas, attrs)]
    # (two outputs of two dtypes: not a member of the fusible, in-place-able elementwise family)
    return defop_vjp(name, fn, sbp=sbp, bwd_sbp=_same_shape_bwd_sbp, outputs=outputs,
                     family="other" if outputs else "elementwise")


def _all_b(n_out: int = 1):
    def rule(metas, attrs):
        return [((B,) * len([m for m in metas if hasattr(m, "shape")]), (B,) * n_out)]
    return rule


def _all_b_bwd(metas, attrs):
    return [((B,) * len([m for m in metas if hasattr(m, "shape")]), (B,) * len(attrs["diff"]))]


def _tensor(name: str, x, arg: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"holoflow.{name}(): argument '{arg}' must be Tensor, not {type(x).__name__}")
    return x


def _floating(name: str, x: Tensor) -> None:
    if x.is_complex():
        raise UnsupportedError(f"holoflow.{name}: not implemented for complex tensors, got {x.dtype}")


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
HYPOT = _ew("hypot", torch.hypot)
COPYSIGN = _ew("copysign", torch.copysign)
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


LDEXP = _ew("ldexp", torch.ldexp)


def ldexp(input: Tensor, other: Tensor) -> Tensor:
    """``input * 2**other``, as ``torch.ldexp``; its gradient is ATen's, ``dy * pow(2, other)`` in
    the exponent's dtype (so 0 where an integer exponent is negative, as torch gives)."""
    return apply(LDEXP, _tensor("ldexp", input), _tensor("ldexp", other, "other"))


def frexp(input: Tensor):
    """Mantissa in [0.5, 1) and integer exponent with ``input = mantissa * 2**exponent``, as ``torch.frexp``."""
    if not _tensor("frexp", input).is_floating_point():
        raise RuntimeError(f"holoflow.frexp only supports floating-point dtypes, got {input.dtype}")
    return _Frexp(*apply(FREXP, input))


# -- membership, binning ---------------------------------------------------------------------------------

def _first_split_sbp(n_out: int = 1, shift: int = 0):
    """Input 0 split on any axis (the others broadcast) splits the output on the same axis (+ shift)."""
    def rule(metas, attrs):
        n = len([m for m in metas if hasattr(m, "shape")])
        sigs = [((B,) * n, (B,) * n_out)]
        if hasattr(metas[0], "shape"):
            sigs += [((S(a),) + (B,) * (n - 1), (S(a + shift),) * n_out) for a in range(len(metas[0].shape))]
        return sigs
    return rule


ISIN = defop("isin", lambda e, t, assume_unique, invert: torch.isin(e, t, assume_unique=assume_unique, invert=invert),
             sbp=_first_split_sbp(), differentiable=False)
BUCKETIZE = defop("bucketize", lambda x, b, out_int32, right: torch.bucketize(
    x.contiguous(), b, out_int32=out_int32, right=right), sbp=_first_split_sbp(), differentiable=False)


def _histc_sbp(metas, attrs):
    sigs = [((B,), (B,))]
    if attrs["min"] < attrs["max"]:  # a fixed range: each shard's histogram is a partial sum
        sigs += [((S(a),), (P,)) for a in range(len(metas[0].shape))]
    return sigs


HISTC = defop("histc", lambda x, bins, min, max: torch.histc(x, bins, min, max),  # noqa: A006
              sbp=_histc_sbp, differentiable=False)
UNRAVEL = defop("unravel_index", lambda i, shape: torch.stack(torch.unravel_index(i, shape)),
                sbp=_first_split_sbp(shift=1), differentiable=False)


def isin(elements, test_elements, *, assume_unique: bool = False, invert: bool = False) -> Tensor:
    """Whether each of ``elements`` is in ``test_elements`` (either may be a number), as ``torch.isin``."""
    if not isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        raise TypeError("holoflow.isin(): at least one of 'elements' and 'test_elements' must be a Tensor")
    if not isinstance(elements, Tensor):
        elements = Tensor._make(torch.tensor(elements, device=test_elements.device.torch))
    return apply(ISIN, elements, test_elements, assume_unique=bool(assume_unique), invert=bool(invert))


def bucketize(input, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:
    """The bucket index of each value in the sorted 1-D ``boundaries``, as ``torch.bucketize``."""
    if _tensor("bucketize", boundaries, "boundaries").dim() != 1:
        raise RuntimeError(f"holoflow.bucketize: boundaries tensor must be 1 dimension, but got shape "
                           f"{tuple(boundaries.shape)}")
    if not isinstance(input, Tensor):
        input = Tensor._make(torch.tensor(input, device=boundaries.device.torch))
    return apply(BUCKETIZE, input, boundaries, out_int32=bool(out_int32), right=bool(right))


def histc(input: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
    """A histogram of ``bins`` equal bins over [min, max] (the data's range when both are 0), as ``torch.histc``."""
    if not _tensor("histc", input).is_floating_point():
        raise UnsupportedError(f"holoflow.histc: \"histogram_cpu\" not implemented for '{input.dtype}'")
    if bins <= 0:
        raise RuntimeError(f"holoflow.histc: bins must be > 0, but got {bins}")
    if min > max:
        raise RuntimeError(f"holoflow.histc: max must be larger than min, got min={min} max={max}")
    return apply(HISTC, input, bins=int(bins), min=min, max=max)


def unravel_index(indices, shape) -> tuple:
    """The coordinates of flat ``indices`` in a tensor of ``shape``, one tensor per dim, as
    ``torch.unravel_index``."""
    if not isinstance(indices, Tensor):
        indices = Tensor._make(torch.tensor(indices))
    if indices.is_floating_point() or indices.is_complex() or indices._data.dtype is torch.bool:
        raise TypeError(f"holoflow.unravel_index: expected 'indices' to be integer dtype, but got {indices.dtype}")
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"holoflow.unravel_index: 'shape' cannot have negative values, but got {shape}")
    return tuple(apply(UNRAVEL, indices, shape=shape).unbind(0))


# -- composites: differences, products, rotations, integration --------------------------------------------

def diff(input: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None,
         append: Tensor | None = None) -> Tensor:
    """The ``n``-th forward difference along ``dim`` (``!=`` for bool), as ``torch.diff``."""
    if _tensor("diff", input).dim() == 0:
        raise RuntimeError("holoflow.diff expects input to be at least one-dimensional")
    if n < 0:
        raise RuntimeError(f"holoflow.diff expects n to be non-negative, got n={n}")
    d = normalize_dim("diff", dim, input.dim())
    parts = [t for t in (prepend, input, append) if t is not None]
    for t in parts:
        if t.dim() != input.dim():
            raise RuntimeError(f"holoflow.diff expects prepend or append to be the same dimension as input, got "
                               f"shapes {tuple(t.shape)} and {tuple(input.shape)}")
    x = cat(parts, d) if len(parts) > 1 else input
    for _ in range(n):
        m = max(x.shape[d] - 1, 0)
        hi, lo = x.narrow(d, 1, m) if m else x.narrow(d, 0, 0), x.narrow(d, 0, m)
        x = (hi != lo) if x._data.dtype is torch.bool else hi - lo
    return x


def kron(input: Tensor, other: Tensor) -> Tensor:
    """The Kronecker product (shapes padded with leading 1s to equal rank), as ``torch.kron``."""
    a, b = _tensor("kron", input), _tensor("kron", other, "other")
    nd = max(a.dim(), b.dim())
    sa = (1,) * (nd - a.dim()) + tuple(a.shape)
    sb = (1,) * (nd - b.dim()) + tuple(b.shape)
    ai = reshape(a, *[v for s in sa for v in (s, 1)])
    bi = reshape(b, *[v for s in sb for v in (1, s)])
    return reshape(ai * bi, *[x * y for x, y in zip(sa, sb)])


def _dims_lists(dims, na: int, nb: int) -> tuple[list[int], list[int]]:
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"holoflow.tensordot expects dims >= 0, but got dims={dims}")
        if dims > min(na, nb):
            raise RuntimeError(f"holoflow.tensordot: dims={dims} exceeds the dimensions of the inputs ({na} and {nb})")
        return list(range(na - dims, na)), list(range(dims))
    da, db = dims
    da, db = ([da], [db]) if isinstance(da, int) else (list(da), list(db))
    if len(da) != len(db):
        raise RuntimeError(f"holoflow.tensordot: both dimension lists should have same length, got {da} and {db}")
    return [normalize_dim("tensordot", d, na) for d in da], [normalize_dim("tensordot", d, nb) for d in db]


def tensordot(a: Tensor, b: Tensor, dims=2, out=None) -> Tensor:
    """Sums products over ``dims`` of ``a`` and ``b``, as ``torch.tensordot``."""
    _tensor("tensordot", a, "a"), _tensor("tensordot", b, "b")
    da, db = _dims_lists(dims, a.dim(), b.dim())
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            raise RuntimeError(f"holoflow.tensordot: contracted dimensions need to match, but first has size "
                               f"{a.shape[i]} in dim {i} and second has size {b.shape[j]} in dim {j}")
    fa = [i for i in range(a.dim()) if i not in da]
    fb = [j for j in range(b.dim()) if j not in db]
    k = math.prod(a.shape[i] for i in da)
    am = reshape(permute(a, *fa, *da), math.prod(a.shape[i] for i in fa), k)
    bm = reshape(permute(b, *db, *fb), k, math.prod(b.shape[j] for j in fb))
    return reshape(matmul(am, bm), *[a.shape[i] for i in fa], *[b.shape[j] for j in fb])


def rot90(input: Tensor, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
    """Rotates by 90 degrees ``k`` times in the plane ``dims`` (from the first towards the second
    axis), as ``torch.rot90``."""
    x = _tensor("rot90", input)
    if len(dims) != 2:
        raise RuntimeError(f"holoflow.rot90: expected total rotation dims == 2, but got dims = {len(dims)}")
    if x.dim() < 2:
        raise RuntimeError(f"holoflow.rot90: expected total dims >= 2, but got total dims = {x.dim()}")
    d0, d1 = (normalize_dim("rot90", d, x.dim()) for d in dims)
    if d0 == d1:
        raise RuntimeError(f"holoflow.rot90: expected rotation dims to be different, but got dim0 = {d0} and "
                           f"dim1 = {d1}")
    k %= 4
    if k == 1:
        return x.flip(d1).transpose(d0, d1)
    if k == 2:
        return x.flip(d0, d1)
    if k == 3:
        return x.flip(d0).transpose(d0, d1)
    return x.clone()


def trapezoid(y: Tensor, x=None, *, dx=None, dim: int = -1) -> Tensor:
    """The trapezoidal rule along ``dim`` with sample points ``x`` or spacing ``dx`` (default 1),
    as ``torch.trapezoid`` (the same formulas ATen uses)."""
    d = normalize_dim("trapezoid", dim, _tensor("trapezoid", y, "y").dim())
    if isinstance(x, Tensor) and dx is not None:
        raise RuntimeError("holoflow.trapezoid: received both x and dx; pass one of them")
    n = y.shape[d]
    if not isinstance(x, Tensor):
        spacing = 1 if x is None and dx is None else (dx if dx is not None else x)
        if n == 0:
            return y.sum(d) * 0
        return (y.sum(d) - (y.select(d, 0) + y.select(d, -1)) * 0.5) * spacing
    if x.dim() == 1:
        if x.shape[0] != n:
            raise RuntimeError(f"holoflow.trapezoid: there must be one `x` value for each sample point, got "
                               f"{x.shape[0]} x values for {n} samples along dim {d}")
        shape = [1] * y.dim()
        shape[d] = n
        x = reshape(x, *shape)
        xd = d
    else:
        xd = d - y.dim() + x.dim()
    if n == 0:
        return y.sum(d) * 0
    dxs = x.narrow(xd, 1, n - 1) - x.narrow(xd, 0, n - 1)
    # ATen's order: (left + right) * dx (a complex add multiplies its second operand by alpha = 1)
    return ((y.narrow(d, 0, n - 1) + y.narrow(d, 1, n - 1)) * dxs).sum(d) / 2


def trapz(y: Tensor, x=None, *, dx=None, dim: int = -1) -> Tensor:
    """``torch.trapz``: :func:`trapezoid`'s older name."""
    return trapezoid(y, x, dx=dx, dim=dim)


# -- primitives with ATen's derivative ---------------------------------------------------------------

def _diag_embed_sbp(metas, attrs):
    """Batch axis a of the input is the a-th output axis other than dim1/dim2."""
    nd = len(metas[0].shape)
    rest = [a for a in range(nd + 1) if a not in (attrs["dim1"], attrs["dim2"])]
    return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(rest[a]),)) for a in range(nd - 1)]


def _diag_embed_bwd_sbp(metas, attrs):
    nd = len(metas[0].shape)
    rest = [a for a in range(nd + 1) if a not in (attrs["dim1"], attrs["dim2"])]
    return [((B, B), (B,)), ((B, P), (P,))] + [((S(a), S(rest[a])), (S(a),)) for a in range(nd - 1)]


def _one_split_sbp(axes):
    """All inputs and outputs split alike on each axis ``axes(metas, attrs)`` names."""
    def rule(metas, attrs):
        n = len([m for m in metas if hasattr(m, "shape")])
        return [((B,) * n, (B,))] + [((S(a),) * n, (S(a),)) for a in axes(metas, attrs)]
    return rule


def _one_split_bwd_sbp(axes):
    def rule(metas, attrs):
        n, k = len([m for m in metas if hasattr(m, "shape")]), len(attrs["diff"])
        return [((B,) * n, (B,) * k)] + [((S(a),) * n, (S(a),) * k) for a in axes(metas, attrs)]
    return rule


def _scatter_axes(metas, attrs):
    """Axes other than ``dim`` where input, index and src have one size: split there."""
    ts = [m for m in metas if hasattr(m, "shape")][:3]
    return [a for a in range(len(ts[0].shape)) if a != attrs["dim"] and len({len(m.shape) for m in ts}) == 1
            and len({m.shape[a] for m in ts}) == 1]


def _index_copy_sbp(metas, attrs):  # (input, index, source): index stays broadcast
    ts = [m for m in metas if hasattr(m, "shape")]
    axes = [a for a in range(len(ts[0].shape)) if a != attrs["dim"] and len(ts[2].shape) == len(ts[0].shape)
            and ts[0].shape[a] == ts[2].shape[a]]
    k = len(attrs["diff"]) if "diff" in attrs else None
    n = len(ts)
    if k is None:
        return [((B, B, B), (B,))] + [((S(a), B, S(a)), (S(a),)) for a in axes]
    return [((B,) * n, (B,) * k)] + [((S(a), B, S(a)) + (S(a),) * (n - 3), (S(a),) * k) for a in axes]


DIAG_EMBED = defop_vjp("diag_embed", lambda x, offset, dim1, dim2: torch.diag_embed(x, offset, dim1, dim2),
                       sbp=_diag_embed_sbp, bwd_sbp=_diag_embed_bwd_sbp, family="shape")
BLOCK_DIAG = defop_vjp("block_diag", torch.block_diag, sbp=_all_b(), bwd_sbp=_all_b_bwd, family="shape")
CARTESIAN_PROD = defop_vjp("cartesian_prod", torch.cartesian_prod, sbp=_all_b(), bwd_sbp=_all_b_bwd, family="shape")
COV = defop_vjp("cov", lambda x, fw, aw, correction: torch.cov(x, correction=correction, fweights=fw, aweights=aw),
                sbp=_all_b(), bwd_sbp=_all_b_bwd, family="reduction")
CORRCOEF = defop_vjp("corrcoef", torch.corrcoef, sbp=_all_b(), bwd_sbp=_all_b_bwd, family="reduction")
RENORM = defop_vjp("renorm", lambda x, p, dim, maxnorm: torch.renorm(x, p, dim, maxnorm),
                   sbp=_one_split_sbp(lambda m, a: [a["dim"]]), bwd_sbp=_one_split_bwd_sbp(lambda m, a: [a["dim"]]))
INDEX_COPY = defop_vjp("index_copy", lambda x, index, src, dim: torch.index_copy(x, dim, index, src),
                       sbp=_index_copy_sbp, bwd_sbp=_index_copy_sbp, family="indexing")
MASKED_SCATTER = defop_vjp("masked_scatter", torch.masked_scatter, sbp=_all_b(), bwd_sbp=_all_b_bwd,
                           family="indexing")
SCATTER_REDUCE = defop_vjp(
    "scatter_reduce", lambda x, index, src, dim, reduce, include_self: torch.scatter_reduce(
        x, dim, index, src, reduce, include_self=include_self),
    sbp=_one_split_sbp(_scatter_axes), bwd_sbp=_one_split_bwd_sbp(_scatter_axes), family="indexing")


def diag_embed(input: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """A tensor whose diagonals (``offset``, in the planes ``dim1``/``dim2``) are ``input``'s last dim,
    as ``torch.diag_embed``."""
    nd = _tensor("diag_embed", input).dim() + 1
    d1, d2 = normalize_dim("diag_embed", dim1, nd), normalize_dim("diag_embed", dim2, nd)
    if d1 == d2:
        raise RuntimeError(f"holoflow.diag_embed: diagonal dimensions cannot be identical {dim1}, {dim2}")
    return apply(DIAG_EMBED, input, offset=int(offset), dim1=d1, dim2=d2)


def block_diag(*tensors: Tensor) -> Tensor:
    """A block-diagonal matrix of 0-, 1- or 2-d ``tensors``, as ``torch.block_diag``."""
    for i, t in enumerate(tensors):
        if _tensor("block_diag", t, f"tensors[{i}]").dim() > 2:
            raise RuntimeError(f"holoflow.block_diag: input tensors must have 2 or fewer dimensions. Input {i} "
                               f"has {t.dim()} dimensions (shape {tuple(t.shape)})")
    return apply(BLOCK_DIAG, *tensors)


def cartesian_prod(*tensors: Tensor) -> Tensor:
    """The Cartesian product of 1-d ``tensors`` (one row per combination), as ``torch.cartesian_prod``."""
    for i, t in enumerate(tensors):
        if _tensor("cartesian_prod", t, f"tensors[{i}]").dim() != 1:
            raise RuntimeError(f"holoflow.cartesian_prod: expect a 1D vector, but got shape {tuple(t.shape)}")
    return apply(CARTESIAN_PROD, *tensors)


def vander(x: Tensor, N: int | None = None, increasing: bool = False) -> Tensor:
    """The Vandermonde matrix of the 1-d ``x`` with ``N`` columns, as ``torch.vander``."""
    if _tensor("vander", x, "x").dim() != 1:
        raise RuntimeError(f"holoflow.vander: x must be a one-dimensional tensor, got shape {tuple(x.shape)}")
    if N is not None and N < 0:
        raise RuntimeError(f"holoflow.vander: N must be non-negative, got N={N}")
    n = x.shape[0] if N is None else N
    if n == 0:
        return x.unsqueeze(1).narrow(1, 0, 0)
    # ATen's algorithm (ones, then a running product), out of place: torch's own backward of
    # vander fails on its in-place cumprod_, this one is the same values with a gradient
    cols = cat([x.unsqueeze(1).mul(0).add(1), x.unsqueeze(1).expand(x.shape[0], n - 1)], 1).cumprod(1)
    return cols if increasing else cols.flip(1)


def cov(input: Tensor, *, correction: int = 1, fweights: Tensor | None = None,
        aweights: Tensor | None = None) -> Tensor:
    """The covariance matrix of the variables in ``input``'s rows, as ``torch.cov``."""
    if _tensor("cov", input).dim() > 2:
        raise RuntimeError(f"holoflow.cov: expected input to have two or fewer dimensions but got an input "
                           f"with {input.dim()} dimensions (shape {tuple(input.shape)})")
    return apply(COV, input, fweights, aweights, correction=correction)


def corrcoef(input: Tensor) -> Tensor:
    """Pearson correlation coefficients of the variables in ``input``'s rows, as ``torch.corrcoef``."""
    if _tensor("corrcoef", input).dim() > 2:
        raise RuntimeError(f"holoflow.corrcoef: expected input to have two or fewer dimensions but got an input "
                           f"with {input.dim()} dimensions (shape {tuple(input.shape)})")
    return apply(CORRCOEF, input)


def renorm(input: Tensor, p: float, dim: int, maxnorm: float) -> Tensor:
    """Each sub-tensor along ``dim`` rescaled to ``p``-norm at most ``maxnorm``, as ``torch.renorm``."""
    d = normalize_dim("renorm", dim, _tensor("renorm", input).dim())
    if p <= 0:
        raise RuntimeError(f"holoflow.renorm: non-positive-norm not supported, got p={p}")
    if maxnorm < 0:
        raise RuntimeError(f"holoflow.renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    return apply(RENORM, input, p=p, dim=d, maxnorm=maxnorm)


def index_copy(input: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """``input`` with the slices ``index`` along ``dim`` replaced by ``source``'s, as ``torch.index_copy``."""
    d = normalize_dim("index_copy", dim, _tensor("index_copy", input).dim())
    input, source = interpret.composite("index_copy", input, _tensor("index_copy", source, "source"))
    if _tensor("index_copy", index, "index")._data.dtype is not torch.int64:
        raise RuntimeError(f"holoflow.index_copy: expected a long tensor for index, but got {index.dtype}")
    if _tensor("index_copy", source, "source")._data.dtype != input._data.dtype:
        raise RuntimeError(f"holoflow.index_copy: self ({input.dtype}) and source ({source.dtype}) must have "
                           f"the same scalar type")
    return apply(INDEX_COPY, input, index, source, dim=d)


def masked_scatter(input: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """``input`` with the ``mask``ed positions filled from ``source`` in order, as ``torch.masked_scatter``."""
    if _tensor("masked_scatter", mask, "mask")._data.dtype is not torch.bool:
        raise RuntimeError(f"holoflow.masked_scatter: expected mask to be a bool tensor, got {mask.dtype}")
    if _tensor("masked_scatter", source, "source")._data.dtype != _tensor("masked_scatter", input)._data.dtype:
        raise RuntimeError(f"holoflow.masked_scatter: expected self and source to have same dtypes but got "
                           f"{input.dtype} and {source.dtype}")
    return apply(MASKED_SCATTER, input, mask, source)


def scatter_reduce(input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    """``src`` reduced into ``input`` at ``index`` along ``dim`` with ``reduce``, as ``torch.scatter_reduce``."""
    d = normalize_dim("scatter_reduce", dim, _tensor("scatter_reduce", input).dim())
    if _tensor("scatter_reduce", index, "index")._data.dtype is not torch.int64:
        raise RuntimeError(f"holoflow.scatter_reduce: expected dtype int64 for index, got {index.dtype}")
    if _tensor("scatter_reduce", src, "src")._data.dtype != input._data.dtype:
        raise RuntimeError(f"holoflow.scatter_reduce: expected self and src to have the same dtype, got "
                           f"{input.dtype} and {src.dtype}")
    if not (index.dim() == input.dim() == src.dim()) and index.numel():
        raise RuntimeError(f"holoflow.scatter_reduce: index {tuple(index.shape)}, self {tuple(input.shape)} and "
                           f"src {tuple(src.shape)} should all have the same number of dimensions")
    return apply(SCATTER_REDUCE, input, index, src, dim=d, reduce=reduce, include_self=bool(include_self))


# -- flat indexing: take, put ----------------------------------------------------------------------------

def _take_sbp(metas, attrs):
    """The input is read at flat positions, so it stays whole (B, or P: take is linear in it); the
    index splits the output alike."""
    return [((B, B), (B,)), ((P, B), (P,))] + [((B, S(a)), (S(a),)) for a in range(len(metas[1].shape))]


def _take_backward_sbp(metas, attrs):
    """``(dy, index) -> zeros(shape)`` with dy added at index: shards of both add partial sums."""
    return [((B, B), (B,)), ((P, B), (P,))] + [((S(a), S(a)), (P,)) for a in range(len(metas[1].shape))]


def _put_sbp(metas, attrs):
    """Linear in (input, source) together; a number source (the gradient's zeros) keeps P only if 0."""
    if isinstance(metas[2], Meta):
        return [((B, B, B), (B,)), ((P, B, P), (P,))]
    return [((B, B), (B,))] + ([((P, B), (P,))] if metas[2] == 0 else [])


def _put_kernel(x, index, source, accumulate):
    if not isinstance(source, torch.Tensor):  # a number at every indexed position (put's own gradient)
        source = x.new_full(index.shape, source)
    return x.put(index, source, accumulate)


def _put_grad(c, dy):
    """ATen's: the input's gradient is dy, with the written positions zeroed unless accumulating;
    the source's is dy taken at index."""
    index = c.inputs[1]
    g_in = (dy if c.accumulate else apply(PUT, dy, index, 0.0, accumulate=False)) if needs(c, 0) else None
    g_src = reshape(apply(TAKE, dy, index), c.shapes[2]) if needs(c, 2) else None
    return g_in, None, g_src


_INDEX_ONLY = dict(save="inputs", saved_inputs=(1,), family="indexing")
TAKE = defop("take", lambda x, index: torch.take(x, index), sbp=_take_sbp, **_INDEX_ONLY,
             grad=lambda c, dy: (apply(TAKE_BACKWARD, dy, c.inputs[1], shape=tuple(c.shapes[0])), None))
TAKE_BACKWARD = defop("take_backward", lambda dy, index, shape: dy.new_zeros(shape).put_(index, dy, accumulate=True),
                      sbp=_take_backward_sbp, **_INDEX_ONLY,
                      grad=lambda c, g: (apply(TAKE, g, c.inputs[1]), None))
PUT = defop("put", _put_kernel, grad=_put_grad, sbp=_put_sbp, **_INDEX_ONLY)


def take(input: Tensor, index: Tensor) -> Tensor:
    """``input`` read as a 1-D tensor at ``index`` (int64; negative counts from the end), shaped like
    ``index``, as ``torch.take``."""
    return apply(TAKE, _tensor("take", input), _tensor("take", index, "index"))


def put(input: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """A copy of ``input`` with ``source``'s elements written (or, with ``accumulate``, added) at the
    flat positions ``index``, as ``torch.put``."""
    return apply(PUT, _tensor("put", input), _tensor("put", index, "index"), _tensor("put", source, "source"),
                 accumulate=bool(accumulate))


def _put_(self: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    return apply_inplace(PUT, self, _tensor("put_", index, "index"), _tensor("put_", source, "source"),
                         accumulate=bool(accumulate))


def argwhere(input: Tensor) -> Tensor:
    """The indices of the non-zero elements, one row each, as ``torch.argwhere``."""
    return nonzero(_tensor("argwhere", input))


def diagflat(input: Tensor, offset: int = 0) -> Tensor:
    """A square matrix with the flattened input on its ``offset`` diagonal, as ``torch.diagflat``."""
    return diag(reshape(_tensor("diagflat", input), (-1,)), offset)


# -- histogram ----------------------------------------------------------------------------------------------

def _histogram_kernel(x, edges, weight, bins, range, density):  # noqa: A002
    if x.device.type == "meta":   # aten has no meta kernel; the shapes are known (graph tracing)
        n = bins if edges is None else edges.shape[0] - 1
        return x.new_empty(n), x.new_empty(n + 1)
    if edges is not None:
        return torch.histogram(x, edges, weight=weight, density=density)
    return torch.histogram(x, bins, range=range, weight=weight, density=density)


def _histogram_sbp(metas, attrs):
    """With fixed bins (given edges or range) and counts (no density), shards of the input (and of
    the weight alike) count partial sums; the edges are the same everywhere."""
    x, edges, weight = metas
    has_edges, has_weight = isinstance(edges, Meta), isinstance(weight, Meta)
    n = 1 + has_edges + has_weight
    sigs = [((B,) * n, (B, B))]
    if not attrs["density"] and (has_edges or attrs["range"] is not None):
        sigs += [((S(a),) + (B,) * has_edges + (S(a),) * has_weight, (P, B)) for a in range(len(x.shape))]
    return sigs


HISTOGRAM = defop("histogram", _histogram_kernel, sbp=_histogram_sbp, outputs=("hist", "bin_edges"),
                  differentiable=False)


def histogram(input: Tensor, bins=100, *, range=None, weight: Tensor | None = None,  # noqa: A002
              density: bool = False):
    """Counts (or a density) of ``input`` in ``bins`` equal bins over ``range`` (the data's range by
    default), or between the edges of a 1-D ``bins`` tensor, as ``torch.histogram``: a namedtuple
    ``(hist, bin_edges)``. Not differentiable."""
    edges = bins if isinstance(bins, Tensor) else None
    if edges is None and (isinstance(bins, bool) or not isinstance(bins, int) or bins <= 0):
        raise ArgValueError(f"holoflow.histogram: bins must be a positive int or a 1-D tensor of edges, got {bins!r}")
    if edges is not None and range is not None:
        raise TypeError("holoflow.histogram: range can't be given with a tensor of bin edges")
    rng = None if range is None else (float(range[0]), float(range[1]))
    return apply(HISTOGRAM, _tensor("histogram", input), edges, weight, bins=None if edges is not None else bins,
                 range=rng, density=bool(density))


# -- Tensor.unfold: sliding windows as a view ---------------------------------------------------------------

def _unfold_sbp(metas, attrs):
    """A split on any axis but ``dimension`` stays (the window axis is appended last); linear."""
    return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(a),)) for a in range(len(metas[0].shape))
                                           if a != attrs["dimension"]]


def _unfold_backward_sbp(metas, attrs):
    return [((B,), (B,)), ((P,), (P,))] + [((S(a),), (S(a),)) for a in range(len(attrs["shape"]))
                                           if a != attrs["dimension"]]


def _unfold_backward_local(attrs, metas, local_metas, in_sbps):
    """The input's shape follows the gradient's split."""
    s = in_sbps[0]
    if not isinstance(s, S):
        return attrs
    shape = list(attrs["shape"])
    shape[s.axis] = local_metas[0].shape[s.axis]
    return {**attrs, "shape": tuple(shape)}


_WINDOW = ("dimension", "size", "step")
UNFOLD = defop("unfold", lambda x, dimension, size, step: x.unfold(dimension, size, step), sbp=_unfold_sbp,
               family="shape", view=True,
               grad=lambda c, dy: (apply(UNFOLD_BACKWARD, dy, shape=tuple(c.shapes[0]),
                                         **{k: getattr(c, k) for k in _WINDOW}),))
UNFOLD_BACKWARD = defop("unfold_backward", lambda dy, shape, dimension, size, step: torch.ops.aten.unfold_backward(
    dy, shape, dimension, size, step), sbp=_unfold_backward_sbp, local_attrs=_unfold_backward_local, family="shape",
    grad=lambda c, g: (apply(UNFOLD, g, **{k: getattr(c, k) for k in _WINDOW}),))


def _unfold(self: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """``Tensor.unfold``: a view of every ``size``-long window along ``dimension``, ``step`` apart,
    as a new last dim (writes through it reach ``self``, as torch's)."""
    d = normalize_dim("unfold", dimension, self.dim())
    return apply(UNFOLD, self, dimension=d, size=int(size), step=int(step))


# -- Tensor methods -------------------------------------------------------------------------------------

def _method_inplace(op):
    """``x.op_(...)``: the op written into ``x`` (torch's in-place autograd, core/dispatch.py)."""
    def method(self, *args, **kwargs):
        return apply_inplace(op, self, *args, **kwargs)
    return method


for _name in ("diff", "kron", "rot90", "diag_embed", "histc", "lgamma", "digamma", "i0", "sinc", "hypot",
              "copysign", "heaviside", "frexp", "ldexp", "cov", "corrcoef", "renorm", "index_copy",
              "masked_scatter", "scatter_reduce", "gcd", "nextafter", "take", "put", "argwhere", "diagflat",
              "histogram"):
    setattr(Tensor, _name, globals()[_name])
Tensor.put_ = _put_
Tensor.unfold = _unfold
Tensor.polygamma = lambda self, n: polygamma(n, self)
for _name, _op in (("lgamma_", LGAMMA), ("digamma_", DIGAMMA), ("i0_", I0), ("sinc_", SINC), ("hypot_", HYPOT),
                   ("copysign_", COPYSIGN), ("heaviside_", HEAVISIDE), ("gcd_", GCD), ("nextafter_", NEXTAFTER)):
    setattr(Tensor, _name, _method_inplace(_op))
Tensor.polygamma_ = lambda self, n: apply_inplace(POLYGAMMA, self, n=n)
Tensor.ldexp_ = _method_inplace(LDEXP)
Tensor.renorm_ = lambda self, p, dim, maxnorm: self.copy_(renorm(self.clone(), p, dim, maxnorm))
Tensor.index_copy_ = lambda self, dim, index, source: self.copy_(index_copy(self.clone(), dim, index, source))
Tensor.masked_scatter_ = lambda self, mask, source: self.copy_(masked_scatter(self.clone(), mask, source))
Tensor.scatter_reduce_ = lambda self, dim, index, src, reduce, *, include_self=True: self.copy_(
    scatter_reduce(self.clone(), dim, index, src, reduce, include_self=include_self))
Tensor.nbytes = property(lambda self: self.numel() * self.element_size(), doc="Bytes of the elements.")
Tensor.itemsize = property(lambda self: self.element_size(), doc="Bytes of one element.")
Tensor.storage_offset = lambda self: self._data.storage_offset()
