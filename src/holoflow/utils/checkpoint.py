"""``holoflow.utils.checkpoint``: activation checkpointing in eager mode, as torch's.

``checkpoint(fn, *args, use_reentrant=False)`` records ``fn``'s graph but none of the tensors its
nodes save: saved-tensor hooks (``autograd.graph.saved_tensors_hooks``) keep a handle in their
place, and the first unpack re-runs ``fn`` on detached copies of the inputs (with the CPU/CUDA RNG
state and autocast settings of the first run, so dropout masks and bf16 casts repeat), collecting
what its nodes save, in order. The graph is the real one, so gradients through it are
differentiable again, forward mode (reverse mode here) flows through it, and ``autograd.grad``
touches only what it is asked for, as torch's.

``use_reentrant=True`` (and None, torch's default) is an autograd Function: ``fn`` runs without
recording its graph, keeping only the inputs; the backward re-runs it and backpropagates through
the recomputed graph (no second derivative, no ``autograd.grad``, as torch's). The recomputation
hangs off a node that needs at least one differentiable input. When no tensor argument requires
grad, the parameters of ``fn`` (a Module, or a bound method of one) serve; when there are none of
those either (a closure over parameters), ``fn`` simply runs with its graph recorded: the
gradients are still right, only the memory is not saved. A trace (holoflow.compile, nn.Graph)
records either kind as that Function.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from ..amp.autocast import autocast, get_autocast_dtype, is_autocast_enabled
from ..autograd import Function
from ..autograd import backward as _backward
from ..autograd.graph import saved_tensors_hooks
from ..core import generators, grad_mode, interpret
from ..core.autograd import current_graph_task
from ..core.tensor import Tensor

__all__ = ["checkpoint", "checkpoint_sequential"]


def _owner_params(fn: Callable) -> list[Tensor]:
    owner = getattr(fn, "__self__", fn)
    params = getattr(owner, "parameters", None)
    return [p for p in params() if p.requires_grad] if callable(params) else []


def _autocast_state() -> list[tuple[str, Any]]:
    return [(dev, get_autocast_dtype(dev)) for dev in ("cpu", "cuda") if is_autocast_enabled(dev)]


def _rng_devices(args: tuple) -> list[torch.device]:
    """The devices whose random state a recompute replays: the CPU and the inputs' CUDA devices."""
    cuda = sorted({a._data.device.index or 0 for a in args if isinstance(a, Tensor) and a.is_cuda})
    return [torch.device("cpu")] + [torch.device("cuda", d) for d in cuda]


@contextlib.contextmanager
def _replaying(states: list | None, devices: list):
    """Runs the block from the random ``states`` of ``devices`` (the forward's), leaving this
    thread's default generators (a simulated rank's own) as they were, as torch's fork_rng;
    nothing when ``states`` is None."""
    if states is None:
        yield
        return
    before = [generators.get_state(d) for d in devices]
    for d, st in zip(devices, states):
        generators.set_state(st, d)
    try:
        yield
    finally:
        for d, st in zip(devices, before):
            generators.set_state(st, d)


class _Recompute(Function):
    @staticmethod
    def forward(ctx, run: Callable, preserve_rng: bool, reentrant: bool, n_args: int, *args):
        ctx.run, ctx.preserve_rng, ctx.reentrant, ctx.n_args = run, preserve_rng, reentrant, n_args
        ctx.devices = _rng_devices(args[:n_args])
        ctx.rng_states = [generators.get_state(d) for d in ctx.devices] if preserve_rng else None
        ctx.autocast = _autocast_state()
        ctx.args, ctx.n_anchors = args[:n_args], len(args) - n_args
        ctx.save_for_backward(*[a for a in args[:n_args] if isinstance(a, Tensor)])
        return run(*args[:n_args])

    @staticmethod
    def backward(ctx, *grads):
        ctx.saved_tensors  # noqa: B018 - raises if an input was modified in place since forward
        task = current_graph_task()
        if ctx.reentrant and task is not None and task.runs is not None:   # (torch's _is_checkpoint_valid)
            raise RuntimeError("When use_reentrant=True, holoflow.utils.checkpoint is incompatible with .grad() or "
                               "passing an `inputs` parameter to .backward(), as torch's: set use_reentrant=False, "
                               "or call .backward() without `inputs`")
        inputs = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, Tensor) else a
                       for a in ctx.args)
        with _replaying(ctx.rng_states, ctx.devices):
            with grad_mode.enable_grad(), contextlib.ExitStack() as stack:
                for dev, dt in ctx.autocast:
                    stack.enter_context(autocast(dev, dtype=dt))
                outs = ctx.run(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, g) for o, g in zip(outs, grads)
                 if isinstance(o, Tensor) and o.requires_grad and g is not None]
        if pairs:
            _backward([o for o, _ in pairs], [g for _, g in pairs])
        # the anchors' (parameters') gradients were accumulated by the backward above
        return (None, None, None, None) + tuple(i.grad if isinstance(i, Tensor) and i.requires_grad else None
                                          for i in inputs) + (None,) * ctx.n_anchors


class _Frame:
    """One non-reentrant checkpoint's first run: what ``fn`` needs to run again as it did, and
    the tensors the recomputation saved (None until an unpack asks for them)."""

    def __init__(self, run: Callable, args: tuple, preserve_rng: bool, check: bool) -> None:
        self.run, self.saved, self.metas = run, None, []
        self.check = check
        self.args = [(a.detach(), a.requires_grad) if isinstance(a, Tensor) else (a, None) for a in args]
        self.devices = _rng_devices(args)
        self.rng_states = [generators.get_state(d) for d in self.devices] if preserve_rng else None
        self.autocast = _autocast_state()

    def pack(self, x: Tensor) -> int:
        self.metas.append((tuple(x.shape), x.dtype, x.device))
        return len(self.metas) - 1

    def unpack(self, i: int) -> Tensor:
        if self.saved is None:
            self.saved = self._recompute()
        return self.saved[i]

    def _recompute(self) -> list:
        saved: list = []

        def keep(x: Tensor) -> None:
            saved.append(x.detach())

        inputs = [a.detach().requires_grad_(rg) if rg is not None else a for a, rg in self.args]
        with _replaying(self.rng_states, self.devices), grad_mode.enable_grad(), contextlib.ExitStack() as stack:
            for dev, dt in self.autocast:
                stack.enter_context(autocast(dev, dtype=dt))
            with saved_tensors_hooks(keep, lambda _: None):
                self.run(*inputs)
        if len(saved) != len(self.metas):
            raise RuntimeError(f"holoflow.utils.checkpoint: a different number of tensors was saved during the "
                               f"original forward ({len(self.metas)}) and the recomputation ({len(saved)}): the "
                               f"checkpointed function must run the same operations both times")
        differ = [i for i, (x, m) in enumerate(zip(saved, self.metas)) if (tuple(x.shape), x.dtype, x.device) != m]
        if self.check and differ:   # (torch's determinism_check="default")
            raise RuntimeError(f"holoflow.utils.checkpoint: recomputed values for the saved tensors {differ} have "
                               f"different metadata (shape, dtype, device) than during the forward pass; pass "
                               f"determinism_check='none' to skip this check")
        return saved


def _hooked(run: Callable, args: tuple, preserve_rng: bool, check: bool) -> Any:
    """``run(*args)`` recorded with its saved tensors left out, recomputed when backward reads them."""
    frame = _Frame(run, args, preserve_rng, check)
    with saved_tensors_hooks(frame.pack, frame.unpack):
        return run(*args)


def checkpoint(function: Callable, *args: Any, use_reentrant: bool | None = None,
               context_fn: Callable | None = None, determinism_check: str = "default",
               debug: bool = False, preserve_rng_state: bool = True, **kwargs: Any) -> Any:
    """Runs ``function(*args, **kwargs)`` without keeping its activations; they are recomputed
    in backward. Same results and gradients as calling ``function`` directly.

    >>> y = checkpoint(block, x, use_reentrant=False)
    """
    if context_fn is not None:
        raise NotImplementedError("holoflow.utils.checkpoint: context_fn is not supported; leave it None")
    if use_reentrant and grad_mode.STATE.level > 0:   # (torch's reentrant checkpoint is such a Function)
        raise RuntimeError("holoflow.utils.checkpoint(use_reentrant=True) is an autograd.Function without "
                           "setup_context, which holoflow.func's transforms (vmap, grad, jvp, jacrev, ...) refuse "
                           "as torch.func does; pass use_reentrant=False (which grad, vjp and jacrev refuse too, as "
                           "torch.func's: call checkpoint outside them, or inside vmap/jvp/jacfwd)")
    run = (lambda *a: function(*a, **kwargs)) if kwargs else function
    if not grad_mode.is_grad_enabled():
        return run(*args)
    if use_reentrant is False and not interpret.is_lazy():   # (a trace keeps no saved-tensor hooks)
        return _hooked(run, args, preserve_rng_state, determinism_check != "none")
    needs = any(isinstance(a, Tensor) and a.requires_grad for a in args)
    anchors = [] if needs else _owner_params(function)
    if not needs and not anchors:
        return run(*args)
    return _Recompute.apply(run, preserve_rng_state, bool(use_reentrant), len(args), *args, *anchors)


def checkpoint_sequential(functions: Any, segments: int, input: Any, use_reentrant: bool | None = None,
                          **kwargs: Any) -> Any:
    """Splits a Sequential (or list of modules) into ``segments`` chunks and checkpoints all but
    the last, as torch."""
    fns = list(functions.children()) if hasattr(functions, "children") else list(functions)
    size = len(fns) // segments

    def run_range(start: int, end: int) -> Callable:
        def forward(x):
            for j in range(start, end + 1):
                x = fns[j](x)
            return x
        forward.parameters = lambda: (p for f in fns[start:end + 1] for p in f.parameters())  # type: ignore[attr-defined]
        return forward

    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run_range(start, end), input, use_reentrant=use_reentrant, **kwargs)
    return run_range(end + 1, len(fns) - 1)(input)
