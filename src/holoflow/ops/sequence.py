"""Bag and sequence ops: ``embedding_bag`` and ``ctc_loss``.

Both are primitives on ATen kernels with ATen's derivative (ops/torch_vjp.py), so empty bags,
``padding_idx``, ``per_sample_weights``, impossible alignments and ``zero_infinity`` behave as
torch's. ``embedding_bag`` saves what torch's backward reads (max mode: the rows of the maxima,
an output of its own op), never the weight for the weight's own gradient. ``ctc_loss``'s op computes the per-sample
loss; the reduction is a composite.
SBP: the batch (bags, samples) splits everything batched; ``embedding_bag`` also splits the
embedding dim of the weight.
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from ..core.dispatch import apply
from ..core.errors import DTypeError, ShapeError, UnsupportedError
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .creation import tensor as _tensor
from .loss import _reduction
from .family import needs
from .nn_ops import embedding_renorm_
from .torch_vjp import _bwd_kernel, defop_vjp

__all__: list[str] = []   # nn.functional names

# -- embedding_bag --------------------------------------------------------------------------------


def _bag_kernel(input, weight, offsets, per_sample_weights, mode, scale_grad_by_freq, include_last_offset,
                padding_idx):
    return TF.embedding_bag(input, weight, offsets, None, 2.0, scale_grad_by_freq, mode, False,
                            per_sample_weights, include_last_offset, padding_idx)


def _bag_max_kernel(input, weight, offsets, per_sample_weights, mode, scale_grad_by_freq, include_last_offset,
                    padding_idx):
    """Max mode: the bags' maxima and, per element, the row it came from (-1 for an empty bag):
    torch's derivative reads these indices, not the weight."""
    if input.dim() == 2:   # one bag per row, as nn.functional.embedding_bag lays it out for ATen
        offsets = torch.arange(0, input.numel(), input.shape[1], dtype=input.dtype, device=input.device)
        input = input.reshape(-1)
    out, _, bag_size, rows = torch.embedding_bag(weight, input, offsets, scale_grad_by_freq, 2, False, None,
                                                 include_last_offset, padding_idx)
    empty = bag_size[:len(rows)].unsqueeze(-1) == 0   # (ATen's meta bag_size has one more with include_last_offset)
    return out, rows.masked_fill(empty, -1)


def _bag_max_bwd_kernel(rows, dy, num_weights):
    grad = dy.new_zeros(num_weights, dy.shape[-1])
    return grad.scatter_add_(0, rows.clamp(min=0), dy.masked_fill(rows < 0, 0))


def _present(metas) -> list[bool]:
    return [isinstance(m, Meta) for m in metas[:4]]


def _bag_sbp(metas, attrs):
    """Per present tensor (input, weight, offsets, per_sample_weights): all B; bags split (a 2-D
    input without offsets, and its weights) -> rows of the output; the weight's embedding dim
    -> columns; P through the weight in sum/mean mode and through the sample weights. Max mode's
    second output (the maxima's rows) is laid out as the first."""
    has = _present(metas)
    n_out = 2 if attrs["mode"] == "max" else 1

    def sig(per, out):
        return (tuple(s for s, h in zip(per, has) if h), (out,) * n_out)
    sigs = [sig((B, B, B, B), B), sig((B, S(1), B, B), S(1))]
    # (not with scale_grad_by_freq: a shard's backward would count the indices of its bags only)
    if not has[2] and len(metas[0].shape) == 2 and not attrs["scale_grad_by_freq"]:
        sigs.append(sig((S(0), B, B, S(0)), S(0)))
    if attrs["mode"] != "max":
        sigs.append(sig((B, P, B, B), P))
        if has[3]:
            sigs.append(sig((B, B, B, P), P))
    return sigs


def _bag_bwd_sbp(metas, attrs):
    """``(input, weight, offsets, psw, dy) -> grads of attrs['diff']`` (weight 1, psw 3); the
    weight is absent (None) where only its gradient is wanted."""
    has = _present(metas)
    diff = attrs["diff"]

    def sig(per, dy, grads):
        return (tuple(s for s, h in zip(per, has) if h) + (dy,), tuple(grads[i] for i in diff))
    sigs = [sig((B, B, B, B), B, {1: B, 3: B}), sig((B, S(1), B, B), S(1), {1: S(1), 3: P})]
    if not has[2] and len(metas[0].shape) == 2 and not attrs["scale_grad_by_freq"]:  # counts span all bags
        sigs.append(sig((S(0), B, B, S(0)), S(0), {1: P, 3: S(0)}))
    return sigs


def _bag_max_bwd_sbp(metas, attrs):
    """``(rows, dy) -> the weight's gradient``: bags split -> partial sums; columns -> columns."""
    return [((B, B), (B,)), ((S(1), S(1)), (S(1),)), ((S(0), S(0)), (P,))]


_vjp_kernel = _bwd_kernel(_bag_kernel)


def _bag_bwd_kernel(input, weight, offsets, per_sample_weights, dy, *, num_weights, **attrs):
    if weight is None:   # sum/mean: the weight's gradient reads its size only, as torch's formula
        weight = dy.new_zeros(num_weights, dy.shape[-1])
    return _vjp_kernel(input, weight, offsets, per_sample_weights, dy, **attrs)


def _no_double(ctx, *dys):
    raise UnsupportedError(f"holoflow.{ctx.op.name}: double backward is not implemented")


EMBEDDING_BAG_BWD = defop("embedding_bag_backward", _bag_bwd_kernel, sbp=_bag_bwd_sbp, grad=_no_double,
                          family="embedding")
EMBEDDING_BAG_MAX_BWD = defop("embedding_bag_max_backward", _bag_max_bwd_kernel, sbp=_bag_max_bwd_sbp,
                              grad=_no_double, family="embedding")


def _bag_grad(c, dy):
    want = tuple(i for i in (1, 3) if needs(c, i))
    if not want:
        return (None,) * 4
    gs = apply(EMBEDDING_BAG_BWD, *c.inputs, dy, n_in=4, diff=want, num_weights=c.shapes[1][0], **c.attrs)
    res: list = [None] * 4
    for i, g in zip(want, gs):
        res[i] = g
    return tuple(res)


def _bag_max_grad(c, dy, _drows):
    if not needs(c, 1):
        return (None,) * 4
    return (None, apply(EMBEDDING_BAG_MAX_BWD, c.outs[1], dy, num_weights=c.shapes[1][0]), None, None)


# What each mode's backward reads, as torch's: sum/mean the indices, offsets and sample weights
# (the weight only for the sample weights' gradient), max the rows of the maxima. So the weight
# may change in place before the backward (max_norm renormalizes it at every call).
EMBEDDING_BAG = defop("embedding_bag", _bag_kernel, grad=_bag_grad, save="inputs",
                      saved_inputs=lambda needs: (0, 2, 3) + ((1,) if needs[3] else ()), sbp=_bag_sbp,
                      family="embedding")
EMBEDDING_BAG_MAX = defop("embedding_bag_max", _bag_max_kernel, grad=_bag_max_grad, save="output",
                          saved_outputs=(1,), grad_reads=(0,), outputs=("output", "rows"), sbp=_bag_sbp,
                          family="embedding")


def embedding_bag(input: Tensor, weight: Tensor, offsets: Tensor | None = None, max_norm=None,
                  norm_type: float = 2, scale_grad_by_freq: bool = False, mode: str = "mean",
                  sparse: bool = False, per_sample_weights: Tensor | None = None,
                  include_last_offset: bool = False, padding_idx: int | None = None) -> Tensor:
    """Sums, means or maxes of bags of embeddings, as ``torch.nn.functional.embedding_bag``: a
    2-D ``input`` is one bag per row; a 1-D one is cut into bags at ``offsets``."""
    if sparse:
        raise UnsupportedError("holoflow.embedding_bag: sparse is not supported")
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"holoflow.embedding_bag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
    if weight.dim() != 2:
        raise ShapeError(f"holoflow.embedding_bag: weight must be 2-D (num_embeddings, dim), got {tuple(weight.shape)}")
    if input.dim() == 2 and offsets is not None:
        raise ValueError("holoflow.embedding_bag: if input is 2-D, then offsets has to be None, as input is "
                         "treated as a mini-batch of fixed length sequences")
    if input.dim() == 1 and (offsets is None or offsets.dim() != 1):
        got = "None" if offsets is None else f"shape {tuple(offsets.shape)}"
        raise ValueError(f"holoflow.embedding_bag: offsets has to be a 1-D tensor for a 1-D input, got {got}")
    if input.dim() not in (1, 2):
        raise ShapeError(f"holoflow.embedding_bag: input has to be 1-D or 2-D, got shape {tuple(input.shape)}")
    if mode == "max" and scale_grad_by_freq:
        raise ValueError("holoflow.embedding_bag: max mode does not support scaling the gradient by the frequency "
                         "(scale_grad_by_freq=True)")
    if input.is_floating_point():   # (after the shape checks, as torch's kernel, with its class)
        raise DTypeError(f"holoflow.embedding_bag: indices must be an integer tensor, got {input.dtype}")
    if per_sample_weights is not None:   # (the shape first, as torch)
        if tuple(per_sample_weights.shape) != tuple(input.shape):
            raise ShapeError(f"holoflow.embedding_bag: per_sample_weights of shape {tuple(per_sample_weights.shape)} "
                             f"must have the input's shape {tuple(input.shape)}")
        if mode != "sum":
            raise NotImplementedError(f"holoflow.embedding_bag: per_sample_weights was not None; only mode='sum' "
                                      f"supports them, got mode={mode!r}")
    n = weight.shape[0]
    if padding_idx is not None:
        if not -n <= padding_idx < n:
            raise IndexError(f"holoflow.embedding_bag: padding_idx {padding_idx} out of range for {n} embeddings")
        padding_idx %= n
    if max_norm is not None:   # the looked-up rows renormalized in place first, as torch
        embedding_renorm_(weight, input, max_norm, norm_type)
    attrs = dict(mode=mode, scale_grad_by_freq=bool(scale_grad_by_freq),
                 include_last_offset=bool(include_last_offset), padding_idx=padding_idx)
    if mode == "max":
        return apply(EMBEDDING_BAG_MAX, input, weight, offsets, per_sample_weights, **attrs)[0]
    return apply(EMBEDDING_BAG, input, weight, offsets, per_sample_weights, **attrs)


# -- ctc_loss ----------------------------------------------------------------------------------------

def _ctc_kernel(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    return TF.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, "none", zero_infinity)


def _ctc_shape(metas, attrs):
    lp = metas[0]
    return [Meta((lp.shape[1],) if len(lp.shape) == 3 else (), lp.dtype, lp.device)]


def _ctc_sbp(metas, attrs):
    sigs = [((B, B, B, B), (B,))]
    if len(metas[0].shape) == 3 and len(metas[1].shape) == 2:
        sigs.append(((S(1), S(0), S(0), S(0)), (S(0),)))
    return sigs


def _ctc_bwd_sbp(metas, attrs):
    sigs = [((B,) * 5, (B,))]
    if len(metas[0].shape) == 3 and len(metas[1].shape) == 2:
        sigs.append(((S(1), S(0), S(0), S(0), S(0)), (S(1),)))
    return sigs


CTC_LOSS = defop_vjp("ctc_loss", _ctc_kernel, sbp=_ctc_sbp, bwd_sbp=_ctc_bwd_sbp, family="loss", shape=_ctc_shape)


def _lengths(name: str, v, what: str) -> Tensor:
    if isinstance(v, Tensor):
        if v.is_floating_point():
            raise DTypeError(f"holoflow.ctc_loss: {what} must be integers, got {v.dtype}")
        return v
    # on the CPU, as torch passes list lengths to its kernel (which reads them on the host)
    return _tensor(list(v) if isinstance(v, (list, tuple)) else v, dtype=torch.int64, device="cpu")


def ctc_loss(log_probs: Tensor, targets: Tensor, input_lengths, target_lengths, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False) -> Tensor:
    """Connectionist temporal classification loss of ``log_probs`` ``(T, N, C)`` against
    ``targets`` (``(N, S)`` padded or 1-D concatenated), as ``torch.nn.functional.ctc_loss``;
    'mean' divides each loss by its target length, then averages over the batch."""
    red = _reduction("ctc_loss", reduction)
    if log_probs.dim() not in (2, 3):
        raise ShapeError(f"holoflow.ctc_loss: log_probs must be (T, N, C) or (T, C), got {tuple(log_probs.shape)}")
    il, tl = _lengths("ctc_loss", input_lengths, "input_lengths"), _lengths("ctc_loss", target_lengths,
                                                                            "target_lengths")
    loss = apply(CTC_LOSS, log_probs, targets, il, tl, blank=int(blank), zero_infinity=bool(zero_infinity))
    if red == "none":
        return loss
    if red == "sum":
        return loss.sum()
    return (loss / tl.clamp_min(1).to(device=loss.device, dtype=loss.dtype)).mean()  # CPU list lengths
