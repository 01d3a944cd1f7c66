"""The elementwise losses (l1, mse, smooth_l1, huber, binary cross-entropy with and without
logits, kl_div, soft_margin) and the reductions every loss shares. Most are composites of
elementwise ops; binary_cross_entropy, its logits form and soft_margin_loss are ops on torch's
kernels with torch's backward formulas (written with holoflow ops, so they differentiate again),
since their composites differ from torch at the edges (x = 0 or 1, infinite logits)."""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from ..core import grad_mode, interpret
from ..core.dtype import promote_types
from ..core.dispatch import apply
from ..core.errors import DTypeError, ShapeError, UnsupportedError
from ..core.registry import defop
from ..core.sbp import B
from ..core.tensor import Tensor
from . import elementwise as E
from .family import SUM_TO, elementwise_sbp, elementwise_shape, needs, reduce_grad
from .nn_ops import logsigmoid

_REDUCTIONS = ("none", "mean", "sum")


def _reduction(name: str, reduction: str, size_average=None, reduce=None) -> str:
    if size_average is not None or reduce is not None:  # torch's legacy arguments
        size_average = True if size_average is None else size_average
        reduction = "none" if reduce is False else ("mean" if size_average else "sum")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"holoflow.{name}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


def reduce_loss(loss: Tensor, reduction: str, name: str = "loss") -> Tensor:
    """'none' -> as is; 'sum' -> total; 'mean' -> total / numel (nan for an empty loss); as torch's
    mean, not of an integer loss (``l1_loss`` of two integer tensors: torch's RuntimeError)."""
    if reduction == "none":
        return loss
    if reduction == "mean" and not (loss.is_floating_point() or loss.is_complex()):
        raise DTypeError(f"holoflow.{name}: the mean of a loss of dtype {loss.dtype} is not defined (as torch's "
                         f"mean of integers); pass floating point tensors, or reduction='sum' or 'none'")
    total = apply(SUM_TO, loss, shape=())
    return total if reduction == "sum" else total / loss.numel() if loss.numel() else total * float("nan")


def _pair(name: str, input: Tensor, target: Tensor, same_shape: bool = False) -> None:
    if same_shape and tuple(input.shape) != tuple(target.shape):
        raise ShapeError(f"holoflow.{name}: target of shape {tuple(target.shape)} must have the input's "
                         f"shape {tuple(input.shape)}")


# -- ops on torch's kernels, with torch's backward formulas (tools/autograd/derivatives.yaml) ----------

def _bce_grad(c, dy):
    """torch's: ``d/dx = dy (x - t) / max(x (1 - x), 1e-12)``, ``d/dt = -dy logit(x)``."""
    x, t = c.inputs
    return (reduce_grad(dy * (x - t) / (x * (1 - x)).clamp_min(1e-12), c, 0) if needs(c, 0) else None,
            reduce_grad(-dy * E.logit(x), c, 1) if needs(c, 1) else None)


def _bce_kernel(x, t):
    return TF.binary_cross_entropy(x, t, reduction="none")


BCE = defop("binary_cross_entropy", _bce_kernel, grad=_bce_grad, save="inputs", family="elementwise",
            shape=elementwise_shape("binary_cross_entropy", _bce_kernel), sbp=elementwise_sbp())


def _bce_logits_kernel(x, t, pos_weight):
    return TF.binary_cross_entropy_with_logits(x, t, reduction="none", pos_weight=pos_weight)


def _bce_logits_grad(c, dy):
    """torch's: ``d/dx = dy (sigmoid(x) - t)``, with ``pos_weight`` ``dy ((pw t + 1 - t) sigmoid(x)
    - pw t)``; ``d/dt = -dy x`` (``dy (logsigmoid(-x) - pw logsigmoid(x))``). torch gives
    ``pos_weight`` no gradient; holoflow's is ``-dy t logsigmoid(x)``."""
    x, t, pw = c.inputs
    sig = x.sigmoid()
    if pw is None:
        dx = dy * (sig - t) if needs(c, 0) else None
        dt = -dy * x if needs(c, 1) else None
        return (reduce_grad(dx, c, 0) if dx is not None else None,
                reduce_grad(dt, c, 1) if dt is not None else None, None)
    pt = pw * t
    dx = dy * ((pt + 1 - t) * sig - pt) if needs(c, 0) else None
    dt = dy * (logsigmoid(-x) - pw * logsigmoid(x)) if needs(c, 1) else None
    dpw = -dy * t * logsigmoid(x) if needs(c, 2) else None
    return tuple(reduce_grad(g, c, i) if g is not None else None for i, g in enumerate((dx, dt, dpw)))


BCE_LOGITS = defop("binary_cross_entropy_with_logits", _bce_logits_kernel, grad=_bce_logits_grad, save="inputs",
                   family="elementwise", shape=elementwise_shape("binary_cross_entropy_with_logits",
                                                                 _bce_logits_kernel), sbp=elementwise_sbp())


def _soft_margin_kernel(x, t):
    return TF.soft_margin_loss(x, t, reduction="none")


def _soft_margin_grad(c, dy):
    """torch's: ``d/dx = -dy t z / (1 + z)`` with ``z = exp(-t x)`` (NaN where z is infinite, as
    torch's). torch gives the target no gradient; holoflow's is the same form with x for t."""
    x, t = c.inputs
    z = (-t * x).exp()
    f = z / (1 + z)
    return (reduce_grad(-dy * t * f, c, 0) if needs(c, 0) else None,
            reduce_grad(-dy * x * f, c, 1) if needs(c, 1) else None)


SOFT_MARGIN = defop("soft_margin_loss", _soft_margin_kernel, grad=_soft_margin_grad, save="inputs",
                    family="elementwise", shape=elementwise_shape("soft_margin_loss", _soft_margin_kernel),
                    sbp=elementwise_sbp())


_ENUM = {"none": 0, "mean": 1, "sum": 2}   # (torch's reduction enum)
_LOCAL_ONLY = dict(save="inputs", sbp=lambda metas, attrs: [((B,) * sum(m is not None for m in metas), (B,))])


def _aten_loss(name: str, forward, backward, formula):
    """A pointwise loss with its reduction as torch runs its eager case: ``forward(x, t, enum,
    **attrs)`` (aten's kernel) and, for each input, aten's ``backward(dy, x, t, enum, **attrs)``
    (the target's: the input's negated, as torch's formulas are) when no graph of the backward is
    recorded, else ``formula(d, dy, norm, **attrs)`` with holoflow ops (differentiable again; ``d``
    the difference, ``norm`` 1/numel for a mean). Local eager tensors only (``_eager_case``);
    global tensors and traces take the loss's composite."""
    bwd = defop(f"{name}_backward", lambda dy, x, t, reduction, **a: backward(dy, x, t, _ENUM[reduction], **a),
                **_LOCAL_ONLY)   # (runs with grad mode off: never recorded)

    def grad(c, dy):
        x, t = c.inputs
        attrs = {k: v for k, v in c.attrs.items() if k != "reduction"}
        if not grad_mode.STATE.enabled:
            gx = apply(bwd, dy, x, t, **c.attrs) if needs(c, 0) or needs(c, 1) else None
            return (gx if needs(c, 0) else None, -gx if needs(c, 1) else None)
        norm = 1.0 / x.numel() if c.reduction == "mean" else 1.0
        gx = formula(x - t, dy, norm, **attrs)
        return (gx if needs(c, 0) else None, -gx if needs(c, 1) else None)
    return defop(name, lambda x, t, reduction, **a: forward(x, t, _ENUM[reduction], **a), grad=grad, **_LOCAL_ONLY)


def _broadcast_pair(input, target) -> tuple:
    """torch.nn.functional's first step: input and target expanded to one shape, so they promote
    as equals (a 0-d float32 target makes a float16 input's loss float32, as ``input - target``
    alone would not)."""
    if not (isinstance(input, Tensor) and isinstance(target, Tensor)) or input.shape == target.shape:
        return input, target
    shape = tuple(torch.broadcast_shapes(tuple(input.shape), tuple(target.shape)))
    return input.expand(shape), target.expand(shape)


def _floating_pair(name: str, input, target) -> tuple:
    """``_broadcast_pair``, cast to the promoted dtype torch's kernel computes in (a bool input
    too); torch's kernels (mse, smooth_l1) take floating point dtypes only."""
    input, target = _broadcast_pair(input, target)
    if not (isinstance(input, Tensor) and isinstance(target, Tensor)):
        return input, target
    dt = promote_types(input.dtype, target.dtype)
    if not dt.is_floating_point:
        raise UnsupportedError(f"holoflow.{name}: torch's kernel is not implemented for {dt} (input {input.dtype}, "
                               f"target {target.dtype}); pass floating point tensors")
    return input.to(dt), target.to(dt)


def _eager_case(input, target) -> bool:
    """Whether a pointwise loss runs as torch's eager kernels: local, untraced, same shape and
    floating dtype, not empty (the rest: broadcasting, mixed dtypes, global tensors, traces)."""
    return (isinstance(input, Tensor) and isinstance(target, Tensor) and input._global is None
            and target._global is None and not interpret.is_lazy() and input.shape == target.shape
            and input.dtype == target.dtype and input.dtype.is_floating_point and input.numel() > 0)


# values and gradients bit for bit torch's (a composite's mean backward scales first: last-bit differences)
MSE = _aten_loss("mse_loss", torch.ops.aten.mse_loss.default, torch.ops.aten.mse_loss_backward.default,
                 lambda d, dy, norm: (2.0 * norm) * d * dy)
SMOOTH_L1 = _aten_loss(
    "smooth_l1_loss", lambda x, t, r, beta: torch.ops.aten.smooth_l1_loss.default(x, t, r, beta),
    lambda dy, x, t, r, beta: torch.ops.aten.smooth_l1_loss_backward.default(dy, x, t, r, beta),
    lambda d, dy, norm, beta: E.where(d < -beta, -norm * dy, E.where(d > beta, norm * dy, norm * d * dy / beta)))
HUBER = _aten_loss(
    "huber_loss", lambda x, t, r, delta: torch.ops.aten.huber_loss.default(x, t, r, delta),
    lambda dy, x, t, r, delta: torch.ops.aten.huber_loss_backward.default(dy, x, t, r, delta),
    lambda d, dy, norm, delta: E.where(d < -delta, -norm * dy * delta,
                                       E.where(d > delta, norm * dy * delta, norm * d * dy)))


def mse_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean",
             weight=None) -> Tensor:
    """Mean squared error ``(input - target)^2``, reduced."""
    input, target = _floating_pair("mse_loss", *interpret.composite("mse_loss", input, target))
    reduction = _reduction("mse_loss", reduction, size_average, reduce)
    if _eager_case(input, target):
        return apply(MSE, input, target, reduction=reduction)
    d = input - target
    return reduce_loss(d * d, reduction)


def l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """Mean absolute error ``|input - target|``, reduced."""
    input, target = _broadcast_pair(*interpret.composite("l1_loss", input, target))
    return reduce_loss((input - target).abs(), _reduction("l1_loss", reduction, size_average, reduce), "l1_loss")


def smooth_l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean",
                   beta: float = 1.0) -> Tensor:
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (L1 for ``beta == 0``)."""
    input, target = _floating_pair("smooth_l1_loss", *interpret.composite("smooth_l1_loss", input, target))
    reduction = _reduction("smooth_l1_loss", reduction, size_average, reduce)
    if beta < 0:
        raise RuntimeError(f"holoflow.smooth_l1_loss: beta must be non-negative, got {beta}")
    if beta > 0 and _eager_case(input, target):
        return apply(SMOOTH_L1, input, target, reduction=reduction, beta=float(beta))
    d = (input - target).abs()
    if beta == 0:
        return reduce_loss(d, reduction)
    # the quadratic side (also for NaN, as torch's kernel) reads d only where chosen: an infinite d
    # gives torch's +-1, not 0 * inf
    inside = ~(d >= beta)
    dq = E.where(inside, d, 0.0)
    return reduce_loss(E.where(inside, dq * dq * (0.5 / beta), d - 0.5 * beta), reduction)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)``."""
    input, target = interpret.composite("huber_loss", input, target)
    if delta <= 0:
        raise RuntimeError(f"holoflow.huber_loss: delta must be positive, got {delta}")
    if _eager_case(input, target):
        return apply(HUBER, input, target, reduction=_reduction("huber_loss", reduction), delta=float(delta))
    d = (input - target).abs()
    inside = ~(d >= delta)   # (as smooth_l1_loss)
    dq = E.where(inside, d, 0.0)
    return reduce_loss(E.where(inside, dq * dq * 0.5, (d - 0.5 * delta) * delta), _reduction("huber_loss", reduction))


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
                         reduce=None, reduction: str = "mean") -> Tensor:
    """``-(t log x + (1 - t) log(1 - x))`` for probabilities ``x``, the logs clamped at -100 as
    torch does; ``weight`` rescales each element."""
    input, target = interpret.composite("binary_cross_entropy", input, target)
    _pair("binary_cross_entropy", input, target, same_shape=True)
    if not interpret.is_lazy() and not input.is_global:  # a value check: eager local tensors only
        inside = (input >= 0) & (input <= 1)  # NaN is outside too, as in torch
        if not bool(inside.all()):
            bad = input.detach()[~inside]
            raise RuntimeError(f"holoflow.binary_cross_entropy: all elements of input should be between 0 and 1 "
                               f"(probabilities); {bad.numel()} are not, e.g. {float(bad.reshape(-1)[0])}; for "
                               f"logits use binary_cross_entropy_with_logits")
    loss = apply(BCE, input, target)
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, _reduction("binary_cross_entropy", reduction, size_average, reduce))


def _bce_logits_reduced_grad(c, dy):
    """torch's binary_cross_entropy_with_logits_backward and _target_backward, in its order: the
    elementwise gradient times dy, times weight, then divided by the count for a mean."""
    x, t, w, pw = c.inputs

    def finish(g):
        g = g * dy
        g = g * w if w is not None else g
        return g / x.numel() if c.reduction == "mean" else g
    gx = gt = None
    if needs(c, 0):
        if pw is None:
            gx = finish(x.sigmoid() - t)
        else:
            pt = pw * t
            gx = finish((pt + 1 - t) * x.sigmoid() - pt)
    if needs(c, 1):
        gt = finish(-x if pw is None else logsigmoid(-x) - logsigmoid(x) * pw)
    return gx, gt, None, None


# the common eager case (local tensors) as torch runs it: its kernel with the reduction, its backward
# formulas (bit for bit torch's); global tensors and traces take the elementwise op and a reduction
BCE_LOGITS_REDUCED = defop("binary_cross_entropy_with_logits_reduced", lambda x, t, w, pw, reduction:
                           TF.binary_cross_entropy_with_logits(x, t, w, reduction=reduction, pos_weight=pw),
                           grad=_bce_logits_reduced_grad, **_LOCAL_ONLY)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     size_average=None, reduce=None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """``binary_cross_entropy(sigmoid(input), target)`` computed stably from logits;
    ``pos_weight`` weighs the positive term (broadcast along the class dim)."""
    _pair("binary_cross_entropy_with_logits", input, target, same_shape=True)
    red = _reduction("binary_cross_entropy_with_logits", reduction, size_average, reduce)
    # (weights that require grad keep the composite, which differentiates them: torch refuses to)
    if all(v is None or (isinstance(v, Tensor) and v._global is None) for v in (input, target, weight, pos_weight)) \
            and not interpret.is_lazy() and input.numel() and \
            not any(v is not None and v.requires_grad for v in (weight, pos_weight)):
        return apply(BCE_LOGITS_REDUCED, input, target, weight, pos_weight, reduction=red)
    loss = apply(BCE_LOGITS, input, target, pos_weight)
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, red)


def kl_div(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False) -> Tensor:
    """``target * (log target - input)`` with ``input`` log-probabilities (``target`` too when
    ``log_target``); reduction 'batchmean' divides the sum by the batch size."""
    input, target = interpret.composite("kl_div", input, target)
    if reduction == "batchmean":
        red = "batchmean"
    else:
        red = _reduction("kl_div", reduction, size_average, reduce)
    if log_target:
        loss = target.exp() * (target - input)
    else:
        loss = E.xlogy(target, target) - target * input
    if red == "batchmean":
        total = reduce_loss(loss, "sum")
        return total / input.shape[0] if input.dim() else total
    return reduce_loss(loss, red)


def soft_margin_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """``log(1 + exp(-target * input))``."""
    input, target = interpret.composite("soft_margin_loss", input, target)
    return reduce_loss(apply(SOFT_MARGIN, input, target), _reduction("soft_margin_loss", reduction))


__all__ = ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss"]
