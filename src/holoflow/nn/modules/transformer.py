"""``TransformerEncoderLayer`` and ``TransformerEncoder`` with torch's submodule names."""
from __future__ import annotations

import copy
import warnings
from typing import Any, Callable

from ...amp.autocast import is_autocast_enabled
from ...core import dtype as _dtype
from ...core.grad_mode import is_grad_enabled
from ...core.tensor import Tensor
from ...ops.creation import full
from ...ops.layout import triu

from ..containers import ModuleList
from ..module import Module
from .activation import GELU, ReLU
from .attention import MultiheadAttention
from .dropout import Dropout
from .linear import Linear
from .norm import LayerNorm
from .. import functional as F



def _get_activation_fn(activation: str) -> Callable[[Tensor], Tensor]:
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    raise RuntimeError(f"activation should be relu/gelu, not {activation}")


def _get_clones(module: Module, n: int) -> ModuleList:
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


def generate_square_subsequent_mask(sz: int, device: Any = None, dtype: Any = None) -> Tensor:
    """A ``(sz, sz)`` float mask with ``-inf`` above the diagonal (causal attention)."""
    return triu(full((sz, sz), float("-inf"), dtype=dtype, device=device), diagonal=1)


class TransformerEncoderLayer(Module):
    """Self-attention then a feed-forward block, each with residual and LayerNorm
    (post-norm by default, pre-norm with ``norm_first=True``)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _get_activation_fn(activation) if isinstance(activation, str) else activation

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None,
                  is_causal: bool = False) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)


class TransformerEncoder(Module):
    """``num_layers`` deep copies of ``encoder_layer``, then an optional final ``norm``."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        self.layers = _get_clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor = enable_nested_tensor
        self.use_nested_tensor = enable_nested_tensor
        self.mask_check = mask_check
        why_not = _why_not_nested(encoder_layer)
        if enable_nested_tensor and why_not:
            warnings.warn(f"enable_nested_tensor is True, but self.use_nested_tensor is False because {why_not}",
                          stacklevel=2)
            self.use_nested_tensor = False

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None) -> Tensor:
        output = src
        for name, m in (("src_key_padding_mask", src_key_padding_mask), ("mask", mask)):   # torch's first checks
            if m is not None and m.dtype != _dtype.bool and not m.is_floating_point():
                raise AssertionError(f"only bool and floating types of {name} are supported")
        _check_encoder_layer(self.layers[0])
        for mod in self.layers:
            output = mod(output, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                         is_causal=bool(is_causal))
        pad = self._nested_padding(src, mask, src_key_padding_mask)
        if pad is not None:
            # torch runs this case on a nested tensor and pads the result with zeros
            output = output.masked_fill(pad.unsqueeze(-1), 0.0)
        if self.norm is not None:
            output = self.norm(output)
        return output

    def _nested_padding(self, src: Tensor, mask, key_padding_mask) -> Tensor | None:
        """The padded positions (bool, ``(N, S)``) when torch's sparsity fast path applies: then
        torch encodes a nested tensor of the unpadded prefixes and its output is 0.0 at the padded
        positions (before the final norm). The conditions are torch's: inference (eval mode, no
        grad needed), batched input, a left-aligned key padding mask and no attention mask."""
        if key_padding_mask is None or mask is not None or not getattr(self, "use_nested_tensor", False) \
                or self.layers[0].training or src.dim() != 3 or is_autocast_enabled():
            return None
        if is_grad_enabled() and (src.requires_grad or any(p.requires_grad for p in self.layers[0].parameters())):
            return None
        pad = key_padding_mask if key_padding_mask.dtype == _dtype.bool else key_padding_mask != 0
        if getattr(self, "mask_check", True):
            keep = pad.logical_not().to(_dtype.int64)
            if not bool((keep.cumprod(dim=1) == keep).all()):       # not left-aligned
                return None
        return pad


def _check_encoder_layer(layer: Module) -> None:
    """torch's encoder reads its first layer's ``self_attn.batch_first`` before any layer runs: a
    layer without one (not a ``TransformerEncoderLayer``) raises AttributeError there."""
    if not hasattr(getattr(layer, "self_attn", None), "batch_first"):
        raise AttributeError(f"holoflow.nn.TransformerEncoder: its layers must have a self_attn with batch_first "
                             f"(a TransformerEncoderLayer); {type(layer).__name__} has none")


def _why_not_nested(layer) -> str:
    """Why torch's TransformerEncoder would not use nested tensors with this layer ('' if it would)."""
    name = "encoder_layer"
    if not isinstance(layer, TransformerEncoderLayer):
        return f"{name} was not TransformerEncoderLayer"
    if layer.norm_first:
        return f"{name}.norm_first was True"
    if not layer.self_attn.batch_first:
        return f"{name}.self_attn.batch_first was not True(use batch_first for better inference performance)"
    if not layer.self_attn._qkv_same_embed_dim:
        return f"{name}.self_attn._qkv_same_embed_dim was not True"
    if layer.self_attn.in_proj_bias is None:
        return f"{name}.self_attn was passed bias=False"
    if layer.activation not in (F.relu, F.gelu) and not isinstance(layer.activation, (ReLU, GELU)):
        return f"{name}.activation_relu_or_gelu was not True"
    if layer.norm1.eps != layer.norm2.eps:
        return f"{name}.norm1.eps was not equal to {name}.norm2.eps"
    if layer.self_attn.num_heads % 2 == 1:
        return f"{name}.self_attn.num_heads is odd"
    return ""
