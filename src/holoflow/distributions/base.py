"""The ``Distribution`` base: batch/event shapes, ``sample`` from ``rsample``, argument checks."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..core import grad_mode
from ..core.tensor import Tensor
from ..ops.creation import tensor

__all__ = ["Distribution", "broadcast_all", "as_size"]


def as_size(sample_shape: Any) -> torch.Size:
    return torch.Size(sample_shape if isinstance(sample_shape, (tuple, list, torch.Size)) else (sample_shape,))


def broadcast_all(*values: Any) -> tuple[Tensor, ...]:
    """Numbers become tensors of the first tensor's dtype/device (else the default dtype); all
    are expanded to the common broadcast shape, as torch.distributions.utils.broadcast_all."""
    like = next((v for v in values if isinstance(v, Tensor)), None)
    kw = {"dtype": like.dtype, "device": like.device} if like is not None else {}
    ts = [v if isinstance(v, Tensor) else tensor(v, **kw) for v in values]
    shape = torch.broadcast_shapes(*[tuple(t.shape) for t in ts])
    return tuple(t.expand(shape) for t in ts)


class Distribution:
    """Base class: subclasses set ``batch_shape``/``event_shape`` and write ``rsample`` (or
    ``sample``), ``log_prob`` and ``entropy``."""

    has_rsample = False
    has_enumerate_support = False
    _validate_args = __debug__

    @staticmethod
    def set_default_validate_args(value: bool) -> None:
        """Sets whether argument validation is on when a distribution is built with
        ``validate_args=None`` (the default; on unless Python runs with -O), as torch's."""
        if value not in [True, False]:
            raise ValueError
        Distribution._validate_args = value

    def _validates(self, validate_args: bool | None) -> bool:
        return Distribution._validate_args if validate_args is None else bool(validate_args)

    def __init__(self, batch_shape: torch.Size = torch.Size(), event_shape: torch.Size = torch.Size(),
                 validate_args: bool | None = None) -> None:
        self._batch_shape, self._event_shape = torch.Size(batch_shape), torch.Size(event_shape)
        if validate_args is not None:
            self._validate_args = validate_args

    @property
    def batch_shape(self) -> torch.Size:
        return self._batch_shape

    @property
    def event_shape(self) -> torch.Size:
        return self._event_shape

    def _extended_shape(self, sample_shape: Any = ()) -> torch.Size:
        return as_size(sample_shape) + self._batch_shape + self._event_shape

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """A sample without gradient (``rsample`` under no_grad for reparameterized families)."""
        with grad_mode.no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        raise NotImplementedError(f"holoflow.distributions.{type(self).__name__} has no rsample "
                                  f"(not reparameterizable); use sample()")

    def sample_n(self, n: int) -> Tensor:
        return self.sample((n,))

    @property
    def stddev(self) -> Tensor:
        return self.variance.sqrt()

    def perplexity(self) -> Tensor:
        return self.entropy().exp()

    def _check(self, ok: Any, name: str, value: Any, constraint: str) -> None:
        if not bool(ok):
            raise ValueError(f"holoflow.distributions.{type(self).__name__}: expected parameter {name} "
                             f"(shape {tuple(getattr(value, 'shape', ()))}) to satisfy the constraint "
                             f"{constraint}, but found invalid values")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_shape={tuple(self.batch_shape)})"


LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))
