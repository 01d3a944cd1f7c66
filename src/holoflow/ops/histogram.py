"""Counting and sample statistics: ``bincount``, ``histc``, ``histogram``, ``cov`` and
``corrcoef`` (``histogramdd`` is in ops/numeric.py, ``bucketize`` in ops/sorting.py).

The counts are primitives on torch's kernels and not differentiable; with a fixed binning, shards
of the input count partial sums (SBP ``S -> P``). ``cov``/``corrcoef`` are primitives with ATen's
derivative (ops/torch_vjp.py), whole on every rank.
"""
from __future__ import annotations

import torch

from ..core.dispatch import apply
from ..core.errors import ArgValueError, ShapeError, UnsupportedError
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .pointwise import _tensor
from .stacking import _all_b, _all_b_bwd
from .torch_vjp import defop_vjp

__all__ = ["bincount", "histc", "cov", "corrcoef", "histogram"]


# -- bincount --------------------------------------------------------------------------------------------

BINCOUNT = defop("bincount", lambda x, w, minlength: torch.bincount(x, w, minlength),
                 sbp=lambda metas, attrs: [((B,) * len([m for m in metas if hasattr(m, "shape")]), (B,))],
                 differentiable=False, family="other")


def bincount(input: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """Counts of each value of the 1-D non-negative integer ``input`` (summed ``weights``)."""
    if input.dim() != 1:
        raise ShapeError(f"holoflow.bincount: input must be 1-D, got shape {tuple(input.shape)}")
    if input.is_floating_point() or input.is_complex() or input.dtype is torch.bool:
        raise UnsupportedError(f"holoflow.bincount: input must be an integer tensor, got {input.dtype}")
    if weights is not None and tuple(weights.shape) != tuple(input.shape):
        raise ShapeError(f"holoflow.bincount: weights of shape {tuple(weights.shape)} must match the input's "
                         f"{tuple(input.shape)}")
    return apply(BINCOUNT, input, weights, minlength=int(minlength))  # negative values: the kernel names them


Tensor.bincount = bincount


def _histc_sbp(metas, attrs):
    sigs = [((B,), (B,))]
    if attrs["min"] < attrs["max"]:  # a fixed range: each shard's histogram is a partial sum
        sigs += [((S(a),), (P,)) for a in range(len(metas[0].shape))]
    return sigs


HISTC = defop("histc", lambda x, bins, min, max: torch.histc(x, bins, min, max),  # noqa: A006
              sbp=_histc_sbp, differentiable=False)


def histc(input: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
    """A histogram of ``bins`` equal bins over [min, max] (the data's range when both are 0), as ``torch.histc``."""
    if not _tensor("histc", input).is_floating_point():
        raise UnsupportedError(f"holoflow.histc: \"histogram_cpu\" not implemented for '{input.dtype}'")
    if bins <= 0:
        raise RuntimeError(f"holoflow.histc: bins must be > 0, but got {bins}")
    if min > max:
        raise RuntimeError(f"holoflow.histc: max must be larger than min, got min={min} max={max}")
    return apply(HISTC, input, bins=int(bins), min=min, max=max)


COV = defop_vjp("cov", lambda x, fw, aw, correction: torch.cov(x, correction=correction, fweights=fw, aweights=aw),
                sbp=_all_b(), bwd_sbp=_all_b_bwd, family="reduction")
CORRCOEF = defop_vjp("corrcoef", torch.corrcoef, sbp=_all_b(), bwd_sbp=_all_b_bwd, family="reduction")


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


for _name in ("histc", "cov", "corrcoef", "histogram"):
    setattr(Tensor, _name, globals()[_name])
