"""Activations beyond ops/nn_ops.py's: ``prelu`` (a primitive whose backward op has a double
backward), ``glu``, ``celu``, ``softsign``, ``tanhshrink``, ``softshrink`` and ``hardshrink``.

``glu`` and ``celu`` run nn_ops' GLU and ELU primitives, the shrinks are piecewise-linear family
members (ops/nn_ops.py), ``softsign``/``tanhshrink`` composites. Re-exported by ops/nn_ops.py
(which this module imports: it comes in through nn_ops' star import).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as TF

from ..core.dispatch import apply
from ..core.errors import ShapeError, normalize_dim
from ..core.registry import defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from . import elementwise as E
from .nn_ops import ELU, GLU, piecewise_linear, write_into

__all__ = ["prelu", "glu", "celu", "softsign", "tanhshrink", "softshrink", "hardshrink"]


# -- activations -----------------------------------------------------------------------------------

def _prelu_weight_shape(n: int, nd: int) -> tuple:
    """How prelu's 1-D weight of ``n`` entries broadcasts over an ``nd``-dim input: one entry
    everywhere, or one per channel (dim 1)."""
    return () if n == 1 else (n,) + (1,) * (nd - 2)


def _prelu_backward_kernel(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor):
    """``(dL/dx, dL/dweight)``: ``dy`` where ``x > 0`` else ``weight * dy``; the weight's is
    ``x * dy`` where ``x <= 0``, summed over everything but the channels."""
    wb = w.reshape(_prelu_weight_shape(w.numel(), x.dim()))
    pos = x > 0
    gx = torch.where(pos, dy, wb * dy)
    gw = torch.where(pos, 0, x * dy)
    gw = gw.sum() if wb.dim() == 0 else gw.sum_to_size(wb.shape)
    return gx, gw.reshape(w.shape)


def _prelu_sbp(metas, attrs):
    """Elementwise in ``x``: any split of it, the weight broadcast, except a split of the channels
    (dim 1) of a per-channel weight, which splits the weight alike."""
    x, w = metas
    per_channel = math.prod(w.shape) != 1
    sigs = [((B, B), (B,))]
    sigs += [((S(a), B), (S(a),)) for a in range(len(x.shape)) if not (per_channel and a == 1)]
    if per_channel:
        sigs.append(((S(1), S(0)), (S(1),)))
    return sigs


def _prelu_backward_sbp(metas, attrs):
    """Like prelu's, the weight's gradient a partial sum where the batch/spatial dims are split;
    linear in ``dy``."""
    dy, x, w = metas
    per_channel = math.prod(w.shape) != 1
    sigs = [((B, B, B), (B, B)), ((P, B, B), (P, P))]
    sigs += [((S(a), S(a), B), (S(a), P)) for a in range(len(x.shape)) if not (per_channel and a == 1)]
    if per_channel:
        sigs.append(((S(1), S(1), S(0)), (S(1), S(0))))
    return sigs


def _prelu_grad(c, dy):
    x, w = c.inputs
    gx, gw = apply(PRELU_BACKWARD, dy, x, w)
    return gx if c.needs_grad[0] else None, gw if c.needs_grad[1] else None


def _prelu_backward_grad(c, ggx, ggw):
    """prelu's double backward: the backward is linear in ``dy`` (its grad: ``ggx`` through
    prelu's slopes plus ``ggw`` times ``x`` where ``x < 0``), piecewise constant in ``x`` (d2/dx2
    is zero) and linear in the weight; the cross terms are ``ggw * dy`` (for ``x``) and the sum of
    ``ggx * dy`` (for the weight), each where ``x < 0``. At ``x == 0`` torch's double backward
    takes the positive side (slope 1, no cross terms) while its backward takes the weight's slope:
    both are followed. Written with ops: it differentiates again."""
    dy, x, w = c.inputs
    wshape = _prelu_weight_shape(w.numel(), x.dim())
    wb, ggw_b = w.reshape(wshape), ggw.reshape(wshape)
    pos = x >= 0
    g_dy = E.where(pos, ggx, ggx * wb + ggw_b * x) if c.needs_grad[0] else None
    g_x = E.where(pos, 0.0, ggw_b * dy) if c.needs_grad[1] else None
    g_w = None
    if c.needs_grad[2]:
        t = E.where(pos, 0.0, ggx * dy)
        t = t.sum() if not wshape else t.sum([d for d in range(x.dim()) if d != 1])
        g_w = t.reshape(tuple(w.shape))
    return g_dy, g_x, g_w


def _same_dtypes(x, w) -> None:
    """torch's prelu doesn't promote (checked after autocast has cast both, as torch checks)."""
    if x.dtype != w.dtype:
        raise RuntimeError(f"holoflow.prelu: type promoting is not supported (as in torch): input is "
                           f"{str(x.dtype).replace('torch.', '')} and weight {str(w.dtype).replace('torch.', '')}; "
                           f"cast one of them")


def _prelu_kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    _same_dtypes(x, w)
    return torch.prelu(x, w)


def _prelu_shape(metas, attrs):
    _same_dtypes(*metas)
    return [metas[0]]


PRELU = defop("prelu", _prelu_kernel, grad=_prelu_grad, save="inputs", sbp=_prelu_sbp, shape=_prelu_shape)
PRELU_BACKWARD = defop("prelu_backward", _prelu_backward_kernel, grad=_prelu_backward_grad, save="inputs",
                       sbp=_prelu_backward_sbp, outputs=("grad_input", "grad_weight"),
                       shape=lambda metas, attrs: [metas[1], metas[2]])


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """``x`` if ``x > 0`` else ``weight * x``; ``weight`` has one entry, or one per channel (dim 1;
    inputs of fewer than 2 dims have one channel). Its backward is an op with a double backward
    (torch's: zero in ``x`` twice, the cross terms with the weight)."""
    n = weight.numel()
    if weight.dim() > 1:
        raise ShapeError(f"holoflow.prelu: weight must be 1-D, got shape {tuple(weight.shape)}")
    if n != 1 and (input.dim() < 2 or input.shape[1] != n):
        raise ShapeError(f"holoflow.prelu: weight of {n} entries needs {n} channels in dim 1 of the "
                         f"input, got input of shape {tuple(input.shape)}")
    return apply(PRELU, input, weight)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """Gated linear unit: ``a * sigmoid(b)`` for the two halves ``a, b`` of ``input`` along ``dim``."""
    d = normalize_dim("glu", dim, input.dim())
    if input.shape[d] % 2:
        raise ShapeError(f"holoflow.glu: halving dimension must be even, but dim {dim} of input shape "
                         f"{tuple(input.shape)} has size {input.shape[d]}")
    return apply(GLU, input, dim=d)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``, i.e. ``alpha * elu(x / alpha)``."""
    if alpha == 0:
        raise ValueError("holoflow.celu: alpha must not be 0 (it divides the input)")
    def compute(x: Tensor) -> Tensor:   # (torch's: aten's elu with an input scale)
        return apply(ELU, x, alpha=alpha, scale=1.0, input_scale=1.0 / alpha,
                     grad_input_scale=1.0 / float(np.float32(alpha)))   # (torch: 1.0 / alpha.toFloat())
    return write_into(input, "celu", compute) if inplace else compute(input)


def softsign(input: Tensor) -> Tensor:
    """``x / (1 + |x|)``."""
    return input / (input.abs() + 1)


def tanhshrink(input: Tensor) -> Tensor:
    """``x - tanh(x)``."""
    return input - input.tanh()


def _check_lambd(name: str, lambd: float) -> None:
    if lambd < 0:
        raise ValueError(f"holoflow.{name}: lambd must be non-negative, got {lambd}")


SOFTSHRINK = piecewise_linear(
    "softshrink", lambda x, lambd=0.5: TF.softshrink(x, lambd),
    lambda dy, x, lambd=0.5: torch.ops.aten.softshrink_backward.default(dy, x, lambd))
HARDSHRINK = piecewise_linear(
    "hardshrink", lambda x, lambd=0.5: TF.hardshrink(x, lambd),
    lambda dy, x, lambd=0.5: torch.ops.aten.hardshrink_backward.default(dy, x, lambd))


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0."""
    _check_lambd("softshrink", lambd)
    return apply(SOFTSHRINK, input, lambd=float(lambd))


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0 (a negative ``lambd`` keeps every ``x``, as torch's)."""
    return apply(HARDSHRINK, input, lambd=float(lambd))
