"""The interpreter stack: how an op application is evaluated right now.

``apply(op, *inputs, **attrs)`` (core/dispatch.py) hands the op to the innermost active
interpreter; each handles what it knows and binds on to the one below it (its ``parent``), JAX's
trace stack being the model. The bottom is always the eager interpreter (run the kernel, record
autograd). Above it, in the order they were entered: autocast (cast inputs, bind on), a graph
trace (record a node, return lazy tensors), test recorders. Global tensors carry their own
interpreter (``x._global.interpreter``): the eager interpreter hands them to it, and it binds the
local shards back to eager.

The stack is a context variable, so threads (simulated ranks, concurrent backward passes) never
see each other's interpreters. See docs/architecture.md, "Interpreters".

Writing one::

    class Count(Interpreter):
        def __init__(self):
            super().__init__(); self.names = []
        def bind(self, op, inputs, attrs):
            self.names.append(op.name)
            return self.parent.bind(op, inputs, attrs)

    with pushed(Count()) as c:
        y = x @ w
    c.names   # ['matmul']
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, TypeVar


class Interpreter:
    """One way of evaluating ops. Every method's default is to defer to ``parent``."""

    #: True while values are symbolic (a graph trace): reading data is impossible, and
    #: library fast paths that call torch directly must step aside.
    lazy = False

    def __init__(self) -> None:
        self.parent: Interpreter | None = None

    def bind(self, op, inputs: tuple, attrs: dict):
        """Evaluates ``op`` on ``inputs`` (Tensors or Python constants) with keyword ``attrs``."""
        return self.parent.bind(op, inputs, attrs)

    def assign(self, x, out, name: str):
        """Writes ``out`` into ``x`` (an in-place op), taking over its autograd history."""
        return self.parent.assign(x, out, name)

    def backward(self, tensors: list, grads: list, retain_graph: bool, create_graph: bool, inputs):
        """``Tensor.backward`` / ``autograd.backward`` of ``tensors`` seeded with ``grads``."""
        return self.parent.backward(tensors, grads, retain_graph, create_graph, inputs)

    def composite(self, name: str, inputs: tuple) -> tuple:
        """Inputs of a composite op written from primitives (autocast casts these by name)."""
        return self.parent.composite(name, inputs)

    def device_type_of(self, x) -> str:
        """The device type ``x`` lives on (a traced value: the device it will live on)."""
        return self.parent.device_type_of(x)

    def value_token(self, x) -> object:
        """Identifies ``x``'s current value where storage does not (a trace's symbolic value);
        views compare it to notice that their base was rewritten."""
        return self.parent.value_token(x)

    def overwrite(self, x, values) -> None:
        """``x``'s storage takes ``values``' values (of its shape and dtype), its history and
        everything saved of it unchanged: what a grad rule that saved ``x`` reads from now on."""
        return self.parent.overwrite(x, values)

    def creation_default(self) -> tuple | None:
        """``(placement, sbp)`` that creation ops without ``placement=`` use (a ``global_mode``
        scope), or None: create local tensors."""
        return self.parent.creation_default()

    def globalize(self, t, placement, sbp):
        """A new tensor ``t`` that every rank created identically, as a global tensor of
        ``placement`` and ``sbp`` (``t`` is the logical value)."""
        return self.parent.globalize(t, placement, sbp)

    def convert_global(self, x, placement, nd: tuple):
        """``x`` (a global tensor of live state: a parameter or buffer, not a value this stack
        computed) re-laid out to ``placement`` and nd-SBP ``nd`` as this interpreter evaluates it
        (a graph trace records the conversion of the live state, so each run reads it and
        backward passes through it), or None: convert it eagerly, now. The bottom of the stack
        answers None."""
        return None if self.parent is None else self.parent.convert_global(x, placement, nd)

    def above_trace(self, device_type: str) -> "Interpreter | None":
        """The interpreter to re-enter above a graph trace started while this one is active
        (autocast keeps casting lazy values as if they lived on ``device_type``); None to stay
        below it."""
        return None


_CURRENT: contextvars.ContextVar[Interpreter | None] = contextvars.ContextVar("holoflow_interpreter",
                                                                            default=None)
_BOTTOM: list[Interpreter] = []  # the eager interpreter, registered once by core/dispatch.py


def current() -> Interpreter:
    """The innermost active interpreter (the eager one when nothing is pushed)."""
    top = _CURRENT.get()
    return top if top is not None else _BOTTOM[0]


def composite(name: str, *inputs) -> tuple:
    """``inputs`` as a composite op written from primitives receives them: autocast applies the
    policy torch lists ``name`` under (``mse_loss``: float32) at its boundary."""
    return current().composite(name, inputs)


def stack() -> list[Interpreter]:
    """Active interpreters, innermost first, down to the eager one."""
    out, it = [], current()
    while it is not None:
        out.append(it)
        it = it.parent
    return out


def plain() -> bool:
    """Whether nothing is pushed: ops run on the eager interpreter itself (no autocast region,
    trace or observer)."""
    return _CURRENT.get() is None


def is_lazy() -> bool:
    """Whether ops are being traced (values are symbolic) in this context."""
    top = _CURRENT.get()
    return top is not None and top.lazy_below


def token_of(x) -> object:
    """``value_token(x)`` of the active stack (None when no interpreter below the innermost one
    tracks values: then storage identifies a value)."""
    top = _CURRENT.get()
    if top is None:
        return None
    src = top.token_source
    return None if src is None else src.value_token(x)


def _token_source(interp: Interpreter) -> Interpreter | None:
    """The interpreter whose ``value_token`` answers for ``interp``'s (the first on the way down
    that defines its own); None when that is the eager one, whose tokens are all None."""
    it = interp
    while it is not None and type(it).value_token is Interpreter.value_token:
        it = it.parent
    return None if it is None or (_BOTTOM and it is _BOTTOM[0]) else it


I = TypeVar("I", bound=Interpreter)


@contextlib.contextmanager
def pushed(interp: I) -> Iterator[I]:
    """Makes ``interp`` the innermost interpreter for the ``with`` block (this context only)."""
    interp.parent = parent = current()
    # what every op's bookkeeping asks of the whole stack, worked out once per push
    interp.lazy_below = bool(interp.lazy or getattr(parent, "lazy_below", parent.lazy))
    interp.token_source = _token_source(interp)
    token = _CURRENT.set(interp)
    try:
        yield interp
    finally:
        _CURRENT.reset(token)
        interp.parent = None


class Observe(Interpreter):
    """Calls ``fn(op, inputs, attrs)`` for every op reaching it, then binds on unchanged (op
    counters, recorders in tests and tools)."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def bind(self, op, inputs: tuple, attrs: dict):
        self.fn(op, inputs, attrs)
        return self.parent.bind(op, inputs, attrs)
