"""The short-time Fourier transform: ``stft``/``istft`` (the plain DFTs are in ops/fft.py).

Primitives on torch's kernels whose backward is ATen's derivative (ops/torch_vjp.py); torch's own
argument checks run first on meta stand-ins, so a bad call raises torch's error class naming
holoflow. SBP: a batch of signals splits on its batch axis; the window is broadcast.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..core.dispatch import apply
from ..core.registry import Meta
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .tensor_meta import _tensor
from .torch_vjp import defop_vjp

__all__ = ["stft", "istft"]


# -- stft / istft: torch's kernels, ATen's derivatives ----------------------------------------------------

def _batched_sbp(batched: int):
    """``(signal, window?) -> out``: a batch of signals (``batched`` dims more than one signal)
    splits on its batch axis; the window is broadcast."""
    def rule(metas, attrs):
        n = len([m for m in metas if isinstance(m, Meta)])
        sigs = [((B,) * n, (B,))]
        if len(metas[0].shape) == batched + 1:
            sigs.append(((S(0),) + (B,) * (n - 1), (S(0),)))
        return sigs
    return rule


def _batched_bwd_sbp(batched: int):
    """``(signal, window?, dy) -> grads``: the signal's and dy's batch axis split alike; the
    window's gradient is then a partial sum."""
    def rule(metas, attrs):
        tens = [m for m in metas if isinstance(m, Meta)]
        n, diff = len(tens), attrs["diff"]
        sigs = [((B,) * n, (B,) * len(diff))]
        if len(metas[0].shape) == batched + 1:
            ins = (S(0),) + (B,) * (n - 2) + (S(0),)
            sigs.append((ins, tuple(S(0) if i == 0 else P for i in diff)))
        return sigs
    return rule


def _stft_kernel(x, window, n_fft, hop_length, win_length, center, pad_mode, normalized, onesided,
                 return_complex, align_to_window):
    kw = {} if align_to_window is None else {"align_to_window": align_to_window}
    if x.dim() == 2 and x.shape[0] == 0 and x.shape[1] > 0:   # an empty shard of a batch: torch refuses it
        return _stft_kernel(x.new_zeros((1, x.shape[1])) + x.sum(), window, n_fft, hop_length, win_length, center,
                            pad_mode, normalized, onesided, return_complex, align_to_window)[:0]
    return torch.stft(x, n_fft, hop_length, win_length, window, center, pad_mode, normalized, onesided,
                      return_complex, **kw)


def _istft_kernel(x, window, n_fft, hop_length, win_length, center, normalized, onesided, length,
                  return_complex):
    if x.device.type == "meta":   # istft checks the window envelope's values; the shape is known
        hop = n_fft // 4 if hop_length is None else hop_length
        n = length if length is not None else n_fft + hop * (x.shape[-1] - 1) - (2 * (n_fft // 2) if center else 0)
        dt = x.dtype if return_complex else x.dtype.to_real()
        return torch.empty(tuple(x.shape[:-2]) + (n,), dtype=dt, device="meta")
    if x.dim() == 3 and x.shape[0] == 0:   # an empty shard of a batch
        return _istft_kernel(x.new_zeros((1,) + tuple(x.shape[1:])) + x.sum(), window, n_fft, hop_length, win_length,
                             center, normalized, onesided, length, return_complex)[:0]
    return torch.istft(x, n_fft, hop_length, win_length, window, center, normalized, onesided, length,
                       return_complex)


STFT = defop_vjp("stft", _stft_kernel, sbp=_batched_sbp(1), bwd_sbp=_batched_bwd_sbp(1), complex_grads=True)
ISTFT = defop_vjp("istft", _istft_kernel, sbp=_batched_sbp(2), bwd_sbp=_batched_bwd_sbp(2),
                  complex_grads=True)


def _torch_checked(name: str, fn: Callable, *args, **kwargs):
    """Runs torch's own argument checks (on empty stand-ins of the inputs), so a bad call raises
    torch's class with holoflow's name before dispatch."""
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, ValueError, TypeError) as e:
        raise type(e)(f"holoflow.{name}: {str(e).splitlines()[0]}") from None


def _meta(x):
    return torch.empty(x.shape, dtype=x._data.dtype, device="meta") if isinstance(x, Tensor) else x


def stft(input: Tensor, n_fft: int, hop_length: int | None = None, win_length: int | None = None,
         window: Tensor | None = None, center: bool = True, pad_mode: str = "reflect", normalized: bool = False,
         onesided: bool | None = None, return_complex: bool | None = None,
         align_to_window: bool | None = None) -> Tensor:
    """The short-time Fourier transform, as ``torch.stft`` (torch's kernel and derivative)."""
    _tensor("stft", input)
    attrs = dict(n_fft=n_fft, hop_length=hop_length, win_length=win_length, center=center, pad_mode=pad_mode,
                 normalized=normalized, onesided=onesided, return_complex=return_complex,
                 align_to_window=align_to_window)
    if return_complex is None and not (input.is_complex() or (window is not None and window.is_complex())):
        raise RuntimeError("holoflow.stft: stft requires the return_complex parameter be given for real inputs, "
                           "and will further require that return_complex=True in a future PyTorch release")
    _torch_checked("stft", _stft_kernel, _meta(input), _meta(window), **attrs)
    return apply(STFT, input, window, **attrs)


def istft(input: Tensor, n_fft: int, hop_length: int | None = None, win_length: int | None = None,
          window: Tensor | None = None, center: bool = True, normalized: bool = False,
          onesided: bool | None = None, length: int | None = None, return_complex: bool = False) -> Tensor:
    """The inverse short-time Fourier transform, as ``torch.istft`` (torch's kernel and derivative)."""
    _tensor("istft", input)
    if not input.is_complex():
        raise RuntimeError("holoflow.istft: istft requires a complex-valued input tensor")
    attrs = dict(n_fft=n_fft, hop_length=hop_length, win_length=win_length, center=center,
                 normalized=normalized, onesided=onesided, length=length, return_complex=return_complex)
    try:
        return apply(ISTFT, input, window, **attrs)
    except RuntimeError as e:
        if "holoflow" in str(e):
            raise
        raise RuntimeError(f"holoflow.istft: {str(e).splitlines()[0]}") from None


for _name, _fn in {"stft": stft, "istft": istft}.items():
    if not hasattr(Tensor, _name):
        setattr(Tensor, _name, _fn)
