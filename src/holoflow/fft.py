"""``holoflow.fft``: torch.fft's transforms as differentiable holoflow ops (see ops/fft.py).

>>> spec = flow.fft.rfft(signal)           # complex, last dim n // 2 + 1
>>> back = flow.fft.irfft(spec, n=signal.shape[-1])
"""
from __future__ import annotations

from typing import Sequence

import torch

from .core.tensor import Tensor
from .ops import fft as _F
from .ops.layout import roll

__all__ = ["fft", "ifft", "rfft", "irfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn",
           "irfftn", "hfft", "ihfft", "hfft2", "ihfft2", "hfftn", "ihfftn", "fftfreq", "rfftfreq", "fftshift",
           "ifftshift"]


def fft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """1-d discrete Fourier transform along ``dim`` (``n`` trims or zero-pads first)."""
    return _F.c2c(input, n, dim, norm, True, "fft")


def ifft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """1-d inverse transform along ``dim``."""
    return _F.c2c(input, n, dim, norm, False, "ifft")


def rfft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """Transform of a real signal: the ``n // 2 + 1`` non-negative frequencies."""
    return _F.r2c(input, n, dim, norm)


def irfft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """Inverse of :func:`rfft`: a real signal of length ``n`` (default ``2 * (m - 1)``)."""
    return _F.c2r(input, n, dim, norm)


def _dims(input: Tensor, s: Sequence[int] | None, dim: Sequence[int] | int | None) -> tuple[list, list]:
    if isinstance(dim, int):
        dim = [dim]
    if dim is None:
        dim = list(range(input.dim() - len(s), input.dim())) if s is not None else list(range(input.dim()))
    dims = [d % input.dim() for d in dim]
    if s is not None and len(s) != len(dims):
        raise ValueError(f"holoflow.fft: s has {len(s)} sizes but dim has {len(dims)} dims")
    return dims, list(s) if s is not None else [None] * len(dims)


def fftn(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
         norm: str | None = None) -> Tensor:
    """N-d transform: 1-d transforms over ``dim`` in turn."""
    dims, sizes = _dims(input, s, dim)
    out = input
    for d, n in zip(dims, sizes):
        out = _F.c2c(out, n, d, norm, True, "fftn")
    return out


def ifftn(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None) -> Tensor:
    dims, sizes = _dims(input, s, dim)
    out = input
    for d, n in zip(dims, sizes):
        out = _F.c2c(out, n, d, norm, False, "ifftn")
    return out


def rfftn(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None) -> Tensor:
    """Real N-d transform: rfft over the last of ``dim``, then fft over the others."""
    dims, sizes = _dims(input, s, dim)
    out = _F.r2c(input, sizes[-1], dims[-1], norm, "rfftn")
    for d, n in zip(dims[:-1], sizes[:-1]):
        out = _F.c2c(out, n, d, norm, True, "rfftn")
    return out


def irfftn(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
           norm: str | None = None) -> Tensor:
    dims, sizes = _dims(input, s, dim)
    out = input
    for d, n in zip(dims[:-1], sizes[:-1]):
        out = _F.c2c(out, n, d, norm, False, "irfftn")
    return _F.c2r(out, sizes[-1], dims[-1], norm, "irfftn")


def fft2(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
         norm: str | None = None) -> Tensor:
    return fftn(input, s, dim, norm)


def ifft2(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
         norm: str | None = None) -> Tensor:
    return ifftn(input, s, dim, norm)


def rfft2(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
         norm: str | None = None) -> Tensor:
    return rfftn(input, s, dim, norm)


def irfft2(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
         norm: str | None = None) -> Tensor:
    return irfftn(input, s, dim, norm)


# The Hermitian transforms are the real ones of the conjugate with the normalization moved to the
# other direction: hfft(x) = irfft(conj(x)) scaled as a forward transform, ihfft(x) = conj(rfft(x))
# scaled as an inverse one (an unknown norm passes through, for the real transforms' error).
_SWAP_NORM = {None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"}


def _swap(norm):
    return _SWAP_NORM.get(norm, norm) if isinstance(norm, (str, type(None))) else norm


def _conj(x: Tensor) -> Tensor:
    return x.conj() if x.is_complex() else x


def hfft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """Transform of a one-sided Hermitian signal (the inverse of :func:`ihfft`): a real signal of
    length ``n`` (default ``2 * (m - 1)``)."""
    return irfft(_conj(input), n, dim, _swap(norm))


def ihfft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """Inverse transform of a real signal: the ``n // 2 + 1`` non-negative frequencies."""
    return rfft(input, n, dim, _swap(norm)).conj()


def hfftn(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None) -> Tensor:
    """N-d :func:`hfft`: the last of ``dim`` is one-sided, the output real."""
    return irfftn(_conj(input), s, dim, _swap(norm))


def ihfftn(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
           norm: str | None = None) -> Tensor:
    """N-d :func:`ihfft` of a real input."""
    return rfftn(input, s, dim, _swap(norm)).conj()


def hfft2(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
          norm: str | None = None) -> Tensor:
    return hfftn(input, s, dim, norm)


def ihfft2(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
           norm: str | None = None) -> Tensor:
    return ihfftn(input, s, dim, norm)


def fftfreq(n: int, d: float = 1.0, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Sample frequencies of an ``n``-point transform, as torch.fft.fftfreq."""
    return Tensor._make(torch.fft.fftfreq(n, d, dtype=_dt(dtype), device=_dev(device))).requires_grad_(requires_grad)


def rfftfreq(n: int, d: float = 1.0, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return Tensor._make(torch.fft.rfftfreq(n, d, dtype=_dt(dtype), device=_dev(device))).requires_grad_(requires_grad)


def fftshift(input: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
    """Moves the zero frequency to the center (a roll by ``size // 2`` over ``dim``)."""
    dims = list(range(input.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    return roll(input, [input.shape[d] // 2 for d in dims], dims)


def ifftshift(input: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
    dims = list(range(input.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    return roll(input, [-(input.shape[d] // 2) for d in dims], dims)


def _dt(dtype):
    from .core.dtype import to_torch
    return to_torch(dtype)


def _dev(device):
    from .core.device import to_torch
    return to_torch(device)


