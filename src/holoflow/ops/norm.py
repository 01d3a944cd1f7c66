"""Normalization primitives: layer_norm, group_norm, batch_norm (ATen forward and backward
kernels; the backward ops' own grad rules, the double backward, are written with holoflow ops),
and rms_norm/instance_norm composites; local_response_norm (a composite) and renorm (each
sub-tensor rescaled to a maximum norm: ATen's kernel and derivative)."""
from __future__ import annotations

import math

import torch

from ..core import grad_mode
from ..core.dispatch import apply
from ..core.errors import ShapeError, normalize_dim
from ..core.interpret import is_lazy
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from ..core.registry import defop
from .family import needs
from .nn_ops import _tensor_flags, sum_keep
from .pointwise import _tensor
from .shape import pad
from .torch_vjp import defop_vjp


# -- layer_norm / group_norm / rms_norm --------------------------------------------------------

def _norm_sbp(lead_axes):
    """x, mean, rstd (and dy, dx) split on an axis the norm doesn't reduce; weight/bias B; the
    backward's dweight/dbias are then partial sums."""
    def rule(metas, attrs):
        flags = _tensor_flags(metas)
        nd = len(metas[0].shape)
        n_out = 3
        is_bwd = "output_mask" in attrs
        sigs = [((B,) * sum(flags), (B,) * n_out)]
        for a in lead_axes(nd, attrs, metas):
            ins = tuple(S(a) if i < (4 if is_bwd else 1) else B for i, f in enumerate(flags) if f)
            outs = (S(a), P, P) if is_bwd else (S(a),) * 3
            sigs.append((ins, outs))
        return sigs
    return rule


def _ln_axes(nd, attrs, metas):
    return range(nd - len(attrs["normalized_shape"]))


def _opt(t, like: torch.Tensor, n: int) -> torch.Tensor:
    return t if t is not None else like.new_zeros(n)


def _dx(t, x: torch.Tensor) -> torch.Tensor:
    """The input gradient, or (output_mask[0] off: the input needs none, a graph input say) a
    zero of the input's meta that the grad rule drops; aten returns None there."""
    return t if t is not None else x.new_zeros(()).expand(x.shape)


def _norm_double_backward(dy, x, mean, rstd, w, dims, ddx, ddw, ddb):
    """The gradients ``(of dy, of x, of w)`` of a normalization's backward
    ``dx = rstd * P(dy * w)``, ``dw = sum(dy * xhat)``, ``db = sum(dy)`` against the cotangents
    ``ddx, ddw, ddb`` (None: not needed), where ``xhat = (x - mean) * rstd`` and
    ``P(v) = v - mean(v) - xhat * mean(v * xhat)`` (means over ``dims``, the normalized ones) is
    symmetric. Everything is given broadcastable to ``x``; ``gw`` comes back in that form, unsummed.
    As torch's, ``mean``/``rstd`` are the forward's saved statistics and the derivative through
    them (as functions of ``x``) is part of ``gx``: none is returned for them."""
    n = math.prod(x.shape[d] for d in dims)
    xhat = (x - mean) * rstd
    avg = lambda t: sum_keep(t, dims) / n
    proj = lambda v: v - avg(v) - xhat * avg(v * xhat)
    gdy = gxhat = gw = gx = None
    if ddx is not None:
        g = dy if w is None else dy * w
        pdd = rstd * proj(ddx)
        gdy = pdd if w is None else pdd * w
        gw = pdd * dy
        gxhat = -rstd * (ddx * avg(g * xhat) + g * avg(ddx * xhat))
        gx = -rstd * xhat * avg(ddx * rstd * proj(g))      # through rstd's dependence on x
    if ddw is not None:
        gdy = _plus(gdy, ddw * xhat)
        gxhat = _plus(gxhat, ddw * dy)
    if ddb is not None:
        gdy = _plus(gdy, ddb)
    if gxhat is not None:
        gx = _plus(gx, rstd * proj(gxhat))
    if gdy is not None and tuple(gdy.shape) != tuple(x.shape):
        gdy = gdy.expand(tuple(x.shape))
    return gdy, gx, gw


def _plus(a, b):
    return b if a is None else a + b


def _wanted(dys, mask) -> tuple:
    """The cotangents of the outputs the backward op computed (``output_mask``; the others are
    placeholders)."""
    return tuple(d if m else None for d, m in zip(dys, mask))


def _as(g, like):
    """``g`` in ``like``'s dtype (reduced-precision inputs meet float32 statistics)."""
    return g if g is None or g.dtype == like.dtype else g.to(like.dtype)


def _ln_bwd_grad(c, *dys):
    dy, x, mean, rstd, w, _ = c.inputs
    dims = tuple(range(x.dim() - len(c.normalized_shape), x.dim()))
    ddx, ddw, ddb = _wanted(dys, c.output_mask)
    gdy, gx, gw = _norm_double_backward(dy, x, mean, rstd, w, dims, ddx, ddw, ddb)
    gw = None if gw is None or w is None else sum_keep(gw, range(x.dim() - len(dims))).reshape(tuple(w.shape))
    return _as(gdy, dy), _as(gx, x), None, None, _as(gw, w), None


def _ln_bwd_kernel(dy, x, mean, rstd, w, b, normalized_shape, output_mask):
    dy, x, mean, rstd = (t.contiguous() for t in (dy, x, mean, rstd))  # strided shards read wrongly
    # the CPU kernel wants the statistics its forward gives: float32 for a low-precision x with a
    # float32 weight (its mixed-type path), else x's dtype. The meta kernel (the IR's dtypes) says
    # float32 for any low-precision x, so under a graph's AMP a backward cast back to its traced
    # float32 x could meet the bf16 statistics of a weightless bf16 forward
    mixed = w is not None and w.dtype == torch.float32 and x.dtype in (torch.bfloat16, torch.float16)
    want = torch.float32 if mixed else x.dtype
    if x.device.type == "cpu" and mean.dtype != want:
        mean, rstd = mean.to(want), rstd.to(want)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward.default(dy, x, normalized_shape, mean, rstd, w, b,
                                                           output_mask)
    return _dx(dx, x), _opt(dw, x, 0), _opt(db, x, 0)


LAYER_NORM_BWD = defop("layer_norm_backward", _ln_bwd_kernel, sbp=_norm_sbp(_ln_axes),
                       grad=_ln_bwd_grad, save="inputs", family="norm", mask_split=True)


def _ln_grad(c, dy, _dmean, _drstd):
    x, w, b = c.inputs
    _, mean, rstd = c.outs
    mask = [needs(c, 0), w is not None and needs(c, 1), b is not None and needs(c, 2)]
    dx, dw, db = apply(LAYER_NORM_BWD, dy, x, mean, rstd, w, b,
                       normalized_shape=c.normalized_shape, output_mask=mask)
    return dx if mask[0] else None, dw if mask[1] else None, db if mask[2] else None


LAYER_NORM = defop("layer_norm", lambda x, w, b, normalized_shape, eps:
                   torch.native_layer_norm(x, normalized_shape, w, b, eps),
                   grad=_ln_grad, save="both", saved_outputs=(1, 2), sbp=_norm_sbp(_ln_axes),
                   outputs=("out", "mean", "rstd"), grad_reads=(0,), family="norm")


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalizes over the last ``len(normalized_shape)`` dims, then scales and shifts."""
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(input.shape[input.dim() - len(ns):]) != ns or len(ns) > input.dim():
        raise ShapeError(f"holoflow.layer_norm: input of shape {tuple(input.shape)} does not end with "
                         f"normalized_shape {ns}")
    return apply(LAYER_NORM, input, weight, bias, normalized_shape=ns, eps=eps).out


def _gn_dims(x: torch.Tensor) -> tuple:
    n, c = x.shape[0], x.shape[1]
    hxw = x[0, 0].numel() if n and c else math.prod(x.shape[2:])
    return n, c, hxw


def _gn_format(x: torch.Tensor) -> torch.memory_format:
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


def _gn_layout(x: torch.Tensor, fmt: torch.memory_format | None = None) -> torch.Tensor:
    """ATen's native group norm (forward and backward) reads ``x`` and ``dy`` as dense in one
    memory format (torch's ``F.group_norm`` densifies its input first; a strided ``dy`` is read
    wrongly): a strided view, e.g. a transposed ``(N, T, C)`` activation, is copied; contiguous
    and channels-last tensors are kept; ``dy`` follows ``x``'s format."""
    return x.contiguous(memory_format=_gn_format(x) if fmt is None else fmt)


def _gn_kernel(x, w, b, num_groups, eps):
    x = _gn_layout(x)
    n, c, hxw = _gn_dims(x)
    return torch.native_group_norm(x, w, b, n, c, hxw, num_groups, eps)


def _gn_bwd_kernel(dy, x, mean, rstd, w, num_groups, output_mask):
    x = _gn_layout(x)
    dy, mean, rstd = _gn_layout(dy, _gn_format(x)), mean.contiguous(), rstd.contiguous()
    n, c, hxw = _gn_dims(x)
    dx, dw, db = torch.ops.aten.native_group_norm_backward.default(dy, x, mean, rstd, w, n, c, hxw, num_groups,
                                                           output_mask)
    return _dx(dx, x), _opt(dw, x, 0), _opt(db, x, 0)


def _gn_axes(nd, attrs, metas):
    return (0,)


def _gn_bwd_grad(c, *dys):
    """Computed on the ``(N, G, C/G, HxW)`` view, where the groups are dims (2, 3)."""
    dy, x, mean, rstd, w = c.inputs
    n, ch, g = x.shape[0], x.shape[1], c.num_groups
    view = (n, g, ch // g, math.prod(x.shape[2:]))   # (not -1: an empty batch leaves it ambiguous)
    ddx, ddw, ddb = _wanted(dys, c.output_mask)
    per_channel = lambda t: None if t is None else t.reshape(1, g, ch // g, 1)
    gdy, gx, gw = _norm_double_backward(dy.reshape(view), x.reshape(view), mean.reshape(n, g, 1, 1),
                                        rstd.reshape(n, g, 1, 1), per_channel(w), (2, 3), _view(ddx, view),
                                        per_channel(ddw), per_channel(ddb))
    gw = None if gw is None or w is None else sum_keep(gw, (0, 3)).reshape(tuple(w.shape))
    shape = tuple(x.shape)
    return _as(_view(gdy, shape), dy), _as(_view(gx, shape), x), None, None, _as(gw, w)


def _view(t, shape):
    return None if t is None else t.reshape(shape)


GROUP_NORM_BWD = defop("group_norm_backward", _gn_bwd_kernel, sbp=_norm_sbp(_gn_axes),
                       grad=_gn_bwd_grad, save="inputs", family="norm", mask_split=True)


def _gn_grad(c, dy, _dmean, _drstd):
    x, w, _ = c.inputs
    _, mean, rstd = c.outs
    mask = [needs(c, 0), w is not None and needs(c, 1), c.shapes[2] is not None and needs(c, 2)]
    dx, dw, db = apply(GROUP_NORM_BWD, dy, x, mean, rstd, w, num_groups=c.num_groups, output_mask=mask)
    return dx if mask[0] else None, dw if mask[1] else None, db if mask[2] else None


GROUP_NORM = defop("group_norm", _gn_kernel, grad=_gn_grad, save="both", saved_inputs=(0, 1),
                   saved_outputs=(1, 2), sbp=_norm_sbp(_gn_axes), outputs=("out", "mean", "rstd"),
                   grad_reads=(0,), family="norm")


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalizes each of ``num_groups`` channel groups of an ``(N, C, *)`` input."""
    if input.dim() < 2 or input.shape[1] % num_groups:
        raise ShapeError(f"holoflow.group_norm: input of shape {tuple(input.shape)} needs a channel dim 1 "
                         f"divisible by num_groups={num_groups}")
    return apply(GROUP_NORM, input, weight, bias, num_groups=num_groups, eps=eps).out


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape`` dims (a
    composite; reduced precision inputs are computed in float32, as torch does)."""
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(input.shape[input.dim() - len(ns):]) != ns or len(ns) > input.dim():
        raise ShapeError(f"holoflow.rms_norm: input of shape {tuple(input.shape)} does not end with "
                         f"normalized_shape {ns}")
    dt = input._data.dtype
    x = input.float() if dt in (torch.bfloat16, torch.float16) else input
    if eps is None:
        eps = torch.finfo(x._data.dtype).eps
    dims = list(range(input.dim() - len(ns), input.dim()))
    # torch's composite, op for op (its gradients bit for bit)
    out = (x * (x.pow(2).mean(dims, keepdim=True) + eps).rsqrt()).to(dt)
    return out * weight if weight is not None else out


# -- batch_norm -----------------------------------------------------------------------------------

def _bn_sbp(metas, attrs):
    """Channel split: x S(1), every per-channel tensor S(0). Splitting other axes of x is legal
    only in eval (training reads batch statistics over them)."""
    flags = _tensor_flags(metas)
    is_bwd = "output_mask" in attrs
    n_out = 3
    sigs = [((B,) * sum(flags), (B,) * n_out)]
    if len(metas[0].shape) < 2:
        return sigs
    channel_inputs = 2 if is_bwd else 1     # (dy, x) or (x,)
    ins = tuple(S(1) if i < channel_inputs else S(0) for i, f in enumerate(flags) if f)
    sigs.append((ins, (S(1), S(0), S(0)) if is_bwd else (S(1), S(0), S(0))))
    if not attrs["training"]:
        for a in [0] + list(range(2, len(metas[0].shape))):
            ins = tuple(S(a) if i < channel_inputs else B for i, f in enumerate(flags) if f)
            sigs.append((ins, (S(a), P, P) if is_bwd else (S(a), B, B)))
    return sigs


def _bn_bwd_kernel(dy, x, w, rm, rv, save_mean, save_invstd, training, eps, output_mask):
    if x.numel() == 0:  # aten's kernel divides by the element count (SIGFPE on an empty shard)
        c = x.shape[1] if x.dim() > 1 else 0
        z = x.new_zeros((c,))
        return x.new_zeros(x.shape), z, z.clone()
    dx, dw, db = torch.ops.aten.native_batch_norm_backward.default(dy, x, w, rm, rv, save_mean, save_invstd,
                                                           training, eps, output_mask)
    c = x.shape[1] if x.dim() > 1 else 0
    return _dx(dx, x), _opt(dw, x, c), _opt(db, x, c)


def _bn_bwd_grad(c, *dys):
    """Training: the batch statistics' double backward over dims (0, 2, ...). Eval: the output is
    affine in ``x`` (running statistics), so ``dx = dy * w * rstd`` and ``dw = sum(dy * xhat)``
    are bilinear and their gradients are products."""
    dy, x, w, rm, rv, save_mean, save_invstd = c.inputs
    chan = lambda t: None if t is None else t.reshape((1, -1) + (1,) * (x.dim() - 2))
    dims = (0,) + tuple(range(2, x.dim()))
    ddx, ddw, ddb = _wanted(dys, c.output_mask)
    if c.training:
        gdy, gx, gw = _norm_double_backward(dy, x, chan(save_mean), chan(save_invstd), chan(w), dims,
                                            ddx, chan(ddw), chan(ddb))
    else:
        rstd = chan((rv + c.eps).rsqrt())
        xhat = (x - chan(rm)) * rstd
        gdy = gx = gw = None
        if ddx is not None:
            gdy = ddx * rstd if w is None else ddx * chan(w) * rstd
            gw = ddx * dy * rstd
        if ddw is not None:
            gdy = _plus(gdy, chan(ddw) * xhat)
            gx = chan(ddw) * dy * rstd
        if ddb is not None:
            gdy = _plus(gdy, chan(ddb))
        if gdy is not None and tuple(gdy.shape) != tuple(x.shape):
            gdy = gdy.expand(tuple(x.shape))
    gw = None if gw is None or w is None else sum_keep(gw, dims).reshape(tuple(w.shape))
    return _as(gdy, dy), _as(gx, x), _as(gw, w), None, None, None, None


BATCH_NORM_BWD = defop("batch_norm_backward", _bn_bwd_kernel, sbp=_bn_sbp,
                       grad=_bn_bwd_grad, save="inputs", family="norm", mask_split=True)


def _bn_grad(c, dy, _dm, _dv):
    x, w, _, rm, rv = c.inputs
    _, save_mean, save_invstd = c.outs
    mask = [needs(c, 0), w is not None and needs(c, 1), c.shapes[2] is not None and needs(c, 2)]
    dx, dw, db = apply(BATCH_NORM_BWD, dy, x, w, rm, rv, save_mean, save_invstd,
                       training=c.training, eps=c.eps, output_mask=mask)
    return dx if mask[0] else None, dw if mask[1] else None, db if mask[2] else None, None, None


def _bn_kernel(x, w, b, rm, rv, training, momentum, eps):
    out, mean, invstd = torch.native_batch_norm(x, w, b, rm, rv, training, momentum, eps)
    if not training and mean.numel() == 0 and rm is not None and rm.numel():
        # CPU's eval kernel returns empty statistics where the meta kernel (shape inference) gives
        # (C,): global tensors check shards against it. Backward in eval reads the running ones.
        mean, invstd = rm.clone(), (rv + eps).rsqrt()
    return out, mean, invstd


BATCH_NORM = defop("batch_norm", _bn_kernel,
                   grad=_bn_grad, save="both", saved_inputs=(0, 1, 3, 4), saved_outputs=(1, 2), sbp=_bn_sbp,
                   outputs=("out", "save_mean", "save_invstd"), grad_reads=(0,), family="norm")


def _bn_stats_kernel(x, rm, rv, momentum, eps):
    out = torch.ops.aten._native_batch_norm_legit_functional(x, None, None, rm, rv, True, momentum, eps)
    return out[3], out[4]


def _bn_stats_sbp(metas, attrs):
    return [((B,) * sum(_tensor_flags(metas)), (B, B))]


# the running statistics a training batch norm leaves (``batch_norm`` traced: see there)
BATCH_NORM_STATS = defop("batch_norm_stats", _bn_stats_kernel, sbp=_bn_stats_sbp, outputs=("mean", "var"),
                         family="norm")


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalizes each channel (dim 1) over the batch and spatial dims. In training the running
    statistics are updated in place (``running = (1 - momentum) * running + momentum * batch``,
    unbiased variance), as torch does."""
    if not training and (running_mean is None or running_var is None):
        raise ValueError("holoflow.batch_norm: running_mean and running_var are required when training=False")
    c = input.shape[1] if input.dim() > 1 else None
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if t is not None and tuple(t.shape) != (c,):
            raise ShapeError(f"holoflow.batch_norm: {name} has shape {tuple(t.shape)} but input of shape "
                             f"{tuple(input.shape)} has {c} channels (dim 1)")
    if training and input.numel() // max(c or 1, 1) <= 1:
        raise ValueError(f"holoflow.batch_norm: expected more than 1 value per channel when training, "
                         f"got input of shape {tuple(input.shape)}")
    if training and is_lazy() and (running_mean is not None or running_var is not None) and \
            not getattr(input, "is_global", False):
        # traced: the kernel's in-place write of the running statistics would be invisible to the
        # IR (the node reads them as pure inputs, so scheduling may reorder two updates of one
        # buffer and recomputation redoes one); the new statistics come from a functional op
        # instead (same kernel, same bits as eager), written back by in-place copies the trace
        # records as state updates
        out = apply(BATCH_NORM, input, weight, bias, None, None, training=True, momentum=0.0, eps=float(eps)).out
        with grad_mode.no_grad():
            rm = running_mean if running_mean is not None else running_var
            rv = running_var if running_var is not None else running_mean
            new_rm, new_rv = apply(BATCH_NORM_STATS, input.detach(), rm, rv, momentum=float(momentum),
                                   eps=float(eps))
            if running_mean is not None:
                running_mean.copy_(new_rm)
            if running_var is not None:
                running_var.copy_(new_rv)
        return out
    return apply(BATCH_NORM, input, weight, bias, running_mean, running_var,
                 training=bool(training), momentum=float(momentum), eps=float(eps)).out


def instance_norm(input: Tensor, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Per-sample, per-channel normalization (group_norm with one group per channel), as torch's:
    with ``use_input_stats`` the statistics of each instance, and running statistics, when
    given, move towards the batch average of the instances' means and unbiased variances;
    without, the running statistics normalize (batch_norm in evaluation)."""
    if input.dim() < 3:
        raise ValueError(f"holoflow.instance_norm: expected an input of 3 or more dims (N, C, *), got shape "
                         f"{tuple(input.shape)}")
    if use_input_stats and math.prod(input.shape[2:]) == 1:   # (torch's check: a variance of one element)
        raise ValueError(f"holoflow.instance_norm: Expected more than 1 spatial element when training, got input "
                         f"size {tuple(input.shape)}")
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise ValueError("holoflow.instance_norm: running_mean and running_var are required when "
                             "use_input_stats=False")
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    out = group_norm(input, input.shape[1], weight, bias, eps)
    if running_mean is not None or running_var is not None:
        spatial = tuple(range(2, input.dim()))
        with grad_mode.no_grad():
            x = input.detach()
            if running_mean is not None:
                running_mean.mul_(1 - momentum).add_(x.mean(spatial).mean(0), alpha=momentum)
            if running_var is not None:
                running_var.mul_(1 - momentum).add_(x.var(spatial, correction=1).mean(0), alpha=momentum)
    return out


__all__ = ["layer_norm", "group_norm", "rms_norm", "batch_norm", "instance_norm"]


def _one_split_sbp(axes):
    """All inputs and outputs split alike on each axis ``axes(metas, attrs)`` names."""
    def rule(metas, attrs):
        n = len([m for m in metas if hasattr(m, "shape")])
        return [((B,) * n, (B,))] + [((S(a),) * n, (S(a),)) for a in axes(metas, attrs)]
    return rule


def _one_split_bwd_sbp(axes):
    def rule(metas, attrs):
        n, k = len([m for m in metas if hasattr(m, "shape")]), len(attrs["diff"])
        return [((B,) * n, (B,) * k)] + [((S(a),) * n, (S(a),) * k) for a in axes(metas, attrs)]
    return rule


RENORM = defop_vjp("renorm", lambda x, p, dim, maxnorm: torch.renorm(x, p, dim, maxnorm),
                   sbp=_one_split_sbp(lambda m, a: [a["dim"]]), bwd_sbp=_one_split_bwd_sbp(lambda m, a: [a["dim"]]))


def renorm(input: Tensor, p: float, dim: int, maxnorm: float) -> Tensor:
    """Each sub-tensor along ``dim`` rescaled to ``p``-norm at most ``maxnorm``, as ``torch.renorm``."""
    d = normalize_dim("renorm", dim, _tensor("renorm", input).dim())
    if p <= 0:
        raise RuntimeError(f"holoflow.renorm: non-positive-norm not supported, got p={p}")
    if maxnorm < 0:
        raise RuntimeError(f"holoflow.renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    return apply(RENORM, input, p=p, dim=d, maxnorm=maxnorm)


for _name in ("renorm",):
    setattr(Tensor, _name, globals()[_name])

Tensor.renorm_ = lambda self, p, dim, maxnorm: self.copy_(renorm(self.clone(), p, dim, maxnorm))


def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Tensor:
    """``x / (k + alpha * mean of x^2 over `size` neighbouring channels)^beta``, the window
    zero-padded as torch pads it. The window sum is ``size`` shifted slices of the channel axis
    (an average pool over it would fail on a shard with an empty leading dim)."""
    if input.dim() < 3:
        raise ShapeError(f"holoflow.local_response_norm: expected a 3-D or higher input, got shape "
                         f"{tuple(input.shape)}")
    if input.numel() == 0:
        return input
    c = input.shape[1]
    sq = pad(input * input, [0, 0] * (input.dim() - 2) + [size // 2, (size - 1) // 2])
    div = sq.narrow(1, 0, c)
    for i in range(1, size):
        div = div + sq.narrow(1, i, c)
    return input / (div / size * alpha + k) ** beta


__all__ += ["renorm", "local_response_norm"]
