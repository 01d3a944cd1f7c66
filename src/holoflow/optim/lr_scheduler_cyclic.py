"""Cyclic schedules: ``CyclicLR`` and ``CosineAnnealingWarmRestarts``, step for step as torch's."""
from __future__ import annotations

import math
import types
from typing import Any, Callable

from .lr_scheduler import LRScheduler, _lrs, _per_group
from .optimizer import Optimizer

__all__ = ["CyclicLR", "CosineAnnealingWarmRestarts"]


def _set_momentum(group: dict, m: float, use_beta1: bool) -> None:
    if use_beta1:
        group["betas"] = (m, *group["betas"][1:])
    else:
        group["momentum"] = m


class CyclicLR(LRScheduler):
    """Cycles each group's lr between ``base_lr`` and ``max_lr`` (``triangular``, ``triangular2``,
    ``exp_range`` or a custom ``scale_fn``), and the momentum (or Adam's beta1) inversely.
    Steps once per batch."""

    def __init__(self, optimizer: Optimizer, base_lr: float | list[float], max_lr: float | list[float],
                 step_size_up: int = 2000, step_size_down: int | None = None, mode: str = "triangular",
                 gamma: float = 1.0, scale_fn: Callable[[float], float] | None = None,
                 scale_mode: str = "cycle", cycle_momentum: bool = True, base_momentum: float = 0.8,
                 max_momentum: float = 0.9, last_epoch: int = -1) -> None:
        name = "holoflow.optim.lr_scheduler.CyclicLR"
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{name}: {type(optimizer).__name__} is not a holoflow Optimizer")
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError(f"{name}: mode {mode!r} is invalid and scale_fn is None; use "
                             f"'triangular', 'triangular2', 'exp_range' or pass scale_fn")
        self.optimizer = optimizer
        base_lrs = _per_group("base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups):
                group["lr"] = lr
        self.max_lrs = _per_group("max_lr", optimizer, max_lr)
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        self.mode, self.gamma, self.scale_mode = mode, gamma, scale_mode
        self._scale_fn_custom = scale_fn
        self._init_scale_fn()
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(f"{name}: the optimizer must support momentum or beta1 with "
                                 f"cycle_momentum=True")
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = _per_group("base_momentum", optimizer, base_momentum)
            self.max_momentums = _per_group("max_momentum", optimizer, max_momentum)
            if last_epoch == -1:
                for mx, bm, g in zip(self.max_momentums, self.base_momentums, optimizer.param_groups):
                    _set_momentum(g, mx, self.use_beta1)
                    g["max_momentum"], g["base_momentum"] = mx, bm
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _init_scale_fn(self) -> None:
        if self._scale_fn_custom is not None:
            return
        if self.mode in ("triangular", "triangular2"):
            self.scale_mode = "cycle"
        elif self.mode == "exp_range":
            self.scale_mode = "iterations"

    def scale_fn(self, x: float) -> float:
        """The amplitude scale at cycle (or iteration) ``x``."""
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma ** x

    def get_lr(self) -> list[float]:
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        scale = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        at = cycle if self.scale_mode == "cycle" else self.last_epoch
        lrs = [base + (mx - base) * scale * self.scale_fn(at) for base, mx in zip(self.base_lrs, self.max_lrs)]
        if self.cycle_momentum:
            for g, bm, mx in zip(self.optimizer.param_groups, self.base_momentums, self.max_momentums):
                _set_momentum(g, mx - (mx - bm) * scale * self.scale_fn(at), self.use_beta1)
        return lrs

    def state_dict(self) -> dict[str, Any]:
        """As torch: a custom scale_fn is saved only as a callable object's ``__dict__``."""
        state = super().state_dict()
        fn = state.pop("_scale_fn_custom")
        state["_scale_fn_custom"] = None if fn is None or isinstance(fn, types.FunctionType) \
            else fn.__dict__.copy()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        fn = state_dict.pop("_scale_fn_custom")
        super().load_state_dict(state_dict)
        if fn is not None:
            self._scale_fn_custom.__dict__.update(fn)
        self._init_scale_fn()


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from each group's lr to ``eta_min`` over ``T_i`` epochs, restarting with
    ``T_i *= T_mult``; ``step(epoch)`` accepts fractional epochs, as torch."""

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        name = "holoflow.optim.lr_scheduler.CosineAnnealingWarmRestarts"
        if not isinstance(T_0, int) or T_0 <= 0:
            raise ValueError(f"{name}: expected a positive integer T_0, got {T_0!r}")
        if not isinstance(T_mult, int) or T_mult < 1:
            raise ValueError(f"{name}: expected an integer T_mult >= 1, got {T_mult!r}")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"{name}: expected a float or int eta_min, got {type(eta_min).__name__}")
        self.T_0, self.T_i, self.T_mult, self.eta_min = T_0, T_0, T_mult, eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base in self.base_lrs]

    def step(self, epoch: float | None = None) -> None:  # type: ignore[override]
        """Advances one epoch, or jumps to ``epoch`` (fractional epochs allowed)."""
        self._step_count += 1
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur += 1
            if self.T_cur >= self.T_i:
                self.T_cur, self.T_i = self.T_cur % self.T_i, self.T_i * self.T_mult
        elif epoch < 0:
            raise ValueError(f"holoflow.optim.lr_scheduler.CosineAnnealingWarmRestarts: expected a "
                             f"non-negative epoch, got {epoch}")
        elif epoch >= self.T_0:
            if self.T_mult == 1:
                self.T_cur = epoch % self.T_0
            else:
                n = int(math.log((epoch / self.T_0 * (self.T_mult - 1) + 1), self.T_mult))
                self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                self.T_i = self.T_0 * self.T_mult ** n
        else:
            self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = _lrs(self.optimizer)
