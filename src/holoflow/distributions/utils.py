"""``holoflow.distributions.utils``: torch's helpers of that module (``broadcast_all``,
``probs_to_logits``/``logits_to_probs``, ``clamp_probs``, ``lazy_property``, the triangular
packing ``tril_matrix_to_vec``/``vec_to_tril_matrix``) written in holoflow ops."""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ..core import grad_mode
from ..core.dtype import finfo
from ..core.tensor import Tensor
from ..nn.functional import softmax
from ..ops.creation import arange, tensor, zeros

__all__ = ["broadcast_all", "clamp_probs", "euler_constant", "lazy_property", "logits_to_probs", "probs_to_logits",
           "tril_matrix_to_vec", "vec_to_tril_matrix"]

euler_constant = 0.57721566490153286060  # Euler Mascheroni Constant


def broadcast_all(*values: Any) -> tuple[Tensor, ...]:
    """Numbers become tensors of the first tensor's dtype/device (else the default dtype); all
    are expanded to the common broadcast shape, as torch.distributions.utils.broadcast_all."""
    if not all(isinstance(v, (Tensor, int, float)) for v in values):
        raise ValueError("holoflow.distributions: input arguments must all be numbers or holoflow Tensors, got "
                         f"{[type(v).__name__ for v in values]}")
    like = next((v for v in values if isinstance(v, Tensor)), None)
    kw = {"dtype": like.dtype, "device": like.device} if like is not None else {}
    ts = [v if isinstance(v, Tensor) else tensor(float(v) if like is None else v, **kw) for v in values]
    shape = torch.broadcast_shapes(*[tuple(t.shape) for t in ts])
    return tuple(t.expand(shape) for t in ts)


def clamp_probs(probs: Tensor) -> Tensor:
    """``probs`` clamped into ``[eps, 1 - eps]`` of its dtype (logs stay finite)."""
    eps = finfo(probs.dtype).eps
    return probs.clamp(min=eps, max=1 - eps)


def logits_to_probs(logits: Tensor, is_binary: bool = False) -> Tensor:
    return logits.sigmoid() if is_binary else softmax(logits, dim=-1)


def probs_to_logits(probs: Tensor, is_binary: bool = False) -> Tensor:
    ps = clamp_probs(probs)
    return ps.log() - (-ps).log1p() if is_binary else ps.log()


class lazy_property:
    """A property computed on first use (with gradients enabled, as torch's) and then stored in
    the instance's ``__dict__``, so ``'logits' in d.__dict__`` says which parameterization was given."""

    def __init__(self, wrapped: Callable) -> None:
        self.wrapped = wrapped
        functools.update_wrapper(self, wrapped)  # type: ignore[arg-type]

    def __get__(self, instance: Any, obj_type: Any = None) -> Any:
        if instance is None:
            return self
        with grad_mode.enable_grad():
            value = self.wrapped(instance)
        setattr(instance, self.wrapped.__name__, value)
        return value


def _tril_mask(n: int, diag: int, device: Any) -> Tensor:
    r = arange(n, device=device)
    return r < r.view(-1, 1) + (diag + 1)


def tril_matrix_to_vec(mat: Tensor, diag: int = 0) -> Tensor:
    """The entries of ``mat`` on and below diagonal ``diag``, row by row, as a vector."""
    n = mat.shape[-1]
    if diag < -n or diag >= n:
        raise ValueError(f"holoflow.distributions.utils.tril_matrix_to_vec: diag ({diag}) provided is outside "
                         f"[{-n}, {n - 1}].")
    return mat[..., _tril_mask(n, diag, mat.device)]


def vec_to_tril_matrix(vec: Tensor, diag: int = 0) -> Tensor:
    """The inverse of ``tril_matrix_to_vec``: a ``(n, n)`` matrix zero above diagonal ``diag``."""
    n = (-(1 + 2 * diag) + ((1 + 2 * diag) ** 2 + 8 * vec.shape[-1] + 4 * abs(diag) * (diag + 1)) ** 0.5) / 2
    if round(n) - n > finfo(vec.dtype).eps:
        raise ValueError(f"holoflow.distributions.utils.vec_to_tril_matrix: the size of last dimension is "
                         f"{vec.shape[-1]} which cannot be expressed as the lower triangular part of a square "
                         f"D x D matrix.")
    n = round(n)
    mask = _tril_mask(n, diag, vec.device)
    mat = zeros(tuple(vec.shape[:-1]) + (n, n), dtype=vec.dtype, device=vec.device)
    return mat.masked_scatter(mask.expand(mat.shape), vec)


def as_tensor_like(value: Any, like: Tensor) -> Tensor:
    """``torch.as_tensor(value, dtype=like.dtype, device=like.device)``: numbers become tensors,
    tensors of another dtype are cast."""
    if isinstance(value, Tensor):
        return value if value.dtype == like.dtype else value.to(like.dtype)
    return tensor(value, dtype=like.dtype, device=like.device)


