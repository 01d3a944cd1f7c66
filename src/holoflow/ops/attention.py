"""``scaled_dot_product_attention`` as a primitive.

On CPU, without a mask and with equal head sizes, forward and backward are torch's fused flash
kernels (``_scaled_dot_product_flash_attention_for_cpu[_backward]``): the forward also returns
the per-row logsumexp, which the fused backward takes with the output. Otherwise (masks,
differing value head size) the forward is torch's dispatcher and the backward op recomputes the
attention matrix and applies the math backward, so nothing of size L x S is kept between forward
and backward.

On CUDA (``FUSED_VJP_DEVICES``) the forward is torch's dispatcher, which picks its fused kernels
(flash, cuDNN or memory-efficient) in the inputs' dtype — the autocast dtype under autocast, as
the op is on autocast's lower-precision list (amp/policy.py) — and the backward is torch's own
backward of that call, in that dtype (no float32 score matrix, no ``masked_fill``). The forward
records torch's autograd node on detached aliases of q, k, v (and a float mask), and its second
output (a placeholder: of the logsumexp's shape without a mask, empty with one; the backend's own
logsumexp is in the node) carries the node's vector-Jacobian product to the backward op: torch's
backward kernel on what its forward saved (output, logsumexp, RNG state), no recomputed forward,
whatever the backend's private signatures in this torch version. A placeholder that lost it (a
copy, a redistribution) makes the backward record the forward again. torch.compile cannot trace
autograd, so on these devices the ops declare themselves ``opaque``: a graph compiled with
``enable_compile`` runs them in plain tasks between compiled ones. Double backward of either backward op
raises UnsupportedError. With ``dropout_p > 0`` the forward is the math path (as torch's CPU
kernel is), returning the scaled keep-mask that the backward reuses; that op is declared
``random``.

The backends torch's flags enable (``nn.attention.sdpa_kernel`` sets them) are recorded when the
op is applied (attr ``backends``, None for all: :func:`enabled_backends`): the CPU flash path runs
only where flash is enabled, and the dispatcher's calls run under the recorded set, so a graph
traced inside ``sdpa_kernel`` keeps its choice. ``CausalBias`` (``nn.attention.bias``) as a mask
runs as ``is_causal`` (upper-left) or as its materialized boolean mask (lower-right).
"""
from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

import torch
import torch.nn.functional as TF
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..core import generators, grad_mode
from ..core.dispatch import apply
from ..core.errors import ShapeError, UnsupportedError
from ..core.forward_ad import any_dual
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor

# Devices whose backward is torch's VJP of its own dispatcher call (fused kernels, any dtype);
# a module constant so CPU tests can run that path too.
FUSED_VJP_DEVICES = {"cuda"}


def _runs_autograd(device_type: str) -> bool:
    """The ops' ``opaque`` rule: on FUSED_VJP_DEVICES their kernels run torch's autograd."""
    return device_type in FUSED_VJP_DEVICES


def _scores(q, k, mask, is_causal, scale):
    s = q.shape[-1]
    scale = 1 / math.sqrt(s) if scale is None else scale
    acc = torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype
    scores = torch.matmul(q.to(acc), k.to(acc).transpose(-2, -1)) * scale
    if is_causal:
        L, S_ = q.shape[-2], k.shape[-2]
        scores = scores.masked_fill(~torch.ones(L, S_, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.to(acc)
    return scores, scale, acc


def _fusable(q_shape: tuple, k_shape: tuple, v_shape: tuple, has_mask: bool,
             backends: tuple | None = None) -> bool:
    """Whether torch's fused flash kernel computes this attention: the flash backend enabled
    (``backends``: :func:`enabled_backends` when the op was applied), no mask, equal head sizes,
    and non-empty L, S and E (batch dims may be empty: shards of uneven splits are)."""
    return (backends is None or backends[0]) and not has_mask and q_shape[:-2] == k_shape[:-2] == v_shape[:-2] \
        and q_shape[-1] == v_shape[-1] and min(q_shape[-2], k_shape[-2], q_shape[-1]) > 0


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """``x`` as (B, H, L, E) for torch's private CPU flash kernels, with a unit stride on E: those
    kernels read each row as dense memory and return garbage (NaN) for a transposed input whose last
    dim is strided (e.g. ``reshape(b, h, e, l).transpose(-1, -2)``), which the public call copies."""
    if x.dim() != 4:
        x = x.reshape(-1, x.shape[-3] if x.dim() > 2 else 1, *x.shape[-2:])
    return x if x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()


def _lse_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype


_SDP_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
                 SDPBackend.CUDNN_ATTENTION)


def enabled_backends() -> tuple | None:
    """The attention backends torch's flags enable now (``nn.attention.sdpa_kernel`` sets them), as
    (flash, memory-efficient, math, cuDNN) flags; None when all are (the default). An op records it when applied,
    and its kernels run under it, so a graph traced inside ``sdpa_kernel`` keeps the choice."""
    b = torch.backends.cuda
    on = (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled())
    return None if all(on) else on


def _only(backends: tuple | None):
    """torch's dispatcher restricted to ``backends`` (nothing to do for the default)."""
    if backends is None:
        return contextlib.nullcontext()
    return sdpa_kernel([b for b, on in zip(_SDP_BACKENDS, backends) if on])


def _sdpa_kernel(q, k, v, mask, is_causal, scale, backends=None):
    """(out, logsumexp): torch's fused flash kernel where :func:`_fusable` (logsumexp of the
    scaled scores per query row, what the fused backward needs); otherwise torch's dispatcher
    and an empty logsumexp (the math backward recomputes the scores)."""
    if any_dual(q, k, v, mask):   # (forward-mode AD: torch has formulas for its math path only)
        with sdpa_kernel(SDPBackend.MATH):
            out = TF.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
        return out, q.new_empty((0,), dtype=_lse_dtype(q))
    if not _fusable(q.shape, k.shape, v.shape, mask is not None, backends):
        lse = q.new_empty((0,), dtype=_lse_dtype(q))
        with _only(backends):
            if q.device.type in FUSED_VJP_DEVICES and q.numel() and k.numel() and grad_mode.is_grad_enabled():
                out, lse.holoflow_vjp = _recorded(q, k, v, mask, is_causal, scale)   # as below
                return out, lse
            return TF.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale), lse
    if q.numel() == 0:  # the CPU kernel does not take empty batches
        return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=_lse_dtype(q))
    if q.device.type in FUSED_VJP_DEVICES:   # torch's fused call, its node kept where a backward may follow
        lse = q.new_empty(q.shape[:-1], dtype=_lse_dtype(q))
        if not grad_mode.is_grad_enabled():
            return TF.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale), lse
        out, lse.holoflow_vjp = _recorded(q, k, v, None, is_causal, scale)
        return out, lse
    out, lse = torch._scaled_dot_product_flash_attention_for_cpu(
        _as_4d(q), _as_4d(k), _as_4d(v), 0.0, is_causal, scale=scale)
    if q.dim() == 4:
        return out, lse
    return out.reshape(q.shape), lse.reshape(q.shape[:-1])


def _sdpa_fused_bwd_kernel(dy, q, k, v, out, lse, is_causal, scale):
    """(dq, dk, dv) of the fused forward: torch's flash backward on CPU, the math backward elsewhere."""
    if q.numel() == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if q.device.type in FUSED_VJP_DEVICES:
        return _node_or_recompute(lse, dy, q, k, v, None, is_causal, scale)[:3]
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        _as_4d(dy), _as_4d(q), _as_4d(k), _as_4d(v), _as_4d(out), lse.reshape(_as_4d(q).shape[:-1]), 0.0,
        is_causal, scale=scale)
    if q.dim() == 4:
        return tuple(grads)
    return tuple(g.reshape(x.shape) for g, x in zip(grads, (q, k, v)))


def _sdpa_dropout_kernel(q, k, v, mask, is_causal, scale, dropout_p, generator=None):
    scores, _, acc = _scores(q, k, mask, is_causal, scale)
    attn = torch.ops.aten._safe_softmax(scores, -1)   # torch's math attention: a fully masked row is 0
    keep = torch.empty_like(attn).bernoulli_(1 - dropout_p, generator=generator).div_(1 - dropout_p)
    return torch.matmul((attn * keep).to(q.dtype), v), keep


def _no_mask_grad(q: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=q.dtype, device=q.device).expand(0)


def _recorded(q, k, v, mask, is_causal, scale):
    """torch's ``scaled_dot_product_attention`` with its autograd node recorded on detached
    aliases of q, k, v (and a float mask: it is differentiable), no copies: (output, vjp) where
    ``vjp(dy)`` is (dq, dk, dv, dmask) by torch's backward of this very call, in q's dtype (dmask
    an empty placeholder for a bool or no mask). The node, and what it saved, lives as long as
    ``vjp``; the graph is retained, so a second backward (``retain_graph``) works too."""
    diff_mask = mask is not None and mask.is_floating_point()
    with torch.enable_grad():
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        m_ = mask.detach().requires_grad_() if diff_mask else mask
        out = TF.scaled_dot_product_attention(q_, k_, v_, attn_mask=m_, is_causal=is_causal, scale=scale)
    wrt = (q_, k_, v_, m_) if diff_mask else (q_, k_, v_)

    def vjp(dy: torch.Tensor) -> tuple:
        grads = torch.autograd.grad(out, wrt, dy.to(out.dtype), retain_graph=True)
        return (*grads[:3], grads[3].to(mask.dtype) if diff_mask else _no_mask_grad(q))
    return out.detach(), vjp


def _node_or_recompute(lse, dy, q, k, v, mask, is_causal, scale) -> tuple:
    """(dq, dk, dv, dmask) by the node the forward kept on ``lse``, or, where it was lost (a copy,
    a redistribution), by recording the forward again."""
    vjp = getattr(lse, "holoflow_vjp", None) if lse is not None else None
    if vjp is None:
        vjp = _recorded(q, k, v, mask, is_causal, scale)[1]
    return vjp(dy)


def _sdpa_bwd_kernel(dy, q, k, v, mask, keep, is_causal, scale, lse=None):
    """Math backward of softmax(q k^T * scale + mask) [* keep] @ v, computed in float32 for
    reduced precision; returns (dq, dk, dv, dmask) with dmask reduced to the mask's shape.
    Without dropout on ``FUSED_VJP_DEVICES``: torch's fused backward, by the node the forward
    kept on its placeholder ``lse``."""
    if keep is None and q.device.type in FUSED_VJP_DEVICES:
        return _node_or_recompute(lse, dy, q, k, v, mask, is_causal, scale)
    scores, scale, acc = _scores(q, k, mask, is_causal, scale)
    attn = torch.ops.aten._safe_softmax(scores, -1)   # as torch's math forward: a fully masked row is 0
    dy_, v_ = dy.to(acc), v.to(acc)
    dropped = attn if keep is None else attn * keep
    dv = torch.matmul(dropped.transpose(-2, -1), dy_)
    dattn = torch.matmul(dy_, v_.transpose(-2, -1))
    if keep is not None:
        dattn = dattn * keep
    ds = attn * (dattn - (dattn * attn).sum(-1, keepdim=True))
    dq = torch.matmul(ds, k.to(acc)) * scale
    dk = torch.matmul(ds.transpose(-2, -1), q.to(acc)) * scale
    if mask is not None and mask.is_floating_point():
        dmask = ds.sum_to_size(mask.shape).to(mask.dtype)
    else:
        dmask = _no_mask_grad(q)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dmask


def _batch_axes(q: Meta, k: Meta, v: Meta) -> list[int]:
    """The batch axes (heads included) that q, k and v share: the axes attention may be split on."""
    if not len(k.shape) == len(v.shape) == len(q.shape):
        return []
    return [a for a in range(len(q.shape) - 2) if q.shape[a] == k.shape[a] == v.shape[a]]


def _follow(m, q: Meta, a: int):
    """A mask (or keep-mask) follows q's split on axis ``a`` where it has that axis, else B."""
    if not isinstance(m, Meta):
        return B
    off = len(m.shape) - len(q.shape) + a
    return S(off) if off >= 0 and m.shape[off] == q.shape[a] and m.shape[off] > 1 else B


def _sdpa_sbp(metas, attrs):
    """Split on any shared batch axis: q, k, v and out; a mask where it has that axis (else B);
    the logsumexp too when the fused kernel made it (else it is an empty placeholder, B), and
    the dropout keep-mask like a mask."""
    q, k, v, mask = metas[:4]
    real_second = "dropout_p" in attrs or _fusable(q.shape, k.shape, v.shape, isinstance(mask, Meta),
                                                    attrs.get("backends"))
    masks = [mask] if isinstance(mask, Meta) else []
    sigs = [((B,) * (3 + len(masks)), (B, B))]
    for a in _batch_axes(q, k, v):
        sigs.append(((S(a), S(a), S(a), *(_follow(m, q, a) for m in masks)), (S(a), S(a) if real_second else B)))
    return sigs


def _sdpa_bwd_sbp(metas, attrs):
    """The unfused backward (dy, q, k, v, mask, keep, lse): split like the forward; dmask is split
    too where the mask has the axis, else a partial sum; the forward's placeholder lse is B."""
    dy, q, k, v, mask, keep, lse = metas
    extra = [m for m in (mask, keep) if isinstance(m, Meta)]  # absent ones are not tensor inputs
    tail = (B,) if isinstance(lse, Meta) else ()
    sigs = [((B,) * (4 + len(extra)) + tail, (B,) * 4)]
    for a in _batch_axes(q, k, v):
        sigs.append(((S(a),) * 4 + tuple(_follow(m, q, a) for m in extra) + tail,
                     (S(a),) * 3 + (_dmask_sbp(mask, q, a),)))
    return sigs


def _sdpa_fused_bwd_sbp(metas, attrs):
    """The fused backward (dy, q, k, v, out, lse): everything split on a shared batch axis."""
    q, k, v = metas[1:4]
    return [((B,) * 6, (B,) * 3)] + [((S(a),) * 6, (S(a),) * 3) for a in _batch_axes(q, k, v)]


def _dmask_sbp(mask, q, a):
    if not isinstance(mask, Meta) or not mask.dtype.is_floating_point:
        return B  # an empty placeholder
    off = len(mask.shape) - len(q.shape) + a
    return S(off) if off >= 0 and mask.shape[off] == q.shape[a] and mask.shape[off] > 1 else P


def _no_double(ctx, *dys):
    raise UnsupportedError(f"holoflow.{ctx.op.name}: double backward is not implemented (differentiate "
                           f"a math attention written with matmul/softmax instead)")


def _math_grad(c, dy, keep, lse=None):
    q, k, v, mask = c.inputs[:4]
    dq, dk, dv, dmask = apply(SDPA_BWD, dy, q, k, v, mask, keep, lse, is_causal=c.is_causal, scale=c.scale,
                              keep_given=keep is not None)
    want_mask = mask is not None and c.needs_grad[3]
    return dq, dk, dv, dmask if want_mask else None


def _sdpa_grad(c, dy, _dlse):
    q, k, v, mask = c.inputs[:4]
    out, lse = c.outs
    if not _fusable(tuple(q.shape), tuple(k.shape), tuple(v.shape), mask is not None, c.backends):
        return _math_grad(c, dy, None, lse)
    return (*apply(SDPA_FUSED_BWD, dy, q, k, v, out, lse, is_causal=c.is_causal, scale=c.scale), None)


def _sdpa_dropout_grad(c, dy, _dkeep):
    return _math_grad(c, dy, c.outs[1])


def _sdpa_flops(ins, outs, attrs) -> float:   # q @ k^T and p @ v: 2 x 2 x |q| x Lk
    return 4.0 * math.prod(ins[0]) * ins[1][-2]


def _sdpa_bwd_flops(ins, outs, attrs) -> float:   # (dy, q, k, ...): ~2.5x the forward
    return 10.0 * math.prod(ins[1]) * ins[2][-2]


SDPA_BWD = defop("scaled_dot_product_attention_backward",
                 lambda dy, q, k, v, mask, keep, lse, is_causal, scale, keep_given:
                 _sdpa_bwd_kernel(dy, q, k, v, mask, keep, is_causal, scale, lse),
                 grad=_no_double, sbp=_sdpa_bwd_sbp, family="attention", amp_keep=(6,), opaque=_runs_autograd,
                 flops=_sdpa_bwd_flops)
SDPA_FUSED_BWD = defop("scaled_dot_product_attention_fused_backward", _sdpa_fused_bwd_kernel, grad=_no_double,
                       sbp=_sdpa_fused_bwd_sbp, family="attention", amp_keep=(5,), opaque=_runs_autograd,
                       flops=_sdpa_bwd_flops)
SDPA = defop("scaled_dot_product_attention", _sdpa_kernel, grad=_sdpa_grad, save="both", sbp=_sdpa_sbp,
             outputs=("out", "logsumexp"), grad_reads=(0,), family="attention", opaque=_runs_autograd,
             flops=_sdpa_flops)
SDPA_DROPOUT = defop("scaled_dot_product_attention_dropout", _sdpa_dropout_kernel, grad=_sdpa_dropout_grad,
                     save="both", sbp=_sdpa_sbp, outputs=("out", "keep"), grad_reads=(0,), random=True,
                     family="attention", flops=_sdpa_flops)


def _repeat_kv_heads(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    if min(query.dim(), key.dim(), value.dim()) < 3:
        raise IndexError("holoflow.scaled_dot_product_attention: enable_gqa needs a heads dim -3, got query "
                         f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
    hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
    if hq % hk or hq % hv:
        raise RuntimeError(f"holoflow.scaled_dot_product_attention: Number of heads in key and value must divide "
                           f"the number of heads in query, got {hk} and {hv} for {hq}")
    return (key.repeat_interleave(hq // hk, -3) if hk != hq else key,
            value.repeat_interleave(hq // hv, -3) if hv != hq else value)


def causal_variant() -> type:
    """torch's ``CausalVariant`` enum, imported at first use: its module imports torch._dynamo,
    about half of ``import holoflow``'s time were it imported with this one."""
    from torch.nn.attention.bias import CausalVariant
    return CausalVariant


class CausalBias:
    """A causal mask described, not materialized (``torch.nn.attention.bias.CausalBias``): the
    upper-left variant (``tril`` of the (L, S) scores, as ``is_causal``) or the lower-right one
    (aligned to the scores' last row: ``tril(diagonal=S - L)``). As ``attn_mask`` of
    :func:`scaled_dot_product_attention` the upper-left one runs as ``is_causal`` (the fused
    kernel where it applies); ``_materialize`` (torch's name) gives the boolean mask."""

    def __init__(self, variant: Any, seq_len_q: int, seq_len_kv: int) -> None:
        CausalVariant = causal_variant()
        if not isinstance(variant, CausalVariant):
            raise AssertionError(f"variant must be a CausalVariant, got {type(variant).__name__}")
        self.variant, self.seq_len_q, self.seq_len_kv = variant, seq_len_q, seq_len_kv
        if seq_len_q > seq_len_kv and variant == CausalVariant.LOWER_RIGHT:
            warnings.warn("Lower right causal bias will produce NaNs in the output when seq_len_q > seq_len_kv!",
                          stacklevel=2)

    def _materialize(self, device: Any = None) -> Tensor:
        offset = 0 if self.variant == causal_variant().UPPER_LEFT else self.seq_len_kv - self.seq_len_q
        mask = torch.ones(self.seq_len_q, self.seq_len_kv, dtype=torch.bool,
                          device=None if device is None else torch.device(str(device))).tril(offset)
        return Tensor._make(mask)

    def __repr__(self) -> str:
        return repr(self._materialize())


def _causal_bias(attn_mask: CausalBias, query: Tensor, key: Tensor) -> tuple[Tensor | None, bool]:
    """(attn_mask, is_causal) for a CausalBias mask of (L, S) = the scores' last two dims."""
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (query.shape[-2], key.shape[-2]):
        raise ShapeError(f"holoflow.scaled_dot_product_attention: a causal bias of {attn_mask.seq_len_q} x "
                         f"{attn_mask.seq_len_kv} for query length {query.shape[-2]} and key length {key.shape[-2]}")
    if attn_mask.variant == causal_variant().UPPER_LEFT or attn_mask.seq_len_q == attn_mask.seq_len_kv:
        return None, True
    mask = attn_mask._materialize(query.device)
    if query.is_global:   # (every rank's mask alike: broadcast on the query's placement)
        mask = mask.to_global(query.placement, [B] * query.placement.ndim)
    return mask, False


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | CausalBias | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``softmax(q k^T * scale + mask) @ v`` over the last two dims; a bool mask keeps where
    True, a float mask is added; ``is_causal`` masks the upper triangle. ``enable_gqa``: key and
    value have fewer heads (dim -3) than the query, each shared by a group of query heads (they
    are repeated, as torch's math path does)."""
    if isinstance(attn_mask, CausalBias):
        if is_causal:
            raise ValueError("holoflow.scaled_dot_product_attention: a CausalBias attn_mask is causal already; "
                             "pass is_causal=False")
        attn_mask, is_causal = _causal_bias(attn_mask, query, key)
    if enable_gqa:
        key, value = _repeat_kv_heads(query, key, value)
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim() \
            or query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ShapeError(f"holoflow.scaled_dot_product_attention: query {tuple(query.shape)}, key "
                         f"{tuple(key.shape)} and value {tuple(value.shape)} must be (..., L, E), (..., S, E) "
                         f"and (..., S, Ev)")
    if is_causal and attn_mask is not None:
        raise ValueError("holoflow.scaled_dot_product_attention: give attn_mask or is_causal, not both")
    if dropout_p > 0:
        g = generators.for_op(None, query)   # (a simulated rank's own)
        return apply(SDPA_DROPOUT, query, key, value, attn_mask, is_causal=is_causal, scale=scale,
                     dropout_p=float(dropout_p), **({} if g is None else {"generator": g})).out
    return apply(SDPA, query, key, value, attn_mask, is_causal=is_causal, scale=scale,
                 backends=enabled_backends()).out


__all__ = ["scaled_dot_product_attention"]   # (CausalBias: holoflow.nn.attention.bias)
