"""Numerical composites over several dims with torch's argument checks: ``gradient`` (central
and one-sided differences per dim), ``histogramdd`` (a D-dimensional histogram; not
differentiable, a fixed binning of split rows counts partial sums) and ``mvlgamma`` (the
multivariate log-gamma on torch's kernel, with torch's derivative; ``Tensor.mvlgamma_``).

They share ops/tensor_meta.py's argument check (whose message differs from the one of
ops/calculus.py, histogram.py and special.py), hence a module of their own.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any, Sequence

import torch

from ..core.dispatch import apply, apply_inplace
from ..core.errors import normalize_dim
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .family import unary
from .spectral import _torch_checked
from .tensor_meta import _tensor

__all__ = ["gradient", "mvlgamma", "histogramdd"]


def gradient(input: Tensor, *, spacing: Any = 1, dim: Any = None, edge_order: int = 1) -> tuple:
    """Central differences in the interior and one-sided ones (of ``edge_order`` 1 or 2) at the
    edges, per dim, with uniform spacings or coordinates, as ``torch.gradient``."""
    from .shape import cat
    _tensor("gradient", input)
    nd = input.dim()
    dims = list(range(nd)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    dims = [normalize_dim("gradient", d, nd) for d in dims]
    if spacing is None:   # (torch's schema default: unit spacing)
        spacing = 1
    if isinstance(spacing, (list, tuple)):
        if len(spacing) == 1 and isinstance(spacing[0], Tensor) and spacing[0].dim() == 0:
            spacing = [spacing[0]] * len(dims)
        if len(spacing) != len(dims):
            where = f"'dim' argument of length {len(dims)}" if dim is not None else f"'self.dim() = {nd}'"
            raise RuntimeError(f"holoflow.gradient: expected spacing to be unspecified, a scalar, or a list of "
                               f"length equal to {where}, but got a list of length {len(spacing)}")
        spacing = list(spacing)
    else:
        spacing = [spacing] * len(dims)
    if edge_order not in (1, 2):
        raise RuntimeError("holoflow.gradient: torch.gradient only supports edge_order=1 and edge_order=2.")
    for d in dims:
        if input.shape[d] < edge_order + 1:
            raise RuntimeError("holoflow.gradient: torch.gradient expected each dimension size to be at least "
                               "edge_order+1")

    def sl(d, start=None, stop=None):
        return input[(slice(None),) * d + (slice(start, stop),)]

    out = []
    for d, h in zip(dims, spacing):
        if isinstance(h, Tensor) and h.dim() == 1:
            if h.shape[0] != input.shape[d]:
                raise RuntimeError(f"holoflow.gradient: expected each tensor in spacing to have as many entries "
                                   f"as dim {d} of the input ({input.shape[d]}), got {h.shape[0]}")
            shape = [1] * nd
            shape[d] = -1
            dx = h[1:] - h[:-1]
            dx1, dx2 = dx[:-1], dx[1:]
            a = (-dx2 / (dx1 * (dx1 + dx2))).reshape(shape)
            b = ((dx2 - dx1) / (dx1 * dx2)).reshape(shape)
            c = (dx1 / (dx2 * (dx1 + dx2))).reshape(shape)
            center = a * sl(d, 0, -2) + b * sl(d, 1, -1) + c * sl(d, 2)
            if edge_order == 1:
                pre = (sl(d, 1, 2) - sl(d, 0, 1)) / dx[0]
                app = (sl(d, -1) - sl(d, -2, -1)) / dx[-1]
            else:
                a = -(2.0 * dx[0] + dx[1]) / (dx[0] * (dx[0] + dx[1]))
                b = (dx[0] + dx[1]) / (dx[0] * dx[1])
                c = -dx[0] / (dx[1] * (dx[0] + dx[1]))
                pre = a * sl(d, 0, 1) + b * sl(d, 1, 2) + c * sl(d, 2, 3)
                a = dx[-1] / (dx[-2] * (dx[-1] + dx[-2]))
                b = -(dx[-1] + dx[-2]) / (dx[-1] * dx[-2])
                c = (2 * dx[-1] + dx[-2]) / (dx[-1] * (dx[-1] + dx[-2]))
                app = a * sl(d, -3, -2) + b * sl(d, -2, -1) + c * sl(d, -1)
        else:
            if isinstance(h, Tensor):
                h = h.item()
            center = (sl(d, 2) - sl(d, 0, -2)) / h / 2
            if edge_order == 1:
                pre = (sl(d, 1, 2) - sl(d, 0, 1)) / h
                app = (sl(d, -1) - sl(d, -2, -1)) / h
            else:
                pre = (-1.5 * sl(d, 0, 1) + 2 * sl(d, 1, 2) - 0.5 * sl(d, 2, 3)) / h
                app = (0.5 * sl(d, -3, -2) - 2 * sl(d, -2, -1) + 1.5 * sl(d, -1)) / h
        out.append(cat([pre, center, app], d))
    return tuple(out)


# -- mvlgamma ---------------------------------------------------------------------------------------------

def _mvlgamma_grad(c, dy):
    """torch's ``mvlgamma_backward``: ``dy * digamma(x + [-(p-1)/2, ..., -1/2, 0]).sum(-1)`` (the
    offsets in x's dtype, summed in torch's reduction over a last dim of size p)."""
    from .reduction import sum as _sum
    from .shape import stack
    from .special import DIGAMMA
    x, p = c.inputs[0], c.attrs["p"]
    terms = [apply(DIGAMMA, x + (k - p + 1) / 2) for k in range(p)]
    return (dy * _sum(stack(terms, -1), -1),)


# one op on torch's kernel (its forward bits; a composite of lgammas differed by an ulp), written in
# place as one op (the composite's copy_ into overlapping windows summed the windows' gradients)
MVLGAMMA = unary("mvlgamma", lambda x, p: torch.mvlgamma(x, p), _mvlgamma_grad, "inputs")


def mvlgamma(input: Tensor, p: int) -> Tensor:
    """The multivariate log-gamma of dimension ``p``:
    ``p(p-1)/4 log(pi) + sum_{i<p} lgamma(input - i/2)``, as ``torch.mvlgamma``."""
    _tensor("mvlgamma", input)
    if p < 1:
        raise RuntimeError("holoflow.mvlgamma: p has to be greater than or equal to 1")
    return apply(MVLGAMMA, input, p=p)


def _mvlgamma_(self: Tensor, p: int) -> Tensor:
    if not self.is_floating_point():
        raise RuntimeError(f"holoflow.mvlgamma_: result type Float can't be cast to the desired output type "
                           f"{self.dtype}")
    if p < 1:
        raise RuntimeError("holoflow.mvlgamma_: p has to be greater than or equal to 1")
    return apply_inplace(MVLGAMMA, self, p=p)


# -- histogramdd ----------------------------------------------------------------------------------------

_HistogramddResult = namedtuple("histogramdd", ["hist", "bin_edges"])


def _histogramdd_kernel(x, weight, *edges, bins, range, density):  # noqa: A002
    if x.device.type == "meta":
        counts = [e.shape[0] - 1 for e in edges] if edges else list(bins)
        return (x.new_empty(counts),) + tuple(x.new_empty(n + 1) for n in counts)
    hist, out_edges = torch.histogramdd(x, list(edges) if edges else list(bins), range=range, weight=weight,
                                        density=density)
    return (hist, *out_edges)


def _histogramdd_sbp(metas, attrs):
    """Rows of the samples (and of the weight alike) split into partial counts when the bins are
    fixed (given edges, or a range) and no density is asked; the edges are the same everywhere."""
    x, weight, *edges = metas
    has_w = isinstance(weight, Meta)
    n_in, n_out = 1 + has_w + len(edges), 1 + len(edges or attrs["bins"])
    sigs = [((B,) * n_in, (B,) * n_out)]
    if not attrs["density"] and (edges or attrs["range"] is not None):
        sigs += [((S(a),) + (S(a),) * has_w + (B,) * len(edges), (P,) + (B,) * (n_out - 1))
                 for a in range(len(x.shape) - 1)]
    return sigs


HISTOGRAMDD = defop("histogramdd", _histogramdd_kernel, sbp=_histogramdd_sbp, differentiable=False)


def histogramdd(input: Tensor, bins: Any = 10, *, range: Sequence[float] | None = None,  # noqa: A002
                weight: Tensor | None = None, density: bool = False):
    """A D-dimensional histogram of the rows of ``input`` (..., D), as ``torch.histogramdd``: a
    namedtuple ``(hist, bin_edges)``. Not differentiable."""
    _tensor("histogramdd", input)
    if input.dim() < 1:
        raise RuntimeError("holoflow.histogramdd: input should have at least 1 dimension")
    D = input.shape[-1]
    edges: tuple = ()
    if isinstance(bins, Tensor):
        raise TypeError("holoflow.histogramdd: bins must be an int, a sequence of ints or a sequence of 1-D "
                        "tensors of edges, got a Tensor")
    if isinstance(bins, (list, tuple)) and bins and all(isinstance(b, Tensor) for b in bins):
        edges, counts = tuple(bins), None
    elif isinstance(bins, int) and not isinstance(bins, bool):
        counts = (bins,) * D
    elif isinstance(bins, (list, tuple)) and all(isinstance(b, int) and not isinstance(b, bool) for b in bins):
        counts = tuple(bins)
    else:
        raise TypeError(f"holoflow.histogramdd: bins must be an int, a sequence of ints or a sequence of 1-D "
                        f"tensors of edges, got {bins!r}")
    rng = None if range is None else [float(r) for r in range]
    # torch's argument checks read shapes, dtypes and the range, never the values: empty CPU
    # stand-ins (no device copy; ATen's histogramdd has no meta kernel, so a meta input or
    # nn.Graph's trace could not be checked on its own device)
    def cpu(t: Tensor, shape: tuple) -> torch.Tensor:
        return torch.zeros(shape, dtype=t._data.dtype, device="cpu")
    rows = (0,) + tuple(input.shape[1:])   # the input without its rows (the weight alike, if it fits)
    _torch_checked("histogramdd", torch.histogramdd, cpu(input, rows),
                   [cpu(e, tuple(e.shape)) for e in edges] if edges else list(counts), range=rng,
                   weight=None if weight is None else
                   cpu(weight, rows[:-1] if tuple(weight.shape) == tuple(input.shape[:-1]) else tuple(weight.shape)),
                   density=density)
    if counts is not None and any(c <= 0 for c in counts):
        raise RuntimeError(f"holoflow.histogramdd: bins must be positive, got {list(counts)}")
    outs = apply(HISTOGRAMDD, input, weight, *edges, bins=counts, range=rng, density=bool(density))
    return _HistogramddResult(outs[0], tuple(outs[1:]))


for _name, _fn in {"mvlgamma": mvlgamma, "mvlgamma_": _mvlgamma_}.items():
    if not hasattr(Tensor, _name):
        setattr(Tensor, _name, _fn)
