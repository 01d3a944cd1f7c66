"""torch's ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper`` (what mock_torch gives
for it): modules wrapped so that their forward recomputes in backward (``checkpoint_wrapper``)
or keeps its saved tensors on the CPU (``offload_wrapper``), and ``apply_activation_checkpointing``
wrapping the submodules a predicate picks — the order torchtitan uses before ``fully_shard``.

A wrapper's state dict and parameter names are the wrapped module's (the
``_checkpoint_wrapped_module.`` prefix is taken out on save and put back on load), so checkpoints
move between wrapped and plain models, as torch's.
"""
from __future__ import annotations

import enum
import functools
from typing import Any, Callable, Iterator

from ..autograd.graph import save_on_cpu
from ..nn.module import Module
from ..utils.checkpoint import checkpoint
from .fsdp.wrap import _recursive_wrap

__all__ = ["CheckpointImpl", "ActivationWrapper", "CheckpointWrapper", "OffloadWrapper", "checkpoint_wrapper",
           "offload_wrapper", "apply_activation_checkpointing"]

_WRAPPED = "_checkpoint_wrapped_module"
_PREFIX = _WRAPPED + "."


class CheckpointImpl(enum.Enum):
    REENTRANT = enum.auto()
    NO_REENTRANT = enum.auto()


def _replace_prefix(state_dict: dict, old: str, new: str) -> None:
    for key in [k for k in state_dict if k.startswith(old)]:
        state_dict[new + key[len(old):]] = state_dict.pop(key)


class ActivationWrapper(Module):
    """A module around ``_checkpoint_wrapped_module``: attributes and indexing reach the wrapped
    module; names in ``named_parameters`` and the state dict are the wrapped module's."""

    def __init__(self, mod: Module) -> None:
        super().__init__()
        self._checkpoint_wrapped_module = mod
        self.register_state_dict_hook(ActivationWrapper._strip_prefix)
        self.register_load_state_dict_pre_hook(ActivationWrapper._add_prefix)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("holoflow ActivationWrapper: use CheckpointWrapper or OffloadWrapper")

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._checkpoint_wrapped_module, name)

    def __getitem__(self, key: int) -> Any:
        return self._checkpoint_wrapped_module[key]

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator:
        for name, p in super().named_parameters(*args, **kwargs):
            yield name.replace(_PREFIX, ""), p

    @staticmethod
    def _strip_prefix(module: Module, state_dict: dict, prefix: str, *args: Any) -> dict:
        _replace_prefix(state_dict, prefix + _PREFIX, prefix)
        return state_dict

    @staticmethod
    def _add_prefix(module: Module, state_dict: dict, prefix: str, *args: Any) -> None:
        _replace_prefix(state_dict, prefix, prefix + _PREFIX)


class OffloadWrapper(ActivationWrapper):
    """The wrapped module's saved tensors kept on the CPU until backward (``save_on_cpu``)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with save_on_cpu(pin_memory=True):
            return self._checkpoint_wrapped_module(*args, **kwargs)


class CheckpointWrapper(ActivationWrapper):
    """The wrapped module's forward under ``checkpoint_fn`` (``utils.checkpoint.checkpoint``,
    reentrant or not as ``checkpoint_impl`` says)."""

    def __init__(self, mod: Module, checkpoint_impl: CheckpointImpl = CheckpointImpl.NO_REENTRANT,
                 checkpoint_fn: Callable | None = None, **checkpoint_fn_kwargs: Any) -> None:
        super().__init__(mod)
        self.checkpoint_impl = checkpoint_impl
        if checkpoint_fn is None:
            reentrant = checkpoint_impl == CheckpointImpl.REENTRANT
            self.checkpoint_fn = functools.partial(checkpoint, use_reentrant=reentrant, **checkpoint_fn_kwargs)
        else:
            self.checkpoint_fn = functools.partial(checkpoint_fn, **checkpoint_fn_kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        inner = self._checkpoint_wrapped_module
        if self.checkpoint_impl == CheckpointImpl.REENTRANT and kwargs:
            keys = tuple(kwargs)   # (a reentrant checkpoint takes positional inputs only)

            def positional(*flat: Any) -> Any:
                n = len(flat) - len(keys)
                return inner(*flat[:n], **dict(zip(keys, flat[n:])))
            return self.checkpoint_fn(positional, *args, *kwargs.values())
        return self.checkpoint_fn(inner, *args, **kwargs)


def checkpoint_wrapper(module: Module, checkpoint_impl: CheckpointImpl = CheckpointImpl.NO_REENTRANT,
                       checkpoint_fn: Callable | None = None, **checkpoint_fn_kwargs: Any) -> Module:
    """``module`` recomputing its forward in backward."""
    return CheckpointWrapper(module, checkpoint_impl, checkpoint_fn, **checkpoint_fn_kwargs)


def offload_wrapper(module: Module) -> Module:
    """``module`` keeping what its backward reads on the CPU."""
    return OffloadWrapper(module)


def apply_activation_checkpointing(model: Module, checkpoint_wrapper_fn: Callable = checkpoint_wrapper,
                                   check_fn: Callable = lambda _: True, auto_wrap_policy: Callable | None = None
                                   ) -> None:
    """Replaces, in place, the submodules of ``model`` (not ``model`` itself) that ``check_fn``
    picks, or that ``auto_wrap_policy`` (``policy(module=, recurse=, nonwrapped_numel=)``, as
    ``holoflow.dtensor.fsdp.wrap``'s) chooses, by ``checkpoint_wrapper_fn(submodule)`` — bottom-up as
    torch's recursive wrap: children first, so a picked module inside a picked one is wrapped
    too."""
    if auto_wrap_policy is None:
        def auto_wrap_policy(module: Module, recurse: bool, nonwrapped_numel: int) -> bool:
            return True if recurse else bool(check_fn(module))
    elif not callable(auto_wrap_policy):
        raise NotImplementedError(f"holoflow apply_activation_checkpointing: auto_wrap_policy "
                                  f"{type(auto_wrap_policy).__name__} is not callable; pass check_fn or a policy of "
                                  f"holoflow.dtensor.fsdp.wrap (torch.distributed.fsdp.wrap)")
    _recursive_wrap(model, auto_wrap_policy, checkpoint_wrapper_fn, only_children=True)
