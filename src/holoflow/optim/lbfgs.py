"""``LBFGS`` (history, fixed step or strong-Wolfe line search), torch's algorithm step for step.

The search runs on the parameters' flat storages (torch tensors), as torch's does on its own; the
closure is the user's holoflow code (forward + backward), called with grad enabled. The strong
Wolfe line search is torch's own function (pure tensor arithmetic on those flat storages), so the
accepted steps are torch's.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch.optim.lbfgs import _strong_wolfe

from ..core import grad_mode
from ..core.errors import UnsupportedError
from ..core.tensor import Tensor
from .optimizer import Optimizer

__all__ = ["LBFGS"]


class LBFGS(Optimizer):
    """L-BFGS, as ``torch.optim.LBFGS``; ``step(closure)`` needs the closure (it re-evaluates the
    loss several times). One parameter group; local (non-global) parameters in eager mode.

    >>> opt = flow.optim.LBFGS(model.parameters(), lr=1, line_search_fn="strong_wolfe")
    >>> def closure():
    ...     opt.zero_grad(); loss = loss_fn(model(x), y); loss.backward(); return loss
    >>> opt.step(closure)
    """

    def __init__(self, params: Iterable, lr: float = 1, max_iter: int = 20, max_eval: int | None = None,
                 tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None) -> None:
        if not 0.0 <= lr:
            raise ValueError(f"holoflow.optim.LBFGS: invalid learning rate {lr}; it must be >= 0")
        if line_search_fn not in (None, "strong_wolfe"):
            raise ValueError(f"holoflow.optim.LBFGS: line_search_fn={line_search_fn!r}; only None "
                             f"and 'strong_wolfe' are supported (as torch)")
        defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_iter * 5 // 4 if max_eval is None else max_eval,
                        tolerance_grad=tolerance_grad, tolerance_change=tolerance_change,
                        history_size=history_size, line_search_fn=line_search_fn)
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("holoflow.optim.LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]
        if any(p._global is not None for p in self._params):
            raise UnsupportedError("holoflow.optim.LBFGS: global parameters are not supported; it "
                                   "works on local tensors (to_local() or a single-device model)")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As :meth:`Optimizer.load_state_dict`, keeping the search state (``d``, ``t``,
        ``H_diag``, ``prev_flat_grad``, ...) as the torch tensors the algorithm works on."""
        super().load_state_dict(state_dict)
        for st in self.state.values():
            for k, v in st.items():
                if isinstance(v, Tensor):
                    st[k] = v._data

    # -- flat views over the parameters' torch storages ------------------------------------
    def _storages(self) -> list[torch.Tensor]:
        return [p._data for p in self._params]

    def _gather_flat_grad(self) -> torch.Tensor:
        views = [p._data.new_zeros(p.numel()) if p.grad is None else p.grad._data.reshape(-1)
                 for p in self._params]
        return torch.cat(views, 0)

    def _add_grad(self, step_size, update: torch.Tensor) -> None:
        offset = 0
        for p in self._storages():
            p.add_(update[offset:offset + p.numel()].view_as(p), alpha=step_size)
            offset += p.numel()

    def _clone_param(self) -> list[torch.Tensor]:
        return [p.clone(memory_format=torch.contiguous_format) for p in self._storages()]

    def _set_param(self, params_data: list[torch.Tensor]) -> None:
        for p, pdata in zip(self._storages(), params_data):
            p.copy_(pdata)

    def _evaluate(self, closure: Callable[[], Any]) -> Any:
        with grad_mode.enable_grad():
            return closure()

    def _directional_evaluate(self, closure, x, t, d):
        self._add_grad(t, d)
        loss = float(self._evaluate(closure))
        flat_grad = self._gather_flat_grad()
        self._set_param(x)
        return loss, flat_grad

    # -- the algorithm ------------------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # noqa: C901 - torch's loop
        """Runs up to ``max_iter`` L-BFGS iterations; returns the loss of the first evaluation."""
        if closure is None:
            raise TypeError("holoflow.optim.LBFGS.step: a closure that re-evaluates the model and "
                            "returns the loss is required")
        group = self.param_groups[0]
        lr, max_iter, max_eval = float(group["lr"]), group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        history_size = group["history_size"]
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = self._evaluate(closure)
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        with grad_mode.no_grad():
            flat_grad = self._gather_flat_grad()
        if flat_grad.abs().max() <= tol_grad:
            return orig_loss
        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        H_diag, prev_flat_grad, prev_loss = state.get("H_diag"), state.get("prev_flat_grad"), state.get("prev_loss")
        n_iter, opt_cond = 0, False
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d, old_dirs, old_stps, ro, H_diag = flat_grad.neg(), [], [], [], 1
            else:
                y = flat_grad.sub(prev_flat_grad)
                s = d.mul(t)
                ys = y.dot(s)
                if ys > 1e-10:
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    H_diag = ys / y.dot(y)
                num_old = len(old_dirs)
                al = state.setdefault("al", [None] * history_size)
                q = flat_grad.neg()
                for i in range(num_old - 1, -1, -1):
                    al[i] = old_stps[i].dot(q) * ro[i]
                    q.add_(old_dirs[i], alpha=-al[i])
                d = r = torch.mul(q, H_diag)
                for i in range(num_old):
                    be_i = old_dirs[i].dot(r) * ro[i]
                    r.add_(old_stps[i], alpha=al[i] - be_i)
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone(memory_format=torch.contiguous_format)
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss
            t = min(1.0, 1.0 / flat_grad.abs().sum()) * lr if state["n_iter"] == 1 else lr
            gtd = flat_grad.dot(d)
            if gtd > -tol_change:
                break
            ls_func_evals = 0
            if group["line_search_fn"] is not None:
                x_init = self._clone_param()

                def obj_func(x, t, d):
                    return self._directional_evaluate(closure, x, t, d)

                loss, flat_grad, t, ls_func_evals = _strong_wolfe(
                    obj_func, x_init, t, d, loss, flat_grad, gtd, max_ls=max_eval - current_evals)
                self._add_grad(t, d)
                opt_cond = flat_grad.abs().max() <= tol_grad
            else:
                self._add_grad(t, d)
                if n_iter != max_iter:
                    loss = float(self._evaluate(closure))
                    flat_grad = self._gather_flat_grad()
                    opt_cond = flat_grad.abs().max() <= tol_grad
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals
            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if d.mul(t).abs().max() <= tol_change or abs(loss - prev_loss) < tol_change:
                break
        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=H_diag,
                     prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        self._step_count += 1
        self._opt_called = True
        return orig_loss
