"""``SparseAdam``: torch's constructor, defaults and errors.

torch's SparseAdam steps only with sparse-layout gradients (``nn.Embedding(sparse=True)``) and
raises RuntimeError for dense ones. holoflow has no sparse tensors (``is_sparse`` is always False,
``Embedding(sparse=True)`` raises UnsupportedError), so every gradient it can produce is dense:
``step`` raises torch's RuntimeError. The class exists so code that builds one (and state dicts
that name one) load, and fails where torch would fail given dense gradients.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from ..core import grad_mode
from .optimizer import Optimizer

__all__ = ["SparseAdam"]

_DENSE_GRADIENTS = ("holoflow.optim.SparseAdam: SparseAdam does not support dense gradients, please consider "
                    "Adam instead (holoflow has no sparse gradients, so SparseAdam cannot step; use "
                    "holoflow.optim.Adam)")


class SparseAdam(Optimizer):
    """SparseAdam, as ``torch.optim.SparseAdam`` (lr 1e-3, betas (0.9, 0.999), eps 1e-8).

    Construction checks what torch checks; :meth:`step` raises RuntimeError for the dense
    gradients holoflow produces, as torch does for dense gradients: use Adam instead."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, maximize: bool = False) -> None:
        if not 0.0 < lr:
            raise ValueError(f"holoflow.optim.SparseAdam: invalid learning rate {lr}; it must be > 0")
        if not 0.0 < eps:
            raise ValueError(f"holoflow.optim.SparseAdam: invalid epsilon value {eps}; it must be > 0")
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"holoflow.optim.SparseAdam: invalid beta parameter at index {i}: {b}; "
                                 f"it must lie in [0, 1)")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, maximize=maximize))
        complex_params = [[gi, pi] for gi, g in enumerate(self.param_groups)
                          for pi, p in enumerate(g["params"]) if p.is_complex()]
        if complex_params:
            raise ValueError(f"holoflow.optim.SparseAdam: complex params at indices {complex_params}: "
                             f"SparseAdam does not support complex parameters")

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Raises for any gradient (all are dense in holoflow), after running ``closure``, as torch
        does; a step with no gradients does nothing."""
        loss = None
        if closure is not None:
            with grad_mode.enable_grad():
                loss = closure()
        if any(p.grad is not None for g in self.param_groups for p in g["params"]):
            raise RuntimeError(_DENSE_GRADIENTS)
        self._step_count += 1
        return loss

    def _update(self, V, group: dict, params: list, grads: list, states: list) -> None:
        """The update nn.Graph runs (it calls the rule, not :meth:`step`): the same error."""
        raise RuntimeError(_DENSE_GRADIENTS)
