"""``holoflow.special``: torch.special's functions that holoflow's ops compute (the same kernels or
differentiable composites of them), under torch.special's names.

>>> flow.special.expit(x)                  # sigmoid
>>> flow.special.xlogy(p, p).sum()         # 0 where p == 0
>>> flow.special.zeta(2.0, q)              # Hurwitz zeta; differentiable in q
>>> flow.special.chebyshev_polynomial_t(x, 3)  # n: a tensor or a number

Every public function of torch.special is here. The Bessel functions and orthogonal polynomials
are not differentiable (their outputs never require grad), as torch's; ``zeta`` has the derivative
in ``q`` only, and raises NotImplementedError for ``x``'s, as torch.
"""
from __future__ import annotations

import math

import torch as _torch

from .core.tensor import Tensor
from .ops import elementwise as _E
from .ops.numeric import mvlgamma
from .ops.elementwise import _FUNCS as _EW
from .ops.elementwise import logit, round, xlogy  # noqa: A004 - torch.special.round
from .ops.special import (SPECIAL_FUNCTIONS, digamma, entr, erfcx, i0, i0e, i1, i1e, lgamma, log_ndtr, ndtri, polygamma,
                          sinc, zeta)
from .ops.nn_ops import log_softmax as _log_softmax
from .ops.nn_ops import softmax as _softmax
from .ops.reduction import logsumexp

__all__ = ["expit", "exp2", "expm1", "log1p", "erf", "erfc", "erfinv", "digamma", "psi", "gammaln", "polygamma",
           "multigammaln", "gammainc", "gammaincc", "i0", "sinc", "round", "logit", "xlogy", "xlog1py",
           "logsumexp", "softmax", "log_softmax", "ndtr", "entr", "erfcx", "ndtri", "log_ndtr", "i0e", "i1", "i1e",
           "zeta", *SPECIAL_FUNCTIONS]

# the Bessel functions (airy_ai, bessel_j0, ..., spherical_bessel_j0) and the (x, n) polynomials
# (chebyshev_polynomial_t, ..., legendre_polynomial_p): ops/special.py
globals().update(SPECIAL_FUNCTIONS)

expit = _EW["sigmoid"]
exp2 = _EW["exp2"]
expm1 = _EW["expm1"]
log1p = _EW["log1p"]
erf = _EW["erf"]
erfc = _EW["erfc"]
erfinv = _EW["erfinv"]
gammainc = _EW["igamma"]
gammaincc = _EW["igammac"]
psi = digamma
gammaln = lgamma


def multigammaln(input: Tensor, p: int) -> Tensor:
    """The log of the multivariate gamma function of dimension ``p``."""
    return mvlgamma(input, p)


def softmax(input: Tensor, dim: int, *, dtype=None) -> Tensor:
    return _softmax(input, dim, dtype=dtype)


def log_softmax(input: Tensor, dim: int, *, dtype=None) -> Tensor:
    return _log_softmax(input, dim, dtype=dtype)


def ndtr(input: Tensor) -> Tensor:
    """The standard normal CDF, ``erfc(-x / sqrt(2)) / 2`` (torch's formula)."""
    return erfc(input * -math.sqrt(0.5)) * 0.5


def xlog1py(input, other) -> Tensor:
    """``input * log1p(other)``, 0 where ``input`` is 0 (unless ``other`` is NaN), as torch."""
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        raise TypeError("holoflow.special.xlog1py: expected at least one Tensor argument, got "
                        f"{type(input).__name__} and {type(other).__name__}")
    if not isinstance(input, Tensor):   # (a number at the floating dtype computed in, as torch's wrapped
        input = _number_beside(input, other)   # number: 2.5 isn't an integer tensor's 2, nor -1 uint8's 255)
    if not isinstance(other, Tensor):
        other = _number_beside(other, input)
    return _E.apply(_E.XLOG1PY, input, other)


def _number_beside(v, t: Tensor) -> Tensor:
    dt = _torch.result_type(t._data, v)
    return t.new_full((), v, dtype=dt if dt.is_floating_point or dt.is_complex else _torch.get_default_dtype())
