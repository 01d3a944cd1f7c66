"""``scaled_dot_product_attention`` as a primitive.

Forward runs torch's fused kernel (flash/memory-efficient where available). The backward op
recomputes the attention matrix (as flash attention's backward does) and applies the math
backward, so nothing of size L x S is kept between forward and backward. With ``dropout_p > 0``
the forward is the math path (as torch's CPU kernel is), returning the scaled keep-mask that the
backward reuses; that op is declared ``random``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as TF

from ..core.dispatch import apply
from ..core.errors import ShapeError, UnsupportedError
from ..core.registry import Meta, defop
from ..core.sbp import B, S
from ..core.tensor import Tensor


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


def _sdpa_kernel(q, k, v, mask, is_causal, scale):
    return TF.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)


def _sdpa_dropout_kernel(q, k, v, mask, is_causal, scale, dropout_p):
    scores, _, acc = _scores(q, k, mask, is_causal, scale)
    attn = torch.softmax(scores, -1)
    keep = torch.empty_like(attn).bernoulli_(1 - dropout_p).div_(1 - dropout_p)
    return torch.matmul((attn * keep).to(q.dtype), v), keep


def _sdpa_bwd_kernel(dy, q, k, v, mask, keep, is_causal, scale):
    """Math backward of softmax(q k^T * scale + mask) [* keep] @ v, computed in float32 for
    reduced precision; returns (dq, dk, dv, dmask) with dmask reduced to the mask's shape."""
    scores, scale, acc = _scores(q, k, mask, is_causal, scale)
    attn = torch.softmax(scores, -1)
    dy_, v_ = dy.to(acc), v.to(acc)
    dropped = attn if keep is None else attn * keep
    dv = torch.matmul(dropped.transpose(-2, -1), dy_)
    dattn = torch.matmul(dy_, v_.transpose(-2, -1))
    if keep is not None:
        dattn = dattn * keep
    ds = attn * (dattn - (dattn * attn).sum(-1, keepdim=True))
    ds = torch.nan_to_num(ds)   # fully masked rows have no gradient
    dq = torch.matmul(ds, k.to(acc)) * scale
    dk = torch.matmul(ds.transpose(-2, -1), q.to(acc)) * scale
    if mask is not None and mask.is_floating_point():
        dmask = ds.sum_to_size(mask.shape).to(mask.dtype)
    else:
        dmask = torch.zeros((), dtype=q.dtype, device=q.device).expand(0)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dmask


def _sdpa_sbp(metas, attrs):
    """Split on any batch axis (heads included) that q, k and v share; a mask follows where it
    has that axis (else B); the backward's dmask is then split too or a partial sum."""
    q, k, v = metas[:3]
    rest = [m for m in metas[3:] if isinstance(m, Meta)]
    is_bwd = "keep_given" in attrs
    if is_bwd:
        dy, q, k, v = metas[:4]
        rest = [m for m in metas[4:] if isinstance(m, Meta)]
    nb = len(q.shape) - 2
    n_in = (4 if is_bwd else 3) + len(rest)
    n_out = 4 if is_bwd else (2 if "dropout_p" in attrs else 1)
    sigs = [((B,) * n_in, (B,) * n_out)]
    for a in range(nb):
        if not (len(k.shape) == len(v.shape) == len(q.shape) and q.shape[a] == k.shape[a] == v.shape[a]):
            continue
        ins = [S(a)] * (4 if is_bwd else 3)
        for m in rest:  # mask (and keep): broadcast along a -> B
            off = len(m.shape) - len(q.shape) + a
            ins.append(S(off) if off >= 0 and m.shape[off] == q.shape[a] and m.shape[off] > 1 else B)
        outs = [S(a)] * n_out
        if is_bwd:
            outs = [S(a)] * 3 + [_dmask_sbp(metas[4], q, a)]
        sigs.append((tuple(ins), tuple(outs)))
    return sigs


def _dmask_sbp(mask, q, a):
    from ..core.sbp import P
    if not isinstance(mask, Meta) or not mask.dtype.is_floating_point:
        return B  # an empty placeholder
    off = len(mask.shape) - len(q.shape) + a
    return S(off) if off >= 0 and mask.shape[off] == q.shape[a] and mask.shape[off] > 1 else P


def _no_double(ctx, *dys):
    raise UnsupportedError("holoflow.scaled_dot_product_attention_backward: double backward is not implemented")


def _sdpa_grad(c, *dys):
    q, k, v, mask = c.inputs[:4]
    keep = c.outs[1] if len(dys) > 1 else None
    dq, dk, dv, dmask = apply(SDPA_BWD, dys[0], q, k, v, mask, keep, is_causal=c.is_causal, scale=c.scale,
                              keep_given=keep is not None)
    want_mask = mask is not None and c.needs_grad[3]
    return dq, dk, dv, dmask if want_mask else None


SDPA_BWD = defop("scaled_dot_product_attention_backward",
                 lambda dy, q, k, v, mask, keep, is_causal, scale, keep_given:
                 _sdpa_bwd_kernel(dy, q, k, v, mask, keep, is_causal, scale),
                 grad=_no_double, sbp=_sdpa_sbp, family="attention")
SDPA = defop("scaled_dot_product_attention", _sdpa_kernel, grad=_sdpa_grad, save="inputs", sbp=_sdpa_sbp,
             family="attention")
SDPA_DROPOUT = defop("scaled_dot_product_attention_dropout", _sdpa_dropout_kernel, grad=_sdpa_grad,
                     save="both", sbp=_sdpa_sbp, outputs=("out", "keep"), random=True, family="attention")


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``softmax(q k^T * scale + mask) @ v`` over the last two dims; a bool mask keeps where
    True, a float mask is added; ``is_causal`` masks the upper triangle."""
    if enable_gqa:
        raise UnsupportedError("holoflow.scaled_dot_product_attention: enable_gqa is not supported")
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim() \
            or query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ShapeError(f"holoflow.scaled_dot_product_attention: query {tuple(query.shape)}, key "
                         f"{tuple(key.shape)} and value {tuple(value.shape)} must be (..., L, E), (..., S, E) "
                         f"and (..., S, Ev)")
    if is_causal and attn_mask is not None:
        raise ValueError("holoflow.scaled_dot_product_attention: give attn_mask or is_causal, not both")
    if dropout_p > 0:
        return apply(SDPA_DROPOUT, query, key, value, attn_mask, is_causal=is_causal, scale=scale,
                     dropout_p=float(dropout_p)).out
    return apply(SDPA, query, key, value, attn_mask, is_causal=is_causal, scale=scale)


__all__ = ["scaled_dot_product_attention"]
