"""``holoflow.mock_torch``: run code written for PyTorch on holoflow without editing it.

>>> from holoflow import mock_torch
>>> mock_torch.enable()            # as oneflow.mock_torch.enable()
>>> import torch                    # holoflow
>>> import torch.nn.functional as F # holoflow.nn.functional
>>> mock_torch.disable()           # the real torch is back

Both also work as context managers (``with mock_torch.enable(): ...``), restoring the previous
state on exit. ``torch.X.Y`` maps to ``holoflow.X.Y``; what holoflow lacks raises
``AttributeError("holoflow (mock_torch): torch.X is not implemented in holoflow")``.
While enabled, ``str(x.dtype)`` reads ``'torch.float32'`` and ``x.type()`` ``'torch.FloatTensor'``
(code compares them), and ``torch.__version__`` is the installed torch's version string: holoflow
follows the API of the torch it runs on, so a script's version checks choose the matching paths.

How: ``enable`` wraps ``builtins.__import__`` and ``importlib.import_module`` so that an import
of ``torch*`` made by code outside holoflow/torch (and the few packages in ``REAL_TORCH_USERS``)
returns a mock module forwarding to holoflow; holoflow's and torch's own imports, lazy ones
included, get the real torch. ``sys.modules`` keeps the real torch modules: torch's C++ reads
``sys.modules["torch"]`` directly (``PyImport_ImportModule``), so swapping them out breaks kernels.
Code that reads ``sys.modules["torch"]`` itself therefore sees the real torch.
"""
from __future__ import annotations

import builtins
import importlib
import sys
import threading
import types
from typing import Any

__all__ = ["enable", "disable", "is_enabled"]

# (pickle and multiprocessing import torch's reductions by name while moving tensors between
# processes: they must get the real modules)
REAL_TORCH_USERS = {"holoflow", "torch", "torchgen", "functorch", "safetensors", "torchvision",
                    "multiprocessing", "pickle", "copyreg", "copy"}

_LOCK = threading.Lock()
_ORIG_IMPORT = builtins.__import__
_ORIG_IMPORT_MODULE = importlib.import_module


class _State:
    enabled = False
    mocks: dict[str, "_MockModule"] = {}


# torch modules that are holoflow modules of another name (the module-level DTensor API needs nn,
# which sits above the distributed layer)
ALIASES = {"torch.distributed.tensor": "holoflow.dtensor", "torch.distributed._tensor": "holoflow.dtensor",
           "torch.distributed.tensor.parallel": "holoflow.dtensor.parallel",
           "torch.distributed.fsdp": "holoflow.dtensor.fsdp",
           "torch.distributed._composable.fsdp": "holoflow.dtensor.fsdp",
           "torch.distributed.checkpoint": "holoflow.dtensor.checkpoint",
           "torch.distributed.nn": "holoflow.distributed_nn", "torch.distributed.optim": "holoflow.distributed_optim",
           "torch.distributed._functional_collectives": "holoflow.distributed_nn._functional_collectives",
           "torch.distributed.pipelining": "holoflow.distributed_pipelining",
           "torch.distributed.algorithms._checkpoint.checkpoint_wrapper": "holoflow.dtensor.checkpoint_wrapper",
           # torchrun's error recording (``@record``) touches no tensor: torch's own
           "torch.distributed.elastic": "torch.distributed.elastic"}


def _target_name(name: str) -> str:
    """The holoflow module behind ``torch.X.Y`` (an alias covers the modules under it too)."""
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        alias = ALIASES.get(".".join(parts[:i]))
        if alias is not None:
            return ".".join([alias, *parts[i:]])
    return "holoflow" + name[len("torch"):]


def _is_torch(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


def _missing(name: str) -> str:
    return f"holoflow (mock_torch): {name} is not implemented in holoflow"


class _MockModule(types.ModuleType):
    """``torch[.X]`` forwarding attribute reads to ``holoflow[.X]``."""

    def __init__(self, name: str, target: types.ModuleType) -> None:
        super().__init__(name, getattr(target, "__doc__", None))
        self.__dict__["_holoflow_target"] = target
        self.__path__: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        if attr == "__version__" and self.__name__ == "torch":
            return _real_torch_version()
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        target = self.__dict__["_holoflow_target"]
        alias = ALIASES.get(f"{self.__name__}.{attr}")   # (below an alias, target is the aliased module)
        if alias is not None:
            value = _ORIG_IMPORT_MODULE(alias)
        elif hasattr(target, attr):
            value = getattr(target, attr)
        else:
            sub = f"{target.__name__}.{attr}"
            try:
                value = _ORIG_IMPORT_MODULE(sub)
            except ModuleNotFoundError as e:
                if e.name != sub:
                    raise
                raise AttributeError(_missing(f"{self.__name__}.{attr}")) from None
        if isinstance(value, types.ModuleType) and value.__name__.startswith("holoflow"):
            return _mock(f"{self.__name__}.{attr}", value)
        return value

    def __setattr__(self, attr: str, value: Any) -> None:
        """``torch.backends.cudnn.benchmark = True`` sets holoflow's (there: torch's) switch."""
        if attr.startswith("_") or attr in self.__dict__:
            super().__setattr__(attr, value)
        else:
            setattr(self.__dict__["_holoflow_target"], attr, value)

    def __delattr__(self, attr: str) -> None:
        """Deletes where ``__setattr__`` set: ``unittest.mock.patch("torch.cuda.set_rng_state", f)``
        (AOTAutograd patches it while Inductor compiles) sets holoflow's attribute on entry and
        deletes it on exit before restoring the original."""
        if attr.startswith("_") or attr in self.__dict__:
            super().__delattr__(attr)
        else:
            delattr(self.__dict__["_holoflow_target"], attr)

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_holoflow_target"])


def _real_torch_version() -> Any:
    """``torch.__version__`` under the mock is the installed torch's version (a TorchVersion,
    comparable with strings and tuples): holoflow implements torch's API as of the torch whose
    kernels it runs on, so version checks in scripts pick the code paths that match it."""
    return sys.modules["torch"].__version__


def _mock(name: str, target: types.ModuleType) -> _MockModule:
    m = _State.mocks.get(name)
    if m is None or m.__dict__["_holoflow_target"] is not target:
        m = _State.mocks[name] = _MockModule(name, target)
    return m


def _resolve(name: str) -> _MockModule:
    """The mock for ``torch.X.Y`` (holoflow.X.Y), or ModuleNotFoundError naming what's missing."""
    if name in _State.mocks:
        return _State.mocks[name]
    target = _target_name(name)
    try:
        return _mock(name, _ORIG_IMPORT_MODULE(target))
    except ModuleNotFoundError as e:
        if e.name is None or not target.startswith(e.name):
            raise
        raise ModuleNotFoundError(_missing(name), name=name) from None


def _internal(module_name: str | None) -> bool:
    return bool(module_name) and module_name.partition(".")[0] in REAL_TORCH_USERS


def _torch_target(name: str, fromlist) -> Any:
    """What ``import torch.X`` (fromlist empty) or ``from torch.X import a`` gives under the mock."""
    mod = _resolve(name)
    return mod if fromlist else _resolve("torch")


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and _is_torch(name) and not _internal((globals or {}).get("__name__")):
        return _torch_target(name, fromlist)
    return _ORIG_IMPORT(name, globals, locals, fromlist, level)


def _import_module(name: str, package: str | None = None):
    if _is_torch(name) and not _internal(sys._getframe(1).f_globals.get("__name__")):
        return _resolve(name)
    return _ORIG_IMPORT_MODULE(name, package)


class _Switch:
    """Returned by enable()/disable(): used as a context manager, restores the previous state."""

    def __init__(self, was_enabled: bool) -> None:
        self._was = was_enabled

    def __enter__(self) -> "_Switch":
        return self

    def __exit__(self, *exc) -> None:
        (_on if self._was else _off)()


def _display(name: str) -> None:
    """dtypes and tensor types print as ``torch.float32`` / ``torch.FloatTensor`` under the mock."""
    from .core import dtype
    dtype.DISPLAY[0] = name


def _on() -> None:
    # torch's compiler stack, which holoflow.compile and torch's own modules import at first use,
    # imports torch internals from generated code by plain names (torch.distributed's RemoteModule
    # template: ``import torch.distributed.rpc``): imported now, while they are torch's
    import torch._dynamo  # noqa: F401
    with _LOCK:
        if _State.enabled:
            return
        builtins.__import__ = _import
        importlib.import_module = _import_module
        _display("torch")
        _State.enabled = True


def _off() -> None:
    with _LOCK:
        if not _State.enabled:
            return
        builtins.__import__ = _ORIG_IMPORT
        importlib.import_module = _ORIG_IMPORT_MODULE
        _display("holoflow")
        _State.enabled = False


def enable(lazy: bool = False, verbose: bool = False, extra_dict: dict | None = None) -> _Switch:
    """Makes ``import torch[...]`` resolve to holoflow (``lazy``/``verbose``/``extra_dict`` are
    accepted for OneFlow compatibility). ``with enable(): ...`` restores the previous state."""
    was = _State.enabled
    _on()
    return _Switch(was)


def disable() -> _Switch:
    """Restores the real torch modules. ``with disable(): ...`` re-enables on exit if it was on."""
    was = _State.enabled
    _off()
    return _Switch(was)


def is_enabled() -> bool:
    """Whether ``import torch`` currently gives holoflow."""
    return _State.enabled
