"""``linear_cross_entropy``: cross entropy of a linear layer's logits (torch 2.13's
``F.linear_cross_entropy``), optionally in batch chunks so the ``(N, C)`` logits never exist at
once: a language model's vocabulary head at a fraction of the memory.

Without ``options`` it is ``cross_entropy(linear(input, W, b), target)``, composed of those ops
(every feature of both, K-dimensional losses included). With a :class:`LinearCrossEntropyOptions`
it runs two ops of its own: the forward keeps, per row, only the logsumexp of its logits; the
backward recomputes each chunk's logits from the saved input and weight and turns them into the
three gradients at once. torch's chunked path instead computes the gradients inside the forward
and consumes them in place (so a second backward needs ``allow_retain_graph``); recomputing costs
one more ``(chunk, C)`` matmul per chunk and keeps holoflow's rules: ``retain_graph`` always works,
the saved tensors are version-checked, and no gradient exists before a backward asks for it.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import torch

from ..core.dispatch import apply
from ..core.errors import DTypeError, ShapeError, UnsupportedError
from ..core.forward_ad import any_dual
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .family import needs
from .linalg import linear
from .loss import CLASS_WEIGHT_TOTAL, cross_entropy

__all__ = ["linear_cross_entropy", "LinearCrossEntropyOptions"]

_POLICIES = ("auto", "accurate", "balanced", "compact")
_ACC_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# torch's per-(device type, input dtype) picks for chunking_method="auto", and the fallback
_AUTO_CHUNKING = {("cpu", torch.bfloat16): "aspect_ratio", ("cpu", torch.float16): "aspect_ratio"}
_AUTO_CHUNKING_FALLBACK = "aspect_ratio:2"


@dataclasses.dataclass(slots=True, frozen=True)
class LinearCrossEntropyOptions:
    """How :func:`linear_cross_entropy` chunks the batch (torch's ``nn.LinearCrossEntropyOptions``).

    ``batch_chunk_size`` rows per chunk, or ``chunking_method`` ``"aspect_ratio[:N]"``: chunks
    whose ``(rows, C)`` logits are about as large as the ``(N, in_features)`` input, divided by
    ``N``; ``"auto"`` picks torch's choice for the device and dtype. ``acc_dtype`` is the dtype of
    the softmax statistics, the matmuls and the gradient sums (float32 for float16/bfloat16 inputs
    under ``"auto"``). holoflow computes every ``acc_policy`` as torch's ``"accurate"`` one, and
    ``allow_retain_graph`` is accepted for torch's programs: holoflow's backward recomputes, so a
    second backward always works.

    >>> LinearCrossEntropyOptions(batch_chunk_size=64).chunk_rows(1000, 64, 50000, torch.float32, "cpu")
    64
    """

    allow_retain_graph: bool = False
    batch_chunk_size: int | None = None
    chunking_method: str | None = "auto"
    acc_policy: str = "auto"
    acc_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.acc_policy not in _POLICIES:
            raise ValueError(f"invalid acc_policy: {self.acc_policy!r} (one of {_POLICIES})")
        if self.chunking_method is not None and self.chunking_method != "auto":
            name, sep, factor = self.chunking_method.partition(":")
            if not (name == "aspect_ratio" and (not sep or (factor.isdigit() and int(factor) > 0))):
                raise ValueError(f"invalid chunking_method: {self.chunking_method!r} (\"auto\", "
                                 f"\"aspect_ratio\", \"aspect_ratio:N\" with N >= 1, or None)")
        size = self.batch_chunk_size
        if not (size is None or (isinstance(size, int) and not isinstance(size, bool) and size > 0)):
            raise ValueError(f"batch_chunk_size must be positive int or None, got {size!r}")
        if self.acc_dtype is not None and self.acc_dtype not in _ACC_DTYPES:
            raise ValueError(f"acc_dtype must be one of {{None, torch.float16, torch.bfloat16, torch.float32, "
                             f"torch.float64}}, got {self.acc_dtype!r}. Pass acc_dtype=None to let the op "
                             f"pick automatically.")

    def chunk_rows(self, n: int, in_features: int, n_classes: int, dtype: torch.dtype, device_type: str) -> int:
        """Rows per chunk for an ``(n, in_features)`` input and ``n_classes`` classes."""
        method = self.chunking_method
        if method == "auto":
            method = None if self.batch_chunk_size is not None else \
                _AUTO_CHUNKING.get((device_type, dtype), _AUTO_CHUNKING_FALLBACK)
        rows = n if self.batch_chunk_size is None else min(self.batch_chunk_size, n)
        if method is not None:
            factor = int(method.partition(":")[2] or 1)
            target = -(-n // -(-n_classes // max(in_features, 1)))
            by_method = min((1 << max(target - 1, 0).bit_length()) // factor, n)
            if self.batch_chunk_size is not None and self.batch_chunk_size != by_method:
                raise ValueError(f"batch_chunk_size (={self.batch_chunk_size}) and chunking_method "
                                 f"('{method}') give different chunk sizes ({self.batch_chunk_size} vs "
                                 f"{by_method}); pass only one.")
            rows = by_method
        return max(1, rows)

    def accumulation_dtype(self, dtype: torch.dtype) -> torch.dtype:
        if self.acc_dtype is not None:
            return self.acc_dtype
        low = dtype in (torch.float16, torch.bfloat16)
        return torch.float32 if low and self.acc_policy == "auto" else dtype


# -- the chunked ops ----------------------------------------------------------------------------

def _targets(t: torch.Tensor, cw: torch.Tensor | None, ignore_index: int, acc: torch.dtype):
    """(targets with ignored rows pointing at class 0, each row's weight: 0 where ignored)."""
    valid = t != ignore_index
    ts = torch.where(valid, t, torch.zeros_like(t))
    wt = cw.to(acc)[ts] if cw is not None else torch.ones(t.shape, dtype=acc, device=t.device)
    return ts, wt * valid


def _logits(x, w, b, acc):
    x = x.to(acc)
    return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())


def _chunks(n: int, rows: int):
    return ((s, min(s + rows, n)) for s in range(0, n, rows))


def _lce_kernel(x, w, b, t, cw, ignore_index, reduction, chunk, acc_dtype):
    """(loss, logsumexp per row, total weight of the counted rows), chunk by chunk."""
    n, acc = x.shape[0], acc_dtype
    wa, ba = w.to(acc), (b.to(acc) if b is not None else None)
    ts, wt = _targets(t, cw, ignore_index, acc)
    lse = torch.empty(n, dtype=acc, device=x.device)
    rows = torch.empty(n, dtype=acc, device=x.device)
    for s, e in _chunks(n, chunk):
        logits = _logits(x[s:e], wa, ba[None] if ba is not None else None, acc)
        torch.logsumexp(logits, 1, out=lse[s:e])
        torch.sub(lse[s:e], logits.gather(1, ts[s:e, None]).squeeze(1), out=rows[s:e])
    rows.mul_(wt)
    total = wt.sum()
    if reduction == "none":
        loss = rows
    else:
        loss = rows.sum() if reduction == "sum" else rows.sum() / total
    return loss.to(x.dtype), lse, total


def _lce_bwd_kernel(dy, x, w, b, t, cw, lse, total, ignore_index, reduction, chunk, acc_dtype, output_mask):
    """(dx, dW, db): per chunk ``g = (softmax(logits) - onehot(t)) * row weight * dy`` (over the
    total weight for 'mean'), then ``dx = g W``, ``dW += g^T x``, ``db += sum g``."""
    n, acc = x.shape[0], acc_dtype
    wa, ba = w.to(acc), (b.to(acc) if b is not None else None)
    ts, scale = _targets(t, cw, ignore_index, acc)
    scale = scale * dy.to(acc)
    if reduction == "mean":
        scale = scale / total.to(acc)
    want_x, want_w, want_b = output_mask
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if want_x else None
    dw = torch.zeros(w.shape, dtype=acc, device=w.device) if want_w else None
    db = torch.zeros(w.shape[:1], dtype=acc, device=w.device) if want_b else None
    for s, e in _chunks(n, chunk):
        xc = x[s:e].to(acc)
        g = _logits(xc, wa, ba[None] if ba is not None else None, acc)
        g.sub_(lse[s:e, None]).exp_()
        g.scatter_add_(1, ts[s:e, None], torch.full((e - s, 1), -1.0, dtype=acc, device=x.device))
        g.mul_(scale[s:e, None])
        if want_x:
            dx[s:e] = torch.mm(g, wa)
        if want_w:
            dw.addmm_(g.t(), xc)
        if want_b:
            db.add_(g.sum(0))
    return (dx if want_x else _zeros(x.shape, x), dw.to(w.dtype) if want_w else _zeros(w.shape, w),
            db.to(b.dtype if b is not None else w.dtype) if want_b else _zeros(w.shape[:1], w))


def _zeros(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device).expand(shape)


def _lce_shape(metas, attrs):
    x = metas[0]
    n, acc = x.shape[0], attrs["acc_dtype"]
    loss = (n,) if attrs["reduction"] == "none" else ()
    return [Meta(loss, x.dtype, x.device), Meta((n,), acc, x.device), Meta((), acc, x.device)]


def _lce_bwd_shape(metas, attrs):
    _, x, w, b = metas[:4]
    return [Meta(tuple(x.shape), x.dtype, x.device), Meta(tuple(w.shape), w.dtype, w.device),
            Meta(tuple(w.shape[:1]), b.dtype if isinstance(b, Meta) else w.dtype, w.device)]


def _optional(metas, i: int, sbp) -> tuple:
    return (sbp,) if isinstance(metas[i], Meta) else ()


def _lce_sbp(metas, attrs):
    """Broadcast; or rows split (input and targets on dim 0, the rest broadcast): a partial sum
    for 'sum', a split loss for 'none', split logsumexps and a partial total weight. The class
    dim never splits (the logsumexp of a split vocabulary is not one op's signature), and 'mean'
    is broadcast only (``linear_cross_entropy`` of a global input divides a 'sum' by
    ``class_weight_total``)."""
    sigs = [((B, B) + _optional(metas, 2, B) + (B,) + _optional(metas, 4, B), (B, B, B))]
    red = attrs["reduction"]
    if red != "mean":
        ins = (S(0), B) + _optional(metas, 2, B) + (S(0),) + _optional(metas, 4, B)
        sigs.append((ins, (P if red == "sum" else S(0), S(0), P)))
    return sigs


def _lce_bwd_sbp(metas, attrs):
    """Broadcast; or rows split: the weight and bias gradients are partial sums."""
    def ins(dy, rows, total):
        return ((dy, rows, B) + _optional(metas, 3, B) + (rows,) + _optional(metas, 5, B) + (rows, total))
    sigs = [(ins(B, B, B), (B, B, B))]
    if attrs["reduction"] != "mean":
        dy = B if attrs["reduction"] == "sum" else S(0)
        sigs += [(ins(dy, S(0), B), (S(0), P, P)), (ins(dy, S(0), P), (S(0), P, P))]
    return sigs


def _lce_grad(c, dy, _dlse, _dtotal):
    x, w, b, t, cw = c.inputs
    _, lse, total = c.outs
    mask = (needs(c, 0), needs(c, 1), b is not None and needs(c, 2))
    dx, dw, db = apply(LINEAR_CE_BWD, dy, x, w, b, t, cw, lse, total, ignore_index=c.ignore_index,
                       reduction=c.reduction, chunk=c.chunk, acc_dtype=c.acc_dtype, output_mask=mask)
    return dx if mask[0] else None, dw if mask[1] else None, db if mask[2] else None, None, None


def _lce_bwd_grad(c, *dys):
    raise UnsupportedError("holoflow.linear_cross_entropy: the chunked path (options=...) has no second "
                           "derivative; pass options=None for higher-order gradients (create_graph=True)")


def _flops(rows_of, matmuls: int):
    def flops(ins, outs, attrs):
        x, w = ins[rows_of], ins[rows_of + 1]
        return 2.0 * matmuls * x[0] * x[1] * w[0]
    return flops


LINEAR_CE = defop("linear_cross_entropy", _lce_kernel, grad=_lce_grad, save="both", saved_inputs=(0, 1, 2, 3, 4),
                  saved_outputs=(1, 2), outputs=("loss", "logsumexp", "total_weight"), grad_reads=(0,),
                  shape=_lce_shape, sbp=_lce_sbp, family="loss", flops=_flops(0, 1))
LINEAR_CE_BWD = defop("linear_cross_entropy_backward", _lce_bwd_kernel, grad=_lce_bwd_grad, shape=_lce_bwd_shape,
                      sbp=_lce_bwd_sbp, family="loss", flops=_flops(1, 3))


# -- the function -------------------------------------------------------------------------------

def _check(input: Tensor, linear_weight: Tensor, target: Tensor, linear_bias, ignore_index) -> tuple:
    """torch's checks; returns (batch shape, classes, out_features, the logits' shape)."""
    if not 1 <= input.dim() <= 2:
        raise ShapeError(f"holoflow.linear_cross_entropy: expected input with dimensionality 1 or 2, got "
                         f"{input.dim()} (shape {tuple(input.shape)}); flatten the batch dims first")
    if linear_weight.dim() < 2:
        raise ShapeError(f"holoflow.linear_cross_entropy: expected linear_weight with dimensionality at least 2, "
                         f"got {linear_weight.dim()} (shape {tuple(linear_weight.shape)})")
    batch, in_features = tuple(input.shape[:-1]), input.shape[-1]
    if in_features != linear_weight.shape[-1]:
        raise ShapeError(f"holoflow.linear_cross_entropy: expected equal input and linear_weight last dimensions "
                         f"(in_features), got {in_features} and {linear_weight.shape[-1]}, respectively")
    n_classes, out_features = linear_weight.shape[0], tuple(linear_weight.shape[1:-1])
    if linear_bias is not None and tuple(linear_bias.shape) != (n_classes, *out_features):
        raise ShapeError(f"holoflow.linear_cross_entropy: expected linear_bias shape {(n_classes, *out_features)}, "
                         f"got {tuple(linear_bias.shape)}")
    if out_features and not batch:
        raise ShapeError(f"holoflow.linear_cross_entropy: K-dimensional loss defined by linear_weight shape "
                         f"{tuple(linear_weight.shape)} requires batched input, (N, {in_features}), got "
                         f"unbatched input with shape {tuple(input.shape)}")
    logits_shape = (*batch, n_classes, *out_features)
    if tuple(target.shape) == logits_shape and ignore_index is not None:
        raise ValueError("holoflow.linear_cross_entropy: ignore_index cannot be specified when target contains "
                         "probabilities")
    return batch, n_classes, out_features, logits_shape


def linear_cross_entropy(input: Tensor, linear_weight: Tensor, target: Tensor, *, linear_bias: Tensor | None = None,
                         weight: Tensor | None = None, reduction: str = "mean", ignore_index: int | None = None,
                         label_smoothing: float = 0.0,
                         options: LinearCrossEntropyOptions | None = None) -> Tensor:
    """``cross_entropy(linear(input, linear_weight, linear_bias), target, ...)`` for an ``(N, in)``
    or ``(in,)`` input and a ``(C, in)`` (or ``(C, d1, ..., dK, in)``: a K-dimensional loss)
    weight; with ``options`` the logits are computed a chunk of rows at a time and never held
    whole (see :class:`LinearCrossEntropyOptions`)."""
    batch, n_classes, out_features, logits_shape = _check(input, linear_weight, target, linear_bias, ignore_index)
    ignore = -100 if ignore_index is None else ignore_index
    if options is not None and any_dual(input._data, linear_weight._data,
                                        None if linear_bias is None else linear_bias._data):
        options = None   # (forward-mode AD: the chunked kernels write out=, which torch doesn't differentiate)
    if options is not None:
        if out_features or reduction not in ("mean", "sum", "none") or label_smoothing != 0.0 \
                or target._data.dtype != torch.int64:
            warnings.warn(f"linear_cross_entropy: ``options`` ignored; chunked path needs reduction in "
                          f"{{'mean','sum','none'}}, label_smoothing == 0, target.dtype == int64, out_features "
                          f"== (). Got reduction={reduction!r}, label_smoothing={label_smoothing}, "
                          f"target.dtype={target._data.dtype}, out_features={out_features}.", stacklevel=3)
        else:
            return _chunked(input, linear_weight, target, linear_bias, weight, reduction, ignore, options)
    if out_features:
        rows = math.prod(out_features, start=n_classes)
        linear_weight = linear_weight.reshape(rows, linear_weight.shape[-1])
        if linear_bias is not None:
            linear_bias = linear_bias.reshape(rows)
    logits = linear(input, linear_weight, linear_bias).reshape(logits_shape)
    return cross_entropy(logits, target, weight=weight, reduction=reduction, ignore_index=ignore,
                         label_smoothing=label_smoothing)


def _chunked(x: Tensor, w: Tensor, t: Tensor, b, cw, reduction: str, ignore: int,
             options: LinearCrossEntropyOptions) -> Tensor:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"holoflow.linear_cross_entropy: reduction must be one of ('none', 'mean', 'sum'), "
                         f"got {reduction!r}")
    if cw is not None and tuple(cw.shape) != (w.shape[0],):
        raise ShapeError(f"holoflow.linear_cross_entropy: weight of shape {tuple(cw.shape)} should be "
                         f"({w.shape[0]},), one per class")
    unbatched = x.dim() == 1
    if unbatched:
        x, t = x.unsqueeze(0), t.unsqueeze(0)
    if tuple(t.shape) != tuple(x.shape[:1]):
        raise ShapeError(f"holoflow.linear_cross_entropy: input of shape {tuple(x.shape)} needs a class-index "
                         f"target of shape {tuple(x.shape[:1])}, got {tuple(t.shape)}")
    if not (x.is_floating_point() and w.is_floating_point()):
        raise DTypeError(f"holoflow.linear_cross_entropy: input ({x.dtype}) and linear_weight ({w.dtype}) must "
                         f"be floating")
    dtype = x._data.dtype   # (the input's dtype decides, as torch's: the weight's may differ)
    acc = options.accumulation_dtype(dtype)
    chunk = options.chunk_rows(x.shape[0], x.shape[1], w.shape[0], dtype, x._data.device.type)
    attrs = dict(ignore_index=ignore, chunk=chunk, acc_dtype=acc)
    if reduction == "mean" and x.is_global:   # a row-split input: partial sums over the global total
        total = apply(LINEAR_CE, x, w, b, t, cw, reduction="sum", **attrs).loss
        loss = total / apply(CLASS_WEIGHT_TOTAL, t, cw, ignore_index=ignore, dtype=acc).to(total.dtype)
    else:
        loss = apply(LINEAR_CE, x, w, b, t, cw, reduction=reduction, **attrs).loss
    return loss.squeeze(0) if unbatched and reduction == "none" else loss
