"""``graph.config.enable_compile()``: each task's generated function compiled by ``torch.compile``.

Lowering (graph/lower.py) turns a graph into one Python function of direct kernel calls per task
(graph/ir.py ``program``). With the switch on, the functions of the ``compute`` tasks are wrapped in
:class:`CompiledTask`: the first call compiles the function with ``torch.compile(backend="inductor",
fullgraph=True, dynamic=False)``, so Inductor fuses the conv / batch-norm / activation regions and
elementwise chains of forward *and* backward (the program already holds backward as explicit
kernels: no autograd is involved). Tasks that issue collectives, and runs of nodes whose ops
declare their kernels ``opaque`` to dynamo on their device (CUDA attention runs torch's own
autograd node), are tasks of their own (graph/ir.py ``split_tasks``) and stay plain, as do tasks
on the ``copy`` and ``update`` streams, and so does everything when the graph is profiled
(per-node timing needs the plain lines). The ``update`` task runs the optimizer's own update rule
on the live state (graph/optimizer.py) as multi-tensor kernels, one call per operation over every
parameter, or as one fused kernel with ``config.allow_fuse_model_update_ops`` (torch's
``_fused_adamw_``, CPU and CUDA) — the faster of the two; there is little left for Inductor there,
and dynamo cannot trace the optimizer's state lookups.

Values passed from one compiled task to another keep the layouts Inductor chose for them
(``keep_output_stride=False``: the CNN's activations and weight gradients stay channels-last
between its forward and backward tasks instead of being converted to eager's strides and back);
an output leaving compiled code (read by a plain task, a graph output, a state update) is made
contiguous when it is not, so plain kernels, collectives and the optimizer see dense tensors.

``fullgraph=True`` makes dynamo trace a whole task before any kernel runs, so a task dynamo cannot
trace (an effect it does not understand, a kernel with a graph break) fails before it has mutated
anything: the wrapper then warns once, naming the task and the reason, and runs the plain function
from then on. A task that compiled once keeps its compiled function; a later failure of dynamo
itself (a recompilation after a guard failed) also falls back, any other exception propagates.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import torch

LOG = logging.getLogger("holoflow.graph")

PLAIN_STREAMS = ("copy", "update")   # bytes, the optimizer's own kernels


def _dynamo_error() -> tuple:
    try:
        from torch._dynamo.exc import TorchDynamoException
    except ImportError:   # pragma: no cover - torch builds without dynamo
        return ()
    return (TorchDynamoException,)


class CompiledTask:
    """A task function, compiled on first call; the plain function if compiling fails.

    ``state`` is ``"pending"`` (not called yet), ``"compiled"`` or ``"plain"`` (``reason`` says why);
    ``leaving``: positions of the outputs that leave compiled code (made contiguous).
    """

    def __init__(self, name: str, fn: Callable, leaving: tuple = (), **options: Any) -> None:
        self.name, self.fn, self.options, self.leaving = name, fn, options, leaving
        self.state, self.reason = "pending", ""
        self._compiled: Callable | None = None
        self._lock = threading.Lock()
        self.__name__ = getattr(fn, "__name__", name)

    def _fall_back(self, e: BaseException) -> None:
        self.state, self.reason = "plain", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        LOG.warning(f"holoflow.nn.Graph enable_compile: torch.compile failed for task {self.name!r} "
                    f"({self.reason}); it runs uncompiled")

    def __call__(self, *args: Any) -> Any:
        if self.state == "plain":
            return self.fn(*args)
        if self.state == "pending":
            with self._lock:
                if self.state == "pending":
                    try:
                        compiled = torch.compile(self.fn, backend="inductor", **self.options)
                        out = compiled(*args)
                    except Exception as e:    # compile happens before the task's kernels run
                        self._fall_back(e)
                        return self.fn(*args)
                    self._compiled, self.state = compiled, "compiled"
                    return self._dense(out)
            return self(*args)
        try:
            return self._dense(self._compiled(*args))
        except _dynamo_error() as e:
            self._fall_back(e)
            return self.fn(*args)

    def _dense(self, out: tuple) -> tuple:
        if not any(isinstance(out[i], torch.Tensor) and not out[i].is_contiguous() for i in self.leaving):
            return out
        return tuple(x.contiguous() if i in self.leaving and isinstance(x, torch.Tensor) else x
                     for i, x in enumerate(out))


def compile_task(name: str, stream: str, fn: Callable, leaving: tuple = ()) -> Callable:
    """``fn`` wrapped to be compiled on first call, or ``fn`` itself on a stream kept plain;
    ``leaving``: positions of its outputs read outside compiled code."""
    if stream in PLAIN_STREAMS or getattr(torch, "compile", None) is None:
        return fn
    return CompiledTask(name, fn, leaving, fullgraph=True, dynamic=False,
                        options={"keep_output_stride": False})

