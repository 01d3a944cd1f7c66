"""``holoflow.compiler``: torch.compiler's switches for eager holoflow.

holoflow runs eagerly (a static graph is ``holoflow.nn.Graph``), so nothing is ever being
compiled: ``is_compiling()`` is False, ``compile`` returns its argument, and the decorators that
steer the compiler (``disable``, ``allow_in_graph``, ``assume_constant_result``) return the
function unchanged, so code written for ``torch.compile`` runs unmodified with the same numbers.
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["compile", "is_compiling", "is_dynamo_compiling", "is_exporting", "disable", "reset",
           "allow_in_graph", "assume_constant_result", "list_backends", "cudagraph_mark_step_begin"]


def compile(model: Callable | None = None, **kwargs: Any) -> Any:  # noqa: A001 - torch's name
    """``torch.compiler.compile``: returns ``model`` itself (eager holoflow); with no model,
    a decorator doing the same."""
    if model is None:
        return lambda fn: fn
    if not callable(model):
        raise TypeError(f"holoflow.compiler.compile: expected a module or a function, got {type(model).__name__}")
    return model


def is_compiling() -> bool:
    """False: holoflow never traces Python code with a compiler."""
    return False


def is_dynamo_compiling() -> bool:
    """False: there is no TorchDynamo trace in holoflow."""
    return False


def is_exporting() -> bool:
    """False: holoflow has no ``torch.export``."""
    return False


def disable(fn: Callable | None = None, recursive: bool = True, *, reason: str | None = None) -> Any:
    """``@torch.compiler.disable``: ``fn`` unchanged (it already runs eagerly); with no ``fn``,
    a decorator doing the same."""
    if fn is None:
        return lambda f: f
    return fn


def reset() -> None:
    """Clears compilation caches: holoflow keeps none, so this does nothing."""


def allow_in_graph(fn: Callable) -> Callable:
    """``fn`` unchanged (there is no compiler graph to allow it into)."""
    return fn


def assume_constant_result(fn: Callable) -> Callable:
    """``fn`` unchanged (eager execution calls it every time, which is always correct)."""
    return fn


def list_backends(exclude_tags: tuple | None = ("debug", "experimental")) -> list[str]:
    """The compiler backends holoflow has: none (``[]``)."""
    return []


def cudagraph_mark_step_begin() -> None:
    """Marks a CUDA-graph step boundary: holoflow records no CUDA graphs, so this does nothing."""
