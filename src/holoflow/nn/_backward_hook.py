"""``register_full_backward_hook`` support: identity Functions around a module call.

The identity on the outputs records ``grad_output``; the identity on the inputs receives
``grad_input``, calls the hooks, and passes on what they return.
"""
from __future__ import annotations

from typing import Any, Callable

from ..autograd import Function
from ..core.tensor import Tensor
from ..ops.creation import zeros


def _alias(t: Tensor) -> Tensor:
    out = Tensor._make(t._data)
    out._global = t._global
    return out


class _Identity(Function):
    @staticmethod
    def forward(ctx: Any, hook: "BackwardHook", on_input: bool, *tensors: Tensor) -> tuple:
        ctx.hook, ctx.on_input = hook, on_input
        # (as torch's: grad_output holds None for an output nothing used, grad_input zeros for an
        # input that got no gradient, one not requiring grad included)
        ctx.set_materialize_grads(False)
        ctx.metas = [(tuple(t.shape), t.dtype, t.device) if t._global is None else None for t in tensors]
        return tuple(_alias(t) for t in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple:
        needs = ctx.needs_input_grad[2:]
        hook = ctx.hook
        if ctx.on_input:
            grads = tuple(zeros(m[0], dtype=m[1], device=m[2]) if g is None and m is not None else g
                          for g, m in zip(grads, ctx.metas))
            grads = _unpack(hook.input_index, hook.run(_pack(hook.input_index, grads, hook.n_args)))
            grads = tuple(g if need else None for g, need in zip(grads, needs))
        else:
            grads = tuple(g if need else None for g, need in zip(grads, needs))
            hook.grad_output = hook.run_pre(_pack(hook.output_index, grads, hook.n_outputs))
            grads = _unpack(hook.output_index, hook.grad_output)
            if not hook.n_inputs and hook.hooks:  # no input needs a gradient: torch fires
                hook.run((None,) * hook.n_args)  # with all-None grad_input
        return (None, None) + tuple(grads)


def _pack(index: list, values: tuple, size: int) -> tuple:
    """As torch: a hook sees one gradient per argument (output), None for those not tensors."""
    res: list = [None] * size
    for i, v in zip(index, values):
        res[i] = v
    return tuple(res)


def _unpack(index: list, values: tuple) -> tuple:
    return tuple(values[i] for i in index)


class BackwardHook:
    """Wraps one module call: ``setup_input`` before forward, ``setup_output`` after."""

    def __init__(self, module: Any, hooks: list[Callable], pre_hooks: list[Callable] = ()) -> None:
        self.module, self.hooks, self.pre_hooks = module, hooks, list(pre_hooks)
        self.grad_output: tuple | None = None  # unset while no output gradient came through
        self.n_inputs = 0
        self.n_args = self.n_outputs = 0
        self.input_index: list = []
        self.output_index: list = []

    def _wrap(self, values: tuple, on_input: bool) -> tuple:
        idx = [i for i, v in enumerate(values) if isinstance(v, Tensor)]
        if on_input:
            self.n_args, self.input_index = len(values), idx
        else:
            self.n_outputs, self.output_index = len(values), idx
        if not idx or not any(values[i].requires_grad for i in idx):
            return values
        if on_input:
            self.n_inputs = len(idx)
        new = _Identity.apply(self, on_input, *[values[i] for i in idx])
        out = list(values)
        for i, t in zip(idx, new):
            out[i] = t
        return tuple(out)

    def setup_input(self, args: tuple) -> tuple:
        return self._wrap(args, True)

    def setup_output(self, result: Any) -> Any:
        if isinstance(result, Tensor):
            return self._wrap((result,), False)[0]
        if isinstance(result, tuple):
            return self._wrap(result, False)
        return result

    def run_pre(self, grad_output: tuple) -> tuple:
        return _chained(self.pre_hooks, lambda h, g: h(self.module, g), grad_output, "Backward pre hook",
                        "grad_output")

    def run(self, grad_input: tuple) -> tuple:
        if self.grad_output is None:  # the gradient reached the inputs without passing the module's
            return grad_input         # (tensor or tuple) outputs, e.g. a dict output: torch skips
        return _chained(self.hooks, lambda h, g: h(self.module, g, self.grad_output), grad_input,
                        "Backward hook", "grad_input")


def _chained(hooks, call, values: tuple, what: str, name: str) -> tuple:
    """Each hook in turn (``call(hook, values)``); one that returns something replaces ``values``
    with a tuple of the same length (torch's RuntimeError otherwise)."""
    for hook in hooks:
        res = call(hook, values)
        if res is not None:
            res = res if isinstance(res, tuple) else (res,)
            if len(res) != len(values):
                raise RuntimeError(f"{what} returned an invalid number of {name}, got {len(res)}, but expected "
                                   f"{len(values)}")
            values = res
    return values
