"""The hooks around an optimizer's ``state_dict`` / ``load_state_dict``, as torch's
``Optimizer.register_state_dict_pre_hook`` and its three siblings (checkpointing libraries use
them to rename or reshard the state as it is saved and loaded)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

from ..nn.hooks import RemovableHandle

_KINDS = ("state_dict_pre", "state_dict_post", "load_state_dict_pre", "load_state_dict_post")


class StateDictHooks:
    """``register_state_dict_pre_hook(hook)``: ``hook(optimizer)`` before ``state_dict``;
    ``..._post_hook``: ``hook(optimizer, state_dict)`` after it, a non-None result replacing the
    state dict; ``register_load_state_dict_pre_hook``: ``hook(optimizer, state_dict)`` before
    loading (a shallow copy), a non-None result loaded instead; ``..._post_hook``:
    ``hook(optimizer)`` after loading. ``prepend=True`` runs a hook before those already there."""

    def _hooks(self, kind: str) -> OrderedDict:
        name = f"_optimizer_{kind}_hooks"
        if name not in self.__dict__:   # (an optimizer unpickled from before these existed)
            setattr(self, name, OrderedDict())
        return self.__dict__[name]

    def _register(self, kind: str, hook: Callable, prepend: bool) -> RemovableHandle:
        hooks = self._hooks(kind)
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        if prepend:
            hooks.move_to_end(handle.id, last=False)
        return handle

    def register_state_dict_pre_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        return self._register("state_dict_pre", hook, prepend)

    def register_state_dict_post_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        return self._register("state_dict_post", hook, prepend)

    def register_load_state_dict_pre_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        return self._register("load_state_dict_pre", hook, prepend)

    def register_load_state_dict_post_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        return self._register("load_state_dict_post", hook, prepend)

    def _run_hooks(self, kind: str, state_dict: Any = None) -> Any:
        """Runs the ``kind`` hooks; those given a state dict may replace it (returned)."""
        for hook in list(self._hooks(kind).values()):
            if state_dict is None:
                hook(self)
            else:
                out = hook(self, state_dict)
                state_dict = state_dict if out is None else out
        return state_dict
