"""``nn.functional.multi_head_attention_forward``: torch's functional multi-head attention, the
computation of ``nn.MultiheadAttention`` (which calls it with its parameters), for code that
holds the weights itself (static keys and values, separate projection weights)."""
from __future__ import annotations

import math
from typing import Any

from ..core import dtype as _dtype
from ..core.tensor import Tensor
from ..ops.attention import scaled_dot_product_attention
from ..ops.creation import zeros
from ..ops.layout import pad
from ..ops.linalg import linear, matmul
from ..ops.nn_ops import softmax
from ..ops.random_ops import dropout
from ..ops.shape import cat

__all__ = ["multi_head_attention_forward"]


def _float_mask(mask: Tensor | None, dtype: Any, name: str) -> Tensor | None:
    """A boolean mask (True = not allowed) becomes an additive float mask of ``-inf``/``0``."""
    if mask is None:
        return None
    if mask.dtype == _dtype.bool:
        return zeros(*mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    if not mask.is_floating_point():
        raise AssertionError(f"only bool and floating types of {name} are supported")
    return mask.to(dtype)


def _check_dims(query: Tensor, key: Tensor, value: Tensor, key_padding_mask, attn_mask, num_heads: int) -> None:
    """torch's shape check, with its class (AssertionError): a 2-D (unbatched) or 3-D query, key
    and value alike, a key padding mask of one dim less, a 2-D or 3-D attention mask."""
    q = query.dim()
    if q not in (2, 3):
        raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but received {q}-D query tensor")
    kind = "batched (3-D)" if q == 3 else "unbatched (2-D)"
    if key.dim() != q or value.dim() != q:
        raise AssertionError(f"For {kind} `query`, expected `key` and `value` to be {q}-D but found {key.dim()}-D "
                             f"and {value.dim()}-D tensors respectively")
    if key_padding_mask is not None and key_padding_mask.dim() != q - 1:
        raise AssertionError(f"For {kind} `query`, expected `key_padding_mask` to be `None` or {q - 1}-D but found "
                             f"{key_padding_mask.dim()}-D tensor instead")
    if attn_mask is not None and attn_mask.dim() not in (2, 3):
        raise AssertionError(f"For {kind} `query`, expected `attn_mask` to be `None`, 2-D or 3-D but found "
                             f"{attn_mask.dim()}-D tensor instead")
    want = (num_heads, query.shape[0], key.shape[0])
    if q == 2 and attn_mask is not None and attn_mask.dim() == 3 and tuple(attn_mask.shape) != want:
        raise AssertionError(f"Expected `attn_mask` shape to be {want} but got {tuple(attn_mask.shape)}")


def _check_key_value(key: Tensor, value: Tensor, separate: bool) -> None:
    """torch's: packed projections take keys and values of one shape; separate ones, one sequence
    and batch (AssertionError)."""
    if separate and tuple(key.shape[:-1]) != tuple(value.shape[:-1]):
        raise AssertionError(f"key's sequence and batch dims {tuple(key.shape[:-1])} do not match value's "
                             f"{tuple(value.shape[:-1])}")
    if not separate and tuple(key.shape) != tuple(value.shape):
        raise AssertionError(f"key shape {tuple(key.shape)} does not match value shape {tuple(value.shape)}")


def _check_attn_mask(mask: Tensor | None, full: tuple) -> None:
    """A 2-D attention mask is ``(L, S)``, a 3-D one ``(N * num_heads, L, S)``: exactly, as torch
    (RuntimeError); a broadcastable one is refused, not broadcast."""
    if mask is None:
        return
    want = full[1:] if mask.dim() == 2 else full
    if tuple(mask.shape) != want:
        raise RuntimeError(f"The shape of the {mask.dim()}D attn_mask is {tuple(mask.shape)}, but should be {want}.")


def _check_static(t: Tensor | None, name: str, rows: int, head_dim: int) -> None:
    for i, want in ((0, rows), (2, head_dim)):
        if t is not None and t.shape[i] != want:
            raise AssertionError(f"expecting {name}.size({i}) of {want}, but got {t.shape[i]}")


def _in_projection_packed(query: Tensor, key: Tensor, value: Tensor, w: Tensor,
                          b: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v by the packed ``in_proj_weight`` as torch's: one matmul for self-attention (``query
    is key is value``), one for q and one for the packed k, v where ``key is value``, three
    otherwise. One matmul is one bfloat16 rounding of the input's gradient where three
    products' gradients would each be rounded before they are summed."""
    E = query.shape[-1]
    if key is value:
        if query is key:
            proj = linear(query, w, b).unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
            return proj[0], proj[1], proj[2]
        w_q, w_kv = w.split([E, 2 * E])
        b_q, b_kv = (None, None) if b is None else b.split([E, 2 * E])
        kv = linear(key, w_kv, b_kv).unflatten(-1, (2, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
        return linear(query, w_q, b_q), kv[0], kv[1]
    w_q, w_k, w_v = w.chunk(3)
    b_q, b_k, b_v = (None,) * 3 if b is None else b.chunk(3)
    return linear(query, w_q, b_q), linear(key, w_k, b_k), linear(value, w_v, b_v)


def multi_head_attention_forward(
        query: Tensor, key: Tensor, value: Tensor, embed_dim_to_check: int, num_heads: int,
        in_proj_weight: Tensor | None, in_proj_bias: Tensor | None, bias_k: Tensor | None, bias_v: Tensor | None,
        add_zero_attn: bool, dropout_p: float, out_proj_weight: Tensor, out_proj_bias: Tensor | None,
        training: bool = True, key_padding_mask: Tensor | None = None, need_weights: bool = True,
        attn_mask: Tensor | None = None, use_separate_proj_weight: bool = False, q_proj_weight: Tensor | None = None,
        k_proj_weight: Tensor | None = None, v_proj_weight: Tensor | None = None, static_k: Tensor | None = None,
        static_v: Tensor | None = None, average_attn_weights: bool = True,
        is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
    """Multi-head attention of ``(L, N, E)`` inputs (or unbatched ``(L, E)``), as torch's:
    projections (packed ``in_proj_weight`` or ``use_separate_proj_weight``), ``bias_k``/``bias_v``
    and ``add_zero_attn`` appended to the keys and values, ``static_k``/``static_v`` (``(N *
    num_heads, S, head_dim)``) in place of the projected ones, masks (bool: True = not allowed, or
    additive), dropout on the weights in training; returns the output and, with ``need_weights``,
    the weights (averaged over heads with ``average_attn_weights``)."""
    _check_dims(query, key, value, key_padding_mask, attn_mask, num_heads)
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                           "Transformer module method `generate_square_subsequent_mask` to create this mask.")
    tgt_len, bsz, E = query.shape
    if E != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, but got {E}")
    H = num_heads
    hd = E // H
    if hd * H != E:
        raise AssertionError(f"embed_dim {E} not divisible by num_heads {H}")
    _check_key_value(key, value, use_separate_proj_weight)
    b_q, b_k, b_v = (None,) * 3 if in_proj_bias is None else (in_proj_bias[:E], in_proj_bias[E:2 * E],
                                                              in_proj_bias[2 * E:])
    if use_separate_proj_weight:
        q, k, v = linear(query, q_proj_weight, b_q), linear(key, k_proj_weight, b_k), linear(value, v_proj_weight, b_v)
    else:
        q, k, v = _in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)
    attn_mask = _float_mask(attn_mask, q.dtype, "attn_mask")
    key_padding_mask = _float_mask(key_padding_mask, q.dtype, "key_padding_mask")
    _check_attn_mask(attn_mask, (bsz * H, tgt_len, key.shape[0]))
    if attn_mask is not None and attn_mask.dim() == 2:
        attn_mask = attn_mask.unsqueeze(0)
    if (bias_k is None) != (bias_v is None):
        raise AssertionError(f"{'bias_k' if bias_v is None else 'bias_v'} is set but "
                             f"{'bias_v' if bias_v is None else 'bias_k'} is None")
    if bias_k is not None and bias_v is not None:
        if static_k is not None or static_v is not None:
            raise AssertionError(f"bias cannot be added to static {'key' if static_k is not None else 'value'}.")
        k, v = cat([k, bias_k.repeat(1, bsz, 1)]), cat([v, bias_v.repeat(1, bsz, 1)])
        attn_mask = pad(attn_mask, (0, 1)) if attn_mask is not None else None
        key_padding_mask = pad(key_padding_mask, (0, 1)) if key_padding_mask is not None else None
    _check_static(static_k, "static_k", bsz * H, hd)
    _check_static(static_v, "static_v", bsz * H, hd)
    q = q.reshape(tgt_len, bsz * H, hd).transpose(0, 1)
    k = static_k if static_k is not None else k.reshape(k.shape[0], bsz * H, hd).transpose(0, 1)
    v = static_v if static_v is not None else v.reshape(v.shape[0], bsz * H, hd).transpose(0, 1)
    if add_zero_attn:
        k = cat([k, zeros(bsz * H, 1, hd, dtype=k.dtype, device=k.device)], dim=1)
        v = cat([v, zeros(bsz * H, 1, hd, dtype=v.dtype, device=v.device)], dim=1)
        attn_mask = pad(attn_mask, (0, 1)) if attn_mask is not None else None
        key_padding_mask = pad(key_padding_mask, (0, 1)) if key_padding_mask is not None else None
    src_len = k.shape[1]
    if key_padding_mask is not None:
        for i, want in enumerate((bsz, src_len)):
            if key_padding_mask.shape[i] != want:
                raise AssertionError(f"Expected key_padded_mask.shape[{i}] to be {want}, but got "
                                     f"{key_padding_mask.shape[i]}")
        kpm = key_padding_mask.reshape(bsz, 1, 1, src_len).expand(-1, H, -1, -1).reshape(bsz * H, 1, src_len)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    dropout_p = dropout_p if training else 0.0
    if need_weights:
        scores = matmul(q * (1.0 / math.sqrt(hd)), k.transpose(-2, -1))
        if attn_mask is not None:
            scores = scores + attn_mask
        weights = softmax(scores, dim=-1)
        if dropout_p > 0.0:
            weights = dropout(weights, p=dropout_p)
        out = matmul(weights, v)
    else:
        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(0) if attn_mask.shape[0] == 1 else attn_mask.reshape(bsz, H, -1, src_len)
        out = scaled_dot_product_attention(q.reshape(bsz, H, tgt_len, hd), k.reshape(bsz, H, src_len, hd),
                                           v.reshape(bsz, H, src_len, hd), attn_mask, dropout_p)
        out = out.reshape(bsz * H, tgt_len, hd)
        weights = None
    out = out.transpose(0, 1).reshape(tgt_len * bsz, E)
    out = linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, E)
    if weights is not None:
        weights = weights.reshape(bsz, H, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
    if unbatched:
        return out.squeeze(1), (weights.squeeze(0) if weights is not None else None)
    return out, weights
