"""``holoflow.nn.attention.flex_attention``, as ``torch.nn.attention.flex_attention``: attention
whose scores a Python function modifies (``score_mod``) and whose sparsity a mask function
describes (``mask_mod`` in a :class:`BlockMask`).

This is the reference computation, written with holoflow ops: the (B, H, L, S) scores are
materialized, ``score_mod(score, b, h, q_idx, kv_idx)`` and ``mask_mod(b, h, q_idx, kv_idx)`` are
called once on broadcasting index tensors (``b`` of shape (B, 1, 1, 1), ``h`` (1, H, 1, 1),
``q_idx`` (1, 1, L, 1), ``kv_idx`` (1, 1, 1, S)), so a mod written elementwise (comparisons,
``where``, arithmetic, indexing a captured tensor with the indices) computes every score at once.
Being ops, it differentiates (the captured tensors of a ``score_mod`` get gradients: torch's CPU
kernel has no backward), runs on global tensors (the indices are then broadcast on the query's
placement; tensors a mod captures must be global too) and in nn.Graph; its memory is that of the math
attention (torch's fused kernels skip the masked blocks). A row every key is masked out of gives
zeros and a logsumexp of -inf, as torch's.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.nn.attention.flex_attention import AuxOutput, AuxRequest

from ...core.sbp import B as SBP_B
from ...core.tensor import Tensor
from ...ops.creation import arange
from ...ops.linalg import matmul
from ...ops.reduction import amax, logsumexp

__all__ = ["BlockMask", "flex_attention", "AuxOutput", "AuxRequest", "FlexKernelOptions", "create_block_mask",
           "create_mask", "or_masks", "and_masks", "noop_mask"]

_DEFAULT_BLOCK = 128
FlexKernelOptions = dict   # (torch's TypedDict of Triton tuning knobs: accepted and ignored here)


def noop_mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """Keeps every score (made of the indices, so it is global where they are)."""
    return (q_idx >= 0) & (kv_idx >= 0)


def and_masks(*mask_mods: Callable) -> Callable:
    """A mask_mod keeping a score where every one of ``mask_mods`` does."""
    if not all(callable(m) for m in mask_mods):
        raise RuntimeError(f"holoflow.and_masks: all inputs should be callable, got {mask_mods!r}")

    def mask(b, h, q_idx, kv_idx):
        keep = noop_mask(b, h, q_idx, kv_idx)
        for m in mask_mods:
            keep = keep & m(b, h, q_idx, kv_idx)
        return keep
    return mask


def or_masks(*mask_mods: Callable) -> Callable:
    """A mask_mod keeping a score where any of ``mask_mods`` does."""
    if not all(callable(m) for m in mask_mods):
        raise RuntimeError(f"holoflow.or_masks: all inputs should be callable, got {mask_mods!r}")

    def mask(b, h, q_idx, kv_idx):
        keep = ~noop_mask(b, h, q_idx, kv_idx)
        for m in mask_mods:
            keep = keep | m(b, h, q_idx, kv_idx)
        return keep
    return mask


def _indices(B: int, H: int, L: int, S: int, device: Any, like: Tensor | None = None) -> tuple:
    """(b, h, q_idx, kv_idx) as int64 tensors broadcasting to (B, H, L, S): on ``device``, or
    broadcast on the placement of global ``like`` (a global query's scores)."""
    if like is not None and like.is_global:
        where = {"placement": like.placement, "sbp": [SBP_B] * like.placement.ndim}
    else:
        where = {"device": device}
    return (arange(B, **where).view(B, 1, 1, 1), arange(H, **where).view(1, H, 1, 1),
            arange(L, **where).view(1, 1, L, 1), arange(S, **where).view(1, 1, 1, S))


def create_mask(mod_fn: Callable, B: int | None, H: int | None, Q_LEN: int, KV_LEN: int,
                device: Any = "cpu") -> Tensor:
    """``mod_fn`` (a mask_mod) on every (b, h, q_idx, kv_idx): a bool tensor of shape (B, H, Q_LEN,
    KV_LEN), B and H 1 where None."""
    B, H = B or 1, H or 1
    keep = mod_fn(*_indices(B, H, Q_LEN, KV_LEN, device))
    return keep.expand(B, H, Q_LEN, KV_LEN).bool()


class BlockMask:
    """A mask_mod over (B, H, Q_LEN, KV_LEN) in blocks of ``BLOCK_SIZE``, as torch's
    ``BlockMask`` (what ``create_block_mask`` returns and ``flex_attention(block_mask=)`` takes).
    Here the mask applies score by score (the mask_mod on every position), so the blocks only
    describe it: ``to_dense()`` (which blocks hold a kept score), ``sparsity()``."""

    def __init__(self, mask_mod: Callable, shape: tuple, BLOCK_SIZE: tuple, device: Any) -> None:
        self.mask_mod, self.shape, self.BLOCK_SIZE, self.device = mask_mod, tuple(shape), BLOCK_SIZE, device
        self.seq_lengths = tuple(shape[-2:])

    def dense_mask(self) -> Tensor:
        """The mask itself: bool, (B, H, Q_LEN, KV_LEN)."""
        return create_mask(self.mask_mod, *self.shape, device=self.device)

    def to_dense(self) -> Tensor:
        """(B, H, query blocks, key blocks): 1 where a block keeps any score (torch's int32)."""
        B, H, L, S = self.shape
        bq, bk = self.BLOCK_SIZE
        nq, nk = -(-L // bq), -(-S // bk)
        keep = self.dense_mask()
        padded = keep.new_zeros((B, H, nq * bq, nk * bk))
        padded[..., :L, :S] = keep
        return padded.view(B, H, nq, bq, nk, bk).any(-1).any(-2).int()

    def numel(self) -> int:
        """B * H * Q_LEN * KV_LEN."""
        return math.prod(self.shape)

    def sparsity(self) -> float:
        """The percentage of the scores in no computed block, as torch counts it: whole blocks of
        ``BLOCK_SIZE`` (so a mask smaller than one block reads negative)."""
        computed = self.to_dense().sum().item() * self.BLOCK_SIZE[0] * self.BLOCK_SIZE[1]
        return 100 * (1 - computed / self.numel())

    def __repr__(self) -> str:
        return f"BlockMask(shape={self.shape}, sparsity={self.sparsity():.2f}%, BLOCK_SIZE={self.BLOCK_SIZE})"


def create_block_mask(mask_mod: Callable, B: int | None, H: int | None, Q_LEN: int, KV_LEN: int,
                      device: Any = None, BLOCK_SIZE: int | tuple[int, int] = _DEFAULT_BLOCK, _compile: bool = False,
                      separate_full_blocks: bool = True, compute_dq_write_order: bool = False,
                      dq_kv_order: bool = True) -> BlockMask:
    """A :class:`BlockMask` of ``mask_mod`` over (B, H, Q_LEN, KV_LEN) (B and H 1 where None: the
    mask broadcasts over them), as ``torch.nn.attention.flex_attention.create_block_mask``."""
    if not callable(mask_mod):
        raise TypeError(f"holoflow.create_block_mask: mask_mod must be callable, got {type(mask_mod).__name__}")
    block = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else tuple(BLOCK_SIZE)
    return BlockMask(mask_mod, (B or 1, H or 1, Q_LEN, KV_LEN), block, "cpu" if device is None else device)


def _check(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool) -> None:
    name = "holoflow.flex_attention"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"{name}: query, key and value must be 4-D (B, H, L, E), got shapes {tuple(query.shape)}, "
                         f"{tuple(key.shape)} and {tuple(value.shape)}")
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"{name}: expected query, key and value to have one dtype, got {query.dtype}, {key.dtype} "
                         f"and {value.dtype}")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2] or key.shape[1] != value.shape[1]:
        raise ValueError(f"{name}: query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} "
                         f"must be (B, Hq, L, E), (B, Hkv, S, E) and (B, Hkv, S, Ev)")
    hq, hkv = query.shape[1], key.shape[1]
    if (hq != hkv and not enable_gqa) or hq % hkv:
        raise ValueError(f"{name}: query has {hq} heads and key/value {hkv}: "
                         + ("they must be equal (or pass enable_gqa=True)" if not enable_gqa else
                            "the query's must be a multiple of the key's"))


def flex_attention(query: Tensor, key: Tensor, value: Tensor, score_mod: Callable | None = None,
                   block_mask: BlockMask | None = None, scale: float | None = None, enable_gqa: bool = False,
                   return_lse: bool = False, kernel_options: dict | None = None, *,
                   return_aux: AuxRequest | None = None) -> Tensor | tuple:
    """``softmax(score_mod(q k^T * scale) masked by block_mask) @ v``, as torch's ``flex_attention``
    (see the module doc): ``return_lse`` / ``return_aux=AuxRequest(lse=..., max_scores=...)`` give
    the natural-log logsumexp and the maximum of each query row's kept scores."""
    _check(query, key, value, enable_gqa)
    B, hq, L, e = query.shape
    S, hkv = key.shape[-2], key.shape[1]
    if hq != hkv:   # grouped-query attention: each key/value head shared by hq / hkv query heads
        key, value = key.repeat_interleave(hq // hkv, 1), value.repeat_interleave(hq // hkv, 1)
    low = query._data.dtype in (torch.bfloat16, torch.float16)   # (scores in float32, as torch's)
    q, k = (query.float(), key.float()) if low else (query, key)
    scores = matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(e) if scale is None else scale)
    index = _indices(B, hq, L, S, query.device, query)
    if score_mod is not None:
        scores = score_mod(scores, *index)
        if tuple(scores.shape) != (B, hq, L, S):
            scores = scores.expand(B, hq, L, S)
    if block_mask is not None:
        mb, mh = block_mask.shape[:2]
        if tuple(block_mask.seq_lengths) != (L, S) or mb not in (1, B) or mh not in (1, hq):
            raise ValueError(f"holoflow.flex_attention: block_mask was created for shape {block_mask.shape}, "
                             f"the inputs have (B, H, L, S) = ({B}, {hq}, {L}, {S}); its B and H may be 1")
        # (the mask_mod sees the real b and h even in a mask made for B = H = 1, as torch's kernel
        # calls it inside its blocks)
        scores = scores.masked_fill(~block_mask.mask_mod(*index), float("-inf"))
    lse = logsumexp(scores, -1)
    # a row with every key masked out: zeros (not NaN), its logsumexp -inf
    probs = (scores - lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1)).exp()
    out = matmul(probs.to(value.dtype) if not low else probs, value.float() if low else value)
    out = out.to(query.dtype) if low else out
    if return_aux is not None:
        return out, AuxOutput(lse=lse if return_aux.lse else None,
                              max_scores=amax(scores, -1) if return_aux.max_scores else None)
    return (out, lse) if return_lse else out

