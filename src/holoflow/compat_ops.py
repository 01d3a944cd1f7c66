"""torch's top-level (ATen-style) spellings of functions holoflow has under other names: the loss
and sampling functions of ``torch.nn.functional`` with their integer enums (``reduction=1`` is
'mean', ``interpolation_mode=0`` is 'bilinear'), ``torch.convolution`` and ``conv_tbc``, the
``native_*`` normalisations and dropout (results plus saved statistics), the recurrent functions
and cells (``torch.lstm``, ``torch.gru_cell`` ...), the process-wide switches scripts set around
the model (``set_default_tensor_type``, ``set_flush_denormal``, the deterministic debug mode, the
CUDA autocast dtype, ``get_device_module``, ``GradScaler``, ``Stream``/``Event``), and the
functions torch removed in 1.9 (``matrix_rank``, ``solve`` ...: raising as torch's do).

Everything here is a composite of holoflow ops (so it differentiates and takes torch's
gradients) or, for kernel switches and stream objects, torch's own (holoflow's kernels are torch's).
"""
from __future__ import annotations

import types
import warnings
from typing import Any, Sequence

import torch

from . import cpu, cuda, mps, mtia, xpu
from .amp import GradScaler
from .amp.autocast import get_autocast_dtype
from .amp.state import set_autocast_dtype
from .core import grad_mode
from .core.dispatch import apply
from .core.errors import UnsupportedError
from .core.tensor import Tensor
from .nn import functional as F
from .nn.modules.rnn import hidden_first
from .ops import conv as _conv
from .ops.creation import empty, empty_like
from .ops.elementwise import sigmoid, tanh
from .ops.pool3d import max_pool3d as _max_pool3d
from .ops.random_ops import dropout
from .ops.rnn import rnn_layer
from .ops.shape import cat, stack
from .random import default_generator
from .utils.dlpack import to_dlpack

__all__ = ["ctc_loss", "embedding_bag", "max_pool3d", "conv_transpose3d", "triplet_margin_loss",
           "hinge_embedding_loss", "channel_shuffle", "native_channel_shuffle", "affine_grid_generator",
           "grid_sampler", "grid_sampler_2d", "grid_sampler_3d", "convolution", "lstm_cell", "gru_cell",
           "rnn_tanh_cell", "rnn_relu_cell", "lstm", "gru", "rnn_tanh", "rnn_relu", "GradScaler",
           "get_device_module", "default_generator", "set_default_tensor_type", "is_storage", "set_flush_denormal",
           "get_deterministic_debug_mode", "set_deterministic_debug_mode",
           "is_deterministic_algorithms_warn_only_enabled", "get_autocast_gpu_dtype", "set_autocast_gpu_dtype",
           "Stream", "Event", "matrix_rank", "eig", "lstsq", "solve", "symeig", "max_pool1d_with_indices",
           "has_lapack", "has_mkl", "has_openmp", "has_spectral", "is_vulkan_available", "compiled_with_cxx11_abi",
           "init_num_threads", "UntypedStorage", "TypedStorage", "to_dlpack", "conv_tbc", "native_layer_norm",
           "native_group_norm", "native_batch_norm", "native_dropout"]

# kernel switches, build facts, storages and device-agnostic stream objects: torch's own (holoflow
# runs torch's kernels on torch's storages)
has_lapack, has_mkl, has_openmp, has_spectral = torch.has_lapack, torch.has_mkl, torch.has_openmp, torch.has_spectral
is_vulkan_available, compiled_with_cxx11_abi = torch.is_vulkan_available, torch.compiled_with_cxx11_abi
init_num_threads = torch.init_num_threads
UntypedStorage, TypedStorage = torch.UntypedStorage, torch.TypedStorage
set_flush_denormal = torch.set_flush_denormal
get_deterministic_debug_mode = torch.get_deterministic_debug_mode
set_deterministic_debug_mode = torch.set_deterministic_debug_mode
is_deterministic_algorithms_warn_only_enabled = torch.is_deterministic_algorithms_warn_only_enabled
is_storage = torch.is_storage
Stream, Event = torch.Stream, torch.Event


def _reduction(name: str, reduction: Any) -> str:
    """torch's ``at::Reduction`` enum as nn.functional's string: 1 is 'mean', 2 'sum', and any
    other int 'none' (as ATen's kernels read it)."""
    if isinstance(reduction, bool) or not hasattr(reduction, "__index__"):
        raise TypeError(f"holoflow.{name}(): argument 'reduction' must be int, not {type(reduction).__name__}")
    return {1: "mean", 2: "sum"}.get(int(reduction), "none")


# -- losses, pooling, shuffles with ATen's signatures ----------------------------------------------

def ctc_loss(log_probs: Tensor, targets: Tensor, input_lengths: Any, target_lengths: Any, blank: int = 0,
             reduction: int = 1, zero_infinity: bool = False) -> Tensor:
    """``torch.ctc_loss``: ``nn.functional.ctc_loss`` with ``reduction`` as torch's enum (1 mean,
    2 sum, else none)."""
    return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank,
                      _reduction("ctc_loss", reduction), zero_infinity)


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2.0,
                        eps: float = 1e-6, swap: bool = False, reduction: int = 1) -> Tensor:
    """``torch.triplet_margin_loss``: ``nn.functional.triplet_margin_loss`` with an enum ``reduction``."""
    return F.triplet_margin_loss(anchor, positive, negative, margin, p, eps, swap,
                                 reduction=_reduction("triplet_margin_loss", reduction))


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0, reduction: int = 1) -> Tensor:
    """``torch.hinge_embedding_loss``: ``nn.functional.hinge_embedding_loss`` with an enum ``reduction``."""
    return F.hinge_embedding_loss(input, target, margin, reduction=_reduction("hinge_embedding_loss", reduction))


_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


def embedding_bag(weight: Tensor, indices: Tensor, offsets: Tensor, scale_grad_by_freq: bool = False,
                  mode: int = 0, sparse: bool = False, per_sample_weights: Tensor | None = None,
                  include_last_offset: bool = False,
                  padding_idx: int | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``torch.embedding_bag`` (weight first, ``mode`` 0 sum / 1 mean / 2 max): returns torch's
    ``(output, offset2bag, bag_size, max_indices)``. ``output`` is nn.functional.embedding_bag's
    (differentiable); the three index tensors are ATen's bookkeeping, computed by its kernel."""
    if isinstance(mode, bool) or mode not in _BAG_MODES:
        raise RuntimeError(f"holoflow.embedding_bag: mode must be 0 (sum), 1 (mean) or 2 (max), got {mode!r}")
    out = F.embedding_bag(indices, weight, offsets, scale_grad_by_freq=scale_grad_by_freq, mode=_BAG_MODES[mode],
                          sparse=sparse, per_sample_weights=per_sample_weights,
                          include_last_offset=include_last_offset, padding_idx=padding_idx)
    if weight._global is not None or indices._global is not None:
        raise UnsupportedError("holoflow.embedding_bag: the bookkeeping outputs (offset2bag, bag_size, max_indices) "
                               "need local tensors; use holoflow.nn.functional.embedding_bag on global ones")
    with torch.no_grad():
        aux = torch.embedding_bag(weight._data.detach(), indices._data, offsets._data, scale_grad_by_freq, mode,
                                  False, None if per_sample_weights is None else per_sample_weights._data.detach(),
                                  include_last_offset, padding_idx)
    return (out,) + tuple(Tensor._make(a) for a in aux[1:])


def max_pool3d(input: Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False) -> Tensor:
    """``torch.max_pool3d``: the pooled values only (``nn.functional.max_pool3d``)."""
    return _max_pool3d(input, kernel_size, stride if stride not in ((), []) else None, padding, dilation, ceil_mode)


def max_pool1d_with_indices(input: Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                            ceil_mode: bool = False) -> tuple[Tensor, Tensor]:
    """``torch.max_pool1d_with_indices``: the pooled values and their argmax positions."""
    return F.max_pool1d_with_indices(input, kernel_size, stride if stride not in ((), []) else None, padding,
                                     dilation, ceil_mode, return_indices=True)


conv_tbc = _conv.conv_tbc
conv_transpose3d = F.conv_transpose3d
channel_shuffle = F.channel_shuffle
native_channel_shuffle = F.native_channel_shuffle


def affine_grid_generator(theta: Tensor, size: Sequence[int], align_corners: bool) -> Tensor:
    """``torch.affine_grid_generator``: ``nn.functional.affine_grid`` with ``align_corners`` required."""
    return F.affine_grid(theta, list(size), bool(align_corners))


_INTERP = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_PADDING = {0: "zeros", 1: "border", 2: "reflection"}


def _grid_sampler(name: str, dims: tuple[int, ...], input: Tensor, grid: Tensor, interpolation_mode: int,
                  padding_mode: int, align_corners: bool) -> Tensor:
    if input.dim() not in dims:
        raise RuntimeError(f"holoflow.{name}: expected a {' or '.join(f'{d}-D' for d in dims)} input, got shape "
                           f"{tuple(input.shape)}")
    if isinstance(interpolation_mode, bool) or interpolation_mode not in _INTERP:
        raise RuntimeError(f"holoflow.{name}: interpolation_mode must be 0 (bilinear), 1 (nearest) or 2 (bicubic), "
                           f"got {interpolation_mode!r}")
    if isinstance(padding_mode, bool) or padding_mode not in _PADDING:
        raise RuntimeError(f"holoflow.{name}: padding_mode must be 0 (zeros), 1 (border) or 2 (reflection), got "
                           f"{padding_mode!r}")
    if input.dim() == 5 and interpolation_mode == 2:
        raise RuntimeError(f"holoflow.{name}: bicubic interpolation only supports 4-D input")
    return F.grid_sample(input, grid, _INTERP[interpolation_mode], _PADDING[padding_mode], bool(align_corners))


def grid_sampler(input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int,
                 align_corners: bool) -> Tensor:
    """``torch.grid_sampler``: ``nn.functional.grid_sample`` with torch's integer modes
    (interpolation 0 bilinear / 1 nearest / 2 bicubic; padding 0 zeros / 1 border / 2 reflection)."""
    return _grid_sampler("grid_sampler", (4, 5), input, grid, interpolation_mode, padding_mode, align_corners)


def grid_sampler_2d(input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> Tensor:
    """:func:`grid_sampler` of a 4-D input."""
    return _grid_sampler("grid_sampler_2d", (4,), input, grid, interpolation_mode, padding_mode, align_corners)


def grid_sampler_3d(input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> Tensor:
    """:func:`grid_sampler` of a 5-D input."""
    return _grid_sampler("grid_sampler_3d", (5,), input, grid, interpolation_mode, padding_mode, align_corners)


def _spatial(name: str, what: str, v: Any, k: int) -> tuple[int, ...]:
    t = tuple(v) if isinstance(v, (list, tuple, torch.Size)) else (v,)
    if len(t) == 1:
        t = t * k
    return _conv._tuple(t, k, what, name)


def convolution(input: Tensor, weight: Tensor, bias: Tensor | None, stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int) -> Tensor:
    """``torch.convolution``: an N-d (transposed when ``transposed``) convolution with explicit
    stride, padding, dilation and output padding (each one value or one per spatial dim)."""
    k = weight.dim() - 2
    if k < 1:
        raise RuntimeError(f"holoflow.convolution: expected a weight with at least 3 dims, got shape "
                           f"{tuple(weight.shape)}")
    _conv._check_conv("convolution", input, weight, bias, k, groups, bool(transposed))
    return apply(_conv.CONV, input, weight, bias, stride=_spatial("convolution", "stride", stride, k),
                 padding=_spatial("convolution", "padding", padding, k),
                 dilation=_spatial("convolution", "dilation", dilation, k), transposed=bool(transposed),
                 output_padding=_spatial("convolution", "output_padding", output_padding, k), groups=int(groups),
                 extra=None)


# -- the native normalisations and dropout: the result and the statistics ATen saves -------------------

def _stats(x: Tensor, dims: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor]:
    """Mean and ``1 / sqrt(biased variance + eps)`` over ``dims`` (kept), in x's dtype."""
    mean = x.mean(dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dims, keepdim=True)
    return mean, (var + eps).rsqrt()


def native_layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None,
                      eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.native_layer_norm``: ``(layer_norm(...), mean, rstd)``, the statistics over the
    normalized (last) dims with those dims kept as size 1; only the result is differentiable, as torch."""
    out = F.layer_norm(input, normalized_shape, weight, bias, eps)
    k = len(tuple(normalized_shape))
    with grad_mode.no_grad():
        mean, rstd = _stats(input.detach(), tuple(range(input.dim() - k, input.dim())), eps)
    return out, mean, rstd


def native_group_norm(input: Tensor, weight: Tensor | None, bias: Tensor | None, N: int, C: int, HxW: int,
                      group: int, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.native_group_norm``: ``(group_norm(...), mean, rstd)`` with statistics of shape
    ``(N, group)``; all three are differentiable, as torch."""
    if tuple(input.shape[:2]) != (N, C) or input.numel() != N * C * HxW:
        raise RuntimeError(f"holoflow.native_group_norm: input of shape {tuple(input.shape)} does not match N={N}, "
                           f"C={C}, HxW={HxW}")
    out = F.group_norm(input, group, weight, bias, eps)
    mean, rstd = _stats(input.reshape(N, group, -1), (2,), eps)
    return out, mean.reshape(N, group), rstd.reshape(N, group)


def native_batch_norm(input: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
                      running_var: Tensor | None, training: bool, momentum: float,
                      eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.native_batch_norm``: ``(batch_norm(...), save_mean, save_invstd)`` (the batch's
    per-channel mean and inverse std when training or without running stats, else empty);
    updates the running stats in training, as torch. Only the result is differentiable."""
    out = F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    if training or running_mean is None:
        with grad_mode.no_grad():
            dims = (0,) + tuple(range(2, input.dim()))
            mean, invstd = _stats(input.detach(), dims, eps)
        return out, mean.reshape(-1), invstd.reshape(-1)
    return out, empty(0, dtype=input.dtype, device=input.device), empty(0, dtype=input.dtype, device=input.device)


def native_dropout(input: Tensor, p: float, train: bool | None) -> tuple[Tensor, Tensor]:
    """``torch.native_dropout``: ``(output, mask)`` with ``mask`` the kept elements (bool) and
    ``output = input * mask / (1 - p)`` (zeros for ``p = 1``), drawn as torch draws them; not
    training: ``(input, all True)``."""
    if not train:
        return input.clone(), empty_like(input, dtype=torch.bool).fill_(True)
    noise = empty_like(input.detach()).bernoulli_(1.0 - p)
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    return input * noise * scale, noise.bool()


# -- recurrent cells and layers -----------------------------------------------------------------------

def lstm_cell(input: Tensor, hx: Sequence[Tensor], w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None,
              b_hh: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One LSTM step, as ``torch.lstm_cell``: ``hx = (h, c)``; gates in torch's order (input,
    forget, cell, output); returns ``(h', c')``."""
    if len(hx) != 2:
        raise RuntimeError(f"holoflow.lstm_cell: hx must be (h, c), got {len(hx)} tensors")
    h, c = hx
    i, f, g, o = hidden_first(input, h, w_ih, w_hh, b_ih, b_hh).chunk(4, -1)
    c_new = sigmoid(f) * c + sigmoid(i) * tanh(g)
    return sigmoid(o) * tanh(c_new), c_new


def gru_cell(input: Tensor, hx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None,
             b_hh: Tensor | None = None) -> Tensor:
    """One GRU step, as ``torch.gru_cell``: ``n = tanh(x W_in + b_in + r * (h W_hn + b_hn))``,
    ``h' = (1 - z) * n + z * h``."""
    gi, gh = F.linear(input, w_ih, b_ih), F.linear(hx, w_hh, b_hh)
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    r, z = sigmoid(i_r + h_r), sigmoid(i_z + h_z)
    n = tanh(i_n + r * h_n)
    return n + z * (hx - n)


def rnn_tanh_cell(input: Tensor, hx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None,
                  b_hh: Tensor | None = None) -> Tensor:
    """One Elman step with tanh, as ``torch.rnn_tanh_cell``."""
    return tanh(hidden_first(input, hx, w_ih, w_hh, b_ih, b_hh))


def rnn_relu_cell(input: Tensor, hx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None,
                  b_hh: Tensor | None = None) -> Tensor:
    """One Elman step with ReLU, as ``torch.rnn_relu_cell``."""
    return hidden_first(input, hx, w_ih, w_hh, b_ih, b_hh).relu()


def _run_layers(name: str, mode: str, input: Tensor, h0: Tensor, c0: Tensor | None, params: Sequence[Tensor],
                has_biases: bool, num_layers: int, dropout_p: float, train: bool, bidirectional: bool,
                batch_first: bool) -> tuple:
    if not isinstance(input, Tensor) or input.dim() != 3:
        raise RuntimeError(f"holoflow.{name}: expected a 3-D input (the packed-sequence form is not supported; "
                           f"use holoflow.nn.{mode.split('_')[0]} with a PackedSequence)")
    dirs = 2 if bidirectional else 1
    per = len(params) // (num_layers * dirs) if num_layers * dirs else 0
    base = 4 if has_biases else 2
    if per * num_layers * dirs != len(params) or per not in (base, base + (mode == "LSTM")):
        raise RuntimeError(f"holoflow.{name}: got {len(params)} parameter tensors for {num_layers} layer(s), "
                           f"{dirs} direction(s) and has_biases={has_biases}")
    x = input.transpose(0, 1) if batch_first else input
    hs, cs = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            p = list(params[k * per:(k + 1) * per])
            w_ih, w_hh = p[0], p[1]
            b_ih, b_hh = (p[2], p[3]) if has_biases else (None, None)
            w_hr = p[-1] if per == base + 1 else None
            out, h, c = rnn_layer(mode, x, h0[k], c0[k] if c0 is not None else None, w_ih, w_hh, b_ih, b_hh, w_hr,
                                  d == 1)
            outs.append(out)
            hs.append(h)
            cs.append(c)
        x = outs[0] if dirs == 1 else cat(outs, -1)
        if dropout_p and train and layer < num_layers - 1:
            x = dropout(x, dropout_p, True)
    out = x.transpose(0, 1) if batch_first else x
    h_n = stack(hs, 0)
    return (out, h_n, stack(cs, 0)) if mode == "LSTM" else (out, h_n)


def lstm(input: Tensor, hx: Sequence[Tensor], params: Sequence[Tensor], has_biases: bool, num_layers: int,
         dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.lstm`` (the padded form): a multi-layer LSTM over ``input`` with flat ``params``
    (per layer and direction: ``w_ih, w_hh[, b_ih, b_hh][, w_hr]``); returns ``(output, h_n, c_n)``."""
    if len(hx) != 2:
        raise RuntimeError(f"holoflow.lstm: hx must be (h_0, c_0), got {len(hx)} tensors")
    return _run_layers("lstm", "LSTM", input, hx[0], hx[1], params, has_biases, num_layers, dropout, train,
                       bidirectional, batch_first)


def _single_state(name: str, mode: str):
    def fn(input: Tensor, hx: Tensor, params: Sequence[Tensor], has_biases: bool, num_layers: int, dropout: float,
           train: bool, bidirectional: bool, batch_first: bool) -> tuple[Tensor, Tensor]:
        return _run_layers(name, mode, input, hx, None, params, has_biases, num_layers, dropout, train,
                           bidirectional, batch_first)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"``torch.{name}`` (the padded form): a multi-layer {mode} over ``input`` with flat ``params`` "
                  f"(per layer and direction: ``w_ih, w_hh[, b_ih, b_hh]``); returns ``(output, h_n)``.")
    return fn


gru = _single_state("gru", "GRU")
rnn_tanh = _single_state("rnn_tanh", "RNN_TANH")
rnn_relu = _single_state("rnn_relu", "RNN_RELU")


# -- process-wide settings -------------------------------------------------------------------------

def get_device_module(device: Any = None) -> types.ModuleType:
    """holoflow's module for a device type (``holoflow.cuda`` for ``'cuda'``, ``holoflow.cpu``
    for ``'cpu'``; also mps, xpu and mtia), as ``torch.get_device_module``; with no argument, the current accelerator's
    (CUDA when available, else the CPU)."""
    if device is None:
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    elif isinstance(device, torch.device):
        kind = device.type
    elif isinstance(device, str):
        try:
            kind = torch.device(device).type
        except RuntimeError as e:
            raise RuntimeError(f"holoflow.get_device_module: {str(e).splitlines()[0]}") from None
    else:
        kind = getattr(device, "type", None)
        if not isinstance(kind, str):
            raise RuntimeError(f"holoflow.get_device_module: invalid value of device {device!r}")
    mods = {"cuda": cuda, "cpu": cpu, "mps": mps, "xpu": xpu, "mtia": mtia}
    if kind not in mods:
        raise RuntimeError(f"holoflow.get_device_module: device {kind!r} does not have a corresponding module in "
                           f"holoflow (it has {', '.join(f'holoflow.{k}' for k in mods)})")
    return mods[kind]


_LEGACY_TYPES = ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
                 "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor")


def set_default_tensor_type(t: Any) -> None:
    """The deprecated ``torch.set_default_tensor_type``: a floating legacy type (``'torch.FloatTensor'``,
    ``holoflow.DoubleTensor``, ``'torch.cuda.HalfTensor'`` ...) sets the default dtype, and a CUDA
    one the default device, as torch. Prefer ``set_default_dtype`` / ``set_default_device``."""
    if isinstance(t, str):
        name = t
    elif isinstance(t, type) and t.__name__ in _LEGACY_TYPES:
        name = ("cuda." if str(getattr(t, "__module__", "")).startswith("torch.cuda") else "") + t.__name__
    else:
        raise TypeError(f"holoflow.set_default_tensor_type: expected a legacy tensor type or its name (such as "
                        f"'torch.FloatTensor'), got {t!r}")
    for prefix in ("torch.", "holoflow."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if name.split(".")[-1] not in _LEGACY_TYPES or name.count(".") > (1 if name.startswith("cuda.") else 0):
        raise TypeError(f"holoflow.set_default_tensor_type: invalid type {t!r}")
    warnings.warn("holoflow.set_default_tensor_type() is deprecated (as torch's); use holoflow.set_default_dtype() "
                  "and torch.set_default_device() instead", UserWarning, stacklevel=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            torch.set_default_tensor_type(f"torch.{name}")
        except (TypeError, RuntimeError, AssertionError) as e:
            raise type(e)(f"holoflow.set_default_tensor_type: {str(e).splitlines()[0]}") from None


def get_autocast_gpu_dtype() -> Any:
    """The CUDA autocast dtype (deprecated: ``get_autocast_dtype('cuda')``), as torch."""
    warnings.warn("holoflow.get_autocast_gpu_dtype() is deprecated; use holoflow.get_autocast_dtype('cuda')",
                  DeprecationWarning, stacklevel=2)
    return get_autocast_dtype("cuda")


def set_autocast_gpu_dtype(dtype: Any) -> None:
    """Sets the CUDA autocast dtype (deprecated: ``set_autocast_dtype('cuda', dtype)``), as torch."""
    warnings.warn("holoflow.set_autocast_gpu_dtype(dtype) is deprecated; use "
                  "holoflow.set_autocast_dtype('cuda', dtype)", DeprecationWarning, stacklevel=2)
    set_autocast_dtype("cuda", dtype)


# -- functions torch removed in 1.9 (still present there, raising): the same error, naming holoflow's --

def _removed(name: str, instead: str):
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"holoflow.{name}: this function was deprecated since torch 1.9 and is now removed "
                           f"(as in torch); use {instead}")
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Removed, as ``torch.{name}``: raises RuntimeError pointing to ``{instead}``."
    return fn


matrix_rank = _removed("matrix_rank", "holoflow.linalg.matrix_rank")
eig = _removed("eig", "holoflow.linalg.eig")
lstsq = _removed("lstsq", "holoflow.linalg.lstsq")
solve = _removed("solve", "holoflow.linalg.solve")
symeig = _removed("symeig", "holoflow.linalg.eigh")
for _name in ("eig", "lstsq", "solve", "symeig"):   # torch's Tensor methods of these names raise alike
    if not hasattr(Tensor, _name):
        setattr(Tensor, _name, globals()[_name])
