"""``nn.utils.fusion``: folding an eval-mode BatchNorm into the convolution or linear layer before
it, as ``torch.nn.utils.fusion`` (the same formulas, written with holoflow ops, so global
parameters fold too)."""
from __future__ import annotations

import copy
from typing import TypeVar

from ...core.tensor import Tensor
from ...ops import creation as C
from ..modules.norm import _BatchNorm
from ..modules.conv import _ConvNd
from ..modules.linear import Linear
from ..parameter import Parameter

__all__ = ["fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval", "fuse_linear_bn_weights"]

ConvT = TypeVar("ConvT", bound=_ConvNd)
LinearT = TypeVar("LinearT", bound=Linear)


def _check_eval(who: str, layer, bn) -> None:
    if layer.training or bn.training:
        raise AssertionError(f"holoflow.nn.utils.{who}: Fusion only for eval! call .eval() on both modules "
                             f"first (training: {type(layer).__name__} {layer.training}, "
                             f"{type(bn).__name__} {bn.training})")


def _check_stats(who: str, bn) -> None:
    if bn.running_mean is None or bn.running_var is None:
        raise AssertionError(f"holoflow.nn.utils.{who}: bn.running_mean and bn.running_var must not be None "
                             f"(a BatchNorm built with track_running_stats=True has them)")


def fuse_conv_bn_eval(conv: ConvT, bn: _BatchNorm, transpose: bool = False) -> ConvT:
    """A new convolution (a deep copy of ``conv``) computing ``bn(conv(x))`` of the eval-mode
    modules; ``transpose=True`` for a transposed convolution (output channels on dim 1)."""
    _check_eval("fuse_conv_bn_eval", conv, bn)
    fused = copy.deepcopy(conv)
    _check_stats("fuse_conv_bn_eval", bn)
    fused.weight, fused.bias = fuse_conv_bn_weights(fused.weight, fused.bias, bn.running_mean, bn.running_var,
                                                    bn.eps, bn.weight, bn.bias, transpose)
    return fused


def fuse_conv_bn_weights(conv_w: Tensor, conv_b: Tensor | None, bn_rm: Tensor, bn_rv: Tensor, bn_eps: float,
                         bn_w: Tensor | None, bn_b: Tensor | None,
                         transpose: bool = False) -> tuple[Parameter, Parameter]:
    """The fused convolution's ``(weight, bias)``: ``w * (bn_w / sqrt(rv + eps))`` per output
    channel and ``(b - rm) / sqrt(rv + eps) * bn_w + bn_b``, in the convolution's dtypes."""
    w_dtype = conv_w.dtype
    b_dtype = conv_b.dtype if conv_b is not None else w_dtype
    conv_b = C.zeros_like(bn_rm) if conv_b is None else conv_b
    bn_w = C.ones_like(bn_rm) if bn_w is None else bn_w
    bn_b = C.zeros_like(bn_rm) if bn_b is None else bn_b
    rsqrt = (bn_rv + bn_eps).rsqrt()
    shape = ([1, -1] if transpose else [-1, 1]) + [1] * (len(conv_w.shape) - 2)
    fused_w = (conv_w * (bn_w * rsqrt).reshape(shape)).to(dtype=w_dtype)
    fused_b = ((conv_b - bn_rm) * rsqrt * bn_w + bn_b).to(dtype=b_dtype)
    return Parameter(fused_w, conv_w.requires_grad), Parameter(fused_b, conv_b.requires_grad)


def fuse_linear_bn_eval(linear: LinearT, bn: _BatchNorm) -> LinearT:
    """A new linear layer (a deep copy of ``linear``) computing ``bn(linear(x))`` of the
    eval-mode modules; ``bn`` normalises ``linear``'s output features (or has one feature)."""
    _check_eval("fuse_linear_bn_eval", linear, bn)
    fused = copy.deepcopy(linear)
    # the BatchNorm's channels must broadcast against the linear layer's last dim
    if linear.out_features != bn.num_features and bn.num_features != 1:
        raise AssertionError(f"holoflow.nn.utils.fuse_linear_bn_eval: To fuse, linear.out_features == "
                             f"bn.num_features or bn.num_features == 1, got linear.out_features="
                             f"{linear.out_features} and bn.num_features={bn.num_features}")
    _check_stats("fuse_linear_bn_eval", bn)
    fused.weight, fused.bias = fuse_linear_bn_weights(fused.weight, fused.bias, bn.running_mean, bn.running_var,
                                                      bn.eps, bn.weight, bn.bias)
    return fused


def fuse_linear_bn_weights(linear_w: Tensor, linear_b: Tensor | None, bn_rm: Tensor, bn_rv: Tensor, bn_eps: float,
                           bn_w: Tensor, bn_b: Tensor) -> tuple[Parameter, Parameter]:
    """The fused linear layer's ``(weight, bias)``: rows scaled by ``bn_w / sqrt(rv + eps)``, bias
    ``(b - rm) * scale + bn_b``, in the linear layer's dtypes."""
    w_dtype = linear_w.dtype
    b_dtype = linear_b.dtype if linear_b is not None else w_dtype
    linear_b = C.zeros_like(bn_rm) if linear_b is None else linear_b
    scale = bn_w * (bn_rv + bn_eps).rsqrt()
    fused_w = linear_w * scale.unsqueeze(-1).to(dtype=w_dtype)
    fused_b = ((linear_b - bn_rm) * scale + bn_b).to(dtype=b_dtype)
    return Parameter(fused_w, linear_w.requires_grad), Parameter(fused_b, linear_b.requires_grad)
