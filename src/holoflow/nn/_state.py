"""State dicts, loading, and dtype/device conversion of a Module (a mixin of ``nn.Module``).

Key names, ordering, error messages and ``_IncompatibleKeys`` follow torch, so a torch
checkpoint's state dict loads into the equivalent holoflow model and back.
"""
from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any, Callable, Mapping

import torch

from ..core import device as _device
from ..core import dtype as _dtype
from ..core.grad_mode import no_grad
from ..core.tensor import Tensor
from ..distributed.global_tensor import from_full
from .hooks import RemovableHandle
from .parameter import Parameter


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    __slots__ = ()

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _as_storage(value: Any) -> torch.Tensor | None:
    if isinstance(value, Tensor):
        return value._local_full()
    if isinstance(value, torch.Tensor):
        return value
    return None


def _placed_like(param: Tensor, value: Tensor) -> Tensor:
    """``value`` (local whole, or global with any SBP) in global ``param``'s placement and SBP:
    sliced locally or boxed (a collective: every rank loads the same state dict)."""
    g = param._global
    with no_grad():
        if value._global is None:
            return from_full(value._data, g.placement, g.sbp)
        if value._global.placement == g.placement and tuple(value._global.sbp) == tuple(g.sbp):
            return value
        return value.detach().to_global(placement=g.placement, sbp=g.sbp)


def _parse_to(args: tuple, kwargs: dict) -> tuple[torch.device | None, torch.dtype | None]:
    dev, dt = kwargs.pop("device", None), kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"Module.to() got unexpected arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, (Tensor, torch.Tensor)):
            dev, dt = a.device, a.dtype
        elif isinstance(a, (_dtype.dtype, torch.dtype)):
            dt = a
        elif a is not None:
            dev = a
    dev, dt = _device.to_torch(dev), _dtype.to_torch(dt)
    if dt is not None and not (dt.is_floating_point or dt.is_complex):
        raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired "
                        f"dtype={_dtype._FROM_TORCH[dt]}")
    return dev, dt


def _load_tree(module, local_state_dict: dict, prefix: str, metadata, assign: bool, missing_keys: list,
               unexpected_keys: list, error_msgs: list) -> None:
    """``load_state_dict``'s walk: ``module``'s own entries, then each child's under its prefix,
    then ``module``'s post hooks. (Module-level: a closure calling itself is a cycle that would
    hold the state dict's tensors until a collection.)"""
    local_metadata = dict({} if metadata is None else metadata.get(prefix[:-1], {}))
    if assign:
        local_metadata["assign_to_params_buffers"] = True
    module._load_from_state_dict(local_state_dict, prefix, local_metadata, True,
                                 missing_keys, unexpected_keys, error_msgs)
    for name, child in module._modules.items():
        if child is not None:
            child_prefix = prefix + name + "."
            child_sd = {k: v for k, v in local_state_dict.items() if k.startswith(child_prefix)}
            _load_tree(child, child_sd, child_prefix, metadata, assign, missing_keys, unexpected_keys, error_msgs)
    post_hooks = module.__dict__.get("_load_state_dict_post_hooks")
    if post_hooks:
        incompatible = _IncompatibleKeys(missing_keys, unexpected_keys)
        for hook in post_hooks.values():
            if hook(module, incompatible) is not None:
                raise RuntimeError("load_state_dict post-hook must return None")


class StateMixin:
    """``state_dict``/``load_state_dict`` and ``to``/``cuda``/``float``... for ``nn.Module``."""

    # -- saving ------------------------------------------------------------------------------
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()
        if type(self).get_extra_state is not StateMixin.get_extra_state:
            destination[prefix + "_extra_state"] = self.get_extra_state()

    def get_extra_state(self) -> Any:
        raise RuntimeError("Reached a code path in Module.get_extra_state() that should never be "
                           "called; override it together with set_extra_state")

    def set_extra_state(self, state: Any) -> None:
        raise RuntimeError("Reached a code path in Module.set_extra_state() that should never be "
                           "called; override it together with get_extra_state")

    def state_dict(self, *args: Any, destination: dict | None = None, prefix: str = "",
                   keep_vars: bool = False) -> "OrderedDict[str, Tensor]":
        """Parameters and persistent buffers by dotted name, in torch's order and key names."""
        if args:  # torch's deprecated positional form: (destination, prefix, keep_vars)
            destination = args[0]
            prefix = args[1] if len(args) > 1 else prefix
            keep_vars = args[2] if len(args) > 2 else keep_vars
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        for hook in self.__dict__.get("_state_dict_pre_hooks", {}).values():
            hook(self, prefix, keep_vars)
        metadata = getattr(destination, "_metadata", None)
        if metadata is not None:
            metadata[prefix[:-1]] = {"version": getattr(self, "_version", 1)}
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        for hook in self._state_dict_hooks.values():
            result = hook(self, destination, prefix, {})
            if result is not None:
                destination = result
        return destination

    def register_state_dict_hook(self, hook: Callable) -> Any:
        """``hook(module, state_dict, prefix, local_metadata)`` runs after this module's entries."""
        handle = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[handle.id] = hook
        return handle

    _register_state_dict_hook = register_state_dict_hook

    def register_state_dict_post_hook(self, hook: Callable) -> Any:
        """Like torch's: ``hook(module, state_dict, prefix, local_metadata)``, which must return None."""
        def post(module, state_dict, prefix, local_metadata):
            if hook(module, state_dict, prefix, local_metadata) is not None:
                raise RuntimeError("state_dict post-hook must return None")
        return self.register_state_dict_hook(post)

    def register_state_dict_pre_hook(self, hook: Callable) -> Any:
        """``hook(module, prefix, keep_vars)`` runs before ``state_dict`` collects this module."""
        hooks = self.__dict__.setdefault("_state_dict_pre_hooks", OrderedDict())
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def register_load_state_dict_post_hook(self, hook: Callable) -> Any:
        """``hook(module, incompatible_keys)`` runs after ``load_state_dict`` loaded this module; it
        may edit ``incompatible_keys`` in place and must return None."""
        hooks = self.__dict__.setdefault("_load_state_dict_post_hooks", OrderedDict())
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def register_load_state_dict_pre_hook(self, hook: Callable) -> Any:
        """``hook(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors)``."""
        handle = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[handle.id] = hook
        return handle

    def _register_load_state_dict_pre_hook(self, hook: Callable, with_module: bool = False) -> Any:
        """torch's older form: without ``with_module`` the hook gets no module argument."""
        if with_module:
            return self.register_load_state_dict_pre_hook(hook)
        return self.register_load_state_dict_pre_hook(lambda module, *args: hook(*args))

    # -- loading -----------------------------------------------------------------------------
    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        """Copies this module's own entries (not its children's) from ``state_dict``."""
        for hook in self._load_state_dict_pre_hooks.values():
            hook(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        local_state = {k: v for k, v in self._parameters.items() if v is not None}
        local_state.update({k: v for k, v in self._buffers.items()
                            if v is not None and k not in self._non_persistent_buffers_set})
        assign = local_metadata.get("assign_to_params_buffers", False)
        for name, param in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            self._load_one(name, key, param, state_dict[key], assign, error_msgs)
        extra_key = prefix + "_extra_state"
        if type(self).set_extra_state is not StateMixin.set_extra_state:
            if extra_key in state_dict:
                self.set_extra_state(state_dict[extra_key])
            elif strict:
                missing_keys.append(extra_key)
        elif strict and extra_key in state_dict:
            unexpected_keys.append(extra_key)
        if strict:
            for key in state_dict:
                if key.startswith(prefix) and key != extra_key:
                    head = key[len(prefix):].split(".", 1)
                    if (len(head) > 1 and head[0] not in self._modules) or \
                            (len(head) == 1 and head[0] not in local_state):
                        unexpected_keys.append(key)

    def _load_one(self, name: str, key: str, param: Tensor, value: Any, assign: bool,
                  error_msgs: list) -> None:
        if param._global is not None and not assign and isinstance(value, Tensor) and value.shape == param.shape:
            try:   # a global param copies its own shard of the value (its placement and SBP)
                with no_grad():
                    param._data.copy_(_placed_like(param, value)._data)
            except Exception as ex:
                error_msgs.append(f'While copying the global parameter named "{key}" ({param._global.placement}, '
                                  f"sbp {param._global.sbp}), an exception occurred : {ex.args}.")
            return
        src = _as_storage(value)
        if src is None:
            error_msgs.append(f'While copying the parameter named "{key}", expected torch.Tensor or '
                              f"Tensor-like object from checkpoint but received {type(value)}")
            return
        if len(param.shape) == 0 and src.dim() == 1 and src.shape[0] == 1:
            src = src[0]
        if src.shape != param.shape:
            error_msgs.append(f"size mismatch for {key}: copying a param with shape {src.shape} from "
                              f"checkpoint, the shape in current model is {param.shape}.")
            return
        try:
            with no_grad():
                if assign:
                    new = Tensor._make(src.detach())
                    if isinstance(param, Parameter):
                        new = Parameter(new, requires_grad=param.requires_grad)
                    setattr(self, name, new)
                else:
                    param._data.copy_(src.detach())
        except Exception as ex:
            error_msgs.append(f'While copying the parameter named "{key}", whose dimensions in the model '
                              f"are {param.shape} and whose dimensions in the checkpoint are {src.shape}, "
                              f"an exception occurred : {ex.args}.")

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> _IncompatibleKeys:
        """Copies parameters and buffers from ``state_dict`` (holoflow or torch tensors).

        Returns ``_IncompatibleKeys(missing_keys, unexpected_keys)``; with ``strict=True`` any
        mismatch raises ``RuntimeError`` naming the keys; a shape mismatch always raises.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing_keys: list[str] = []
        unexpected_keys: list[str] = []
        error_msgs: list[str] = []
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)

        _load_tree(self, state_dict, "", metadata, assign, missing_keys, unexpected_keys, error_msgs)
        if strict:
            if unexpected_keys:
                error_msgs.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected_keys)))
            if missing_keys:
                error_msgs.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing_keys)))
        if error_msgs:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(error_msgs)))
        return _IncompatibleKeys(missing_keys, unexpected_keys)

    # -- conversion --------------------------------------------------------------------------
    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        """Applies ``fn`` to every parameter's and buffer's storage, in place on parameters
        (their identity, and so optimizers holding them, survive) and on their grads."""
        if recurse:
            for module in self.children():
                module._apply(fn)
        for p in self._parameters.values():
            if p is None:
                continue
            p._data = fn(p._data)
            if p.grad is not None:
                p.grad._data = fn(p.grad._data)
        for key, buf in self._buffers.items():
            if buf is not None:
                new = Tensor._make(fn(buf._data))
                new._rg = buf._rg
                self._buffers[key] = new
        return self

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """Moves/casts parameters and buffers: ``to(device)``, ``to(dtype)``, ``to(tensor)``.
        Only floating-point (and complex) tensors change dtype; ``memory_format`` (e.g.
        ``torch.channels_last``) relays out the 4-D and 5-D ones. ``to(nn.graph.GraphModule)`` gives
        the module's graph settings (OneFlow's spelling; the class says how, via ``for_module``)."""
        if len(args) == 1 and not kwargs and isinstance(args[0], type) and hasattr(args[0], "for_module"):
            return args[0].for_module(self)
        fmt = kwargs.get("memory_format")
        dev, dt = _parse_to(args, dict(kwargs))

        def convert(t: torch.Tensor) -> torch.Tensor:
            cast = dt if dt is not None and (t.is_floating_point() or t.is_complex()) else None
            if dt is not None and t.is_complex() and not dt.is_complex:
                cast = None
            if fmt is not None and t.dim() in (4, 5):   # as torch: only 4-D/5-D tensors take the layout
                return t.to(device=dev, dtype=cast, memory_format=fmt)
            return t.to(device=dev, dtype=cast)
        return self._apply(convert)

    def to_empty(self, *, device: Any, recurse: bool = True) -> Any:
        """Moves parameters and buffers to ``device`` with uninitialized storage (no copy), as
        torch's: how a model built on the meta device gets memory, filled next by
        ``reset_parameters`` or ``load_state_dict``."""
        dev = _device.to_torch(device)
        return self._apply(lambda t: torch.empty_like(t, device=dev), recurse=recurse)

    def cuda(self, device: Any = None) -> Any:
        idx = device if isinstance(device, int) else None
        dev = torch.device("cuda", idx) if device is None or idx is not None else _device.to_torch(device)
        return self._apply(lambda t: t.cuda(dev))

    def cpu(self) -> Any:
        return self._apply(lambda t: t.cpu())

    def _cast_float(self, dt: torch.dtype) -> Any:
        return self._apply(lambda t: t.to(dt) if t.is_floating_point() else t)

    def float(self) -> Any:
        return self._cast_float(torch.float32)

    def double(self) -> Any:
        return self._cast_float(torch.float64)

    def half(self) -> Any:
        return self._cast_float(torch.float16)

    def bfloat16(self) -> Any:
        return self._cast_float(torch.bfloat16)

    def type(self, dst_type: Any) -> Any:
        dt = _dtype.to_torch(dst_type)
        return self._apply(lambda t: t.to(dt))
