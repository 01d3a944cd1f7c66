"""Neural-network ops: activations, softmax, normalization, embedding, one_hot, normalize.

Activations are elementwise family members (shape, SBP, in-place form from ops/family.py).
softmax, log_softmax, gelu, layer_norm, group_norm, batch_norm and embedding are primitives for
speed: each has a dedicated backward op whose kernel is ATen's backward. Double backward is
written where it is a few lines (softmax, log_softmax, gelu 'none', embedding); elsewhere the
backward op's grad raises ``UnsupportedError`` naming the op, so it never silently gives zero.
Normalization lives in ops/norm.py, convolution/pooling/interpolation in ops/conv.py,
attention in ops/attention.py, more activations in ops/activation.py, dropout variants in
ops/dropout.py and 1-d/adaptive/fractional pooling in ops/pooling.py; their public names are
re-exported here so ops/_all.py picks them up.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as TF

from ..core import grad_mode
from ..core.dispatch import apply, apply_inplace, assign, check_inplace_target
from ..core.errors import DTypeError, UnsupportedError, normalize_dim
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from . import elementwise as E
from .family import SUM_TO, binary, elementwise_sbp, needs, refuse_complex_grad, unary
from .random_ops import rrelu_noise
from .shape import cat

# -- shared helpers ------------------------------------------------------------------------------


def sum_keep(x: Tensor, dims: Sequence[int]) -> Tensor:
    """Sum over ``dims`` keeping them as size 1 (via the family's ``sum_to_size`` op, so it
    needs no reduction module and carries its SBP rule: a split summed axis gives P)."""
    dims = {d % max(x.dim(), 1) for d in dims}
    shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    return apply(SUM_TO, x, shape=shape)


def no_double_backward(name: str):
    """Grad rule of a backward op without a second derivative: fails loudly, never zero."""
    def grad(ctx, *dys):
        raise UnsupportedError(f"holoflow.{name}: double backward is not implemented; compute the "
                               f"second derivative with a composite form of the op instead")
    return grad


def split_sigs(metas: Sequence, axes_of: callable, n_out: int, extra: Sequence = ()) -> list:
    """All-broadcast plus, per logical axis ``a`` of the first input in ``axes_of``, the
    signature giving each tensor input ``axes_of(a)[i]`` and every output ``S(out_axis)``."""
    n_in = sum(isinstance(m, Meta) for m in metas)
    sigs = [((B,) * n_in, (B,) * n_out)]
    for ins, outs in axes_of:
        sigs.append((tuple(ins), tuple(outs) if isinstance(outs, (list, tuple)) else (outs,) * n_out))
    return sigs + list(extra)


def _tensor_flags(metas) -> list[bool]:
    return [isinstance(m, Meta) for m in metas]


# -- activations (elementwise family) -----------------------------------------------------------

def _x(c):
    return c.inputs[0]


def _gelu_second_derivative(x: Tensor, approximate: str) -> Tensor:
    """gelu''(x). Exact: ``pdf(x) (2 - x^2)``. Tanh form, ``0.5 x (1 + tanh(u))`` with
    ``u = k (x + c x^3)``: ``(1 - t^2) (u' + 0.5 x (u'' - 2 t u'^2))``, ``t = tanh(u)``."""
    if approximate == "none":
        return (x * x * -0.5).exp() * (1 / math.sqrt(2 * math.pi)) * (2 - x * x)
    k, c = math.sqrt(2 / math.pi), 0.044715
    x2 = x * x
    t = (k * (x + c * x2 * x)).tanh()
    du = k * (1 + 3 * c * x2)
    return (1 - t * t) * (du + 0.5 * x * (6 * k * c * x - 2 * t * du * du))


def _gelu_bwd_grad(c, ddx):
    dy, x = c.inputs
    return (apply(GELU_BWD, ddx, x, approximate=c.approximate) if needs(c, 0) else None,
            ddx * dy * _gelu_second_derivative(x, c.approximate) if needs(c, 1) else None)


GELU_BWD = binary("gelu_backward", lambda dy, x, approximate="none":
                  torch.ops.aten.gelu_backward.default(dy, x, approximate=approximate),
                  _gelu_bwd_grad, "inputs", partial=("PB",))
GELU_BWD.inplace_kernel = lambda dy, x, approximate="none": \
    torch.ops.aten.gelu_backward.grad_input(dy, x, approximate=approximate, grad_input=dy)  # into dy
GELU = unary("gelu", lambda x, approximate="none": TF.gelu(x, approximate=approximate),
             lambda c, dy: (apply(GELU_BWD, dy, _x(c), approximate=c.approximate),), "inputs")
def _relu_bwd_grad(c, ddx):
    """``relu_backward(dy, out)`` is linear in dy with the mask ``out > 0``; zero in ``out``
    almost everywhere (torch's convention: a zero tensor, not "unused")."""
    return (apply(RELU_BWD, ddx, c.inputs[1]) if needs(c, 0) else None,
            apply(E.ZEROS_LIKE, c.inputs[1]) if needs(c, 1) else None)


# one kernel (aten's threshold_backward) instead of a comparison, a cast and a product
RELU_BWD = binary("relu_backward", lambda dy, out: torch.ops.aten.threshold_backward.default(dy, out, 0),
                  _relu_bwd_grad, "inputs", partial=("PB",), saved_inputs=(1,))
RELU = unary("relu", torch.relu, lambda c, dy: (apply(RELU_BWD, dy, c.out),), "output")
def piecewise_linear(name: str, forward, backward):
    """An activation linear in pieces (leaky_relu, hardtanh, threshold, the shrinks) as torch
    declares it: its backward op ``backward(dy, x, **attrs)`` is linear in dy with a slope set by
    where x lies and zero in x almost everywhere, so the backward's own gradient in x is a zero
    tensor, not "unused" (a curvature penalty through these activations is zeros, not an error)."""
    def bwd_grad(c, ddx):
        x = c.inputs[1]
        return (apply(bwd, ddx, x, **c.attrs) if needs(c, 0) else None,
                apply(E.ZEROS_LIKE, x) if needs(c, 1) else None)
    bwd = binary(f"{name}_backward", backward, bwd_grad, "inputs", partial=("PB",), saved_inputs=(1,))
    return unary(name, forward, lambda c, dy: (apply(bwd, dy, _x(c), **c.attrs),), "inputs")


LEAKY_RELU = piecewise_linear(
    "leaky_relu", lambda x, negative_slope=0.01: TF.leaky_relu(x, negative_slope),
    lambda dy, x, negative_slope=0.01: torch.ops.aten.leaky_relu_backward.default(dy, x, negative_slope, False))
HARDTANH = piecewise_linear(
    "hardtanh", lambda x, min_val=-1.0, max_val=1.0: TF.hardtanh(x, min_val, max_val),
    lambda dy, x, min_val=-1.0, max_val=1.0: torch.ops.aten.hardtanh_backward.default(dy, x, min_val, max_val))
THRESHOLD = piecewise_linear(
    "threshold", lambda x, threshold, value: TF.threshold(x, threshold, value),
    lambda dy, x, threshold, value: torch.ops.aten.threshold_backward.default(dy, x, threshold))


# Activations whose torch backward is an aten kernel: the grad rule calls that kernel when no graph
# of the backward is recorded (torch's own backward then: bit for bit), and the composite formula
# (torch's where it has one) when it is (create_graph: double backward differentiates it).
def _aten_grad(name: str, kernel):
    """A backward-only op on aten's kernel ``kernel(dy, x, **attrs)`` (recorded never: it runs
    with grad mode off)."""
    return binary(name, kernel, None, partial=("PB",))


SILU_BWD = _aten_grad("silu_backward", torch.ops.aten.silu_backward.default)


def _silu_grad(c, dy):
    x = _x(c)
    if not grad_mode.STATE.enabled:
        return (apply(SILU_BWD, dy, x),)
    s = x.sigmoid()   # torch's infinitely differentiable formula
    return (dy * s * (1 + x * (1 - s)),)


SILU = unary("silu", TF.silu, _silu_grad, "inputs")
SOFTPLUS_BWD = _aten_grad("softplus_backward", lambda dy, x, beta=1.0, threshold=20.0:
                          torch.ops.aten.softplus_backward.default(dy, x, beta, threshold))


def _softplus_grad(c, dy):
    if not grad_mode.STATE.enabled:
        return (apply(SOFTPLUS_BWD, dy, _x(c), beta=c.beta, threshold=c.threshold),)
    z = _x(c) * c.beta
    return (E.where(z > c.threshold, dy, dy * z.sigmoid()),)


SOFTPLUS = unary("softplus", lambda x, beta=1.0, threshold=20.0: TF.softplus(x, beta, threshold),
                 _softplus_grad, "inputs")
ELU_BWD = _aten_grad("elu_backward", lambda dy, x, alpha=1.0, scale=1.0, input_scale=1.0:
                     torch.ops.aten.elu_backward.default(dy, alpha, scale, input_scale, False, x))


def _elu_grad(c, dy):
    """elu with torch's ``scale`` and ``input_scale`` (selu, celu: ``aten.elu``'s parameters).
    ``grad_input_scale``: the input scale torch's backward uses where it differs (celu's backward
    rounds alpha to float32 first)."""
    x = c.inputs[0]
    alpha, scale = c.alpha, c.scale
    input_scale = c.grad_input_scale if c.grad_input_scale is not None else c.input_scale
    if not grad_mode.STATE.enabled:
        return (apply(ELU_BWD, dy, x, alpha=alpha, scale=scale, input_scale=input_scale),)
    # (torch's test: x <= 0 takes the exponential side, so a NaN input passes dy)
    neg = dy * ((x * input_scale).exp() * (alpha * scale * input_scale))
    return (E.where(x <= 0, neg, dy if scale == 1 else dy * scale),)


ELU = unary("elu", lambda x, alpha=1.0, scale=1.0, input_scale=1.0, grad_input_scale=None:
            torch.ops.aten.elu.default(x, alpha, scale, input_scale), _elu_grad, "inputs")
MISH_BWD = _aten_grad("mish_backward", torch.ops.aten.mish_backward.default)


def _mish_grad(c, dy):
    """torch's formula, one product with dy (the composite's product rule summed two, so an
    infinite dy gave inf - inf = NaN where torch's gives inf)."""
    x = c.inputs[0]
    if not grad_mode.STATE.enabled:
        return (apply(MISH_BWD, dy, x),)
    t = apply(SOFTPLUS, x, beta=1.0, threshold=20.0).tanh()
    return (dy * (t + x * x.sigmoid() * (1 - t * t)),)


MISH = unary("mish", TF.mish, _mish_grad, "inputs")


def _hardswish_grad(c, dy):
    x = _x(c)
    return (E.where(x <= -3, 0.0, E.where(x < 3, dy * (x / 3 + 0.5), dy)),)  # torch's boundaries


HARDSWISH = unary("hardswish", TF.hardswish, _hardswish_grad, "inputs")
HARDSIGMOID_BWD = _aten_grad("hardsigmoid_backward", torch.ops.aten.hardsigmoid_backward.default)


def _hardsigmoid_grad(c, dy):
    if not grad_mode.STATE.enabled:
        return (apply(HARDSIGMOID_BWD, dy, _x(c)),)
    # (selected, not dy * mask: an infinite dy * 0 is NaN)
    return (E.where((_x(c) > -3).logical_and(_x(c) < 3), dy / 6, 0.0),)


HARDSIGMOID = unary("hardsigmoid", TF.hardsigmoid, _hardsigmoid_grad, "inputs")
LOG_SIGMOID_BWD = _aten_grad("log_sigmoid_backward", lambda dy, x: torch.ops.aten.log_sigmoid_backward.default(
    dy, x, torch.ops.aten.log_sigmoid_forward.default(x)[1]))   # (the CPU kernel's buffer, recomputed)


def _log_sigmoid_grad(c, dy):
    x = _x(c)
    if not grad_mode.STATE.enabled:
        return (apply(LOG_SIGMOID_BWD, dy, x),)
    return (dy * (-x).sigmoid(),)


LOG_SIGMOID = unary("log_sigmoid", lambda x: torch.ops.aten.log_sigmoid_forward.default(x)[0], _log_sigmoid_grad,
                    "inputs")


def _maybe_inplace(op, input: Tensor, inplace: bool, **attrs) -> Tensor:
    return apply_inplace(op, input, **attrs) if inplace else apply(op, input, **attrs)


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """``max(x, 0)``, as ``torch.nn.functional.relu``."""
    return _maybe_inplace(RELU, input, inplace)


def relu_(input: Tensor) -> Tensor:
    return apply_inplace(RELU, input)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """``x`` if ``x > 0`` else ``negative_slope * x``."""
    return _maybe_inplace(LEAKY_RELU, input, inplace, negative_slope=negative_slope)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit; ``approximate='tanh'`` for the tanh approximation."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"holoflow.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return apply(GELU, input, approximate=approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * sigmoid(x)`` (swish)."""
    if not inplace:
        refuse_complex_grad("silu", input)
    return _maybe_inplace(SILU, input, inplace)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta x)) / beta``, linear above ``threshold``."""
    return apply(SOFTPLUS, input, beta=beta, threshold=threshold)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` if ``x > 0`` else ``alpha * (exp(x) - 1)``."""
    return _maybe_inplace(ELU, input, inplace, alpha=alpha)


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    """``scale * elu(x, alpha)`` with the self-normalizing constants (aten's elu with a scale, as
    torch's)."""
    def compute(x: Tensor) -> Tensor:
        return apply(ELU, x, alpha=_SELU_ALPHA, scale=_SELU_SCALE, input_scale=1.0)
    return write_into(input, "selu", compute) if inplace else compute(input)


def write_into(input: Tensor, name: str, compute) -> Tensor:
    """``compute(x)`` written into ``input`` after torch's in-place checks; when autograd records,
    it is computed from a copy, so what its backward saved is not the overwritten tensor."""
    recording = grad_mode.STATE.enabled and input.requires_grad
    if recording:
        check_inplace_target(input, name)
    return assign(input, compute(input.clone() if recording else input), name)


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """``x`` where ``x > threshold`` else ``value`` (NaN stays NaN), as ``torch.nn.functional.threshold``."""
    return _maybe_inplace(THRESHOLD, input, inplace, threshold=threshold, value=value)


def threshold_(input: Tensor, threshold: float, value: float) -> Tensor:
    """In-place :func:`threshold`."""
    return globals()["threshold"](input, threshold, value, inplace=True)


def rrelu(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,
          inplace: bool = False, *, generator=None) -> Tensor:
    """Leaky ReLU whose negative slope is drawn from U[lower, upper) per element in training (as
    torch's CPU kernel draws it), and is ``(lower + upper) / 2`` otherwise."""
    if not training:
        return leaky_relu(input, (lower + upper) / 2, inplace)
    if inplace:
        return write_into(input, "rrelu", lambda x: x * rrelu_noise(x, lower, upper, generator))
    return input * rrelu_noise(input, lower, upper, generator)


def rrelu_(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False, *,
           generator=None) -> Tensor:
    """In-place :func:`rrelu`."""
    return rrelu(input, lower, upper, training, True, generator=generator)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * relu6(x + 3) / 6``."""
    return _maybe_inplace(HARDSWISH, input, inplace)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """``relu6(x + 3) / 6``."""
    return _maybe_inplace(HARDSIGMOID, input, inplace)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """``min(max(x, 0), 6)``: hardtanh between 0 and 6, as torch's."""
    return hardtanh(input, 0.0, 6.0, inplace)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` clamped to ``[min_val, max_val]`` (gradient 1 strictly inside, as torch's)."""
    if min_val > max_val:
        raise ValueError(f"holoflow.hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    return _maybe_inplace(HARDTANH, input, inplace, min_val=float(min_val), max_val=float(max_val))


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * tanh(softplus(x))``, torch's kernel."""
    return _maybe_inplace(MISH, input, inplace)


def logsigmoid(input: Tensor) -> Tensor:
    """``log(sigmoid(x))``, aten's kernel."""
    return apply(LOG_SIGMOID, input)


# -- softmax / log_softmax ----------------------------------------------------------------------

def _softmax_sbp(metas, attrs):
    """Split on any axis but the softmax dim, on every tensor operand alike; the backward ops
    are also linear in their first operand (dy), hence (P, B) -> P for them."""
    n = sum(isinstance(m, Meta) for m in metas)
    nd = len(metas[0].shape)
    dim = attrs["dim"] % max(nd, 1)
    sigs = [((B,) * n, (B,))]
    sigs += [((S(a),) * n, (S(a),)) for a in range(nd) if a != dim]
    if n == 2:
        sigs.append(((P, B), (P,)))
    return sigs


GLU_BWD = defop("glu_backward", lambda dy, x, dim: torch.ops.aten.glu_backward.default(dy, x, dim),
                sbp=_softmax_sbp, family="elementwise")   # (runs with grad mode off: never recorded)


def _glu_grad(c, dy):
    """aten's glu_backward when no graph is recorded (torch's own); else the product rule of
    ``a * sigmoid(b)`` (differentiable again)."""
    x = c.inputs[0]
    if not grad_mode.STATE.enabled:
        return (apply(GLU_BWD, dy, x, dim=c.dim),)
    a, b = x.chunk(2, c.dim)
    s = b.sigmoid()
    return (cat([dy * s, dy * a * s * (1 - s)], c.dim),)


GLU = defop("glu", lambda x, dim: torch.ops.aten.glu.default(x, dim), grad=_glu_grad, save="inputs",
            sbp=_softmax_sbp, family="elementwise")


def _softmax_bwd_grad(c, ddx):
    dy, y = c.inputs
    gdy = apply(SOFTMAX_BWD, ddx, y, dim=c.dim) if needs(c, 0) else None
    gy = None
    if needs(c, 1):
        gy = ddx * (dy - sum_keep(dy * y, [c.dim])) - dy * sum_keep(ddx * y, [c.dim])
    return gdy, gy


def _log_softmax_bwd_grad(c, ddx):
    dy, y = c.inputs
    p = y.exp()
    gdy = ddx - sum_keep(ddx * p, [c.dim]) if needs(c, 0) else None
    gy = -ddx * p * sum_keep(dy, [c.dim]) if needs(c, 1) else None
    return gdy, gy


SOFTMAX_BWD = defop("softmax_backward", lambda dy, y, dim: torch._softmax_backward_data(dy, y, dim, y.dtype),
                    grad=_softmax_bwd_grad, save="inputs", sbp=_softmax_sbp, family="softmax")
LOG_SOFTMAX_BWD = defop("log_softmax_backward",
                        lambda dy, y, dim: torch._log_softmax_backward_data(dy, y, dim, y.dtype),
                        grad=_log_softmax_bwd_grad, save="inputs", sbp=_softmax_sbp, family="softmax")
SOFTMAX = defop("softmax", lambda x, dim: torch.softmax(x, dim), save="output", sbp=_softmax_sbp,
                grad=lambda c, dy: (apply(SOFTMAX_BWD, dy, c.out, dim=c.dim),), family="softmax")
LOG_SOFTMAX = defop("log_softmax", lambda x, dim: torch.log_softmax(x, dim), save="output",
                    sbp=_softmax_sbp, family="softmax",
                    grad=lambda c, dy: (apply(LOG_SOFTMAX_BWD, dy, c.out, dim=c.dim),))


def _softmax_dim(name: str, input: Tensor, dim: int | None) -> int:
    if dim is None:  # torch's legacy implicit choice
        dim = 0 if input.dim() in (0, 1, 3) else 1
    elif isinstance(dim, bool) or not hasattr(dim, "__index__"):
        raise TypeError(f"holoflow.{name}: dim must be an int, got {type(dim).__name__} ({dim!r})")
    return normalize_dim(name, int(dim), input.dim())


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """``exp(x) / sum(exp(x), dim)``; ``dtype`` casts the input first (as torch does)."""
    if dtype is not None:
        input = input.to(dtype)
    out = apply(SOFTMAX, input, dim=_softmax_dim("softmax", input, dim))
    refuse_complex_grad("softmax", input)   # (after the kernel: it refuses complex values)
    return out


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """``log(softmax(x, dim))``, computed stably."""
    if dtype is not None:
        input = input.to(dtype)
    out = apply(LOG_SOFTMAX, input, dim=_softmax_dim("log_softmax", input, dim))
    refuse_complex_grad("log_softmax", input)
    return out


def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
    return softmax(-input, dim, dtype=dtype)


# -- embedding, one_hot --------------------------------------------------------------------------

def _emb_sbp(metas, attrs):
    idx, w = metas
    sigs = [((B, B), (B,))]
    sigs += [((S(a), B), (S(a),)) for a in range(len(idx.shape))]
    sigs.append(((B, S(1)), (S(len(idx.shape)),)))
    return sigs


def _emb_bwd_sbp(metas, attrs):
    dy, idx = metas
    nd = len(idx.shape)
    sigs = [((B, B), (B,)), ((P, B), (P,))]
    if not attrs.get("scale_grad_by_freq"):   # (the frequencies count every index: no index splits)
        sigs += [((S(a), S(a)), (P,)) for a in range(nd)]
    sigs.append(((S(nd), B), (S(1),)))
    return sigs


def _emb_bwd_grad(c, ddw):
    idx = c.inputs[1]
    if c.padding_idx >= 0:  # the padding row got no gradient, so it passes none back
        keep = torch.ones(c.num_weights, 1, dtype=ddw._data.dtype, device=ddw.device.torch)
        keep[c.padding_idx] = 0
        ddw = ddw * Tensor._make(keep)
    if c.scale_grad_by_freq:  # each row's gradient was divided by how often the row was looked up
        counts = torch.bincount(idx._data.reshape(-1), minlength=c.num_weights).clamp_(min=1)
        ddw = ddw * Tensor._make(counts.reciprocal().to(ddw._data.dtype).unsqueeze(1))
    return apply(EMBEDDING, idx, ddw, padding_idx=-1, scale_grad_by_freq=False), None


EMBEDDING_BWD = defop("embedding_backward", lambda dy, idx, num_weights, padding_idx, scale_grad_by_freq:
                      torch.ops.aten.embedding_dense_backward.default(dy, idx, num_weights, padding_idx,
                                                                      scale_grad_by_freq),
                      grad=_emb_bwd_grad, save="inputs", sbp=_emb_bwd_sbp, family="embedding")
EMBEDDING = defop("embedding",
                  lambda idx, w, padding_idx, scale_grad_by_freq=False: torch.embedding(w, idx, padding_idx),
                  grad=lambda c, dy: (None, apply(EMBEDDING_BWD, dy, c.inputs[0], num_weights=c.shapes[1][0],
                                                  padding_idx=c.padding_idx,
                                                  scale_grad_by_freq=c.scale_grad_by_freq)),
                  save="inputs", saved_inputs=(0,), sbp=_emb_sbp, family="embedding")  # indices only


def embedding_renorm_(weight: Tensor, input: Tensor, max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Rescales in place, without gradient, each row of ``weight`` that ``input`` looks up whose
    ``norm_type``-norm exceeds ``max_norm`` by ``max_norm / (norm + 1e-7)``, as
    ``torch.embedding_renorm_`` (what ``max_norm`` does before a lookup). Written with ops, so it
    runs on global weights and in a trace (a row looked up twice is written twice, alike)."""
    with grad_mode.no_grad():
        idx = input.reshape(-1)
        rows = weight[idx]
        norms = rows.norm(p=norm_type, dim=1, keepdim=True)
        scale = (max_norm / (norms + 1e-7)).where(norms > max_norm, norms.new_ones(()))
        weight[idx] = rows * scale
    return weight


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None, max_norm=None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Rows of ``weight`` picked by the integer ``input``; the ``padding_idx`` row gets no gradient;
    with ``max_norm`` the looked-up rows are renormalized in place first (`embedding_renorm_`);
    ``scale_grad_by_freq`` divides each row's gradient by how often ``input`` looks it up."""
    if sparse:
        raise UnsupportedError("holoflow.embedding: sparse gradients are not supported")
    if input.is_floating_point() or input.is_complex() or input.dtype is torch.bool:
        raise DTypeError(f"holoflow.embedding: indices must be an integer tensor (int64 or int32), got "
                         f"{input.dtype} (shape {tuple(input.shape)})")
    refuse_complex_grad("embedding", weight)
    if max_norm is not None:
        embedding_renorm_(weight, input, max_norm, norm_type)
    n = weight.shape[0]
    if padding_idx is not None:
        if not -n <= padding_idx < n:
            raise IndexError(f"holoflow.embedding: padding_idx {padding_idx} out of range for {n} embeddings")
        padding_idx %= n
    try:
        return apply(EMBEDDING, input, weight, padding_idx=-1 if padding_idx is None else padding_idx,
                     scale_grad_by_freq=bool(scale_grad_by_freq))
    except IndexError as e:  # the kernel says only "index out of range in self": name the index
        raise IndexError(f"holoflow.embedding: {_bad_index(input, n)} is out of range for {n} embeddings "
                         f"(weight of shape {tuple(weight.shape)}); legal indices are 0..{n - 1}") from e


def _bad_index(idx: Tensor, n: int) -> str:
    """``"index 7"``: the first index of ``idx`` outside [0, n) (read only after a failure)."""
    try:
        t = idx.to_local().to_torch() if idx.is_global else idx.to_torch()
        bad = t[(t < 0) | (t >= n)]
        return f"index {int(bad.reshape(-1)[0])}" if bad.numel() else "an index"
    except Exception:  # noqa: BLE001 - best effort: the message still names the range
        return "an index"


def _one_hot_sbp(metas, attrs):
    if attrs["num_classes"] < 0:  # inferred from the max: a shard would infer its own
        return [((B,), (B,))]
    return [((B,), (B,))] + [((S(a),), (S(a),)) for a in range(len(metas[0].shape))]


ONE_HOT = defop("one_hot", lambda x, num_classes: TF.one_hot(x, num_classes), sbp=_one_hot_sbp,
                differentiable=False, family="embedding")


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """An int64 tensor with one more trailing dim of size ``num_classes`` holding ones at the
    positions given by ``tensor``."""
    return apply(ONE_HOT, tensor, num_classes=num_classes)


# -- composites: normalize, cosine_similarity, pairwise_distance -----------------------------------

def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """``x / max(||x||_p, eps)`` along ``dim`` (a composite; any ``p`` of ``vector_norm``: inf too)."""
    from .reduction import vector_norm
    dim = normalize_dim("normalize", dim, input.dim())
    return input / vector_norm(input, p, dim, keepdim=True).clamp_min(eps)


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """``x1 . x2 / (max(||x1||, eps) * max(||x2||, eps))`` along ``dim`` of the broadcast inputs,
    as torch computes it (each norm clamped in value only: its gradient is the norm's)."""
    from .reduction import sum as reduce_sum
    from .reduction import vector_norm
    shape = torch.broadcast_shapes(tuple(x1.shape), tuple(x2.shape))
    d = normalize_dim("cosine_similarity", dim, len(shape))
    dt = torch.result_type(x1._data, x2._data)
    if not (dt.is_floating_point or dt.is_complex):
        raise RuntimeError(f"holoflow.cosine_similarity: expected a floating point common dtype, got {x1.dtype} and "
                           f"{x2.dtype}; convert the inputs with .float()")
    x1, x2 = x1.to(dt).expand(shape), x2.to(dt).expand(shape)

    def clamped_norm(x: Tensor) -> Tensor:
        n = vector_norm(x, 2, d, keepdim=True)
        return n + (n.detach().clamp_min(eps) - n.detach())
    return reduce_sum((x1 / clamped_norm(x1)) * (x2 / clamped_norm(x2)), d)


Tensor.relu = relu
Tensor.relu_ = relu_
Tensor.softmax = lambda self, dim=None, dtype=None: softmax(self, dim, dtype=dtype)
Tensor.log_softmax = lambda self, dim=None, dtype=None: log_softmax(self, dim, dtype=dtype)

from .norm import *  # noqa: E402,F401,F403
from .norm import __all__ as _norm_all  # noqa: E402
from .conv import *  # noqa: E402,F401,F403
from .conv import __all__ as _conv_all  # noqa: E402
from .attention import *  # noqa: E402,F401,F403
from .attention import __all__ as _attention_all  # noqa: E402
from .activation import *  # noqa: E402,F401,F403
from .activation import __all__ as _activation_all  # noqa: E402
from .dropout import *  # noqa: E402,F401,F403
from .dropout import __all__ as _dropout_all  # noqa: E402
from .pooling import *  # noqa: E402,F401,F403
from .pooling import __all__ as _pooling_all  # noqa: E402

__all__ = ["relu", "relu_", "leaky_relu", "gelu", "silu", "softplus", "elu", "selu", "hardswish",
           "hardsigmoid", "relu6", "hardtanh", "mish", "logsigmoid", "softmax", "log_softmax", "softmin",
           "embedding", "embedding_renorm_", "one_hot", "normalize", "cosine_similarity", "threshold", "threshold_",
           "rrelu", "rrelu_",
           *_norm_all, *_conv_all, *_attention_all,
           *_activation_all, *_dropout_all, *_pooling_all]
_ = elementwise_sbp  # the family's rule is what the activations above use
