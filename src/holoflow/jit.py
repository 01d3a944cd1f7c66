"""``holoflow.jit``: TorchScript is not compiled; ``script`` and ``trace`` return the module or
function itself (eager holoflow, same numbers), and the decorators (``ignore``, ``unused``,
``export``) leave their function as written. Saving a TorchScript archive raises."""
from __future__ import annotations

from typing import Any, Callable, TypeVar

from .core.errors import UnsupportedError

__all__ = ["script", "trace", "ignore", "unused", "export", "is_scripting", "is_tracing", "annotate",
           "Final", "interface", "save", "load", "script_if_tracing"]

T = TypeVar("T")
Final = Any


def script(obj: T, *args: Any, **kwargs: Any) -> T:
    """Pass-through: returns ``obj`` (a module, function or class) unchanged."""
    return obj


def trace(func: T, example_inputs: Any = None, *args: Any, **kwargs: Any) -> T:
    """Pass-through: returns ``func`` unchanged (it is not run on ``example_inputs``)."""
    return func


def _decorator(fn: Callable | None = None, **kwargs: Any) -> Any:
    return (lambda f: f) if fn is None else fn


ignore = unused = export = interface = script_if_tracing = _decorator


def is_scripting() -> bool:
    """False: holoflow code is never TorchScript-compiled."""
    return False


def is_tracing() -> bool:
    """False: ``trace`` is a pass-through."""
    return False


def annotate(the_type: Any, the_value: T) -> T:
    return the_value


def save(m: Any, f: Any, *args: Any, **kwargs: Any) -> None:
    raise UnsupportedError("holoflow.jit.save: TorchScript archives are not supported; save the weights "
                           "with holoflow.save(model.state_dict(), path)")


def load(f: Any, *args: Any, **kwargs: Any) -> Any:
    raise UnsupportedError("holoflow.jit.load: TorchScript archives are not supported; rebuild the model "
                           "in Python and load a state dict (holoflow.load / utils.convert.from_torch_file)")
