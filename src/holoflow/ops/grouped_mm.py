"""``F.grouped_mm`` (torch 2.13): the grouped GEMM of Mixture-of-Experts layers, one matrix product
per group, on torch's kernel (``torch._grouped_mm``: float32, bfloat16 or float16; every stride a
multiple of 16 bytes).

The four layouts, with ``offs`` (int32, increasing, ``offs[-1]`` at most the jagged length) ending
each group's slice of the jagged dimension of a 2-D operand:

============  ===========================  ==========================  ========================
``mat_a``     ``mat_b``                    jagged                      result
============  ===========================  ==========================  ========================
(M, K)        (G, K, N)                    rows of a (tokens)          (M, N)
(G, M, K)     (G, K, N)                    none (``offs`` None)        (G, M, N)
(G, M, K)     (K, N_total)                 columns of b                (M, N_total)
(M, K_total)  (K_total, N)                 the contraction (K)         (G, M, N)
============  ===========================  ==========================  ========================

The gradients are grouped products of the other layouts (closed under differentiation, as torch's
``GroupedMmBackward0``). Rows a jagged dimension leaves past ``offs[-1]`` are not written (torch's
values there are whatever the memory held).

On global tensors: the group dimension of two 3-D operands splits (expert parallelism); the
contraction dimension splits into partial sums; a free dimension of one operand splits its
result; ``offs`` is broadcast.
"""
from __future__ import annotations

import math

import torch

from ..core import dtype as _dtype
from ..core.dispatch import apply
from ..core.registry import Meta
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .family import defop, needs

__all__ = ["grouped_mm"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _mode(a_dim: int, b_dim: int) -> str:
    return f"{a_dim}d{b_dim}d"


def _shape(metas, attrs):
    a, b, offs = metas
    n_groups = offs.shape[0] if isinstance(offs, Meta) else None
    dtype = attrs["out_dtype"] or a.dtype
    mode = _mode(len(a.shape), len(b.shape))
    if mode == "2d3d":
        return (Meta((a.shape[0], b.shape[2]), dtype),)
    if mode == "3d3d":
        return (Meta((a.shape[0], a.shape[1], b.shape[2]), dtype),)
    if mode == "3d2d":
        return (Meta((a.shape[1], b.shape[1]), dtype),)
    return (Meta((n_groups, a.shape[0], b.shape[1]), dtype),)


def _kernel(a, b, offs, out_dtype):
    return torch._grouped_mm(a, b, offs=offs, out_dtype=out_dtype)


def _sbp(metas, attrs):
    """One axis's signatures, over (a, b[, offs]); offs always broadcast."""
    a, b, offs = metas
    tail = (B,) if isinstance(offs, Meta) else ()
    mode = _mode(len(a.shape), len(b.shape))
    sigs = [((B, B) + tail, (B,)), ((P, B) + tail, (P,)), ((B, P) + tail, (P,))]
    if mode == "2d3d":     # a (M, K), b (G, K, N) -> (M, N)
        sigs += [((S(1), S(1)) + tail, (P,)), ((B, S(2)) + tail, (S(1),))]
    elif mode == "3d3d":   # a (G, M, K), b (G, K, N) -> (G, M, N)
        sigs += [((S(0), S(0)), (S(0),)), ((S(1), B), (S(1),)), ((B, S(2)), (S(2),)), ((S(2), S(1)), (P,))]
    elif mode == "3d2d":   # a (G, M, K), b (K, N_total) -> (M, N_total)
        sigs += [((S(1), B) + tail, (S(0),)), ((S(2), S(0)) + tail, (P,))]
    else:                  # a (M, K_total), b (K_total, N) -> (G, M, N)
        sigs += [((S(0), B) + tail, (S(1),)), ((B, S(1)) + tail, (S(2),))]
    return sigs


def _flops(ins, outs, attrs) -> float:
    a, b = ins[0], ins[1]
    contraction = a[-1] if not (len(a) == 2 and len(b) == 2) else a[-1] / max(outs[0][0], 1)
    return 2.0 * math.prod(outs[0]) * contraction


def _t(x: Tensor) -> Tensor:
    return x.transpose(-2, -1)


def _grad(c, dy):
    """Each operand's gradient is a grouped product of the other layouts (see the module doc)."""
    a, b, offs = c.inputs
    dy = dy.contiguous()   # (the kernel refuses a broadcast seed's zero strides)
    da = db = None
    if needs(c, 0):
        # 2d3d: dy (M, N) . b^T (G, N, K) -> (M, K); 3d3d: (G, M, N) . (G, N, K); 3d2d: dy (M, N_total)
        # . b^T (N_total, K) -> (G, M, K); 2d2d: dy (G, M, N) . b^T (N, K_total) -> (M, K_total)
        da = grouped_mm(dy, _t(b), offs=offs)
    if needs(c, 1):
        # 2d3d: a^T (K, M) . dy (M, N) -> (G, K, N); 3d3d: (G, K, M) . (G, M, N); 3d2d: a^T (G, K, M)
        # . dy (M, N_total) -> (K, N_total); 2d2d: a^T (K_total, M) . dy (G, M, N) -> (K_total, N)
        db = grouped_mm(_t(a), dy, offs=offs)
    return da, db, None   # (offs: an index, no gradient)


GROUPED_MM = defop("grouped_mm", _kernel, grad=_grad, save="inputs", saved_inputs=lambda needs_: (
    {1} if needs_[0] else set()) | ({0} if needs_[1] else set()) | {2}, shape=_shape, sbp=_sbp,
    family="einsum", flops=_flops)


def grouped_mm(mat_a: Tensor, mat_b: Tensor, *, offs: Tensor | None = None, bias: Tensor | None = None,
               out_dtype=None) -> Tensor:
    """One matrix product per group, as ``torch.nn.functional.grouped_mm`` (see the module doc for
    the layouts ``offs`` delimits). Errors are torch's classes (RuntimeError), raised before the
    kernel with the shapes and dtypes named."""
    name = "holoflow.grouped_mm"
    if not isinstance(mat_a, Tensor) or not isinstance(mat_b, Tensor):
        raise TypeError(f"{name}: mat_a and mat_b must be tensors, got {type(mat_a).__name__} and "
                        f"{type(mat_b).__name__}")
    if bias is not None:
        raise RuntimeError(f"{name}: bias is not supported yet (as torch's)")
    da, db = mat_a.dim(), mat_b.dim()
    if da not in (2, 3) or db not in (2, 3):
        raise RuntimeError(f"{name}: mat_a and mat_b must be 2-D or 3-D, got shapes {tuple(mat_a.shape)} and "
                         f"{tuple(mat_b.shape)}")
    for what, t in (("mat_a", mat_a), ("mat_b", mat_b)):
        if t._data.dtype not in _DTYPES:
            raise RuntimeError(f"{name}: {what} must be float32, bfloat16 or float16, got {t.dtype}")
    if mat_a._data.dtype != mat_b._data.dtype:
        raise RuntimeError(f"{name}: mat_a and mat_b must have one dtype, got {mat_a.dtype} and {mat_b.dtype}")
    if (offs is None) != (da == 3 and db == 3):
        raise RuntimeError(f"{name}: offs must be given where an operand is 2-D, and only there (mat_a "
                           f"{tuple(mat_a.shape)}, mat_b {tuple(mat_b.shape)}, offs "
                           f"{'None' if offs is None else tuple(offs.shape)})")
    if offs is not None and (offs.dim() != 1 or offs._data.dtype != torch.int32):
        raise RuntimeError(f"{name}: offs must be a 1-D int32 tensor, got shape {tuple(offs.shape)} and "
                           f"dtype {offs.dtype}")
    k_a = mat_a.shape[-1]
    k_b = mat_b.shape[-2] if db == 3 else mat_b.shape[0]
    if k_a != k_b:
        raise RuntimeError(f"{name}: the contraction dimension of mat_a {tuple(mat_a.shape)} ({k_a}) and of "
                         f"mat_b {tuple(mat_b.shape)} ({k_b}) must match")
    if da == 3 and db == 3 and mat_a.shape[0] != mat_b.shape[0]:
        raise RuntimeError(f"{name}: 3-D operands must have one group count, got {mat_a.shape[0]} and "
                         f"{mat_b.shape[0]}")
    if offs is not None and 3 in (da, db):
        groups = (mat_a if da == 3 else mat_b).shape[0]
        if offs.shape[0] != groups:
            raise RuntimeError(f"{name}: offs has {offs.shape[0]} entries for {groups} groups")
    return apply(GROUPED_MM, mat_a, mat_b, offs, out_dtype=None if out_dtype is None else _dtype.to_torch(out_dtype))
