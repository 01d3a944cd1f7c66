"""``holoflow.save(model)``: a whole module in a checkpoint, rebuilt on load only when the
caller allows code to run (``weights_only=False``), as ``torch.load`` decides.

A safetensors file cannot hold code, and rebuilding an arbitrary module needs its class and its
non-tensor attributes. So the module is pickled with its tensors (parameters, buffers, any
tensor attribute) taken out into the file's tensor table; the manifest keeps the module's class
path and the tensor-free pickle. ``load(..., weights_only=True)`` (the default) refuses it with
``pickle.UnpicklingError`` (torch's class) naming the class and what to do;
``weights_only=False`` unpickles it (running the class's module code, as torch.load does) with
its tensors restored, tied weights still tied.
"""
from __future__ import annotations

import base64
import contextvars
import io
import pickle
from typing import Any, Callable

from .core.tensor import Tensor
from .serialization_storage import identity

__all__ = ["is_module", "encode_module", "decode_module", "ALLOW_CODE", "allowing_code"]

ALLOW_CODE: contextvars.ContextVar[bool] = contextvars.ContextVar("holoflow_load_allow_code", default=False)


def is_module(obj: Any) -> bool:
    from .nn.module import Module
    return isinstance(obj, Module)


def _class_path(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class _Pickler(pickle.Pickler):
    def __init__(self, buf: io.BytesIO, tensor_node: Callable[[Tensor, str], dict], where: str) -> None:
        super().__init__(buf, protocol=4)
        self.tensor_node, self.where, self.count = tensor_node, where, 0

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, Tensor):
            return None
        from .nn.parameter import Parameter
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
        _Pickler(buf, tensor_node, where).dump(module)
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
