"""``holoflow.save(model)``: a whole module in a checkpoint, rebuilt on load only when the
caller allows code to run (``weights_only=False``), as ``torch.load`` decides.

A safetensors file cannot hold code, and rebuilding an arbitrary module needs its class and its
non-tensor attributes. So the module is pickled with its tensors (parameters, buffers, any
tensor attribute) taken out into the file's tensor table; the manifest keeps the module's class
path and the tensor-free pickle. ``load(..., weights_only=True)`` (the default) refuses it with
``pickle.UnpicklingError`` (torch's class) naming the class and what to do;
``weights_only=False`` unpickles it (running the class's module code, as torch.load does) with
its tensors restored, tied weights still tied.

A module holding a global tensor is refused when saved (:class:`WholeModuleError`, a
``TypeError``, as torch's for an object it can't save): global tensors are saved by every rank
into a sharded directory, which, as torch's distributed checkpoint (DCP), holds state dicts, and
OneFlow saves global models as ``model.state_dict()`` too; rebuilding a module from it would need
its pickle resharded. ``model.state_dict()`` is saved instead and loaded with ``like=model``.
For the same reason a module of local tensors saved whole beside global tensors (into a sharded
directory) is refused (:func:`refuse_in_sharded`); alone, or with ``global_dst_rank``, it goes
to one ordinary file as any module.
"""
from __future__ import annotations

import base64
import contextvars
import io
import pickle
from typing import Any, Callable

from .core.tensor import Tensor
from .serialization_storage import identity

__all__ = ["is_module", "encode_module", "decode_module", "ALLOW_CODE", "allowing_code", "WholeModuleError",
           "holds_global", "refuse_global", "refuse_in_sharded"]

ALLOW_CODE: contextvars.ContextVar[bool] = contextvars.ContextVar("holoflow_load_allow_code", default=False)


def is_module(obj: Any) -> bool:
    from .nn.module import Module
    return isinstance(obj, Module)


def _class_path(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class WholeModuleError(TypeError):
    """A module that can't be saved whole: it holds a global tensor, or goes into a sharded
    checkpoint (save its ``state_dict()`` instead)."""


def _tensor_name(module: Any, t: Tensor) -> str:
    """The name of ``t`` in ``module`` (a parameter or buffer), else a description of it."""
    for name, x in (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)):
        if x is t:
            return repr(name)
    return "a tensor attribute"


def _refusal(module: Any, t: Tensor, where: str) -> WholeModuleError:
    g = t._global
    return WholeModuleError(
        f"holoflow.save: the module {_class_path(module)} at {where} holds the global tensor "
        f"{_tensor_name(module, t)} (placement {g.placement}, sbp {tuple(g.sbp)}); a module is saved whole "
        f"only with local tensors. Save model.state_dict() instead (flow.save(model.state_dict(), dir): each "
        f"rank writes its shards; flow.load(dir, like=model) gives them model's layout, then "
        f"model.load_state_dict(...)), or its state dict with global_dst_rank=0 for one file of whole tensors")


def holds_global(module: Any) -> bool:
    """Whether ``module`` has a global parameter or buffer (what sends a save to the sharded form)."""
    return any(t._global is not None for t in (*module.parameters(), *module.buffers()))


def refuse_global(module: Any, where: str) -> None:
    """Raises :class:`WholeModuleError` if ``module`` (saved whole) holds a global tensor:
    a parameter, a buffer or any tensor attribute (what :func:`encode_module` would store)."""
    encode_module(lambda t, w: {}, module, where)


def refuse_in_sharded(module: Any, where: str) -> None:
    """Raises :class:`WholeModuleError` for ``module`` met by a sharded (directory) save: which
    global tensor it holds, or that a sharded checkpoint holds state dicts, not modules."""
    refuse_global(module, where)
    raise WholeModuleError(
        f"holoflow.save: the module {_class_path(module)} at {where} is saved whole beside global tensors; a "
        f"checkpoint of global tensors (a directory, each rank writing its shards) holds state dicts, as "
        f"torch's distributed checkpoint does, not modules. Save its state_dict() there (and load it into a "
        f"model you build), or save the module alone to a file")


class _Pickler(pickle.Pickler):
    def __init__(self, buf: io.BytesIO, tensor_node: Callable[[Tensor, str], dict], module: Any,
                 where: str) -> None:
        super().__init__(buf, protocol=4)
        self.tensor_node, self.module, self.where, self.count = tensor_node, module, where, 0

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, Tensor):
            return None
        from .nn.parameter import Parameter
        if obj._global is not None:
            raise _refusal(self.module, obj, self.where)
        self.count += 1
        node = self.tensor_node(obj, f"{self.where}<tensor {self.count}>")
        return ("tensor", node, isinstance(obj, Parameter), obj.requires_grad)


class _Unpickler(pickle.Unpickler):
    def __init__(self, buf: io.BytesIO, load_tensor: Callable[[dict], Tensor]) -> None:
        super().__init__(buf)
        self.load_tensor, self.params = load_tensor, {}

    def persistent_load(self, pid: Any) -> Any:
        kind, node, is_param, requires_grad = pid
        if kind != "tensor":
            raise pickle.UnpicklingError(f"holoflow.load: unknown persistent id {kind!r}")
        t = self.load_tensor(node)
        if not is_param:
            return t
        key = identity(node)
        if key not in self.params:   # one Parameter per saved tensor object: tied weights stay tied
            from .nn.parameter import Parameter
            self.params[key] = Parameter(t.detach(), requires_grad=requires_grad)
        return self.params[key]


def encode_module(tensor_node: Callable[[Tensor, str], dict], module: Any, where: str) -> dict:
    """The manifest node of ``module``: class path + tensor-free pickle; ``tensor_node`` stores
    each tensor in the file's tensor table and returns its node."""
    buf = io.BytesIO()
    try:
        _Pickler(buf, tensor_node, module, where).dump(module)
    except WholeModuleError:
        raise
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise TypeError(f"holoflow.save: the module {_class_path(module)} at {where} cannot be saved "
                        f"whole ({type(e).__name__}: {e}); save module.state_dict() instead") from e
    return {"t": "module", "class": _class_path(module), "pickle": base64.b64encode(buf.getvalue()).decode()}


def decode_module(load_tensor: Callable[[dict], Tensor], node: dict, name: str) -> Any:
    """Rebuilds a module saved whole, when the caller allowed code (``weights_only=False``)."""
    cls = node.get("class", "?")
    if not ALLOW_CODE.get():
        raise pickle.UnpicklingError(
            f"holoflow.load({name}): the file holds a whole module ({cls}); rebuilding it imports and "
            f"runs that class's code, which weights_only=True (the default) forbids. If you trust the "
            f"file, load it with weights_only=False (as torch.load); otherwise save "
            f"model.state_dict() and load that into a model you build")
    return _Unpickler(io.BytesIO(base64.b64decode(node["pickle"])), load_tensor).load()


class allowing_code:
    """``with allowing_code(True): ...``: modules saved whole may be rebuilt inside."""

    def __init__(self, allow: bool) -> None:
        self.allow, self.token = allow, None

    def __enter__(self) -> "allowing_code":
        self.token = ALLOW_CODE.set(self.allow)
        return self

    def __exit__(self, *exc: Any) -> None:
        ALLOW_CODE.reset(self.token)
