"""Pooling of nn.functional beyond the 2-d/3-d primitives of ops/conv.py and ops/pool3d.py:
1-d max/average/adaptive pooling, ``adaptive_max_pool2d``/``adaptive_max_pool3d`` and fractional
max pooling (2-d and 3-d).

1-D pooling runs the 2-D primitives on an input with a unit H axis. Adaptive and fractional max
pooling (windows of varying size have no cheap composite) are ATen kernels returning values and
flat spatial argmax indices: the gradient is a ``scatter_add`` of ``dy`` at those indices (linear
in ``dy``, so it differentiates again and is sharded by scatter's own rule). SBP: split on the
non-spatial leading axes (N, C). Re-exported by ops/nn_ops.py (the 3-d adaptive and fractional
forms are nn.functional names only).
"""
from __future__ import annotations

import torch

from ..core.dispatch import apply
from ..core.errors import ShapeError
from ..core.registry import defop
from ..core.sbp import B, S
from ..core.tensor import Tensor
from .conv import _check_pool, _lead_sbp, _tuple, adaptive_avg_pool2d, avg_pool2d, max_pool2d
from .creation import rand, zeros_like
from .family import empty_safe
from .pool3d import _lead3_sbp

__all__ = ["max_pool1d", "avg_pool1d", "adaptive_avg_pool1d", "adaptive_max_pool2d", "adaptive_max_pool1d"]


# -- 1-D and adaptive pooling ------------------------------------------------------------------------

def _check_1d(name: str, x: Tensor) -> None:
    if x.dim() not in (2, 3):
        raise ShapeError(f"holoflow.{name}: expected a 2-D (C, L) or 3-D (N, C, L) input, got shape "
                         f"{tuple(x.shape)}")


def _one(v, what: str, name: str) -> int:
    return _tuple(v, 1, what, name)[0]


def max_pool1d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """Max over windows of an ``(N, C, L)`` input (max_pool2d over a unit H axis); indices index L."""
    _check_1d("max_pool1d", input)
    k = _one(kernel_size, "kernel_size", "max_pool1d")
    s = k if stride is None or (isinstance(stride, (list, tuple)) and not stride) else _one(stride, "stride",
                                                                                           "max_pool1d")
    out, idx = max_pool2d(input.unsqueeze(-2), (1, k), (1, s), (0, _one(padding, "padding", "max_pool1d")),
                          (1, _one(dilation, "dilation", "max_pool1d")), ceil_mode, return_indices=True)
    out = out.squeeze(-2)
    return (out, idx.squeeze(-2)) if return_indices else out


def avg_pool1d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """Mean over windows of an ``(N, C, L)`` input (avg_pool2d over a unit H axis)."""
    _check_1d("avg_pool1d", input)
    k = _one(kernel_size, "kernel_size", "avg_pool1d")
    s = k if stride is None or (isinstance(stride, (list, tuple)) and not stride) else _one(stride, "stride",
                                                                                           "avg_pool1d")
    return avg_pool2d(input.unsqueeze(-2), (1, k), (1, s), (0, _one(padding, "padding", "avg_pool1d")),
                      ceil_mode, count_include_pad).squeeze(-2)


def adaptive_avg_pool1d(input: Tensor, output_size) -> Tensor:
    """Mean pooling of an ``(N, C, L)`` input to ``output_size`` positions."""
    _check_1d("adaptive_avg_pool1d", input)
    size = _one(output_size, "output_size", "adaptive_avg_pool1d")
    return adaptive_avg_pool2d(input.unsqueeze(-2), (1, size)).squeeze(-2)


def _amp2d_grad(c, dy, _didx) -> tuple:
    """Scatter-add ``dy`` into the flat H*W positions the forward picked (linear in dy, so it is
    differentiable again and sharded by scatter_add's rule)."""
    x, idx = c.inputs[0], c.outs[1]
    dx = zeros_like(x).flatten(-2).scatter_add(-1, idx.flatten(-2), dy.flatten(-2))
    return (dx.reshape(c.shapes[0]),)


def _amp2d_kernel(x: torch.Tensor, output_size: tuple) -> tuple:
    if 0 in x.shape[:-2]:  # aten rejects an empty channel dim, which an uneven shard can have
        shape = tuple(x.shape[:-2]) + tuple(output_size)
        return x.new_empty(shape), torch.empty(shape, dtype=torch.int64, device=x.device)
    return torch.ops.aten.adaptive_max_pool2d.default(x, output_size)


ADAPTIVE_MAX_POOL2D = defop("adaptive_max_pool2d", _amp2d_kernel, grad=_amp2d_grad, save="both",
                            saved_outputs=(1,),
                            sbp=_lead_sbp(n_out=2), outputs=("out", "indices"), family="pool")


def adaptive_max_pool2d(input: Tensor, output_size, return_indices: bool = False):
    """Max pooling to a fixed ``output_size`` (None keeps that size); with ``return_indices``
    also the flat H*W argmax of each window."""
    _check_pool("adaptive_max_pool2d", input)
    size = output_size if isinstance(output_size, (list, tuple)) else (output_size, output_size)
    size = tuple(int(input.shape[-2 + i]) if s is None else int(s) for i, s in enumerate(size))
    out, idx = apply(ADAPTIVE_MAX_POOL2D, input, output_size=size)
    return (out, idx) if return_indices else out


def adaptive_max_pool1d(input: Tensor, output_size, return_indices: bool = False):
    """Max pooling of an ``(N, C, L)`` input to ``output_size`` positions; indices index L."""
    _check_1d("adaptive_max_pool1d", input)
    size = _one(output_size, "output_size", "adaptive_max_pool1d")
    out, idx = adaptive_max_pool2d(input.unsqueeze(-2), (1, size), return_indices=True)
    out = out.squeeze(-2)
    return (out, idx.squeeze(-2)) if return_indices else out


def _scatter_grad(k: int):
    """The input gradient of a max pooling over ``k`` spatial dims: ``dy`` scatter-added at the
    flat argmax indices of each (N, C) plane; non-tensor or sample inputs get None."""
    def grad(c, dy, _didx):
        x, idx = c.inputs[0], c.outs[1]
        dx = zeros_like(x).flatten(-k).scatter_add(-1, idx.flatten(-k), dy.flatten(-k))
        return (dx.reshape(c.shapes[0]),) + (None,) * (len(c.inputs) - 1)
    return grad


# -- adaptive max pooling in 3-d -------------------------------------------------------------------

def _amp3d_kernel(x: torch.Tensor, output_size: tuple) -> tuple:
    return torch.ops.aten.adaptive_max_pool3d.default(x, output_size)


ADAPTIVE_MAX_POOL3D = defop("adaptive_max_pool3d", empty_safe(_amp3d_kernel), grad=_scatter_grad(3), save="both",
                            saved_outputs=(1,), sbp=_lead3_sbp(n_out=2), outputs=("out", "indices"),
                            family="pool")


def adaptive_max_pool3d_with_indices(input: Tensor, output_size, return_indices: bool = False):
    """Max pooling of an ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input to a fixed ``output_size``
    (None keeps that size): ``(values, flat D*H*W argmax indices)``."""
    if input.dim() not in (4, 5):
        raise ShapeError(f"holoflow.adaptive_max_pool3d: expected a 4-D (C, D, H, W) or 5-D (N, C, D, H, W) "
                         f"input, got shape {tuple(input.shape)}")
    size = output_size if isinstance(output_size, (list, tuple)) else (output_size,) * 3
    if len(size) != 3:
        raise ShapeError(f"holoflow.adaptive_max_pool3d: output_size must be an int or 3 values, got {output_size!r}")
    size = tuple(int(input.shape[-3 + i]) if s is None else int(s) for i, s in enumerate(size))
    return apply(ADAPTIVE_MAX_POOL3D, input, output_size=size)


def adaptive_max_pool3d(input: Tensor, output_size, return_indices: bool = False):
    """:func:`adaptive_max_pool3d_with_indices`, the values alone unless ``return_indices``."""
    out, idx = adaptive_max_pool3d_with_indices(input, output_size)
    return (out, idx) if return_indices else out


# -- fractional max pooling ------------------------------------------------------------------------

def _frac_sbp(k: int):
    """x ``(N, C, *k)`` or ``(C, *k)`` with samples ``(N or 1, C, k)``: a split of N or C of the
    input is the same split of the samples; both outputs are laid out as the input."""
    def rule(metas, attrs):
        x = metas[0]
        lead = len(x.shape) - k
        sigs = [((B, B), (B, B))]
        if lead == 2:
            sigs += [((S(0), S(0)), (S(0), S(0))), ((S(1), S(1)), (S(1), S(1)))]
        else:
            sigs.append(((S(0), S(1)), (S(0), S(0))))
        return sigs
    return rule


def _frac_kernel(name: str):
    aten = getattr(torch.ops.aten, name).default

    def kernel(x: torch.Tensor, samples: torch.Tensor, kernel_size: tuple, output_size: tuple) -> tuple:
        if 0 in x.shape[:-len(kernel_size)]:   # an empty shard: aten refuses empty batch/channel dims
            shape = tuple(x.shape[:-len(kernel_size)]) + tuple(output_size)
            return x.new_empty(shape), torch.empty(shape, dtype=torch.int64, device=x.device)
        return aten(x, kernel_size, output_size, samples)
    return kernel


FRACTIONAL_MAX_POOL2D = defop("fractional_max_pool2d", _frac_kernel("fractional_max_pool2d"),
                              grad=_scatter_grad(2), save="both", saved_inputs=(0,), saved_outputs=(1,),
                              sbp=_frac_sbp(2), outputs=("out", "indices"), family="pool")
FRACTIONAL_MAX_POOL3D = defop("fractional_max_pool3d", _frac_kernel("fractional_max_pool3d"),
                              grad=_scatter_grad(3), save="both", saved_inputs=(0,), saved_outputs=(1,),
                              sbp=_frac_sbp(3), outputs=("out", "indices"), family="pool")


def _fractional(k: int, input: Tensor, kernel_size, output_size, output_ratio, _random_samples):
    name = f"fractional_max_pool{k}d"
    if input.dim() not in (k + 1, k + 2):
        raise ShapeError(f"holoflow.{name}: expected a {k + 1}-D or {k + 2}-D input, got shape {tuple(input.shape)}")
    if output_size is None and output_ratio is None:
        raise ValueError(f"holoflow.{name} requires specifying either an output_size or an output_ratio")
    if output_size is None:
        ratio = tuple(output_ratio) if isinstance(output_ratio, (list, tuple)) else (output_ratio,) * k
        if len(ratio) != k:
            raise ValueError(f"holoflow.{name} requires output_ratio to either be a single Int or tuple of Ints.")
        output_size = [int(input.shape[-k + i] * ratio[i]) for i in range(k)]
    size = _tuple(output_size, k, "output_size", name)
    ks = _tuple(kernel_size, k, "kernel_size", name)
    if _random_samples is None:
        n_batch = 1 if input.dim() == k + 1 else input.shape[0]
        _random_samples = rand(n_batch, input.shape[-k - 1], k, dtype=input.dtype, device=input.device)
    op = FRACTIONAL_MAX_POOL2D if k == 2 else FRACTIONAL_MAX_POOL3D
    return apply(op, input, _random_samples.detach(), kernel_size=ks, output_size=size)


def fractional_max_pool2d_with_indices(input: Tensor, kernel_size, output_size=None, output_ratio=None,
                                       return_indices: bool = False, _random_samples: Tensor | None = None):
    """Fractional max pooling (Graham) of an ``(N, C, H, W)`` or ``(C, H, W)`` input: windows at
    pseudo-random offsets drawn from ``_random_samples`` (drawn U[0, 1) as torch draws them when
    not given); returns ``(values, flat H*W argmax indices)``."""
    return _fractional(2, input, kernel_size, output_size, output_ratio, _random_samples)


def fractional_max_pool2d(input: Tensor, kernel_size, output_size=None, output_ratio=None,
                          return_indices: bool = False, _random_samples: Tensor | None = None):
    out, idx = fractional_max_pool2d_with_indices(input, kernel_size, output_size, output_ratio,
                                                  _random_samples=_random_samples)
    return (out, idx) if return_indices else out


def fractional_max_pool3d_with_indices(input: Tensor, kernel_size, output_size=None, output_ratio=None,
                                       return_indices: bool = False, _random_samples: Tensor | None = None):
    """:func:`fractional_max_pool2d_with_indices` over ``(N, C, D, H, W)`` or ``(C, D, H, W)``."""
    return _fractional(3, input, kernel_size, output_size, output_ratio, _random_samples)


def fractional_max_pool3d(input: Tensor, kernel_size, output_size=None, output_ratio=None,
                          return_indices: bool = False, _random_samples: Tensor | None = None):
    out, idx = fractional_max_pool3d_with_indices(input, kernel_size, output_size, output_ratio,
                                                  _random_samples=_random_samples)
    return (out, idx) if return_indices else out
