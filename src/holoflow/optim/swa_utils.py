"""``holoflow.optim.swa_utils``: stochastic weight averaging and EMA models, as
``torch.optim.swa_utils``: ``AveragedModel`` (a copy of a model whose parameters average the
model's, equally (SWA) or exponentially (EMA)), ``SWALR`` (anneals each group's lr to a constant
SWA lr) and ``update_bn`` (recomputes BatchNorm statistics for the averaged weights).

The averages are computed as torch computes them on the CPU (``p + (q - p) / (n + 1)`` with the
count a long tensor) or, for the multi-tensor averaging functions, with ``lerp_`` and torch's
float32 weights, so averaged weights equal torch's.
"""
from __future__ import annotations

import itertools
import math
from copy import deepcopy
from typing import Any, Callable, Iterable

from ..core import dtype as _dtype
from ..core.grad_mode import no_grad
from ..core.tensor import Tensor
from ..nn.module import Module
from ..nn.modules.norm import _BatchNorm
from ..ops.creation import tensor
from .lr_scheduler import LRScheduler, _per_group
from .optimizer import Optimizer

__all__ = ["AveragedModel", "update_bn", "SWALR", "get_ema_multi_avg_fn", "get_swa_multi_avg_fn",
           "get_ema_avg_fn", "get_swa_avg_fn"]


def _check_decay(decay: float) -> None:
    if decay < 0.0 or decay > 1.0:
        raise ValueError(f"Invalid decay value {decay} provided. Please provide a value in [0,1] range.")


def get_ema_multi_avg_fn(decay: float = 0.999) -> Callable:
    """``ema <- ema + (1 - decay) (p - ema)`` over lists of tensors, in place."""
    _check_decay(decay)

    def ema_update(ema_param_list: list, current_param_list: list, _num_averaged) -> None:
        with no_grad():
            if ema_param_list[0].is_floating_point() or ema_param_list[0].is_complex():
                for p_ema, p_model in zip(ema_param_list, current_param_list):
                    p_ema.lerp_(p_model, 1 - decay)
            else:
                for p_ema, p_model in zip(ema_param_list, current_param_list):
                    p_ema.copy_(p_ema * decay + p_model * (1 - decay))
    return ema_update


def get_swa_multi_avg_fn() -> Callable:
    """The running equal-weight average over lists of tensors, in place."""
    def swa_update(averaged_param_list: list, current_param_list: list, num_averaged) -> None:
        with no_grad():
            if averaged_param_list[0].is_floating_point() or averaged_param_list[0].is_complex():
                weight = float(1 / (num_averaged + 1))   # float32 for a count tensor, as torch's
                for p_avg, p_model in zip(averaged_param_list, current_param_list):
                    p_avg.lerp_(p_model, weight)
            else:
                for p_avg, p_model in zip(averaged_param_list, current_param_list):
                    p_avg.add_((p_model - p_avg) / (num_averaged + 1))
    return swa_update


def get_ema_avg_fn(decay: float = 0.999) -> Callable:
    """``decay * ema + (1 - decay) * p`` for one tensor (returns the new value)."""
    _check_decay(decay)

    def ema_update(ema_param: Tensor, current_param: Tensor, num_averaged) -> Tensor:
        with no_grad():
            return decay * ema_param + (1 - decay) * current_param
    return ema_update


def get_swa_avg_fn() -> Callable:
    """The running equal-weight average for one tensor (returns the new value)."""
    def swa_update(averaged_param: Tensor, current_param: Tensor, num_averaged) -> Tensor:
        with no_grad():
            return averaged_param + (current_param - averaged_param) / (num_averaged + 1)
    return swa_update


class AveragedModel(Module):
    """A deep copy of ``model`` whose parameters (and, with ``use_buffers``, buffers) hold an
    average of ``model``'s over the ``update_parameters`` calls: equal weights by default,
    ``avg_fn(avg, p, n)`` per tensor or ``multi_avg_fn(avgs, ps, n)`` over lists otherwise.
    Without ``use_buffers`` the buffers are copied from ``model`` at each update."""

    def __init__(self, model: Module, device: Any = None, avg_fn: Callable | None = None,
                 multi_avg_fn: Callable | None = None, use_buffers: bool = False) -> None:
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise AssertionError("Only one of avg_fn and multi_avg_fn should be provided")
        self.module = deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged", tensor(0, dtype=_dtype.long, device=device))
        self.avg_fn, self.multi_avg_fn, self.use_buffers = avg_fn, multi_avg_fn, use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _tensors(self, model: Module) -> Iterable:
        return itertools.chain(model.parameters(), model.buffers()) if self.use_buffers else model.parameters()

    def update_parameters(self, model: Module) -> None:
        own = self._tensors(self.module) if self.use_buffers else self.parameters()
        pairs = [(p_avg.detach(), p.detach().to(p_avg.device)) for p_avg, p in zip(own, self._tensors(model))]
        n = self.n_averaged
        with no_grad():
            if int(n) == 0:
                for p_avg, p in pairs:
                    p_avg.copy_(p)
            elif self.avg_fn is not None:
                for p_avg, p in pairs:
                    p_avg.copy_(self.avg_fn(p_avg, p, n.to(p_avg.device)))
            else:
                self._average_groups(pairs, n)
            if not self.use_buffers:
                for b_avg, b in zip(self.module.buffers(), model.buffers()):
                    b_avg.detach().copy_(b.detach().to(b_avg.device))
            self.n_averaged += 1

    def _average_groups(self, pairs: list, n: Tensor) -> None:
        """Per (device, dtype) group, as torch: ``multi_avg_fn``, or the default SWA average
        (torch's multi-tensor kernel on CUDA, the per-tensor formula elsewhere)."""
        groups: dict = {}
        for p_avg, p in pairs:
            avgs, ps = groups.setdefault((str(p_avg.device), p_avg.dtype), ([], []))
            avgs.append(p_avg)
            ps.append(p)
        for avgs, ps in groups.values():
            count = n.to(avgs[0].device)
            if self.multi_avg_fn is not None:
                self.multi_avg_fn(avgs, ps, count)
            elif avgs[0].device.type == "cuda":
                get_swa_multi_avg_fn()(avgs, ps, count)
            else:
                avg_fn = get_swa_avg_fn()
                for p_avg, p in zip(avgs, ps):
                    p_avg.copy_(avg_fn(p_avg, p, count))


def update_bn(loader: Iterable, model: Module, device: Any = None) -> None:
    """One pass over ``loader`` (batches, or tuples/lists whose first item is the input) in train
    mode with cumulative averaging (``momentum=None``), after resetting every BatchNorm's running
    statistics: the statistics of the averaged weights."""
    momenta = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    with no_grad():
        for input in loader:
            if isinstance(input, (list, tuple)):
                input = input[0]
            if device is not None:
                input = input.to(device)
            model(input)
    for module, momentum in momenta.items():
        module.momentum = momentum
    model.train(was_training)


class SWALR(LRScheduler):
    """Anneals each group's lr from its value to ``swa_lr`` over ``anneal_epochs`` steps (cosine
    or linear), then keeps it there."""

    def __init__(self, optimizer: Optimizer, swa_lr: float | list, anneal_epochs: int = 10,
                 anneal_strategy: str = "cos", last_epoch: int = -1) -> None:
        for lr, group in zip(_per_group("swa_lr", optimizer, swa_lr), optimizer.param_groups):
            group["swa_lr"] = lr
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        self._set_anneal_func(anneal_strategy)
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _linear_anneal(t: float) -> float:
        return t

    @staticmethod
    def _cosine_anneal(t: float) -> float:
        return (1 - math.cos(math.pi * t)) / 2

    @staticmethod
    def _get_initial_lr(lr: float, swa_lr: float, alpha: float) -> float:
        return swa_lr if alpha == 1 else (lr - alpha * swa_lr) / (1 - alpha)

    def _set_anneal_func(self, anneal_strategy: str) -> None:
        self._anneal_strategy = anneal_strategy
        self.anneal_func = self._cosine_anneal if anneal_strategy == "cos" else self._linear_anneal

    def get_lr(self) -> list[float]:
        """torch's recursive form: recover the lr before annealing from the current one, then
        anneal it one step further."""
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_alpha = self.anneal_func(max(0, min(1, (step - 1) / max(1, self.anneal_epochs))))
        prev_lrs = [self._get_initial_lr(g["lr"], g["swa_lr"], prev_alpha) for g in self.optimizer.param_groups]
        alpha = self.anneal_func(max(0, min(1, step / max(1, self.anneal_epochs))))
        return [g["swa_lr"] * alpha + lr * (1 - alpha) for g, lr in zip(self.optimizer.param_groups, prev_lrs)]

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "anneal_func")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)
        self._set_anneal_func(self._anneal_strategy)
