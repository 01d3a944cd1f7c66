"""3-d pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` inputs: max, average, adaptive average.

Primitives on ATen kernels with dedicated backward ops, as the 2-d ones in ops/conv.py: the
backwards differentiate again (max pooling's gathers at the saved indices). SBP:
split on the non-spatial leading axes (N, C), every tensor alike; P through the linear ones.
"""
from __future__ import annotations

import torch

from ..core.dispatch import apply
from ..core.errors import ShapeError
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .conv import _tuple, max_pool_double_backward
from .family import empty_safe

__all__: list[str] = []   # nn.functional names (torch's top-level has only max_pool3d/avg_pool3d)


def _lead3_sbp(linear_in: tuple = (), n_out: int = 1):
    def rule(metas, attrs):
        tens = [m for m in metas if isinstance(m, Meta)]
        n = len(tens)
        lead = len(tens[-1].shape) - 3
        sigs = [((B,) * n, (B,) * n_out)] + [((S(a),) * n, (S(a),) * n_out) for a in range(lead)]
        sigs += [(tuple(P if j == i else B for j in range(n)), (P,) * n_out) for i in linear_in]
        return sigs
    return rule


_ATTRS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
MAX_POOL3D_BWD = defop("max_pool3d_backward",
                       lambda dy, x, idx, kernel_size, stride, padding, dilation, ceil_mode:
                       torch.ops.aten.max_pool3d_with_indices_backward.default(dy, x, kernel_size, stride, padding,
                                                                       dilation, ceil_mode, idx),
                       sbp=_lead3_sbp((0,)), grad=lambda c, ddx: max_pool_double_backward(c, ddx, 3),
                       save="inputs", saved_inputs=(2,), family="pool")
MAX_POOL3D = defop("max_pool3d", lambda x, kernel_size, stride, padding, dilation, ceil_mode:
                   torch.ops.aten.max_pool3d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode),
                   grad=lambda c, dy, _di: (apply(MAX_POOL3D_BWD, dy, c.inputs[0], c.outs[1],
                                                  **{k: c.attrs[k] for k in _ATTRS}),),
                   save="both", sbp=_lead3_sbp(n_out=2), outputs=("out", "indices"), family="pool")

_AVG_ATTRS = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
AVG_POOL3D_BWD = defop("avg_pool3d_backward",
                       lambda dy, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override:
                       torch.ops.aten.avg_pool3d_backward.default(dy, x, kernel_size, stride, padding, ceil_mode,
                                                          count_include_pad, divisor_override),
                       grad=lambda c, ddx: (apply(AVG_POOL3D, ddx, **{k: c.attrs[k] for k in _AVG_ATTRS}), None),
                       sbp=_lead3_sbp((0,)), family="pool")
AVG_POOL3D = defop("avg_pool3d", lambda x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                   divisor_override: torch.ops.aten.avg_pool3d.default(x, kernel_size, stride, padding, ceil_mode,
                                                               count_include_pad, divisor_override),
                   grad=lambda c, dy: (apply(AVG_POOL3D_BWD, dy, c.inputs[0], **c.attrs),), save="inputs",
                   sbp=_lead3_sbp((0,)), family="pool")

ADAPTIVE_AVG_POOL3D_BWD = defop(
    "adaptive_avg_pool3d_backward", lambda dy, x: torch.ops.aten._adaptive_avg_pool3d_backward.default(dy, x),
    grad=lambda c, ddx: (apply(ADAPTIVE_AVG_POOL3D, ddx, output_size=tuple(c.shapes[0][-3:])), None),
    sbp=_lead3_sbp((0,)), family="pool")
ADAPTIVE_AVG_POOL3D = defop(
    "adaptive_avg_pool3d", lambda x, output_size: torch.ops.aten._adaptive_avg_pool3d.default(x, output_size),
    grad=lambda c, dy: (apply(ADAPTIVE_AVG_POOL3D_BWD, dy, c.inputs[0]),), save="inputs",
    sbp=_lead3_sbp((0,)), family="pool")

for _op in (MAX_POOL3D, MAX_POOL3D_BWD, AVG_POOL3D, AVG_POOL3D_BWD, ADAPTIVE_AVG_POOL3D, ADAPTIVE_AVG_POOL3D_BWD):
    _op.kernel = empty_safe(_op.kernel)


def _check(name: str, x: Tensor) -> None:
    if x.dim() not in (4, 5):
        raise ShapeError(f"holoflow.{name}: expected a 4-D (C, D, H, W) or 5-D (N, C, D, H, W) input, got "
                         f"shape {tuple(x.shape)}")


def _args(name: str, kernel_size, stride, padding) -> dict:
    k = _tuple(kernel_size, 3, "kernel_size", name, True)
    s = k if stride is None or (isinstance(stride, (list, tuple)) and not stride) else \
        _tuple(stride, 3, "stride", name, True)
    return {"kernel_size": k, "stride": s, "padding": _tuple(padding, 3, "padding", name, True)}


def max_pool3d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """Max over ``kernel_size`` 3-d windows; with ``return_indices`` also the flat D*H*W argmax."""
    _check("max_pool3d", input)
    out, idx = apply(MAX_POOL3D, input, dilation=_tuple(dilation, 3, "dilation", "max_pool3d", True),
                     ceil_mode=bool(ceil_mode), **_args("max_pool3d", kernel_size, stride, padding))
    return (out, idx) if return_indices else out


def avg_pool3d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """Mean over ``kernel_size`` 3-d windows, as ``torch.nn.functional.avg_pool3d``."""
    _check("avg_pool3d", input)
    return apply(AVG_POOL3D, input, ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad),
                 divisor_override=divisor_override, **_args("avg_pool3d", kernel_size, stride, padding))


def adaptive_avg_pool3d(input: Tensor, output_size) -> Tensor:
    """Mean pooling to a fixed ``(D, H, W)`` ``output_size`` (None keeps that input size)."""
    _check("adaptive_avg_pool3d", input)
    size = output_size if isinstance(output_size, (list, tuple)) else (output_size,) * 3
    if len(size) != 3:
        raise ValueError(f"holoflow.adaptive_avg_pool3d: output_size must be an int or 3 values, got {output_size!r}")
    size = tuple(int(input.shape[-3 + i]) if s is None else int(s) for i, s in enumerate(size))
    return apply(ADAPTIVE_AVG_POOL3D, input, output_size=size)
