"""torch's auto-wrap policies (``torch.distributed.fsdp.wrap``; what mock_torch gives for it):
predicates ``policy(module, recurse, nonwrapped_numel)`` saying whether to descend into a
module (``recurse=True``) and whether to wrap it (``recurse=False``), as
``apply_activation_checkpointing`` (holoflow.dtensor.checkpoint_wrapper) and FSDP1's
``FullyShardedDataParallel(auto_wrap_policy=...)`` read them, through :func:`_recursive_wrap`."""
from __future__ import annotations

from typing import Any, Callable, Iterable

from ...nn.module import Module
from ...nn.containers import ModuleDict, ModuleList
from ...nn.modules.attention import MultiheadAttention

__all__ = ["ModuleWrapPolicy", "CustomPolicy", "lambda_auto_wrap_policy", "transformer_auto_wrap_policy",
           "size_based_auto_wrap_policy"]


def lambda_auto_wrap_policy(module: Module, recurse: bool, nonwrapped_numel: int,
                            lambda_fn: Callable[[Module], bool]) -> bool:
    """Always descends; wraps the modules ``lambda_fn`` picks."""
    return True if recurse else bool(lambda_fn(module))


def transformer_auto_wrap_policy(module: Module, recurse: bool, nonwrapped_numel: int,
                                 transformer_layer_cls: Iterable[type]) -> bool:
    """Always descends; wraps the instances of ``transformer_layer_cls``."""
    return True if recurse else isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(module: Module, recurse: bool, nonwrapped_numel: int, min_num_params: int = int(1e8),
                                force_leaf_modules: set | None = None, exclude_wrap_modules: set | None = None) -> bool:
    """Descends into, and wraps, modules with at least ``min_num_params`` parameters not wrapped
    yet; never into ``force_leaf_modules``, never wrapping ``exclude_wrap_modules`` (torch's
    defaults: MultiheadAttention; ModuleList and ModuleDict)."""
    leaves = size_based_auto_wrap_policy.FORCE_LEAF_MODULES if force_leaf_modules is None else force_leaf_modules
    excluded = size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES if exclude_wrap_modules is None \
        else exclude_wrap_modules
    large = nonwrapped_numel >= min_num_params
    return large and not isinstance(module, tuple(leaves if recurse else excluded))


size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {ModuleList, ModuleDict}   # type: ignore[attr-defined]
size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {MultiheadAttention}         # type: ignore[attr-defined]


class ModuleWrapPolicy:
    """Wraps every instance of ``module_classes``."""

    def __init__(self, module_classes: Iterable[type]) -> None:
        self._module_classes = tuple(set(module_classes))

    def __call__(self, module: Module, recurse: bool, *args: Any, **kwargs: Any) -> bool:
        return True if recurse else isinstance(module, self._module_classes)


class CustomPolicy:
    """Wraps the modules for which ``lambda_fn`` returns True (or a non-empty dict of per-module
    arguments, which only FSDP1 reads)."""

    def __init__(self, lambda_fn: Callable[[Module], Any]) -> None:
        self._lambda_fn = lambda_fn

    def __call__(self, module: Module, recurse: bool, *args: Any, **kwargs: Any) -> bool:
        return True if recurse else bool(self._lambda_fn(module))


def _recursive_wrap(module: Module, policy: Callable, wrap: Callable, only_children: bool = False,
                    ignored: frozenset = frozenset()) -> tuple:
    """``(module or its wrapper, parameters wrapped below and here)``: the children are visited
    while the policy says to recurse, then ``module`` is wrapped if the policy says so for the
    parameters its wrapped children left (torch's ``_recursive_wrap``). Modules whose id is in
    ``ignored`` are neither wrapped nor entered, and their parameters are not counted."""
    if id(module) in ignored:
        return module, 0
    skip = {id(p) for m in module.modules() if id(m) in ignored for p in m.parameters()}
    numel = sum(p.numel() for p in module.parameters() if id(p) not in skip)
    if not policy(module=module, recurse=True, nonwrapped_numel=numel):
        return module, 0
    wrapped = 0
    for name, child in list(module.named_children()):
        new, n = _recursive_wrap(child, policy, wrap, ignored=ignored)
        if new is not child:
            setattr(module, name, new)
        wrapped += n
    if not only_children and policy(module=module, recurse=False, nonwrapped_numel=numel - wrapped):
        return wrap(module), numel
    return module, wrapped
