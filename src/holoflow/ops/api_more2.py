"""More of torch's top-level API and Tensor methods.

- Signal processing: ``stft``/``istft`` are primitives on torch's kernels whose backward is ATen's
  derivative (ops/torch_vjp.py); a batch of signals splits on its batch axis.
- Composites of existing ops (gradients, SBP and nn.Graph come from the parts): ``gradient``,
  ``mvlgamma``, ``constant_pad_nd``, ``fill``, ``conj_physical``,
  ``as_strided_scatter``, the ``*_copy`` forms of the view ops (the view, cloned), eager ``cond``
  and ``while_loop``, ``Tensor.resize``/``resize_as`` (autograd's shape-preserving resize).
- ``histogramdd`` (not differentiable; a fixed binning of split rows counts partial sums) and
  ``nonzero_static`` (torch's kernel: a static output shape, no host sync).
- State switches: the default device (torch's own: holoflow's creation functions call torch's
  factories), inference mode, anomaly mode, warn-always (autocast's: amp/state.py).
- Local-only Tensor methods torch runs as Python callbacks on CPU (``apply_``, ``map_``,
  ``map2_``) and metadata queries (``layout``, ``output_nr``, ``dim_order``, ``is_set_to``, ...).
"""
from __future__ import annotations

import warnings
from collections import namedtuple
from typing import Any, Callable, Sequence

import torch

from ..core import device as _device
from ..core import dtype as _dtype
from ..core import grad_mode, interpret
from ..core.anomaly import is_anomaly_check_nan_enabled, is_anomaly_enabled, set_anomaly_enabled
from ..core.dispatch import apply
from ..core.errors import UnsupportedError, normalize_dim
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .torch_vjp import defop_vjp
from . import creation as _creation

__all__ = [
    "stft", "istft", "set_default_device", "get_default_device", "is_inference_mode_enabled",
    "is_anomaly_enabled", "set_anomaly_enabled", "is_anomaly_check_nan_enabled",
    "resolve_conj", "resolve_neg", "is_conj", "is_neg", "is_signed", "is_inference", "conj_physical",
    "conj_physical_", "frombuffer", "gradient", "histogramdd", "mvlgamma", "constant_pad_nd", "fill", "cond",
    "while_loop", "nonzero_static", "empty_permuted", "set_warn_always", "is_warn_always_enabled", "get_device",
    "typename", "view_copy", "permute_copy", "transpose_copy", "expand_copy", "squeeze_copy", "unsqueeze_copy",
    "t_copy", "select_copy", "slice_copy", "diagonal_copy", "detach_copy", "alias_copy", "unbind_copy",
    "split_copy", "split_with_sizes_copy", "unfold_copy", "as_strided_copy", "as_strided_scatter",
]


def _tensor(name: str, x: Any, arg: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"holoflow.{name}(): argument '{arg}' must be a Tensor, not {type(x).__name__}")
    return x


def _local(name: str, x: Tensor) -> None:
    if x._global is not None or interpret.is_lazy():
        raise UnsupportedError(f"holoflow.{name}: runs on local tensors outside nn.Graph only (it reads or writes "
                               f"values in Python); call .to_local() first, or use tensor ops")


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


# -- state switches -----------------------------------------------------------------------------------------

def set_default_device(device: Any) -> None:
    """The device creation functions use when none is given, as ``torch.set_default_device``
    (holoflow's creation functions call torch's factories, which honour it)."""
    torch.set_default_device(None if device is None else _device.to_torch(device))


def get_default_device() -> _device.device:
    """The device creation functions use when none is given, as ``torch.get_default_device``."""
    return _device.from_torch(torch.get_default_device())


def is_inference_mode_enabled() -> bool:
    """Whether an ``inference_mode()`` region is active (holoflow's, like torch's)."""
    return bool(getattr(grad_mode.STATE, "inference", False))


set_warn_always, is_warn_always_enabled = torch.set_warn_always, torch.is_warn_always_enabled


# -- predicates and metadata -----------------------------------------------------------------------------

def resolve_conj(input: Tensor) -> Tensor:
    return _tensor("resolve_conj", input).resolve_conj()


def resolve_neg(input: Tensor) -> Tensor:
    return _tensor("resolve_neg", input).resolve_neg()


def is_conj(input: Tensor) -> bool:
    return _tensor("is_conj", input).is_conj()


def is_neg(input: Tensor) -> bool:
    return _tensor("is_neg", input).is_neg()


def is_signed(input: Tensor) -> bool:
    return _tensor("is_signed", input).is_signed()


def _is_inference(self: Tensor) -> bool:
    """Whether the tensor is an inference tensor. holoflow's ``inference_mode`` disables
    recording without making inference tensors, so this is the storage's own answer (False for
    tensors holoflow made)."""
    return bool(self._data.is_inference())


def is_inference(input: Tensor) -> bool:
    return _is_inference(_tensor("is_inference", input))


def get_device(input: Tensor) -> int:
    return _tensor("get_device", input).get_device()


def typename(obj: Any) -> str:
    """``'holoflow.FloatTensor'`` for a tensor (``torch.`` under mock_torch), else the
    object's qualified name, as ``torch.typename``."""
    if isinstance(obj, Tensor):
        return obj.type()
    return torch.typename(obj)


def conj_physical(input: Tensor) -> Tensor:
    """The conjugate, materialised; a real tensor is returned as is (as torch)."""
    _tensor("conj_physical", input)
    return input.conj() if input.is_complex() else input


def conj_physical_(input: Tensor) -> Tensor:
    _tensor("conj_physical_", input)
    if input.is_complex():
        input.copy_(input.conj())
    return input


# -- composites -----------------------------------------------------------------------------------------

def mvlgamma(input: Tensor, p: int) -> Tensor:
    """The multivariate log-gamma of dimension ``p``:
    ``p(p-1)/4 log(pi) + sum_{i<p} lgamma(input - i/2)``, as ``torch.mvlgamma``."""
    import math
    _tensor("mvlgamma", input)
    if p < 1:
        raise RuntimeError("holoflow.mvlgamma: p has to be greater than or equal to 1")
    x = input if input.is_floating_point() else input.to(_dtype.get_default_dtype())
    out = None
    for i in range(p):
        term = (x - i / 2).lgamma()
        out = term if out is None else out + term
    return out + p * (p - 1) / 4 * math.log(math.pi)


def _mvlgamma_(self: Tensor, p: int) -> Tensor:
    if not self.is_floating_point():
        raise RuntimeError(f"holoflow.mvlgamma_: result type Float can't be cast to the desired output type "
                           f"{self.dtype}")
    return self.copy_(mvlgamma(self.clone() if self.requires_grad else self, p))


def constant_pad_nd(input: Tensor, pad: Sequence[int], value: float = 0) -> Tensor:
    """Pads (or, with negative amounts, crops) the last dims with ``value``, as ``torch.constant_pad_nd``."""
    from .layout import pad as _pad
    _tensor("constant_pad_nd", input)
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2 or len(pad) // 2 > input.dim():
        raise RuntimeError(f"holoflow.constant_pad_nd: length of pad must be even and at most twice the "
                           f"input's dims ({input.dim()}), got {len(pad)}")
    return _pad(input, pad, "constant", value)


def fill(input: Tensor, value: Any) -> Tensor:
    """A tensor like ``input`` filled with ``value`` (a number or a 0-d tensor, which receives
    the gradient; ``input``'s is zero), as ``torch.fill``."""
    _tensor("fill", input)
    if isinstance(value, Tensor):
        if value.dim() != 0:
            raise RuntimeError(f"holoflow.fill: fill only supports 0-dimension value tensor but got tensor with "
                               f"{value.dim()} dimensions.")
    mask = _creation.ones_like(input, dtype=_dtype.bool)   # (global like a global input)
    return input.masked_fill(mask, value)   # input's gradient: zeros, as torch's


# torch's kernel: the output shape is ``(size, ndim)`` whatever the values (no host sync on CUDA;
# a meta kernel for nn.Graph's trace), unlike ``nonzero`` followed by a slice or a pad
NONZERO_STATIC = defop("nonzero_static",
                       lambda x, size, fill_value: torch.nonzero_static(x, size=size, fill_value=fill_value),
                       sbp=lambda metas, attrs: [((B,), (B,))], differentiable=False)


def nonzero_static(input: Tensor, *, size: int, fill_value: int = -1) -> Tensor:
    """The indices of the non-zero entries as an ``(size, ndim)`` tensor: truncated, or padded
    with ``fill_value``, as ``torch.nonzero_static``."""
    _tensor("nonzero_static", input)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise RuntimeError(f"holoflow.nonzero_static: 'size' must be a non-negative integer, got {size!r}")
    return apply(NONZERO_STATIC, input, size=size, fill_value=int(fill_value))


def _as_cond_pred(pred: Any) -> bool:
    if isinstance(pred, Tensor):
        if pred.numel() != 1:
            raise RuntimeError(f"holoflow.cond: expected pred to be bool or single-element tensor, but got "
                               f"a tensor of shape {tuple(pred.shape)}")
        return bool(pred.item())
    if isinstance(pred, (bool, int)):
        return bool(pred)
    raise RuntimeError(f"holoflow.cond: expected pred to be bool or single-element tensor, got "
                       f"{type(pred).__name__}")


def cond(pred: Any, true_fn: Callable, false_fn: Callable, operands: tuple | list = ()) -> Any:
    """Runs ``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, as ``torch.cond`` in
    eager mode (differentiable through the branch that ran)."""
    if not (callable(true_fn) and callable(false_fn)):
        raise RuntimeError("holoflow.cond: expected true_fn and false_fn to be callable")
    if not isinstance(operands, (tuple, list)):
        raise RuntimeError(f"holoflow.cond: expected operands to be a tuple or a list, got "
                           f"{type(operands).__name__}")
    return (true_fn if _as_cond_pred(pred) else false_fn)(*operands)


def while_loop(cond_fn: Callable, body_fn: Callable, carried_inputs: tuple | list) -> tuple:
    """``while cond_fn(*carried): carried = body_fn(*carried)``; returns the carried values, as
    ``torch.while_loop`` in eager mode (differentiable through the iterations that ran)."""
    if not (callable(cond_fn) and callable(body_fn)):
        raise RuntimeError("holoflow.while_loop: expected cond_fn and body_fn to be callable")
    if not isinstance(carried_inputs, (tuple, list)):
        raise RuntimeError(f"holoflow.while_loop: carried_inputs must be a tuple or a list, got "
                           f"{type(carried_inputs).__name__}")
    carried = tuple(carried_inputs)
    while True:
        p = cond_fn(*carried)
        if isinstance(p, Tensor) and (p.numel() != 1 or p.dtype is not _dtype.bool):
            raise RuntimeError(f"holoflow.while_loop: cond_fn must return a boolean scalar tensor or a bool, "
                               f"got shape {tuple(p.shape)} of {p.dtype}")
        if not bool(p):
            return carried
        out = body_fn(*carried)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(carried):
            raise RuntimeError(f"holoflow.while_loop: body_fn returned {len(out)} values for {len(carried)} "
                               f"carried inputs")
        carried = out


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


def as_strided_scatter(input: Tensor, src: Tensor, size: Sequence[int], stride: Sequence[int],
                       storage_offset: int | None = None) -> Tensor:
    """``input`` with the elements of its ``as_strided`` view replaced by ``src`` (a new tensor;
    gradients flow to both), as ``torch.as_strided_scatter``."""
    _tensor("as_strided_scatter", input)
    _tensor("as_strided_scatter", src, "src")
    out = input.contiguous().clone()
    view = out.as_strided(size, stride, storage_offset)
    if tuple(view.shape) != tuple(src.shape):
        raise RuntimeError(f"holoflow.as_strided_scatter: expected src to have a size equal to the slice of self. "
                           f"src size = {list(src.shape)}, slice size = {list(view.shape)}")
    view.copy_(src)
    return out


def _copy(name: str, view_fn: Callable) -> Callable:
    def fn(input: Tensor, *args, **kwargs):
        out = view_fn(_tensor(name, input), *args, **kwargs)
        if isinstance(out, Tensor):
            return out.clone(memory_format=torch.contiguous_format)
        return tuple(o.clone(memory_format=torch.contiguous_format) for o in out)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"As ``torch.{name}``: the view ``{name[:-5]}`` as a new tensor."
    return fn


def _view_like(input, *args):
    if len(args) == 1 and isinstance(args[0], (_dtype.dtype, torch.dtype)):
        return input.view(args[0])
    return input.view(*args)


def _slice(input, dim: int = 0, start=None, end=None, step: int = 1):
    d = normalize_dim("slice_copy", dim, input.dim())
    return input[(slice(None),) * d + (slice(start, end, step),)]


view_copy = _copy("view_copy", _view_like)
permute_copy = _copy("permute_copy", lambda x, dims: x.permute(tuple(dims)))
transpose_copy = _copy("transpose_copy", lambda x, dim0, dim1: x.transpose(dim0, dim1))
expand_copy = _copy("expand_copy", lambda x, size, *, implicit=False: x.expand(*size))
squeeze_copy = _copy("squeeze_copy", lambda x, dim=None: x.squeeze() if dim is None else x.squeeze(dim))
unsqueeze_copy = _copy("unsqueeze_copy", lambda x, dim: x.unsqueeze(dim))
t_copy = _copy("t_copy", lambda x: x.t())
select_copy = _copy("select_copy", lambda x, dim, index: x.select(dim, index))
slice_copy = _copy("slice_copy", _slice)
diagonal_copy = _copy("diagonal_copy", lambda x, offset=0, dim1=0, dim2=1: x.diagonal(offset, dim1, dim2))
detach_copy = _copy("detach_copy", lambda x: x.detach())
alias_copy = _copy("alias_copy", lambda x: x)
unbind_copy = _copy("unbind_copy", lambda x, dim=0: x.unbind(dim))
split_copy = _copy("split_copy", lambda x, split_size, dim=0: x.split(split_size, dim))
split_with_sizes_copy = _copy("split_with_sizes_copy", lambda x, split_sizes, dim=0: x.split(list(split_sizes), dim))
unfold_copy = _copy("unfold_copy", lambda x, dimension, size, step: x.unfold(dimension, size, step))
as_strided_copy = _copy("as_strided_copy",
                        lambda x, size, stride, storage_offset=None: x.as_strided(size, stride, storage_offset))


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


# -- creation -------------------------------------------------------------------------------------------

def frombuffer(buffer: Any, *, dtype: Any, count: int = -1, offset: int = 0, requires_grad: bool = False) -> Tensor:
    """A 1-D tensor over the memory of a Python buffer (shared, not copied), as ``torch.frombuffer``."""
    try:
        data = torch.frombuffer(buffer, dtype=_dtype.to_torch(dtype), count=count, offset=offset)
    except (ValueError, TypeError, RuntimeError) as e:
        raise type(e)(f"holoflow.frombuffer: {e}") from None
    out = Tensor._make(data)
    if requires_grad:
        out.requires_grad_(True)
    return out


def empty_permuted(size: Sequence[int], physical_layout: Sequence[int], *, dtype: Any = None, layout: Any = None,
                   device: Any = None, requires_grad: bool = False, pin_memory: bool = False) -> Tensor:
    """An uninitialised tensor of ``size`` whose memory runs in ``physical_layout``'s dim order,
    as ``torch.empty_permuted``."""
    return _creation._factory("empty_permuted", torch.empty_permuted, tuple(size), tuple(physical_layout),
                              dtype=dtype, device=device, requires_grad=requires_grad, layout=layout,
                              pin_memory=pin_memory)


# -- Tensor methods -----------------------------------------------------------------------------------------

def _new(self: Tensor, *args: Any, device: Any = None, **kwargs: Any) -> Tensor:
    """torch's legacy constructor: ``x.new()`` (empty), ``x.new(2, 3)``/``x.new(size)``
    (uninitialised), ``x.new(data)`` (a copy in ``x``'s dtype), ``x.new(tensor)`` (an alias of a
    tensor of ``x``'s dtype)."""
    if kwargs:
        raise TypeError(f"holoflow.Tensor.new: unexpected keyword arguments {sorted(kwargs)} (the legacy "
                        f"constructor takes only device; use new_empty/new_tensor for a dtype)")
    kw = {"dtype": self.dtype, "device": device if device is not None else self.device}
    if not args:
        return _creation.empty(0, **kw)
    if len(args) == 1 and isinstance(args[0], Tensor):
        other = args[0]
        if other.dtype is not self.dtype:
            raise TypeError(f"holoflow.Tensor.new: expected a tensor of {self.dtype}, got {other.dtype}")
        return other.detach()
    if len(args) == 1 and isinstance(args[0], torch.Size):
        return _creation.empty(*args[0], **kw)
    if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return _creation.empty(*args, **kw)
    if len(args) == 1 and not isinstance(args[0], (int, float, complex, bool)):
        return _creation.tensor(args[0], **kw)
    raise TypeError(f"holoflow.Tensor.new: data must be a sequence (got {type(args[0]).__name__})")


def _autograd_resize(self: Tensor, sizes: tuple, what: str) -> Tensor:
    numel = 1
    for s in sizes:
        numel *= s
    if numel != self.numel():
        raise RuntimeError(f"holoflow.{what}: requested resize to {'x'.join(map(str, sizes))} ({numel} elements "
                           f"in total), but the given tensor has a size of {'x'.join(map(str, self.shape))} "
                           f"({self.numel()} elements). autograd's resize can only change the shape of a given "
                           f"tensor, while preserving the number of elements.")
    return self.contiguous().view(*sizes)


def _resize(self: Tensor, *sizes: Any) -> Tensor:
    """Deprecated out-of-place resize (torch's autograd form): the same elements in a new shape."""
    warnings.warn("non-inplace resize is deprecated", stacklevel=2)
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple, torch.Size)):
        sizes = tuple(sizes[0])
    return _autograd_resize(self, tuple(int(s) for s in sizes), "resize")


def _resize_as(self: Tensor, tensor: Tensor) -> Tensor:
    """Deprecated out-of-place ``resize_as`` (torch's autograd form)."""
    warnings.warn("non-inplace resize_as is deprecated", stacklevel=2)
    return _autograd_resize(self, tuple(tensor.shape), "resize_as")


def _callback_target(self: Tensor, name: str) -> None:
    _local(name, self)
    if self._rg:
        raise RuntimeError(f"holoflow.{name}: can't call {name}() on a tensor that requires grad. "
                           f"Use t.detach().{name}() instead.")
    if self._data.device.type != "cpu":
        raise TypeError(f"holoflow.{name}: {name}() is only implemented on CPU tensors")


def _apply_(self: Tensor, callable: Callable) -> Tensor:  # noqa: A002
    """Replaces each element by ``callable(element)`` (a Python call per element, CPU only)."""
    _callback_target(self, "apply_")
    self._data.apply_(callable)
    return self


def _map_(self: Tensor, tensor: Tensor, callable: Callable) -> Tensor:  # noqa: A002
    """``self[i] = callable(self[i], tensor[i])`` with ``tensor`` broadcast (CPU only)."""
    _callback_target(self, "map_")
    _tensor("map_", tensor, "tensor")
    if tensor._rg:
        raise RuntimeError("holoflow.map_: can't call map_() on a tensor argument that requires grad")
    self._data.map_(tensor._local_full(), callable)
    return self


def _map2_(self: Tensor, x: Tensor, y: Tensor, callable: Callable) -> Tensor:  # noqa: A002
    """``self[i] = callable(self[i], x[i], y[i])`` with ``x`` and ``y`` broadcast (CPU only)."""
    _callback_target(self, "map2_")
    for t, arg in ((x, "x"), (y, "y")):
        _tensor("map2_", t, arg)
        if t._rg:
            raise RuntimeError("holoflow.map2_: can't call map2_() on a tensor argument that requires grad")
    self._data.map2_(x._local_full(), y._local_full(), callable)
    return self


def _dim_order(self: Tensor, *, ambiguity_check: Any = False) -> tuple:
    return self._data.dim_order(ambiguity_check=ambiguity_check)


def _is_set_to(self: Tensor, tensor: Tensor) -> bool:
    """Whether both tensors view the same storage with the same offset, sizes and strides."""
    return isinstance(tensor, Tensor) and self._global is None and tensor._global is None and \
        self._data.is_set_to(tensor._data)


def _record_stream(self: Tensor, stream: Any) -> None:
    """Marks the tensor as used by ``stream`` (CUDA memory reuse), as torch: on the CPU torch has no
    kernel for it and raises NotImplementedError, and so does holoflow."""
    try:
        self._data.record_stream(stream)
    except NotImplementedError:
        raise UnsupportedError(f"holoflow.record_stream: not available for {self._data.device.type} tensors "
                               f"(torch has no kernel for it there); it is for CUDA tensors") from None
    except (RuntimeError, TypeError) as e:
        raise type(e)(f"holoflow.record_stream: {str(e).splitlines()[0]}") from None


def _module_load(self: Tensor, other: Tensor, assign: bool = False) -> Tensor:
    """How ``load_state_dict`` loads ``other`` into this tensor, as torch's default."""
    if assign:
        return other.detach()
    with grad_mode.no_grad():
        self.copy_(other)
    return self.detach()


def _storage_type(self: Tensor) -> type:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # TypedStorage's deprecation warning is torch's business
        return self._data.storage_type()


def _output_nr(self: Tensor) -> int:
    return self._out_idx if self.grad_fn is not None else 0


for _name, _fn in {"new": _new, "resize": _resize, "resize_as": _resize_as, "apply_": _apply_, "map_": _map_,
                   "map2_": _map2_, "dim_order": _dim_order, "is_set_to": _is_set_to,
                   "record_stream": _record_stream, "module_load": _module_load, "storage_type": _storage_type,
                   "is_inference": _is_inference, "conj_physical": conj_physical, "conj_physical_": conj_physical_,
                   "mvlgamma": mvlgamma, "mvlgamma_": _mvlgamma_, "nonzero_static": nonzero_static,
                   "as_strided_scatter": as_strided_scatter, "stft": stft, "istft": istft}.items():
    if not hasattr(Tensor, _name):
        setattr(Tensor, _name, _fn)
Tensor.cfloat = lambda self, memory_format=torch.preserve_format: self.to(_dtype.complex64, memory_format=memory_format)
Tensor.cdouble = lambda self, memory_format=torch.preserve_format: self.to(_dtype.complex128,
                                                                         memory_format=memory_format)
Tensor.layout = property(lambda self: torch.strided, doc="Always ``torch.strided`` (dense tensors).")
Tensor.output_nr = property(_output_nr, doc="Which output of its grad_fn this tensor is (0 for leaves).")
