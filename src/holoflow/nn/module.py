"""``nn.Module``: the base class of every layer, with torch's registration, naming and hooks.

State dicts, loading and dtype/device conversion live in :mod:`._state` (a mixin), so this file
holds attribute registration, traversal, hooks and ``__call__``.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Callable, Iterator

from ..core.tensor import Tensor, clear_grads
from ._state import StateMixin
from .hooks import RemovableHandle
from .parameter import Buffer, Parameter


def _addindent(s: str, num_spaces: int) -> str:
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    first = lines.pop(0)
    return first + "\n" + "\n".join(num_spaces * " " + line for line in lines)


def _forward_unimplemented(self, *input: Any) -> None:
    raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')


class Module(StateMixin):
    """Base class for all neural network modules, like ``torch.nn.Module``.

    Example::

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                return self.fc(x).relu()
    """

    training: bool
    forward: Callable[..., Any] = _forward_unimplemented
    call_super_init: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if (args or kwargs) and not self.call_super_init:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments")
        sa = object.__setattr__
        sa(self, "training", True)
        sa(self, "_parameters", {})
        sa(self, "_buffers", {})
        sa(self, "_non_persistent_buffers_set", set())
        sa(self, "_modules", {})
        sa(self, "_forward_pre_hooks", OrderedDict())
        sa(self, "_forward_pre_hooks_with_kwargs", {})
        sa(self, "_forward_hooks", OrderedDict())
        sa(self, "_forward_hooks_with_kwargs", {})
        sa(self, "_forward_hooks_always_called", {})
        sa(self, "_backward_hooks", OrderedDict())
        sa(self, "_backward_pre_hooks", OrderedDict())
        sa(self, "_state_dict_hooks", OrderedDict())
        sa(self, "_load_state_dict_pre_hooks", OrderedDict())
        if self.call_super_init:  # torch's cooperative multiple inheritance: the next class's __init__
            super().__init__(*args, **kwargs)

    # -- registration ------------------------------------------------------------------------
    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Adds a buffer (saved in ``state_dict`` unless ``persistent=False``)."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        self._check_name(name, "buffer")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            f"(holoflow Tensor or None required)")
        if isinstance(tensor, Buffer):
            tensor = _plain(tensor)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Adds a parameter (or ``None``, a declared but absent one such as a missing bias)."""
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        self._check_name(name, "parameter")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            f"(holoflow.nn.Parameter or None required)")
        if param is not None and param.grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters "
                             f"must be created explicitly; use .detach() for a copy")
        self._parameters[name] = param

    def add_module(self, name: str, module: "Module | None") -> None:
        """Adds a child module, reachable as ``self.<name>``."""
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._check_name(name, "module")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._modules[name] = module

    register_module = add_module

    @staticmethod
    def _check_name(name: str, kind: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')

    def get_submodule(self, target: str) -> "Module":
        """The submodule at dotted path ``target`` (``""`` is ``self``)."""
        mod = self
        if target == "":
            return mod
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(mod._get_name() + " has no attribute `" + item + "`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError("`" + item + "` is not an nn.Module")
        return mod

    def set_submodule(self, target: str, module: "Module", strict: bool = False) -> None:
        """Replaces (or, unless ``strict``, adds) the submodule at dotted path ``target``."""
        if target == "":
            raise ValueError("Cannot set the submodule without a target name!")
        if not isinstance(module, Module):
            raise ValueError("`module` is not an nn.Module, found " + str(type(module)))
        parent_path, _, name = target.rpartition(".")
        parent = self.get_submodule(parent_path)
        if strict and not hasattr(parent, name):
            raise AttributeError(parent._get_name() + " has no attribute `" + name + "`")
        if hasattr(parent, name) and not isinstance(getattr(parent, name), Module):
            raise AttributeError("`" + name + "` is not an nn.Module")
        setattr(parent, name, module)

    def _get_owned(self, target: str, store: str, kind: str):
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(mod._get_name() + " has no attribute `" + name + "`")
        if name not in getattr(mod, store):
            raise AttributeError("`" + name + "` is not " + kind)
        return getattr(mod, name)

    def get_parameter(self, target: str) -> Parameter:
        return self._get_owned(target, "_parameters", "an nn.Parameter")

    def get_buffer(self, target: str) -> Tensor:
        return self._get_owned(target, "_buffers", "a buffer")

    # -- attribute protocol ------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            items = d.get(store)
            if items is not None and name in items:
                return items[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        def remove_from(*dicts_or_sets):
            for d in dicts_or_sets:
                if name in d:
                    if isinstance(d, dict):
                        del d[name]
                    else:
                        d.discard(name)

        params = self.__dict__.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(self.__dict__, self._buffers, self._modules, self._non_persistent_buffers_set)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                f"(holoflow.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            if "_modules" not in self.__dict__:
                raise AttributeError("cannot assign module before Module.__init__() call")
            remove_from(self.__dict__, self._parameters, self._buffers, self._non_persistent_buffers_set)
            self._modules[name] = value
        elif "_modules" in self.__dict__ and name in self._modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                f"(holoflow.nn.Module or None expected)")
            self._modules[name] = value
        elif isinstance(value, Buffer):
            remove_from(self.__dict__, self._parameters, self._modules)
            self.register_buffer(name, value, value.persistent)
        elif "_buffers" in self.__dict__ and name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                f"(holoflow Tensor or None expected)")
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        for store in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__.get(store, ()):
                del self.__dict__[store][name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self) -> list[str]:
        attrs = dir(self.__class__) + list(self.__dict__)
        attrs += list(self._parameters) + list(self._modules) + list(self._buffers)
        return sorted(a for a in set(attrs) if not a[:1].isdigit())

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    # -- traversal -----------------------------------------------------------------------------
    def _named_members(self, get_members: Callable, prefix: str = "", recurse: bool = True,
                       remove_duplicate: bool = True) -> Iterator[tuple[str, Any]]:
        memo = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse \
            else [(prefix, self)]
        for module_prefix, module in modules:
            for k, v in get_members(module):
                if v is None or (remove_duplicate and id(v) in memo):
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield (module_prefix + ("." if module_prefix else "") + k, v)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Every parameter (each tied parameter once)."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        return self._named_members(lambda m: m._parameters.items(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members(lambda m: m._buffers.items(), prefix, recurse, remove_duplicate)

    def children(self) -> Iterator["Module"]:
        for _, m in self.named_children():
            yield m

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        memo = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in memo:
                memo.add(id(module))
                yield name, module

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, "Module"]]:
        """This module and every descendant with its dotted name, preorder."""
        if memo is None:
            memo = set()
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from module.named_modules(memo, sub, remove_duplicate)

    # -- modes and gradients -----------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for module in self.children():
            module.train(mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears every parameter's ``.grad`` (to ``None``, or to zeros)."""
        clear_grads(self.parameters(), set_to_none)

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        """Calls ``fn`` on every child (recursively), then on ``self``."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # -- hooks -------------------------------------------------------------------------------
    @staticmethod
    def _add_hook(hooks: OrderedDict, hook: Callable, prepend: bool, *flags: tuple[dict, bool]
                  ) -> RemovableHandle:
        handle = RemovableHandle(hooks, *[d for d, on in flags])
        hooks[handle.id] = hook
        for d, on in flags:
            if on:
                d[handle.id] = True
        if prepend:
            hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_pre_hook(self, hook: Callable, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """``hook(module, args)`` (or ``(module, args, kwargs)``) runs before ``forward``; it may
        return new args (or ``(args, kwargs)``)."""
        return self._add_hook(self._forward_pre_hooks, hook, prepend,
                              (self._forward_pre_hooks_with_kwargs, with_kwargs))

    def register_forward_hook(self, hook: Callable, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        """``hook(module, args, output)`` (or ``(module, args, kwargs, output)``) runs after
        ``forward``; it may return a new output."""
        return self._add_hook(self._forward_hooks, hook, prepend,
                              (self._forward_hooks_with_kwargs, with_kwargs),
                              (self._forward_hooks_always_called, always_call))

    def register_full_backward_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_input, grad_output)`` runs when the gradients of the module's tensor
        inputs are computed; it may return new ``grad_input``."""
        if self.__dict__.get("_is_full_backward_hook") is False:
            raise RuntimeError(_MIXED_BACKWARD_HOOKS)
        self._is_full_backward_hook = True
        return self._add_hook(self._backward_hooks, hook, prepend)

    def register_backward_hook(self, hook: Callable) -> RemovableHandle:
        """Deprecated (torch's non-full backward hook; use :meth:`register_full_backward_hook`).

        ``hook(module, grad_input, grad_output)`` is hooked, at each call, on the grad_fn of the
        module's (first) output, as torch does: ``grad_input`` are the gradients of the inputs of
        the LAST op of ``forward`` (None where one needs none), ``grad_output`` those of its
        outputs; it may return a new ``grad_input``. That equals the module's gradients only when
        ``forward`` is one op on its inputs, which is why torch warns (FutureWarning) otherwise.
        A module takes either these hooks or full ones, never both (RuntimeError, as torch)."""
        if self.__dict__.get("_is_full_backward_hook") is True:
            raise RuntimeError(_MIXED_BACKWARD_HOOKS)
        self._is_full_backward_hook = False
        return self._add_hook(self._backward_hooks, hook, False)

    def register_full_backward_pre_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_output)`` runs when the gradients of the module's outputs are
        computed, before the full backward hooks; it may return new ``grad_output``."""
        return self._add_hook(self.__dict__.setdefault("_backward_pre_hooks", OrderedDict()), hook, prepend)

    def _call_impl(self, *args: Any, **kwargs: Any) -> Any:
        bw_pre = self.__dict__.get("_backward_pre_hooks")
        if not (self._forward_pre_hooks or self._forward_hooks or self._backward_hooks or bw_pre
                or _global_forward_pre_hooks or _global_forward_hooks or _global_backward_hooks
                or _global_backward_pre_hooks):
            return self.forward(*args, **kwargs)
        pre_hooks = list(_global_forward_pre_hooks.items()) + list(self._forward_pre_hooks.items())
        fwd_hooks = list(_global_forward_hooks.items()) + list(self._forward_hooks.items())
        bw = result = None
        called = set()
        try:  # (as torch: always_call hooks also run when a pre-hook or a forward hook raises)
            for hid, hook in pre_hooks:
                if hid in self._forward_pre_hooks_with_kwargs:
                    res = hook(self, args, kwargs)
                    if res is not None:
                        if not (isinstance(res, tuple) and len(res) == 2):
                            raise RuntimeError("forward pre-hook must return None or a tuple of "
                                               f"(new_args, new_kwargs), but got {res}.")
                        args, kwargs = res
                else:
                    res = hook(self, args)
                    if res is not None:
                        args = res if isinstance(res, tuple) else (res,)
            legacy = self.__dict__.get("_is_full_backward_hook") is False
            own_full = () if legacy else self._backward_hooks.values()
            if own_full or bw_pre or _global_backward_hooks or _global_backward_pre_hooks:
                from ._backward_hook import BackwardHook
                bw = BackwardHook(self, [*_global_backward_hooks.values(), *own_full],
                                  [*_global_backward_pre_hooks.values(), *(bw_pre or {}).values()])
                args = bw.setup_input(args)
            result = self.forward(*args, **kwargs)
            for hid, hook in fwd_hooks:
                called.add(hid)
                result = self._run_forward_hook(hid, hook, args, kwargs, result)
        except Exception:
            for hid, hook in fwd_hooks:
                if (hid in self._forward_hooks_always_called or hid in _global_forward_hooks_always_called) \
                        and hid not in called:
                    try:  # they see the output as far as it got (None if forward raised)
                        self._run_forward_hook(hid, hook, args, kwargs, result)
                    except Exception:  # the original error is the one to report
                        pass
            raise
        if bw is not None:
            result = bw.setup_output(result)
        if legacy and self._backward_hooks:
            _hook_output_grad_fn(self, list(self._backward_hooks.values()), args, result)
        return result

    def _run_forward_hook(self, hid: int, hook: Callable, args: tuple, kwargs: dict, result: Any) -> Any:
        if hid in self._forward_hooks_with_kwargs or hid in _global_forward_hooks_with_kwargs:
            res = hook(self, args, kwargs, result)
        else:
            res = hook(self, args, result)
        return result if res is None else res

    __call__: Callable[..., Any] = _call_impl

    def share_memory(self) -> "Module":
        """Moves every parameter and buffer (and gradient) to shared memory, as torch."""
        for t in list(self.parameters()) + list(self.buffers()):
            t.share_memory_()
            if t.grad is not None:
                t.grad.share_memory_()
        return self

    # holoflow.graph (above nn) publishes holoflow.compile's in-place form here, as it publishes
    # nn.Graph; None until it is imported
    _compile_forward: Callable | None = None

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``torch.nn.Module.compile(**torch.compile's kwargs)``: in place, this module's forward
        becomes ``holoflow.compile``'s of it (graph/compile_module.py; its own hooks run eagerly
        around it); returns None."""
        if args:
            raise TypeError(f"holoflow.nn.Module.compile: takes torch.compile's keyword arguments, got "
                            f"{len(args)} positional")
        if Module._compile_forward is not None:
            Module._compile_forward(self, **kwargs)

    # -- printing ------------------------------------------------------------------------------
    def _get_name(self) -> str:
        return type(self).__name__

    def extra_repr(self) -> str:
        """The module's own settings, shown inside its repr (override in layers)."""
        return ""

    def __repr__(self) -> str:
        extra_repr = self.extra_repr()
        extra_lines = extra_repr.split("\n") if extra_repr else []
        child_lines = ["(" + key + "): " + _addindent(repr(m), 2) for key, m in self._modules.items()]
        lines = extra_lines + child_lines
        main_str = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main_str += extra_lines[0]
            else:
                main_str += "\n  " + "\n  ".join(lines) + "\n"
        return main_str + ")"


_MIXED_BACKWARD_HOOKS = ("holoflow.nn.Module: Cannot use both regular backward hooks and full backward hooks "
                         "on a single Module. Please use only one of them: register_full_backward_hook, "
                         "or the deprecated register_backward_hook")


class _LegacyHookedOp:
    """The op of one grad node, with ``register_backward_hook`` hooks run after its grad rule.

    torch hooks the module output's grad_fn (a Node post-hook: it sees the gradients the node
    computed for its inputs and the ones it received); holoflow's engine has per-output
    gradient hooks only, so the node's op is swapped for this proxy, which hands everything but
    ``grad`` to the op. Only that one node is affected."""

    def __init__(self, op: Any) -> None:
        self._op, self._hooks = op, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._op, name)

    def grad(self, ctx: Any, *grad_output: Any) -> tuple:
        grad_input = self._op.grad(ctx, *grad_output)
        if not isinstance(grad_input, tuple):
            grad_input = (grad_input,)
        grad_input = tuple(g if e is not None else None for g, e in zip(grad_input, ctx.edges))
        for module, hook in self._hooks:
            res = hook(module, grad_input, grad_output)
            if res is None:
                continue
            name = getattr(hook, "__name__", type(hook).__name__)
            if not isinstance(res, tuple):
                raise TypeError(f"holoflow.nn.Module.register_backward_hook: expected tuple, but hook "
                                f"{name!r} returned {type(res).__name__!r}")
            if len(res) != len(grad_input):
                raise RuntimeError(f"holoflow.nn.Module.register_backward_hook: hook {name!r} has returned an "
                                   f"incorrect number of values (got {len(res)}, but expected {len(grad_input)})")
            grad_input = res
        return grad_input


def _hook_output_grad_fn(module: Module, hooks: list, args: tuple, result: Any) -> None:
    """Registers ``module``'s legacy backward hooks on the grad_fn of its first output tensor
    (torch's walk: first element of tuples/lists, first tensor value of dicts), and warns as
    torch does where that node does not see the module's whole gradients."""
    var = result
    while not isinstance(var, Tensor):
        if isinstance(var, dict):
            var = next((v for v in var.values() if isinstance(v, Tensor)), None)
        elif isinstance(var, (tuple, list)) and var:
            var = var[0]
        else:
            return
    node = var.grad_fn
    if node is None:
        return
    if not isinstance(node.op, _LegacyHookedOp):
        node.op = _LegacyHookedOp(node.op)
    node.op._hooks.extend((module, h) for h in hooks)
    _warn_partial_legacy_hook(args, result, node)


def _warn_partial_legacy_hook(inputs: tuple, result: Any, node: Any) -> None:
    """torch's FutureWarnings for a non-full backward hook that misses gradients: outputs that
    are not tensors, or come from several ops; inputs that are not tensors, or are not exactly
    the inputs of the last op (a leaf or an input needing no gradient counts as different)."""
    def warn(what: str) -> None:
        warnings.warn(f"Using a non-full backward hook {what} is deprecated and will be removed in "
                      f"future versions. Please use register_full_backward_hook to get the documented "
                      f"behavior.", FutureWarning, stacklevel=5)
    results = (result,) if isinstance(result, Tensor) else result
    if not (isinstance(results, tuple) and all(isinstance(r, Tensor) for r in results)):
        return warn("on a Module that does not return a single Tensor or a tuple of Tensors "
                    "(this hook will be missing some of the grad_output)")
    if not all(isinstance(i, Tensor) for i in inputs):
        return warn("on a Module that does not take as input a single Tensor or a tuple of Tensors "
                    "(this hook will be missing some of the grad_input)")
    out_nodes = {r.grad_fn for r in results if r.grad_fn is not None}
    if len(out_nodes) > 1:
        return warn("when outputs are generated by different autograd Nodes "
                    "(this hook will be missing some grad_output)")
    in_nodes = {i.grad_fn for i in inputs if i.grad_fn is not None}
    next_nodes = {e[0] if isinstance(e, tuple) else (None if e is None else ("leaf", id(e)))
                  for e in node.edges}
    if in_nodes != next_nodes:
        warn("when the forward contains multiple autograd Nodes (this hook will be missing some grad_input)")


# torch.nn.modules.module's global hooks: they run on every module call, before the module's own
_global_forward_pre_hooks: OrderedDict = OrderedDict()
_global_forward_hooks: OrderedDict = OrderedDict()
_global_forward_hooks_with_kwargs: dict = {}
_global_forward_hooks_always_called: dict = {}
_global_backward_hooks: OrderedDict = OrderedDict()
_global_backward_pre_hooks: OrderedDict = OrderedDict()


def register_module_forward_pre_hook(hook: Callable) -> RemovableHandle:
    """``hook(module, args)`` runs before every module's ``forward`` (and its own pre-hooks); it
    may return new args."""
    return Module._add_hook(_global_forward_pre_hooks, hook, False)


def register_module_forward_hook(hook: Callable, *, with_kwargs: bool = False,
                                 always_call: bool = False) -> RemovableHandle:
    """``hook(module, args, output)`` runs after every module's ``forward`` (before its own
    forward hooks); it may return a new output."""
    return Module._add_hook(_global_forward_hooks, hook, False,
                            (_global_forward_hooks_with_kwargs, with_kwargs),
                            (_global_forward_hooks_always_called, always_call))


def register_module_full_backward_hook(hook: Callable) -> RemovableHandle:
    """``hook(module, grad_input, grad_output)`` for every module (before its own backward hooks)."""
    return Module._add_hook(_global_backward_hooks, hook, False)


def register_module_full_backward_pre_hook(hook: Callable) -> RemovableHandle:
    """``hook(module, grad_output)`` for every module (before its own backward pre-hooks)."""
    return Module._add_hook(_global_backward_pre_hooks, hook, False)


def _plain(buf: Buffer) -> Tensor:
    t = Tensor._make(buf._data)
    t._global = buf._global
    return t
