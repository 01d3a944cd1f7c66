"""The ``Distribution`` base, as torch's: batch/event shapes, ``sample`` from ``rsample``, parameter
checks against ``arg_constraints`` and sample checks against ``support`` (when ``validate_args``),
``expand`` through ``_get_checked_instance``."""
from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ..core import grad_mode
from ..core.tensor import Tensor
from . import constraints
from .utils import broadcast_all, lazy_property

__all__ = ["Distribution", "broadcast_all", "as_size"]


def as_size(sample_shape: Any) -> torch.Size:
    return torch.Size(sample_shape if isinstance(sample_shape, (tuple, list, torch.Size)) else (sample_shape,))


def _all_true(valid: Any) -> bool:
    return bool(valid.all()) if isinstance(valid, Tensor) else bool(valid)


class Distribution:
    """Base class: subclasses set ``arg_constraints``, ``support``, the batch/event shapes and write
    ``rsample`` (or ``sample``), ``log_prob``, ``entropy`` and ``expand``."""

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
        if self._validate_args:
            self._check_args()

    def _check_args(self) -> None:
        """Every checkable parameter against its constraint (torch skips dependent constraints
        and lazy parameters not computed yet)."""
        try:
            arg_constraints = self.arg_constraints
        except NotImplementedError:
            arg_constraints = {}
            warnings.warn(f"{self.__class__} does not define `arg_constraints`. Please set `arg_constraints = {{}}` "
                          f"or initialize the distribution with `validate_args=False` to turn off validation.",
                          stacklevel=3)
        for param, constraint in arg_constraints.items():
            if constraints.is_dependent(constraint):
                continue
            attr = getattr(type(self), param, None)   # None: computed on first use by __getattr__
            if param not in self.__dict__ and (attr is None or isinstance(attr, lazy_property)):
                continue
            value = getattr(self, param)
            if not _all_true(constraint.check(value)):
                raise ValueError(f"holoflow.distributions.{type(self).__name__}: expected parameter {param} "
                                 f"({type(value).__name__} of shape {tuple(value.shape)}) of distribution "
                                 f"{self!r} to satisfy the constraint {constraint!r}, but found invalid "
                                 f"values:\n{value}")

    def expand(self, batch_shape: Any, _instance: Any = None) -> "Distribution":
        """A new distribution with its parameters expanded (views, no copies) to ``batch_shape``."""
        raise NotImplementedError

    def _get_checked_instance(self, cls: type, _instance: Any = None) -> Any:
        if _instance is None and type(self).__init__ != cls.__init__:
            raise NotImplementedError(f"Subclass {self.__class__.__name__} of {cls.__name__} that defines a custom "
                                      f"__init__ method must also define a custom .expand() method.")
        return self.__new__(type(self)) if _instance is None else _instance

    def _expanded(self, new: "Distribution", batch_shape: Any, event_shape: Any = None) -> "Distribution":
        """Finishes an ``expand``: the new instance's shapes, unchecked, keeping this one's
        ``validate_args`` (torch's closing lines of every ``expand``)."""
        Distribution.__init__(new, batch_shape, self._event_shape if event_shape is None else event_shape,
                              validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def batch_shape(self) -> torch.Size:
        return self._batch_shape

    @property
    def event_shape(self) -> torch.Size:
        return self._event_shape

    @property
    def arg_constraints(self) -> dict[str, constraints.Constraint]:
        raise NotImplementedError

    @property
    def support(self) -> constraints.Constraint | None:
        raise NotImplementedError

    @property
    def mean(self) -> Tensor:
        raise NotImplementedError

    @property
    def mode(self) -> Tensor:
        raise NotImplementedError(f"{self.__class__} does not implement mode")

    @property
    def variance(self) -> Tensor:
        raise NotImplementedError

    @property
    def stddev(self) -> Tensor:
        return self.variance.sqrt()

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
        warnings.warn("sample_n will be deprecated. Use .sample((n,)) instead", UserWarning, stacklevel=2)
        return self.sample((n,))

    def log_prob(self, value: Tensor) -> Tensor:
        raise NotImplementedError

    def cdf(self, value: Tensor) -> Tensor:
        raise NotImplementedError

    def icdf(self, value: Tensor) -> Tensor:
        raise NotImplementedError

    def enumerate_support(self, expand: bool = True) -> Tensor:
        raise NotImplementedError

    def entropy(self) -> Tensor:
        raise NotImplementedError

    def perplexity(self) -> Tensor:
        return self.entropy().exp()

    def _validate_sample(self, value: Any) -> None:
        """``value``'s rightmost dims agree with the batch and event shapes, and it lies in the
        support (torch's checks before ``log_prob``/``cdf``); ValueError otherwise."""
        name = f"holoflow.distributions.{type(self).__name__}"
        if not isinstance(value, Tensor):
            raise ValueError(f"{name}: the value argument to log_prob must be a Tensor, got {type(value).__name__}")
        shape = torch.Size(value.shape)
        start = len(shape) - len(self._event_shape)
        if shape[start:] != self._event_shape:
            raise ValueError(f"{name}: the right-most size of value must match event_shape: {tuple(shape)} vs "
                             f"{tuple(self._event_shape)}")
        expected = self._batch_shape + self._event_shape
        for i, j in zip(reversed(shape), reversed(expected)):
            if i != 1 and j != 1 and i != j:
                raise ValueError(f"{name}: value is not broadcastable with batch_shape+event_shape: "
                                 f"{tuple(shape)} vs {tuple(expected)}")
        try:
            support = self.support
        except NotImplementedError:
            warnings.warn(f"{self.__class__} does not define `support` to enable sample validation. Please "
                          f"initialize the distribution with `validate_args=False` to turn off validation.",
                          stacklevel=2)
            return
        if not _all_true(support.check(value)):
            raise ValueError(f"{name}: expected value argument ({type(value).__name__} of shape {tuple(shape)}) "
                             f"to be within the support ({support!r}) of the distribution {self!r}, but found "
                             f"invalid values:\n{value}")

    def _check(self, ok: Any, name: str, value: Any, constraint: str) -> None:
        if not bool(ok):
            raise ValueError(f"holoflow.distributions.{type(self).__name__}: expected parameter {name} "
                             f"(shape {tuple(getattr(value, 'shape', ()))}) to satisfy the constraint "
                             f"{constraint}, but found invalid values")

    def __repr__(self) -> str:
        try:
            names = [k for k in self.arg_constraints if k in self.__dict__]
        except NotImplementedError:
            names = []
        args = ", ".join(f"{p}: {self.__dict__[p] if self.__dict__[p].numel() == 1 else self.__dict__[p].size()}"
                         for p in names)
        return f"{type(self).__name__}({args})"


LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))
