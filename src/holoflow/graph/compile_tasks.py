"""``graph.config.enable_compile()``: each task's generated function compiled by Inductor.

Lowering (graph/lower.py) turns a graph into one Python function of direct kernel calls per task
(graph/ir.py ``program``). With the switch on, the functions of the ``compute`` tasks are wrapped in
:class:`CompiledTask`: the first call traces the function to an ATen FX graph (``make_fx`` on fake
tensors: no kernel runs) and hands it to Inductor (``torch._inductor.compile``), so Inductor fuses
the conv / batch-norm / activation regions and elementwise chains of forward *and* backward (the
program already holds backward as explicit kernels: no autograd is involved). A task reading
state takes it as arguments (the program reads the live tensors and calls the compiled
function). No dynamo: the program is straight-line code already, and dynamo's guards on each
call's ~40 arguments cost ~0.1 ms per task call on the CNN (AOTAutograd still handles inputs
written in place and outputs that alias inputs). What dynamo's guards checked is checked here:
the plan is keyed by the feeds' shapes and dtypes and the state's dtypes (graph.py: a model
cast between calls, ``model.double()``, traces a new plan), and Inductor's code asserts every
input's sizes and strides before any kernel runs; an input in a new layout (a strided batch)
compiles once more for it (up to ``MAX_LAYOUTS``, then the task runs plain).

Tasks that issue collectives, and runs of nodes whose ops declare their kernels ``opaque`` to
tracing on their device (CUDA attention runs torch's own autograd node), are tasks of their own
(graph/ir.py ``split_tasks``) and stay plain, as do tasks on the ``copy`` and ``update`` streams,
and so does everything when the graph is profiled (per-node timing needs the plain lines). The
``update`` task runs the optimizer's own update rule on the live state (graph/optimizer.py) as
multi-tensor kernels, one call per operation over every parameter, or as one fused kernel with
``config.allow_fuse_model_update_ops`` (torch's ``_fused_adamw_``, CPU and CUDA) — the faster of
the two; there is little left for Inductor there, and its state lookups are Python.

Values passed from one compiled task to another keep the layouts Inductor chose for them
(``keep_output_stride=False``: the CNN's activations and weight gradients stay channels-last
between its forward and backward tasks instead of being converted to eager's strides and back);
an output leaving compiled code (read by a plain task, a graph output, a state update) is made
contiguous when it is not, so plain kernels, collectives and the optimizer see dense tensors —
unless it is a view of an input (``return self.weight.t()``), which stays a view as in the plain
program.

A task that cannot be traced (a kernel reading a tensor's value, ``.item()``, an op without a
fake kernel) fails before anything ran: the wrapper then warns once, naming the task and the
reason, and runs the plain function from then on.

An exception of a compiled call is raised from Inductor's code, whose traceback names no op of the
task. The wrapper then runs the plain function on the same arguments, once, to locate it: what the
plain run raises propagates (its traceback passes the program line of the failing kernel, which
the graph turns into the op and the user's source line, as for an uncompiled task); if the plain
run does not fail, the compiled call's exception propagates and the graph names every op of the
task. Nothing of this runs on the success path. A device error that leaves the device unusable
(a CUDA device-side assert) is not re-run: every kernel after it fails too.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import torch

LOG = logging.getLogger("holoflow.graph")

PLAIN_STREAMS = ("copy", "update")   # bytes, the optimizer's own kernels

_PLAIN = object()   # a layout the task runs uncompiled for

# errors after which the device runs no more kernels (a device-side assert): not re-run to locate
_DEVICE_ERRORS = tuple(c for c in (getattr(torch, "AcceleratorError", None),) if c is not None)

# Inductor's first use initializes process-wide tables: one compile at a time (simulated ranks
# are threads of one process), as dynamo's own compile lock does
_COMPILE_LOCK = threading.RLock()


def inductor(fn: Callable, args: tuple, options: dict | None = None) -> Callable:
    """``fn`` traced to ATen on fake tensors shaped as ``args`` (no kernel runs) and compiled by
    Inductor: a function of the same arguments returning what ``fn`` returns (a tensor or a
    tuple). Raises what tracing or compiling raises. One compile at a time per process."""
    from torch._inductor import compile as inductor_compile
    from torch.fx.experimental.proxy_tensor import make_fx
    with _COMPILE_LOCK:
        gm = make_fx(fn, tracing_mode="fake")(*args)
        one = isinstance(gm.graph.find_nodes(op="output")[0].args[0], torch.fx.Node)
        compiled = inductor_compile(gm, list(args), options)
    if not one:
        return compiled

    def single(*xs):
        out = compiled(*xs)
        return out[0] if isinstance(out, (list, tuple)) else out
    return single


def _layout(args: tuple) -> tuple:
    """What a compiled function is specialized to: every tensor's sizes, strides (Inductor's code
    asserts them) and dtype."""
    return tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else None for a in args)


class CompiledTask:
    """A task function, compiled on first call; the plain function if compiling fails.

    ``state`` is ``"pending"`` (not called yet), ``"compiled"`` or ``"plain"`` (``reason`` says why);
    ``leaving``: positions of the outputs that leave compiled code (made contiguous).
    """

    MAX_LAYOUTS = 8

    def __init__(self, name: str, fn: Callable, leaving: tuple = (), options: dict | None = None) -> None:
        self.name, self.fn, self.options, self.leaving = name, fn, dict(options or {}), leaving
        self.state, self.reason = "pending", ""
        self._compiled: Callable | None = None
        self._layouts: dict = {}   # input layout -> compiled function
        self.__name__ = getattr(fn, "__name__", name)

    def _fall_back(self, e: BaseException) -> None:
        self._compiled = None
        self.state, self.reason = "plain", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        LOG.warning(f"holoflow: Inductor cannot compile task {self.name!r} "
                    f"({self.reason}); it runs uncompiled")

    def _compile(self, args: tuple) -> Callable | None:
        """The task compiled for ``args``' layout (None after falling back to plain)."""
        with _COMPILE_LOCK:
            key = _layout(args)
            got = self._layouts.get(key)
            if got is None and self.state != "plain":
                if len(self._layouts) >= self.MAX_LAYOUTS:
                    self._fall_back(RuntimeError(f"inputs came in more than {self.MAX_LAYOUTS} layouts"))
                    return None
                try:
                    got = self._layouts[key] = inductor(self.fn, args, self.options)
                except Exception as e:   # tracing and compiling run no kernel of the task
                    if not self._layouts:
                        self._fall_back(e)
                        return None
                    self._plain_layout(key, e)
                    return None
                self.state = "compiled"
            if got is _PLAIN:
                return None
            self._compiled = got
            return got

    def _plain_layout(self, key: tuple, e: BaseException) -> None:
        """Compiled for other layouts, the task cannot be traced for this one (a state tensor whose
        shape changed between calls so that its ops no longer fit): only this layout runs plain,
        where the failing op raises with its program line; the compiled layouts stay compiled."""
        self._layouts[key] = _PLAIN
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        LOG.warning(f"holoflow: Inductor cannot compile task {self.name!r} for "
                    f"inputs of shapes {[k[0] for k in key if k is not None]} ({why}); it runs uncompiled "
                    f"for them")

    def __call__(self, *args: Any) -> Any:
        fn = self._compiled
        if fn is None:
            fn = self._compile(args) if self.state == "pending" else None
            if fn is None:
                return self.fn(*args)
        try:
            out = fn(*args)
        except AssertionError as e:   # Inductor's input checks, before any kernel: a new layout
            if "expected size" not in str(e):
                self._locate(args, e)
                raise
            fn = self._compile(args)
            out = self._run(fn, args) if fn is not None else self.fn(*args)
        except Exception as e:
            self._locate(args, e)
            raise
        return self._dense(out, args)

    def _run(self, fn: Callable, args: tuple) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            self._locate(args, e)
            raise

    def _locate(self, args: tuple, error: Exception) -> None:
        """Runs the plain function on ``args`` after the compiled one raised ``error``, so that the
        error comes from the program line of the failing kernel (Inductor's code names no op):
        raises what the plain run raises, chained to ``error``; returns if it does not fail (the
        caller re-raises ``error``). Not after a device error that poisons the device."""
        if isinstance(error, _DEVICE_ERRORS):
            return
        try:
            self.fn(*args)
        except Exception as plain:
            raise plain from error

    def _dense(self, out: Any, args: tuple) -> tuple:
        """``out`` with its leaving outputs made contiguous, except views of an argument (a
        parameter's ``.t()`` returned by build): as in the plain program they stay views, so they
        show the update the step then makes and writes the caller makes."""
        strided = [i for i in self.leaving if isinstance(out[i], torch.Tensor) and not out[i].is_contiguous()]
        if not strided:
            return tuple(out)
        bases = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        dense = {i for i in strided if out[i].untyped_storage().data_ptr() not in bases}
        return tuple(x.contiguous() if i in dense else x for i, x in enumerate(out))


def compile_task(name: str, stream: str, fn: Callable, leaving: tuple = ()) -> Callable:
    """``fn`` wrapped to be compiled on first call, or ``fn`` itself on a stream kept plain;
    ``leaving``: positions of its outputs read outside compiled code."""
    if stream in PLAIN_STREAMS:
        return fn
    return CompiledTask(name, fn, leaving, options={"keep_output_stride": False})
