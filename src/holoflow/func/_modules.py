"""torch.func's helpers around modules and wrappers: ``stack_module_state`` (an ensemble's
state for ``vmap(functional_call)``), ``replace_all_batch_norm_modules_``, and ``functionalize``
and ``debug_unwrap``, which have nothing to do on holoflow's eager tensors."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

from ..core.tensor import Tensor
from ..nn.module import Module
from ..nn.modules.norm import _BatchNorm
from ..ops import shape as _shape


def stack_module_state(models: Sequence[Module]) -> tuple[dict, dict]:
    """Every model's parameters and buffers stacked along a new leading dimension (an ensemble for
    ``vmap(functional_call)``), as ``torch.func.stack_module_state``: the models must be of one
    class and in one mode; a stacked parameter is a new leaf that requires grad where every
    model's does."""
    models = list(models)
    if not models:
        raise RuntimeError("holoflow.func.stack_module_state: expected at least one model, got 0")
    if len({m.training for m in models}) > 1:
        raise RuntimeError("holoflow.func.stack_module_state: expected all models to have the same training/eval "
                           "mode")
    if any(type(m) is not type(models[0]) for m in models):
        raise RuntimeError("holoflow.func.stack_module_state: expected all models to be of the same class")
    params = [dict(m.named_parameters()) for m in models]
    buffers = [dict(m.named_buffers()) for m in models]
    return ({k: _stacked_leaf([p[k] for p in params], k) for k in params[0]},
            {k: _stacked_leaf([b[k] for b in buffers], k) for k in buffers[0]})


def _stacked_leaf(tensors: list, name: str) -> Tensor:
    wants = {t.requires_grad for t in tensors}
    if len(wants) > 1:
        raise RuntimeError(f"holoflow.func.stack_module_state: expected {name} from each model to have the same "
                           f".requires_grad")
    out = _shape.stack(tensors)
    return out.detach().requires_grad_(True) if wants == {True} else out


def replace_all_batch_norm_modules_(root: Module) -> Module:
    """Makes every batch norm in ``root`` (``root`` included) normalise with its batch's statistics
    only, in place: no running statistics, ``track_running_stats=False``; returns ``root``
    (``torch.func.replace_all_batch_norm_modules_``: what ``vmap`` over a batch-norm model in
    training needs, since a per-sample running-statistics update has nowhere to go)."""
    for m in root.modules():
        if isinstance(m, _BatchNorm) and m.track_running_stats:
            m.running_mean = None
            m.running_var = None
            m.num_batches_tracked = None
            m.track_running_stats = False
    return root


_REMOVE = ("mutations", "mutations_and_views")


def functionalize(func: Callable, *, remove: str = "mutations") -> Callable:
    """``torch.func.functionalize``: ``func`` rewritten without in-place ops (and with
    ``remove="mutations_and_views"`` without views), its results and its writes to its inputs
    the same. holoflow's eager ops have no program to rewrite, so the function runs as written:
    the same results and the same writes, which is all a caller can observe."""
    if remove not in _REMOVE:
        raise RuntimeError(f"holoflow.func.functionalize: remove must be 'mutations' or 'mutations_and_views', "
                           f"got {remove!r}")

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        return func(*args, **kwargs)
    return wrapped


def debug_unwrap(tensor: Tensor, *, recurse: bool = True) -> Tensor:
    """The tensor under torch.func's wrappers (``torch.func.debug_unwrap``): holoflow's transforms
    run on plain tensors (vmap on real samples, grad on recorded ones), so ``tensor`` itself."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"holoflow.func.debug_unwrap: expected a Tensor, got {type(tensor).__name__}")
    return tensor
