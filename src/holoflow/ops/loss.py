"""Losses. ``cross_entropy`` and ``nll_loss`` are primitives (torch's fused kernel forward, a
closed-form backward op); the elementwise losses are in ``loss_pointwise`` (re-exported here);
margin_ranking, cosine_embedding, gaussian_nll and poisson_nll losses are composites."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as TF

from ..core import interpret
from ..core.dispatch import apply
from ..core.grad_mode import no_grad
from ..core.errors import DTypeError, ShapeError
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from . import elementwise as E
from .creation import ones_like, zeros_like
from .family import elementwise_sbp, like_first_input
from .nn_ops import log_softmax
from .reduction import sum as _sum
from .loss_pointwise import (_reduction, binary_cross_entropy, binary_cross_entropy_with_logits, huber_loss, kl_div,
                             l1_loss, mse_loss, smooth_l1_loss, soft_margin_loss)
from .loss_pointwise import reduce_loss as reduce_loss  # (sequence and nn import it here)

# -- cross_entropy / nll_loss primitives ------------------------------------------------------------

def _acc(dt: torch.dtype) -> torch.dtype:
    return torch.float32 if dt in (torch.bfloat16, torch.float16) else dt


def _class_coeffs(x, t, w, ignore_index, ls, cdim, acc):
    """For class-index targets: the coefficients ``a[n, c]`` with loss_n = -sum_c a log p, the
    'mean' denominator (total weight of the non-ignored targets), as torch defines them, and the
    mask of the counted targets' positions."""
    valid = t != ignore_index
    ts = torch.where(valid, t, torch.zeros_like(t))
    hit = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    if x.shape[cdim]:   # (no class at all: every target is ignored, nothing to mark)
        hit.scatter_(cdim, ts.unsqueeze(cdim), True)
    hit &= valid.unsqueeze(cdim)
    wt = (w.to(acc)[ts] if w is not None else torch.ones(t.shape, dtype=acc, device=x.device)) * valid
    a = hit * wt.unsqueeze(cdim) * (1 - ls)
    if ls > 0:
        shape = [1] * x.dim()
        shape[cdim] = x.shape[cdim]
        wc = w.to(acc).view(shape) if w is not None else 1.0
        # (a bool mask times a float is float32; no class: an empty a, any share)
        a = a + (ls / max(x.shape[cdim], 1)) * wc * valid.unsqueeze(cdim).to(acc)
    return a, wt.sum(), hit


def _class_grad(s, a, hit, valid, ls, cdim):
    """d loss / d log p as torch's kernels form it: nll_loss_backward writes ``-w_t s`` at the
    targets only (exact zeros elsewhere, also for an infinite ``s``), the smoothing term adds
    ``-s a`` on the counted rows."""
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    if ls <= 0:
        return torch.where(hit, -s * a, zero)
    return torch.where(valid.unsqueeze(cdim), -s * a, zero)


def _scale(dy, reduction, denom, cdim, acc):
    dy = dy.to(acc)
    if reduction == "none":
        return dy.unsqueeze(cdim)
    return dy / denom if reduction == "mean" else dy


def _ce_bwd_fast(dy, x, t, ignore_index, reduction, acc):
    """The common case (2-D input, class indices, no weight or smoothing, computed in x's dtype,
    float32/64): torch's own backward, nll_loss_backward then _log_softmax_backward_data (half the
    kernels of the general path)."""
    logp = torch.log_softmax(x, 1, dtype=acc)
    total = (t != ignore_index).sum().to(acc)
    g = torch.ops.aten.nll_loss_backward.default(dy.to(acc), logp, t, None, 1 if reduction == "mean" else 2,
                                                 ignore_index, total)
    dx = torch._log_softmax_backward_data(g, logp, 1, logp.dtype).to(x.dtype)
    empty = torch.zeros((), dtype=x.dtype, device=x.device).expand(0)
    return dx, empty, empty


# -- a loss wider than its logits (CUDA autocast: float32 loss of bfloat16/float16 logits) --------
# torch decomposes cross_entropy into ``log_softmax(x, 1, dtype=x.dtype)`` (an explicit dtype, which
# autocast leaves alone: log-probs in the logits' dtype, float32 accumulation inside the kernel)
# and ``nll_loss``, which CUDA autocast runs in float32 on a float32 copy of all the log-probs.
# nll_loss reads one log-prob per target, so these read just those (the same values, no copy of
# the (N, C) log-probs); the gradient of the log-probs is formed in the loss's dtype and rounded
# to theirs once, where torch's copy-backward rounds it.

def _widens(x: torch.Tensor, t: torch.Tensor, dtype, label_smoothing: float) -> bool:
    """Whether cross_entropy takes the wide-loss path: a ``dtype`` other than the logits', class
    indices, a class dim, no smoothing (the other forms cast the logits, as before)."""
    return dtype is not None and dtype != x.dtype and not label_smoothing and not t.is_floating_point() \
        and x.dim() >= 2


def _target_weights(t, w, ignore_index, dtype):
    """(valid, safe indices, per-target weight in ``dtype``, 0 where ignored)."""
    valid = t != ignore_index
    idx = torch.where(valid, t, torch.zeros_like(t))
    wt = valid.to(dtype) if w is None else w.to(dtype)[idx] * valid
    return valid, idx, wt


def _nll_wide(logp, t, w, ignore_index, reduction, dtype):
    """(nll_loss(logp.to(dtype), t, w), its total weight), reading only the targets' log-probs."""
    valid, idx, wt = _target_weights(t, w, ignore_index, dtype)
    picked = logp.gather(1, idx.unsqueeze(1)).squeeze(1).to(dtype)
    losses = torch.where(valid, -picked * wt, torch.zeros((), dtype=dtype, device=logp.device))
    total = wt.sum()
    if reduction == "none":
        return losses, total
    s = losses.sum()
    return (s / total if reduction == "mean" else s), total


def _nll_wide_grad(dy, logp, t, w, ignore_index, reduction, total):
    """d loss / d logp of :func:`_nll_wide`, in logp's dtype (``total``: the 'mean' denominator)."""
    valid, idx, wt = _target_weights(t, w, ignore_index, dy.dtype)
    s = dy / total if reduction == "mean" else dy
    val = torch.where(valid, -s * wt, torch.zeros((), dtype=dy.dtype, device=dy.device)).to(logp.dtype)
    return torch.zeros_like(logp).scatter_(1, idx.unsqueeze(1), val.unsqueeze(1))


def _ce_wide_bwd(dy, x, t, w, ignore_index, reduction):
    logp = torch.log_softmax(x, 1)
    total = _target_weights(t, w, ignore_index, dy.dtype)[2].sum()
    g = _nll_wide_grad(dy, logp, t, w, ignore_index, reduction, total)
    return torch._log_softmax_backward_data(g, logp, 1, x.dtype)


def _ce_bwd_kernel(dy, x, t, w, ignore_index, reduction, label_smoothing, dtype=None):
    if _widens(x, t, dtype, label_smoothing):
        empty = torch.zeros((), dtype=x.dtype, device=x.device).expand(0)
        return _ce_wide_bwd(dy, x, t, w, ignore_index, reduction), empty, empty
    acc = dtype or x.dtype
    if w is None and not label_smoothing and reduction != "none" and x.dim() == 2 and x.shape[0] > 0 \
            and not t.is_floating_point() and acc in (torch.float32, torch.float64) and x.device.type != "meta":
        return _ce_bwd_fast(dy, x, t, ignore_index, reduction, acc)
    acc, cdim = _acc(acc), 1 if x.dim() >= 2 else 0
    logp = torch.log_softmax(x, cdim, dtype=acc)
    ls, n_cls = label_smoothing, x.shape[cdim]
    if t.is_floating_point():
        shape = [1] * x.dim()
        shape[cdim] = n_cls
        wc = w.to(acc).view(shape) if w is not None else 1.0
        share = ls / n_cls if n_cls else math.inf   # (no class: an empty gradient)
        tt = t.to(acc) * (1 - ls) + share if ls > 0 else t.to(acc)
        a = tt * wc
        s = _scale(dy, reduction, x.numel() / n_cls if x.numel() else float("nan"), cdim, acc)
        dt = (-s * logp * wc * (1 - ls)).to(t.dtype)
        dw = None if w is None else (-s * logp * tt).sum_to_size(shape).reshape(w.shape).to(w.dtype)
    else:
        dw = None
        a, denom, hit = _class_coeffs(x, t, w, ignore_index, ls, cdim, acc)
        s = _scale(dy, reduction, denom, cdim, acc)
        dt = torch.zeros((), dtype=x.dtype, device=x.device).expand(0)
    # torch's order: the log-probs' gradient, then log_softmax's backward ``g - p sum(g)`` (an
    # infinite seed gives NaN at the target and inf elsewhere, as torch's)
    g = -s * a if t.is_floating_point() else _class_grad(s, a, hit, t != ignore_index, ls, cdim)
    dx = g - logp.exp() * g.sum(cdim, keepdim=True)
    if dw is None:
        dw = torch.zeros((), dtype=x.dtype, device=x.device).expand(0)
    return dx.to(x.dtype), dt, dw


def _nll_bwd_kernel(dy, x, t, w, ignore_index, reduction):
    acc, cdim = _acc(x.dtype), 1 if x.dim() >= 2 else 0
    a, denom, hit = _class_coeffs(x, t, w, ignore_index, 0.0, cdim, acc)
    return _class_grad(_scale(dy, reduction, denom, cdim, acc), a, hit, None, 0.0, cdim).to(x.dtype)


def _class_loss_sbp(metas, attrs):
    """Reduction 'none': split on the batch or a spatial axis (the class axis never: softmax).
    'sum': the same splits give a partial sum. 'mean': only broadcast (the denominator is global;
    ``cross_entropy``/``nll_loss`` of a global input compute it as sum / ``class_weight_total``).
    For the backward ops (dy first) the same splits, dy following the loss's split."""
    is_bwd = len(metas) == 4
    x, t = (metas[1], metas[2]) if is_bwd else (metas[0], metas[1])
    has_w = isinstance(metas[-1], Meta)
    n_out = (3 if "label_smoothing" in attrs else 1) if is_bwd else 1
    n_in = (1 if is_bwd else 0) + 2 + has_w
    sigs = [((B,) * n_in, (B,) * n_out)]
    red = attrs["reduction"]
    if len(x.shape) < 2 or red == "mean":
        return sigs
    prob = t.dtype.is_floating_point
    for a in [0] + list(range(2, len(x.shape))):
        la = a if a == 0 else a - 1          # the loss has no class axis
        ta = a if prob else la
        ins = (S(a), S(ta)) + ((B,) if has_w else ())
        if is_bwd:
            dy = S(la) if red == "none" else B
            outs = (S(a),) + ((S(ta) if prob else B, P if prob and has_w else B) if n_out == 3 else ())
            sigs.append(((dy,) + ins, outs))
        else:
            sigs.append((ins, (S(la) if red == "none" else P,)))
    return sigs


def _ce_grad(c, dy):
    x, t, w = c.inputs
    dx, dt, dw = apply(CROSS_ENTROPY_BWD, dy, x, t, w, ignore_index=c.ignore_index, reduction=c.reduction,
                       label_smoothing=c.label_smoothing, dtype=c.dtype)
    prob = t.is_floating_point()  # only the probability form is differentiable in target and weight (as torch)
    return dx, dt if prob else None, dw if prob and w is not None else None


def _nll_grad(c, dy):
    x, t, w = c.inputs
    return apply(NLL_LOSS_BWD, dy, x, t, w, ignore_index=c.ignore_index, reduction=c.reduction), None, None


# -- double backward ----------------------------------------------------------------------------
# The backward ops compute ``dx = s * (p * A - a)``: ``p`` the softmax over the class dim, ``a``
# the coefficients with loss = -sum(a * log p) (one-hot target times class weight, smoothed;
# or the probability target times class weight), ``A`` their sum over the classes and ``s`` the
# incoming gradient, divided by the 'mean' denominator. Their grad rules below are that formula's
# derivatives, written with holoflow ops (so they are differentiable again).

def _class_index_coeffs(x: Tensor, t: Tensor, w, ignore_index: int, ls: float, cdim: int) -> tuple:
    """:func:`_class_coeffs` (``a`` and the 'mean' denominator) with holoflow ops."""
    valid = t != ignore_index
    ts = E.where(valid, t, 0)
    onehot = x.detach().new_zeros(tuple(x.shape)).scatter(cdim, ts.unsqueeze(cdim), 1.0)
    wt = (w[ts] if w is not None else onehot.sum(cdim)) * valid
    a = onehot * wt.unsqueeze(cdim) * (1 - ls)
    if ls > 0:
        a = a + (ls / x.shape[cdim]) * _class_weights(w, x, cdim) * valid.unsqueeze(cdim)
    return a, wt.sum()


def _class_weights(w, x: Tensor, cdim: int):
    """The class weights broadcastable against ``x`` (1.0 without)."""
    if w is None:
        return 1.0
    shape = [1] * x.dim()
    shape[cdim] = x.shape[cdim]
    return w.reshape(tuple(shape))


def _to_loss_shape(r: Tensor, reduction: str, cdim: int, dy: Tensor) -> Tensor:
    """The gradient of ``dy`` from ``r`` (``d dx / d dy`` contracted, summed over what ``dy`` was
    broadcast over)."""
    return r.sum(cdim) if reduction == "none" else r.sum().reshape(tuple(dy.shape))


def _ce_double_backward(dy, p, a, ddx, reduction: str, denom, cdim: int) -> tuple:
    """(grad of dy, grad of the log-probs, scale ``s``, grad of ``a``) of ``dx = s * (p * A - a)``
    against ``ddx``; the log-probs' gradient goes through ``p = exp(logp)``."""
    s = dy.unsqueeze(cdim) if reduction == "none" else (dy / denom if reduction == "mean" else dy)
    big_a = a.sum(cdim, keepdim=True)
    r = ddx * (p * big_a - a)
    gdy = _to_loss_shape(r / denom if reduction == "mean" else r, reduction, cdim, dy)
    g_a = s * ((ddx * p).sum(cdim, keepdim=True) - ddx)
    return gdy, ddx * s * big_a * p, s, g_a


def _through_log_softmax(g_logp: Tensor, p: Tensor, cdim: int) -> Tensor:
    return g_logp - p * g_logp.sum(cdim, keepdim=True)


def _ce_bwd_grad(c, ddx, ddt, ddw):
    """Class indices: ``a`` is constant (neither target nor weight is differentiable, as torch).
    Probability targets: ``a = (t (1 - ls) + ls / C) * w`` and the outputs ``dt``, ``dw`` add
    terms linear in ``log p``."""
    dy, x, t, w = c.inputs
    cdim, ls, n_cls = (1 if x.dim() >= 2 else 0), c.label_smoothing, x.shape[1 if x.dim() >= 2 else 0]
    dy = dy.to(x.dtype) if dy.dtype != x.dtype else dy
    logp = x.log_softmax(cdim)
    p = logp.exp()
    prob = t.is_floating_point()
    if prob:
        wc = _class_weights(w, x, cdim)
        tt = t * (1 - ls) + ls / n_cls if ls > 0 else t
        a, denom = tt * wc, (x.numel() / n_cls if x.numel() else float("nan"))
    else:
        a, denom = _class_index_coeffs(x, t, w, c.ignore_index, ls, cdim)
    gdy, g_logp, s, g_a = _ce_double_backward(dy, p, a, ddx, c.reduction, denom, cdim)
    gt = gw = None
    if prob:
        gt, gw_full = g_a * wc * (1 - ls), g_a * tt
        if ddt is not None:      # dt = -s * logp * w * (1 - ls)
            r = -logp * wc * (1 - ls) * ddt
            gdy = gdy + _to_loss_shape(r / denom if c.reduction == "mean" else r, c.reduction, cdim, dy)
            g_logp = g_logp - s * wc * (1 - ls) * ddt
            gw_full = gw_full - s * logp * (1 - ls) * ddt
        if w is not None and ddw is not None:     # dw = sum(-s * logp * tt)
            ddw = _class_weights(ddw, x, cdim)
            r = -logp * tt * ddw
            gdy = gdy + _to_loss_shape(r / denom if c.reduction == "mean" else r, c.reduction, cdim, dy)
            g_logp = g_logp - s * tt * ddw
            gt = gt - s * logp * ddw * (1 - ls)
        if w is not None:
            gw = gw_full.sum_to_size(*_class_weights(w, x, cdim).shape).reshape(tuple(w.shape))
    gdy = gdy.to(c.inputs[0].dtype)
    return gdy, _through_log_softmax(g_logp, p, cdim), gt, gw


CROSS_ENTROPY_BWD = defop("cross_entropy_backward", _ce_bwd_kernel, sbp=_class_loss_sbp, family="loss",
                          grad=_ce_bwd_grad, save="inputs")
def _ce_kernel(x, t, w, ignore_index, reduction, label_smoothing, dtype=None):
    """torch's cross_entropy; with ``dtype`` (the loss's dtype: CUDA autocast sets float32,
    amp/policy.py's FP32_ATTR) the log-probs stay in the logits' dtype and the loss is reduced in
    ``dtype`` (see :func:`_widens`)."""
    if dtype is None or dtype == x.dtype:
        return TF.cross_entropy(x, t, w, ignore_index=ignore_index, reduction=reduction,
                                label_smoothing=label_smoothing)
    if not _widens(x, t, dtype, label_smoothing):
        return TF.cross_entropy(x.to(dtype), t, w, ignore_index=ignore_index, reduction=reduction,
                                label_smoothing=label_smoothing)
    return _nll_wide(torch.log_softmax(x, 1), t, w, ignore_index, reduction, dtype)[0]


CROSS_ENTROPY = defop("cross_entropy", _ce_kernel,
                      grad=_ce_grad, save="inputs", sbp=_class_loss_sbp, family="loss")
def _nll_bwd_grad(c, ddx):
    """``dx = -s * a`` is linear in ``dy`` and constant in ``x``: its derivative against ``ddx``
    is ``nll_loss(ddx)`` (torch's rule); neither target nor weight is differentiable."""
    dy, _, t, w = c.inputs
    gdy = nll_loss(ddx, t, w, ignore_index=c.ignore_index, reduction=c.reduction)
    return (gdy.to(dy.dtype) if gdy.dtype != dy.dtype else gdy), None, None, None


NLL_LOSS_BWD = defop("nll_loss_backward", _nll_bwd_kernel, sbp=_class_loss_sbp, family="loss",
                     grad=_nll_bwd_grad, save="inputs", saved_inputs=(0, 2, 3))
NLL_LOSS = defop("nll_loss", lambda x, t, w, ignore_index, reduction:
                 TF.nll_loss(x, t, w, ignore_index=ignore_index, reduction=reduction),
                 grad=_nll_grad, save="inputs", sbp=_class_loss_sbp, family="loss")


# The common eager case (2-D logits, class indices, no weight or smoothing, 'mean' or 'sum',
# any floating dtype) as torch computes it: log_softmax then nll_loss forward, keeping the log-probs and
# the total weight for the backward (nll_loss_backward + _log_softmax_backward_data), instead of
# cross_entropy's fused forward with log_softmax recomputed in the backward. A trace keeps the
# cross_entropy op: it saves the logits (which a graph often returns anyway) rather than log-probs
# of their size, for one log-softmax recomputed in the backward.
_REDUCTION_ENUM = {"mean": 1, "sum": 2}


def _ce_lsm_kernel(x, t, ignore_index, reduction, dtype=None):
    """(loss, log-probs in x's dtype, total weight); ``dtype``: the loss's, see :func:`_widens`."""
    logp = torch.log_softmax(x, 1)
    if _widens(x, t, dtype, 0.0):
        loss, total = _nll_wide(logp, t, None, ignore_index, reduction, dtype)
    else:
        loss, total = torch.ops.aten.nll_loss_forward.default(logp, t, None, _REDUCTION_ENUM[reduction],
                                                              ignore_index)
    return loss, logp, total


def _ce_lsm_bwd_kernel(dy, logp, t, total, ignore_index, reduction):
    """The logits' gradient (in logp's dtype, the logits')."""
    if dy.dtype != logp.dtype:   # a wider loss
        g = _nll_wide_grad(dy, logp, t, None, ignore_index, reduction, total)
    else:
        g = torch.ops.aten.nll_loss_backward.default(dy, logp, t, None, _REDUCTION_ENUM[reduction],
                                                     ignore_index, total)
    return torch._log_softmax_backward_data(g, logp, 1, logp.dtype)


def _ce_lsm_sbp(metas, attrs):
    """'mean': broadcast only (the denominator is global). 'sum': a batch split gives a partial
    loss, split log-probs and a partial total weight."""
    sigs = [((B, B), (B, B, B))]
    if attrs["reduction"] == "sum":
        sigs.append(((S(0), S(0)), (P, S(0), P)))
    return sigs


def _ce_lsm_bwd_sbp(metas, attrs):
    """dx = (softmax - onehot) * dy (/ total for 'mean'): broadcast, or for 'sum' batch-split
    log-probs and targets (the total is not read)."""
    sigs = [((B, B, B, B), (B,))]
    if attrs["reduction"] == "sum":
        sigs += [((B, S(0), S(0), P), (S(0),)), ((B, S(0), S(0), B), (S(0),))]
    return sigs


def _ce_lsm_grad(c, dy, dlogp, _dtotal):
    """``dlogp`` only comes from the double backward (the log-probs are not returned to callers)."""
    _, t = c.inputs
    _, logp, total = c.outs
    dx = apply(CE_LSM_BWD, dy, logp, t, total, ignore_index=c.ignore_index, reduction=c.reduction)
    if dlogp is not None:
        dx = dx + _through_log_softmax(dlogp, logp.exp(), 1)
    return dx, None


def _ce_lsm_bwd_grad(c, ddx):
    """The derivative with respect to the log-probs (CE_LSM's rule takes it on to the logits)."""
    dy, logp, t, total = c.inputs
    dy = dy.to(logp.dtype) if dy.dtype != logp.dtype else dy
    a, _ = _class_index_coeffs(logp, t, None, c.ignore_index, 0.0, 1)
    gdy, g_logp, _, _ = _ce_double_backward(dy, logp.exp(), a, ddx, c.reduction, total.to(logp.dtype), 1)
    return gdy.to(c.inputs[0].dtype), g_logp, None, None


CE_LSM_BWD = defop("cross_entropy_log_softmax_backward", _ce_lsm_bwd_kernel, sbp=_ce_lsm_bwd_sbp, family="loss",
                   grad=_ce_lsm_bwd_grad, save="inputs")
CE_LSM = defop("cross_entropy_log_softmax", _ce_lsm_kernel, grad=_ce_lsm_grad, sbp=_ce_lsm_sbp, family="loss",
               outputs=("loss", "log_probs", "total_weight"), save="both", saved_inputs=(1,),
               saved_outputs=(1, 2), grad_reads=(0,))


def _saves_log_softmax(input: Tensor, target: Tensor, weight, reduction: str, label_smoothing: float) -> bool:
    """Whether ``cross_entropy`` runs as CE_LSM (see above)."""
    return (weight is None and not label_smoothing and reduction != "none" and input.dim() == 2
            and input.shape[0] > 0 and not target.is_floating_point() and not input.is_global
            and input._data.dtype.is_floating_point and not interpret.is_lazy())


def _weight_total_kernel(t, w, ignore_index, dtype):
    valid = t != ignore_index
    if w is None:
        return valid.sum().to(dtype)
    acc = _acc(w.dtype)
    return (w.to(acc)[torch.where(valid, t, torch.zeros_like(t))] * valid).sum().to(dtype)


def _weight_total_sbp(metas, attrs):
    """The total is a sum over targets: a split target gives partial sums (weights broadcast)."""
    w = (B,) if isinstance(metas[1], Meta) else ()
    return [((B,) + w, (B,))] + [((S(a),) + w, (P,)) for a in range(len(metas[0].shape))]


# the 'mean' denominator of a class-index loss: the total weight of the non-ignored targets
CLASS_WEIGHT_TOTAL = defop("class_weight_total", _weight_total_kernel, sbp=_weight_total_sbp, family="loss",
                           differentiable=False, shape=lambda metas, attrs: [Meta((), attrs["dtype"],
                                                                                 metas[0].device)])


def _split_mean(op, input: Tensor, target: Tensor, weight, **attrs) -> Tensor | None:
    """'mean' of a global (N, C, ...) input as ``sum / denominator``: both are sums over the batch,
    so a batch-split input gives two partial-sum scalars to all-reduce instead of gathering the
    input (the fused kernel's 'mean' needs the global denominator). None: use the fused kernel."""
    if not input.is_global or input.dim() < 2:
        return None
    total = apply(op, input, target, weight, reduction="sum", **attrs)
    if target.is_floating_point():   # class probabilities: torch divides by the element count
        n = input.numel() // input.shape[1]
        return total / n if n else total * float("nan")
    return total / apply(CLASS_WEIGHT_TOTAL, target, weight, ignore_index=attrs["ignore_index"],
                         dtype=input._data.dtype)


def _check_class_target(name: str, input: Tensor, target: Tensor, weight, allow_prob: bool) -> Tensor:
    """The target checked; a uint8 one (torch's kernels take Long or Byte) as int64 (the class
    indices the kernels read)."""
    x, t = tuple(input.shape), tuple(target.shape)
    if input.dim() == 0:
        raise ShapeError(f"holoflow.{name}: input must have a class dim, got a 0-d tensor")
    n_cls = x[1] if len(x) >= 2 else x[0]
    if len(x) >= 2 and t != x and (not t or t[0] != x[0]):   # (torch's first check, a 0-d target's batch: 0)
        raise ShapeError(f"holoflow.{name}: expected input batch_size ({x[0]}) to match target batch_size "
                         f"({t[0] if t else 0}): input of shape {x} needs a class-index target of shape "
                         f"{x[:1] + x[2:]}, got {t}")
    if target.is_floating_point():
        if not allow_prob:
            raise DTypeError(f"holoflow.{name}: target must hold class indices (int64), got {target.dtype}")
        if t != x:
            raise ShapeError(f"holoflow.{name}: a probability target (dtype {target.dtype}) must have the "
                             f"input's shape {x}, got {t}")
    else:
        if target._data.dtype not in (torch.int64, torch.uint8):   # (torch's kernels take Long or Byte)
            raise RuntimeError(f"holoflow.{name}: expected a class-index target of dtype int64 (long) or uint8 "
                               f"(byte), got {target.dtype}"
                               + (" (or a floating target of probabilities)" if allow_prob else ""))
        want = x[:1] + x[2:] if len(x) >= 2 else ()
        if t != want:
            raise ShapeError(f"holoflow.{name}: input of shape {x} (classes on dim {1 if len(x) >= 2 else 0}) "
                             f"needs a class-index target of shape {want}, got {t}")
    if weight is not None and tuple(weight.shape) != (n_cls,):
        raise ShapeError(f"holoflow.{name}: weight of shape {tuple(weight.shape)} should be ({n_cls},)")
    if target._data.dtype != torch.uint8:
        return target
    if len(x) > 2:   # (torch's spatial kernel takes Long only)
        raise RuntimeError(f"holoflow.{name}: a class-index target of an input with spatial dims (shape {x}) must "
                           f"be int64 (long), got {target.dtype}")
    return target.to(torch.int64)


def _smoothed_cross_entropy(x: Tensor, target: Tensor, reduction: str, ignore_index: int,
                            label_smoothing: float) -> Tensor:
    """torch's label-smoothing composite for class indices without weights, op for op (its
    gradients bit for bit): ``(1 - ls) nll + ls / C`` times the masked ``-sum(log_softmax)``."""
    logp = log_softmax(x, 1)
    nll = nll_loss(logp, target, ignore_index=ignore_index, reduction=reduction)
    ignored = target == ignore_index
    smooth = (-logp.sum(1)).masked_fill(ignored, 0.0)
    if reduction == "mean":
        smooth = smooth.sum() / (~ignored).sum()
    elif reduction == "sum":
        smooth = smooth.sum()
    # (no class: torch's double division gives inf, so the loss is NaN, not a Python error)
    share = label_smoothing / x.shape[1] if x.shape[1] else math.inf
    return (1 - label_smoothing) * nll + smooth * share


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
                  ignore_index: int = -100, reduce=None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """``nll_loss(log_softmax(input, 1), target)`` for class indices, or ``-sum(target * log_softmax)``
    for class probabilities; input is ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)``."""
    reduction = _reduction("cross_entropy", reduction, size_average, reduce)
    byte = isinstance(target, Tensor) and target._data.dtype == torch.uint8
    target = _check_class_target("cross_entropy", input, target, weight, True)
    if byte and label_smoothing and weight is not None and reduction == "mean":
        raise RuntimeError("holoflow.cross_entropy: a uint8 class-index target with label_smoothing, weight and "
                           "reduction 'mean' is refused (torch's composite gathers the weights at the target, "
                           "which takes int64 indices only); pass target.long()")
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"holoflow.cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if (label_smoothing and weight is None and input.dim() == 2 and input.shape[0] > 0 and not input.is_global
            and not target.is_floating_point() and input._data.dtype.is_floating_point and interpret.plain()):
        return _smoothed_cross_entropy(input, target, reduction, ignore_index, float(label_smoothing))
    if reduction == "mean":
        out = _split_mean(CROSS_ENTROPY, input, target, weight, ignore_index=ignore_index,
                          label_smoothing=float(label_smoothing))
        if out is not None:
            return out
    if _saves_log_softmax(input, target, weight, reduction, label_smoothing):
        return apply(CE_LSM, input, target, ignore_index=ignore_index, reduction=reduction).loss
    return apply(CROSS_ENTROPY, input, target, weight, ignore_index=ignore_index, reduction=reduction,
                 label_smoothing=float(label_smoothing))


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
             ignore_index: int = -100, reduce=None, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities ``input`` at the ``target`` classes."""
    reduction = _reduction("nll_loss", reduction, size_average, reduce)
    target = _check_class_target("nll_loss", input, target, weight, False)
    if reduction == "mean":
        out = _split_mean(NLL_LOSS, input, target, weight, ignore_index=ignore_index)
        if out is not None:
            return out
    return apply(NLL_LOSS, input, target, weight, ignore_index=ignore_index, reduction=reduction)


# -- composites ------------------------------------------------------------------------------------

# The inputs of a composite op in a trace that the graph's AMP pass will rewrite: an identity whose
# attr ``amp_policy`` names the autocast class its value falls under (graph/passes/amp.py looks a
# node's policy up by that attr when it has one), so ``config.enable_amp`` casts a composite loss
# as autocast does at its boundary.
AMP_BOUNDARY = defop("amp_boundary", lambda x, amp_policy: x, grad=lambda ctx, dy: (dy,), shape=like_first_input,
                     sbp=elementwise_sbp(("P",)))


__all__ = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
           "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss"]


# -- losses ------------------------------------------------------------------------------------------

def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0, size_average=None,
                        reduce=None, reduction: str = "mean") -> Tensor:
    """``max(0, -target * (input1 - input2) + margin)``, reduced."""
    red = _reduction("margin_ranking_loss", reduction, size_average, reduce)
    input1, input2, target = interpret.composite("margin_ranking_loss", input1, input2, target)
    if not input1.dim() == input2.dim() == target.dim():
        raise ShapeError(f"holoflow.margin_ranking_loss: all inputs need the same number of dims, got "
                         f"{tuple(input1.shape)}, {tuple(input2.shape)} and target {tuple(target.shape)}")
    return reduce_loss((-target * (input1 - input2) + margin).clamp_min(0.0), red)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0, size_average=None,
                          reduce=None, reduction: str = "mean") -> Tensor:
    """``1 - cos(x1, x2)`` where ``target == 1``, ``max(0, cos - margin)`` where ``target == -1``."""
    red = _reduction("cosine_embedding_loss", reduction, size_average, reduce)
    input1, input2 = interpret.composite("cosine_embedding_loss", input1, input2)
    if target.dim() not in (0, 1) or input1.dim() != target.dim() + 1 or input2.dim() != target.dim() + 1:
        raise ShapeError(f"holoflow.cosine_embedding_loss: expected a 1-D target with 2-D inputs or a 0-D target "
                         f"with 1-D inputs, got {tuple(input1.shape)}, {tuple(input2.shape)} and target "
                         f"{tuple(target.shape)}")
    d = target.dim()
    eps = 1e-12  # torch's EPSILON
    prod = _sum(input1 * input2, d)
    den = ((_sum(input1 * input1, d) + eps) * (_sum(input2 * input2, d) + eps)).sqrt()
    cos = prod / den
    zero = zeros_like(cos)
    loss = E.where(target == 1, 1 - cos, zero) + E.where(target == -1, (cos - margin).clamp_min(0.0), zero)
    return reduce_loss(loss, red)


def _gaussian_var(input: Tensor, var) -> Tensor:
    if not isinstance(var, Tensor):
        if var < 0:
            raise ValueError("holoflow.gaussian_nll_loss: var has negative entry/entries")
        return ones_like(input) * float(var)   # (torch's; 0 * x would be NaN at an infinite x)
    if bool((var < 0).any()):
        raise ValueError("holoflow.gaussian_nll_loss: var has negative entry/entries")
    vs, xs = tuple(var.shape), tuple(input.shape)
    if vs == xs:
        return var
    if xs[:-1] == vs:
        return var.unsqueeze(-1)
    if len(vs) == len(xs) and sum(v for x, v in zip(xs, vs) if x != v) == 1:
        return var  # one broadcast dim of size 1: homoscedastic along it
    raise ShapeError(f"holoflow.gaussian_nll_loss: var of shape {vs} is of incorrect size for input of shape {xs} "
                     f"(same shape, the input's shape without its last dim, or one dim of size 1)")


def gaussian_nll_loss(input: Tensor, target: Tensor, var, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> Tensor:
    """``0.5 (log var + (input - target)^2 / var)`` (+ ``0.5 log 2 pi`` if ``full``), reduced.
    ``var`` is clamped to ``eps`` for the value only: its gradient passes the clamp unchanged, as
    torch's: an in-place clamp of a clone under ``no_grad`` (the straight-through sum
    ``clamp(v) + (v - v)`` was NaN at an infinite variance)."""
    red = _reduction("gaussian_nll_loss", reduction)
    var = _gaussian_var(input, var).clone()
    with no_grad():
        var.clamp_(min=eps)
    d = input - target
    loss = (var.log() + d * d / var) * 0.5
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return reduce_loss(loss, red)


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False, size_average=None,
                     eps: float = 1e-8, reduce=None, reduction: str = "mean") -> Tensor:
    """Poisson negative log-likelihood: ``exp(input) - target * input`` for log-rates (else
    ``input - target * log(input + eps)``), plus Stirling's term for ``target > 1`` if ``full``."""
    red = _reduction("poisson_nll_loss", reduction, size_average, reduce)
    input, target = interpret.composite("poisson_nll_loss", input, target)
    loss = input.exp() - target * input if log_input else input - target * (input + eps).log()
    if full:
        stirling = target * target.log() - target + (target * (2 * math.pi)).log() * 0.5
        loss = loss + stirling.masked_fill(target <= 1, 0.0)
    return reduce_loss(loss, red)


__all__ += ["margin_ranking_loss", "cosine_embedding_loss", "gaussian_nll_loss", "poisson_nll_loss"]
