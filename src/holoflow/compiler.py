"""``holoflow.compiler``: torch.compiler's switches for eager holoflow.

``compile`` is ``holoflow.compile`` (graph/compile_module.py: a call traced into holoflow's graph
IR and run as lowered plans). Code never runs *while* being compiled as dynamo's does (the trace
runs it once on lazy tensors), so ``is_compiling()`` is False, and the decorators that steer
dynamo (``disable``, ``allow_in_graph``, ``assume_constant_result``) return the function unchanged.
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["compile", "is_compiling", "is_dynamo_compiling", "is_exporting", "disable", "reset",
           "allow_in_graph", "assume_constant_result", "list_backends", "cudagraph_mark_step_begin"]


def compile(model: Callable | None = None, **kwargs: Any) -> Any:  # noqa: A001 - torch's name
    """``torch.compiler.compile``: ``holoflow.compile`` (the same arguments)."""
    from .compat import compile as compile_
    return compile_(model, **kwargs)


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
    """The backends ``compile`` takes: ``inductor`` (each plan's tasks through Inductor), and the
    debug ones running the plans' kernel calls as they are (``eager``, ``aot_eager``)."""
    debug = exclude_tags is not None and "debug" in exclude_tags
    return ["inductor"] if debug else ["aot_eager", "eager", "inductor"]


def cudagraph_mark_step_begin() -> None:
    """Marks a CUDA-graph step boundary: holoflow records no CUDA graphs, so this does nothing."""
