"""Discrete Fourier transforms: three primitives (complex-to-complex, real-to-half-complex,
half-complex-to-real along one dim) and ``real``, with gradients written as the adjoint
transforms; ``n``/``s`` resizing is narrow/zero-padding (its own gradient), and the n-d forms
are 1-d transforms dim by dim. Public functions live in ``holoflow.fft``.

Gradients follow torch's convention for complex numbers (the conjugate Wirtinger derivative):
the adjoint of a transform normalized by ``norm`` is the opposite-direction transform with the
dual normalization (``backward`` <-> ``forward``, ``ortho`` <-> ``ortho``).
"""
from __future__ import annotations

import torch

from ..core import interpret
from ..core.dispatch import apply
from ..core.errors import normalize_dim
from ..core.registry import defop
from ..core.sbp import B, S
from ..core.tensor import Tensor
from .creation import zeros
from .shape import cat

__all__ = ["c2c", "r2c", "c2r", "real_part", "resize"]

_DUAL = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def _sbp(metas, attrs):
    """Each 1-d transform is independent across the other dims: split any of those."""
    nd = len(metas[0].shape)
    return [((B,), (B,))] + [((S(a),), (S(a),)) for a in range(nd) if a != attrs.get("dim", -1)]


def _c2c_grad(ctx, dy):
    g = apply(C2C, dy, dim=ctx.dim, norm=_DUAL[ctx.norm], forward=not ctx.forward)
    return (g if ctx.dtypes[0].is_complex else apply(REAL, g),)


def _r2c_grad(ctx, dy):
    full = resize(dy, ctx.dim, ctx.shapes[0][ctx.dim])
    return (apply(REAL, apply(C2C, full, dim=ctx.dim, norm=_DUAL[ctx.norm], forward=False)),)


def _c2r_grad(ctx, dy):
    """torch's ``fft_c2r_backward``: the half-spectrum transform of ``dy``, with the bins whose
    conjugate twins irfft read implicitly doubled (only those multiplied: a complex infinity times
    a weight of one would turn a zero imaginary part into NaN)."""
    g = apply(R2C, dy, dim=ctx.dim, norm=_DUAL[ctx.norm])
    m = g.shape[ctx.dim]
    doubled = ctx.n - m
    if doubled > 0:
        parts = [g.narrow(ctx.dim, 0, 1), g.narrow(ctx.dim, 1, doubled) * 2]
        if 1 + doubled < m:
            parts.append(g.narrow(ctx.dim, 1 + doubled, m - 1 - doubled))
        g = cat(parts, ctx.dim)
    return (g,)


def _real_grad(ctx, dy):
    return (apply(AS_COMPLEX, dy, dtype=_torch_dtype(ctx.dtypes[0])),)


def _torch_dtype(d):
    return d if isinstance(d, torch.dtype) else d.torch


def _all_splits(metas, attrs):
    return [((B,), (B,))] + [((S(a),), (S(a),)) for a in range(len(metas[0].shape))]


def _empty_safe(kernel):
    """MKL's FFT rejects an empty batch (a shard of an uneven split can be empty): answer those
    from the kernel's shape rule on a meta tensor."""
    def run(x, **attrs):
        if x.numel() or x.device.type == "meta":
            return kernel(x, **attrs)
        out = kernel(x.to("meta"), **attrs)
        return torch.empty(out.shape, dtype=out.dtype, device=x.device)
    return run


C2C = defop("fft_c2c", _empty_safe(lambda x, dim, norm, forward: (torch.fft.fft if forward else torch.fft.ifft)(
    x, dim=dim, norm=norm)), grad=_c2c_grad, sbp=_sbp)
R2C = defop("fft_r2c", _empty_safe(lambda x, dim, norm: torch.fft.rfft(x, dim=dim, norm=norm)),
            grad=_r2c_grad, sbp=_sbp)
C2R = defop("fft_c2r", _empty_safe(lambda x, dim, norm, n: torch.fft.irfft(x, n=n, dim=dim, norm=norm)),
            grad=_c2r_grad, sbp=_sbp)
REAL = defop("real", lambda x: torch.real(x).clone() if x.is_complex() else x.clone(), grad=_real_grad,
             sbp=_all_splits)
# a real tensor as complex (zero imaginary part): real's gradient; its own gradient is real's
AS_COMPLEX = defop("as_complex", lambda x, dtype: x.to(dtype), grad=lambda ctx, dy: (apply(REAL, dy),),
                   sbp=_all_splits)


def resize(x: Tensor, dim: int, size: int) -> Tensor:
    """``x`` trimmed or zero-padded at the end of ``dim`` to ``size`` (torch's ``n=`` rule)."""
    cur = x.shape[dim]
    if cur == size:
        return x
    if cur > size:
        return x.narrow(dim, 0, size)
    shape = list(x.shape)
    shape[dim] = size - cur
    return cat([x, zeros(*shape, dtype=x.dtype, device=x.device)], dim)


def _norm(norm: str | None, op: str) -> str:
    norm = "backward" if norm is None else norm
    if norm not in _DUAL:
        raise ValueError(f"holoflow.fft.{op}: invalid normalization mode {norm!r}; use 'backward', "
                         f"'forward' or 'ortho'")
    return norm


def c2c(x: Tensor, n: int | None, dim: int, norm: str | None, forward: bool, op: str) -> Tensor:
    (x,) = interpret.composite(f"fft_{op}", x)   # (autocast: torch's fft ops run in float32)
    d = normalize_dim(f"fft.{op}", dim, x.dim())
    if n is not None:
        if n < 1:
            raise RuntimeError(f"holoflow.fft.{op}: invalid number of data points ({n}) specified")
        x = resize(x, d, n)
    return apply(C2C, x, dim=d, norm=_norm(norm, op), forward=forward)


def r2c(x: Tensor, n: int | None, dim: int, norm: str | None, op: str = "rfft") -> Tensor:
    if x.is_complex():
        raise RuntimeError(f"holoflow.fft.{op} expects a real input tensor, but got {x.dtype}")
    (x,) = interpret.composite(f"fft_{op}", x)
    d = normalize_dim(f"fft.{op}", dim, x.dim())
    if n is not None:
        x = resize(x, d, n)
    return apply(R2C, x, dim=d, norm=_norm(norm, op))


def c2r(x: Tensor, n: int | None, dim: int, norm: str | None, op: str = "irfft") -> Tensor:
    (x,) = interpret.composite(f"fft_{op}", x)
    d = normalize_dim(f"fft.{op}", dim, x.dim())
    n = 2 * (x.shape[d] - 1) if n is None else n
    if n < 1:
        raise RuntimeError(f"holoflow.fft.{op}: invalid number of data points ({n}) specified")
    if not x.is_complex():
        x = x.to(torch.complex128 if x._data.dtype == torch.float64 else torch.complex64)
    return apply(C2R, resize(x, d, n // 2 + 1), dim=d, norm=_norm(norm, op), n=n)


def real_part(x: Tensor) -> Tensor:
    """The real part of a complex tensor, as a new (differentiable) real tensor."""
    return apply(REAL, x)
