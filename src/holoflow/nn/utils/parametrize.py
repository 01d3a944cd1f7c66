"""``holoflow.nn.utils.parametrize``: a tensor of a module computed from other tensors each time
it is read, as ``torch.nn.utils.parametrize``.

``register_parametrization(m, "weight", p)`` moves ``m.weight`` into
``m.parametrizations.weight.original`` (or ``original0, original1, ...`` when ``p.right_inverse``
returns several tensors), and swaps ``m``'s class for a subclass with a ``weight`` property
returning ``p(original...)``; state-dict keys are torch's.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

from ...core.grad_mode import no_grad
from ...core.tensor import Tensor
from ..containers import ModuleDict, ModuleList
from ..module import Module
from ..parameter import Parameter

__all__ = ["register_parametrization", "remove_parametrizations", "is_parametrized", "cached",
           "ParametrizationList", "type_before_parametrizations", "transfer_parametrizations_and_params"]

_CACHE: dict | None = None


@contextlib.contextmanager
def cached() -> Iterator[None]:
    """Within the block each parametrized tensor is computed once, on first read."""
    global _CACHE
    outer, _CACHE = _CACHE, ({} if _CACHE is None else _CACHE)
    try:
        yield
    finally:
        _CACHE = outer


class ParametrizationList(ModuleList):
    """The parametrizations of one tensor, applied in order, and the unparametrized original(s)."""

    def __init__(self, modules: list, original: Tensor, unsafe: bool = False) -> None:
        super().__init__(modules)
        self.unsafe = unsafe
        new: Any = original
        with no_grad():
            for m in reversed(list(self)):
                if hasattr(m, "right_inverse"):
                    try:
                        new = m.right_inverse(new)
                    except NotImplementedError:   # as torch: registering keeps the tensor as is
                        pass                      # (assigning to it later still raises)
        self.is_tensor = isinstance(new, Tensor)
        self.ntensors = 1 if self.is_tensor else len(new)
        rg = original.requires_grad
        if self.is_tensor:
            if new is not original:
                with no_grad():
                    original._data = new.detach()._data.clone()
            self._register(("original",), [original], rg, isinstance(original, Parameter))
        else:
            self._register([f"original{i}" for i in range(len(new))], list(new), rg, isinstance(original, Parameter))
        if not unsafe:   # torch evaluates the parametrization once to check it (a spectral norm
            z = self()   # in training takes a power-iteration step here, as in torch)
            if tuple(z.shape) != tuple(original.shape) or z.dtype != original.dtype:
                raise ValueError(f"Registering a parametrization may not change the shape or dtype of the tensor, "
                                 f"unless the `unsafe` flag is enabled: {tuple(original.shape)} {original.dtype} "
                                 f"became {tuple(z.shape)} {z.dtype}")

    def _register(self, names, values, rg: bool, as_parameter: bool) -> None:
        # (a parametrized buffer keeps its originals as buffers, as torch: nothing to train; several
        # originals are new Parameters, as torch's, even one that right_inverse returned as it was
        # given: the weight's .grad stays with the weight)
        for name, v in zip(names, values):
            if isinstance(v, Parameter) and len(values) == 1:
                self.register_parameter(name, v)
            elif as_parameter:
                self.register_parameter(name, Parameter(v.detach(), requires_grad=rg))
            else:
                self.register_buffer(name, v if v is values[0] and len(values) == 1 else v.detach())

    def right_inverse(self, value: Tensor) -> None:
        with no_grad():
            for m in reversed(list(self)):
                if hasattr(m, "right_inverse"):
                    value = m.right_inverse(value)
            if self.is_tensor:
                self.original._data.copy_(value._data)
            else:
                for i, v in enumerate(value):
                    getattr(self, f"original{i}")._data.copy_(v._data)

    def forward(self) -> Tensor:
        if self.is_tensor:
            x = self[0](self.original)
        else:
            x = self[0](*(getattr(self, f"original{i}") for i in range(self.ntensors)))
        for m in list(self)[1:]:
            x = m(x)
        return x


def _getstate(self: Module) -> Any:
    raise RuntimeError("Serialization of parametrized modules is only supported through state_dict(). "
                       "See: https://pytorch.org/tutorials/beginner/saving_loading_models.html")


def _deepcopy(self: Module, memo: dict) -> Module:
    # (``__getstate__`` refuses pickling, so deepcopy copies ``__dict__`` itself, as torch)
    if id(self) in memo:
        return memo[id(self)]
    replica = self.__new__(self.__class__)
    memo[id(self)] = replica
    replica.__dict__ = copy.deepcopy(self.__dict__, memo)
    return replica


def _inject_class(module: Module) -> None:
    cls = module.__class__
    attrs: dict = {"_holoflow_original_class": cls, "__getstate__": _getstate}
    if not hasattr(module, "__deepcopy__"):
        attrs["__deepcopy__"] = _deepcopy
    module.__class__ = type(f"Parametrized{cls.__name__}", (cls,), attrs)


def _inject_property(module: Module, name: str) -> None:
    def get(self: Module) -> Tensor:
        plist = self.parametrizations[name]
        if _CACHE is None:
            return plist()
        key = (id(self), name)
        if key not in _CACHE:
            _CACHE[key] = plist()
        return _CACHE[key]

    def put(self: Module, value: Tensor) -> None:
        self.parametrizations[name].right_inverse(value)

    setattr(module.__class__, name, property(get, put))


def is_parametrized(module: Module, tensor_name: str | None = None) -> bool:
    plist = module.__dict__.get("_modules", {}).get("parametrizations")
    if plist is None or not isinstance(plist, ModuleDict):
        return False
    return tensor_name is None or tensor_name in plist


def type_before_parametrizations(module: Module) -> type:
    return getattr(type(module), "_holoflow_original_class", type(module))


def register_parametrization(module: Module, tensor_name: str, parametrization: Module,
                             *, unsafe: bool = False) -> Module:
    """Parametrizes ``module.<tensor_name>`` by ``parametrization`` (chained if already
    parametrized) and returns ``module``."""
    parametrization.train(module.training)
    if is_parametrized(module, tensor_name):
        module.parametrizations[tensor_name].append(parametrization)
        return module
    if tensor_name not in module._parameters and tensor_name not in module._buffers:
        raise ValueError(f"Module '{module}' does not have a parameter, a buffer, or a parametrized element with "
                         f"name '{tensor_name}'")
    # (the list first: a parametrization that refuses the tensor leaves the module as it was)
    plist = ParametrizationList([parametrization], getattr(module, tensor_name), unsafe=unsafe)
    if tensor_name in module._parameters:
        del module._parameters[tensor_name]
    else:
        del module._buffers[tensor_name]  # (it stays a buffer, in the ParametrizationList)
    if not is_parametrized(module):
        _inject_class(module)
        module.parametrizations = ModuleDict()
    module.parametrizations[tensor_name] = plist
    _inject_property(module, tensor_name)
    return module


def remove_parametrizations(module: Module, tensor_name: str, leave_parametrized: bool = True) -> Module:
    """Undoes :func:`register_parametrization`: ``module.<tensor_name>`` becomes a parameter
    again, holding the parametrized value (``leave_parametrized``) or the original."""
    if not is_parametrized(module, tensor_name):
        raise ValueError(f"Module {module} does not have a parametrization on {tensor_name}")
    plist = module.parametrizations[tensor_name]
    if leave_parametrized and plist.is_tensor:
        with no_grad():
            value = getattr(module, tensor_name)
        orig = plist.original
        orig._data = value.detach()._data.clone()
    elif leave_parametrized:   # (as torch: a Parameter where the value requires grad, else a buffer)
        value = getattr(module, tensor_name)
        orig = Parameter(value.detach(), requires_grad=True) if value.requires_grad else value.detach()
    else:
        if not plist.is_tensor:
            raise ValueError("Cannot leave unparametrized (`leave_parametrized=False`) a tensor that is "
                             "parametrized in terms of a sequence of tensors.")
        orig = plist.original
    delattr(module.__class__, tensor_name)
    del module.parametrizations[tensor_name]
    if isinstance(orig, Parameter):
        module.register_parameter(tensor_name, orig)
    else:  # a parametrized buffer is a buffer again
        module.register_buffer(tensor_name, orig)
    if len(module.parametrizations) == 0:
        del module.parametrizations
        module.__class__ = type_before_parametrizations(module)
    return module


def transfer_parametrizations_and_params(from_module: Module, to_module: Module,
                                         tensor_name: str | None = None) -> Module:
    """Registers ``from_module``'s parametrizations (of ``tensor_name``, or of every parametrized
    tensor) on ``to_module`` and shares their originals (``original`` or ``original0, ...``),
    creating the tensor on ``to_module`` first where it has none; returns ``to_module``, as torch."""
    if not is_parametrized(from_module):
        return to_module
    for name in (list(from_module.parametrizations) if tensor_name is None else [tensor_name]):
        if not hasattr(to_module, name):
            setattr(to_module, name, Parameter(getattr(from_module, name)))
        source = from_module.parametrizations[name]
        for parametrization in source:
            register_parametrization(to_module, name, parametrization)
        target = to_module.parametrizations[name]
        if hasattr(source, "original"):
            target.original = source.original
            continue
        num = 0
        while hasattr(source, f"original{num}"):
            setattr(target, f"original{num}", getattr(source, f"original{num}"))
            num += 1
    return to_module
