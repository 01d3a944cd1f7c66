"""Dropout variants beyond ``dropout`` (ops/random_ops.py): channel dropout
(``dropout1d/2d/3d``), ``alpha_dropout``/``feature_alpha_dropout`` and torch's top-level
``feature_dropout``/``feature_dropout_``.

Each is ``x * noise / (1 - p)`` (torch's ``_dropout_impl``; alpha dropout an affine map keeping
SELU's mean and variance) with the noise drawn as torch draws it, so ``holoflow.manual_seed(s)``
reproduces torch's masks; composites, their gradients and SBP rules come from the parts.
Re-exported by ops/nn_ops.py.
"""
from __future__ import annotations

import math
import warnings

from ..core.dispatch import assign
from ..core.errors import ShapeError
from ..core.tensor import Tensor
from .creation import empty_like

__all__ = ["dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "feature_dropout",
           "feature_dropout_"]


# -- dropout variants ------------------------------------------------------------------------------

_SELU_ALPHA_PRIME = 1.7580993408473766  # -selu_scale * selu_alpha: the value alpha dropout drops to


def _check_p(name: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"holoflow.{name}: p must be in [0, 1], got {p}")


def _noise(input: Tensor, lead: int | None, p: float) -> Tensor:
    """0/1 draws of probability ``1 - p`` like the input (``lead=None``) or one per leading
    (batch, channel) entry with unit trailing dims, drawn as torch draws them."""
    x = input.detach()
    if lead is not None:
        for d in range(lead, x.dim()):
            x = x.narrow(d, 0, 1)
    return empty_like(x).bernoulli_(1.0 - p)


def _dropout_impl(name: str, input: Tensor, p: float, training: bool, inplace: bool, lead: int | None,
                  alpha: bool) -> Tensor:
    """torch's ``_dropout_impl``: ``x * noise / (1 - p)``, or for alpha dropout the affine map
    keeping SELU's zero mean and unit variance."""
    _check_p(name, p)
    if p == 0.0 or not training or input.numel() == 0:
        return input
    if p == 1.0:
        out = input * 0.0
    elif alpha:
        noise = _noise(input, lead, p)
        a = 1.0 / math.sqrt((_SELU_ALPHA_PRIME ** 2 * p + 1) * (1 - p))
        b = (noise - 1) * (_SELU_ALPHA_PRIME * a) + _SELU_ALPHA_PRIME * a * p
        out = input * (noise * a) + b
    else:
        out = input * (_noise(input, lead, p) / (1.0 - p))
    return assign(input, out, name) if inplace else out


def _feature_lead(name: str, input: Tensor, spatial: int) -> int:
    """Leading dims that get their own draw: (C,) unbatched, (N, C) batched, as torch reads them."""
    nd = input.dim()
    if name == "dropout1d" and nd not in (2, 3):
        raise ShapeError(f"holoflow.dropout1d: expected a 2-D (C, L) or 3-D (N, C, L) input, got shape "
                         f"{tuple(input.shape)}")
    if nd < 2:
        raise ShapeError(f"holoflow.{name}: expected an input with a channel dim, got shape {tuple(input.shape)}")
    if nd not in (spatial + 1, spatial + 2):
        warnings.warn(f"holoflow.{name}: a {nd}-D input is read as (N, C, *), as torch does", stacklevel=3)
    return 1 if nd == spatial + 1 and spatial != 2 else 2  # torch reads a 3-D dropout2d input as (N, C, L)


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zeroes whole channels of an ``(N, C, L)`` or ``(C, L)`` input with probability ``p``."""
    return _dropout_impl("dropout1d", input, p, training, inplace, _feature_lead("dropout1d", input, 1), False)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zeroes whole channels of an ``(N, C, H, W)`` input (a 3-D input is read as ``(N, C, L)``)."""
    return _dropout_impl("dropout2d", input, p, training, inplace, _feature_lead("dropout2d", input, 2), False)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zeroes whole channels of an ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input."""
    return _dropout_impl("dropout3d", input, p, training, inplace, _feature_lead("dropout3d", input, 3), False)


def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """Dropout for SELU networks: dropped elements take SELU's negative saturation value and an
    affine map restores the input's mean and variance."""
    return _dropout_impl("alpha_dropout", input, p, training, inplace, None, True)


def feature_alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """:func:`alpha_dropout` of whole channels (one draw per ``(N, C)`` entry)."""
    if input.dim() < 2:
        raise ShapeError(f"holoflow.feature_alpha_dropout: expected an (N, C, *) input, got shape "
                         f"{tuple(input.shape)}")
    return _dropout_impl("feature_alpha_dropout", input, p, training, inplace, 2, True)


def feature_dropout(input: Tensor, p: float, train: bool) -> Tensor:
    """Dropout of whole features: one keep/drop draw per ``(N, C)`` entry of an ``(N, C, *)``
    input, kept ones scaled by ``1 / (1 - p)``, as ``torch.feature_dropout``."""
    _feature_check("feature_dropout", input)
    return _dropout_impl("feature_dropout", input, p, train, False, 2, False)


def feature_dropout_(input: Tensor, p: float, train: bool) -> Tensor:
    """In-place :func:`feature_dropout`, as ``torch.feature_dropout_``."""
    _feature_check("feature_dropout_", input)
    return _dropout_impl("feature_dropout_", input, p, train, True, 2, False)


def _feature_check(name: str, input: Tensor) -> None:
    if not isinstance(input, Tensor):
        raise TypeError(f"holoflow.{name}(): argument 'input' must be a Tensor, not {type(input).__name__}")
    if input.dim() < 2:
        raise RuntimeError(f"holoflow.{name}: feature dropout requires at least 2 dimensions in the input, got "
                           f"shape {tuple(input.shape)}")
