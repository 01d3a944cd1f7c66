"""Grad nodes: what dispatch records per op application (:class:`GradNode`, also the ``ctx`` a
grad rule reads), a node that saved through pack hooks (:class:`PackedNode`), and the parts of
``torch.autograd.graph.Node`` the engine honours (``next_functions``, ``metadata``, node pre- and
post-hooks, a leaf's :class:`AccumulateGrad`). The engine that runs them is core/autograd.py.
"""
from __future__ import annotations

import contextvars
import itertools
import weakref
from typing import Any, Callable, NamedTuple

from . import anomaly, grad_mode
from .registry import Op
from .saved import _LIVE, SavedTensor, current as _saved_hooks, pack
from .tensor import Tensor, _LevelHook, _RemovableHandle, is_inference_tensor, refuse_inference_saved

_FREED = object()

# every node's creation number (torch's sequence_nr): the engine runs the ready node made last
# first. One counter for the Python and the C paths (core/_fast.c's ``record`` draws from it).
SEQ = itertools.count()


class GraphTask:
    """The backward pass in progress: callbacks queued for its end, and what it will run (for
    ``autograd.graph.register_multi_grad_hook``)."""

    __slots__ = ("id", "callbacks", "deps", "leaf_deps", "runs", "cap_keys", "accumulate")


_TASK: contextvars.ContextVar[GraphTask | None] = contextvars.ContextVar("holoflow_backward_task",
                                                                         default=None)


class GradNode:
    """One recorded op application; also the ``ctx`` its grad rule reads."""

    __slots__ = ("op", "edges", "attrs", "shapes", "dtypes", "_saved", "_versions", "_outs",
                 "out_metas", "hooks", "retains", "seq", "__weakref__")

    def __init__(self, op, edges: tuple, attrs: dict, shapes: tuple, dtypes: tuple) -> None:
        self.seq = next(SEQ)
        self.op, self.edges, self.attrs = op, edges, attrs
        self.shapes, self.dtypes = shapes, dtypes
        self._saved = self._outs = self._versions = None
        self.out_metas = None
        self.hooks = self.retains = None

    # -- what grad rules read --------------------------------------------------------------
    def __getattr__(self, name: str):
        try:
            return self.attrs[name] if name in self.attrs else self.op.defaults[name]
        except (KeyError, TypeError):
            raise AttributeError(f"grad ctx of {self.op.name!r} has no attribute {name!r}") from None

    @property
    def needs_grad(self) -> tuple[bool, ...]:
        return tuple([e is not None for e in self.edges])

    @property
    def inputs(self) -> tuple:
        saved, versions = self._saved, self._versions
        if saved is _FREED:
            self._check_saved()
        if versions is not None:
            for t, v in versions:
                if t._version != v:
                    self._check_saved()
        return saved

    @property
    def outs(self) -> tuple:
        self._check_saved()
        make = Tensor._make
        fn = self if grad_mode.STATE.enabled else None
        return tuple([make(d, fn, i) if d is not None else None for i, d in enumerate(self._outs)])

    @property
    def out(self):
        return self.outs[0]

    def _check_saved(self) -> None:
        if self._saved is _FREED:
            raise RuntimeError(
                f"holoflow: trying to backward through the graph a second time (or to read the "
                f"saved tensors of {self.name()} after they were freed). Pass retain_graph=True "
                f"to the first backward() or autograd.grad() call if you need to do that.")
        if self._versions is None:
            return
        for t, v in self._versions:
            if t._version != v:
                raise RuntimeError(
                    f"holoflow: one of the tensors needed for gradient computation has been "
                    f"modified by an in-place operation: a tensor of shape {tuple(t.shape)} saved by "
                    f"{self.name()} is at version {t._version}; expected version {v}. Use an "
                    f"out-of-place op (e.g. x = x + y instead of x += y) before this point.")

    def save(self, inputs: tuple | None, outs: tuple | None) -> None:
        """Keeps what the grad rule reads, with storage versions to detect in-place changes; an
        inference tensor is refused, as torch's, but for forward mode's own reverse passes (torch's
        forward mode saves nothing; while it runs, saves go through its hooks, so here)."""
        if grad_mode.INFERENCE_MADE[0] and inputs is not None and \
                any(isinstance(x, Tensor) and is_inference_tensor(x) for x in inputs) and \
                not grad_mode.forward_mode_runs():
            refuse_inference_saved(self.op.name)
        if _LIVE[0]:   # saved-tensor hooks pushed in some thread: this one's, if any, pack
            hooks = _saved_hooks()
            if hooks is not None:
                self._save_packed(hooks, inputs, outs)
                return
        versions = []
        if inputs is not None:
            self._saved = inputs
            for x in inputs:
                if x is None:   # (a position the rule does not read)
                    continue
                d = getattr(x, "_data", None)
                if d is not None:
                    versions.append((d, d._version))
        else:
            self._saved = ()
        if outs is not None:
            self._outs = outs
            for d in outs:
                if d is not None:
                    versions.append((d, d._version))
        self._versions = versions or None

    def _save_packed(self, hooks: tuple, inputs: tuple | None, outs: tuple | None) -> None:
        """``save`` under saved-tensor hooks (core/saved.py): packs what the rule reads; the node
        becomes a :class:`PackedNode`, whose accessors unpack (the plain ones stay branch-free)."""
        T = Tensor
        self._saved = () if inputs is None else tuple([pack(x, hooks) if isinstance(x, T) else x
                                                       for x in inputs])
        if outs is not None:   # the pack hook sees the output as the tensor it is (grad_fn: this node)
            self._outs = tuple([None if d is None else
                                pack(T._make(d, self if d.is_floating_point() or d.is_complex() else None, i),
                                     hooks) for i, d in enumerate(outs)])
        self._versions = None
        self.__class__ = PackedNode

    def moved_output(self, old, new) -> None:
        """An in-place op's result ``old`` now lives in ``new`` (the tensor it wrote to): a saved
        output follows it, so a later in-place change of ``new`` is caught as torch catches it."""
        if self._outs is None or self._outs is _FREED or not any(d is old for d in self._outs):
            return
        self._outs = tuple(new if d is old else d for d in self._outs)
        self._versions = [(new, new._version) if t is old else (t, v) for t, v in self._versions or ()] or None

    def release(self) -> None:
        if self.op.save:
            self._saved, self._outs, self._versions = _FREED, None, None

    @property
    def n_outputs(self) -> int:
        return 1 if self.out_metas is None else len(self.out_metas)

    def name(self) -> str:
        return f"<{self.op.name.title().replace('_', '')}Backward>"

    def _sequence_nr(self) -> int:
        """torch's ``Node._sequence_nr()``: the node's creation number; of the nodes ready at
        once, backward runs the one with the largest first."""
        return self.seq

    # -- torch.autograd.graph.Node ------------------------------------------------------------
    @property
    def next_functions(self) -> tuple:
        """``(node, output index)`` per input: a leaf's is its :class:`AccumulateGrad`, an input
        without a gradient ``(None, 0)``."""
        return tuple([e if type(e) is tuple else (None, 0) if e is None else (grad_accumulator(e), 0)
                      for e in self.edges])

    @property
    def metadata(self) -> dict:
        return anomaly.metadata(self)

    def register_hook(self, fn: Callable) -> Any:
        """torch's ``Node.register_hook``: ``fn(grad_inputs, grad_outputs)`` after the rule ran; it
        may return new ``grad_inputs``."""
        hooks = self._hook_list("post")
        fn = _at_level(fn, self.seq)
        hooks.append(fn)
        return _RemovableHandle(hooks, fn)

    def register_output_hook(self, idx: int, fn: Callable) -> None:
        """A tensor hook (``Tensor.register_hook``) on output ``idx``'s gradient, before the rule."""
        self._hook_list(idx).append(fn)

    def register_prehook(self, fn: Callable) -> Any:
        """torch's ``Node.register_prehook``: ``fn(grad_outputs)`` before the rule (after the
        tensors' hooks and ``retain_grad``); it may return new ``grad_outputs``."""
        hooks = self._hook_list("pre")
        fn = _at_level(fn, self.seq)
        hooks.append(fn)
        return _RemovableHandle(hooks, fn)

    def _hook_list(self, key) -> list:
        """``hooks[key]``: an output index's tensor hooks, or the node's "pre" / "post" hooks."""
        if self.hooks is None:
            self.hooks = {}
        return self.hooks.setdefault(key, [])

    def __repr__(self) -> str:
        return self.name()


class PackedNode(GradNode):
    """A node that saved through pack hooks: a rule's reads unpack (once per backward pass that
    runs the rule: the tuple is kept in ``_versions``, which no version check needs here, until
    the rule returned). As torch's, no version counter is checked: the hooks own the values."""

    __slots__ = ()

    @property
    def inputs(self) -> tuple:
        return self._unpacked()[0]

    @property
    def outs(self) -> tuple:
        make = Tensor._make
        fn = self if grad_mode.STATE.enabled else None
        return tuple([make(t._data, fn, i) if t is not None else None for i, t in enumerate(self._unpacked()[1])])

    def _unpacked(self) -> tuple:
        self._check_saved()
        task, cache = _TASK.get(), self._versions
        if cache is not None and cache[0] is task:
            return cache[1]
        ins = tuple([unpack_saved(s) if type(s) is SavedTensor else s for s in self._saved])
        outs = () if self._outs is None else tuple([None if s is None else unpack_saved(s) for s in self._outs])
        if task is not None:
            self._versions = (task, (ins, outs))
        return ins, outs

    def _check_saved(self) -> None:
        if self._saved is _FREED:
            GradNode._check_saved(self)

    def moved_output(self, old, new) -> None:
        return   # (what was packed is the hooks'; no version follows it)


def unpack_saved(s: SavedTensor):
    """The tensor a rule reads from a packed one: ``unpack_hook(packed)``'s values with the
    original's autograd identity (never the unpacked value's own history, as torch's)."""
    T = Tensor
    u = s.unpack(s.packed)
    if not isinstance(u, T):
        raise TypeError(f"holoflow.autograd.graph: output of saved tensor unpack_hook expected to be a "
                        f"Tensor but got result of type {type(u).__name__}")
    leaf = s.leaf
    if leaf is not None:
        if u._data is leaf._data:
            return leaf
        # what a rule computes from it under create_graph must reach the leaf itself
        t = T._make(u._data, _leaf_link(leaf) if grad_mode.STATE.enabled else None)
        t._rg = True
    else:
        t = T._make(u._data, s.grad_fn, s.out_idx)
        t._rg = s.rg
    t._global = s.glob
    return t


_SAVED_LEAF = Op("saved_leaf", kernel=None, grad=lambda ctx, dy: (dy,))


def _leaf_link(leaf) -> GradNode:
    """A node handing its gradient to ``leaf``: what an unpacked copy of a leaf hangs from."""
    node = GradNode(_SAVED_LEAF, (leaf,), {}, (leaf._data.shape,), (leaf._data.dtype,))
    node._saved = ()
    return node


class AccumulateGrad:
    """The node of a leaf in ``next_functions`` (torch's AccumulateGrad): ``variable`` is the leaf.
    One per leaf while it lives; it holds the leaf weakly (the leaf's dict holds it)."""

    def __init__(self, leaf) -> None:
        self._leaf = weakref.ref(leaf)

    @property
    def variable(self):
        return self._leaf()

    def name(self) -> str:
        return "<AccumulateGrad>"

    def _sequence_nr(self) -> int:
        """torch's: UINT64_MAX, so a leaf whose gradients all came goes before any ready node."""
        return (1 << 64) - 1

    @property
    def next_functions(self) -> tuple:
        return ()

    @property
    def metadata(self) -> dict:
        return anomaly.metadata(self)

    def register_prehook(self, fn: Callable) -> Any:
        """``fn(grad_outputs)`` before the gradient is accumulated: a hook on the leaf's gradient."""
        leaf = self._leaf()

        def hook(g):
            r = fn((g,))
            return None if r is None else _one_grad(fn, r)
        hook = _at_level(hook, None, leaf.__dict__.get("_func_level", 0))
        if leaf._hooks is None:
            leaf._hooks = []
        leaf._hooks.append(hook)
        return _RemovableHandle(leaf._hooks, hook)

    def register_hook(self, fn: Callable) -> Any:
        """``fn((), (grad,))`` after the gradient was accumulated into the leaf's ``.grad``."""
        hooks = self._leaf().__dict__.setdefault("_post_acc_hooks", [])
        h = AccumulatePostHook(fn)
        hooks.append(h)
        return _RemovableHandle(hooks, h)

    def __repr__(self) -> str:
        return self.name()


class AccumulatePostHook:
    """An ``AccumulateGrad.register_hook`` hook among the leaf's post-accumulate hooks: the engine
    calls ``fn((), (grad,))`` where it calls the others with the leaf."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable) -> None:
        self.fn = fn


class GradientEdge(NamedTuple):
    """A gradient edge of the graph: ``node`` (a grad node, or a leaf's AccumulateGrad) and the
    index of its output; ``autograd.graph.get_gradient_edge(t)`` is where ``t``'s gradient is
    computed."""

    node: GradNode | AccumulateGrad
    output_nr: int
    ownership_token: GradNode | AccumulateGrad | None = None


def grad_accumulator(leaf) -> AccumulateGrad:
    acc = leaf.__dict__.get("_grad_accumulator")
    if acc is None:
        acc = leaf.__dict__["_grad_accumulator"] = AccumulateGrad(leaf)
    return acc


def _one_grad(fn, r):
    if not isinstance(r, tuple) or len(r) != 1:
        raise RuntimeError(f"holoflow.autograd.graph: hook '{_hook_name(fn)}' has returned an incorrect "
                           f"number of values (got {len(r) if isinstance(r, tuple) else type(r).__name__}, "
                           f"but expected 1)")
    return r[0]


def _hook_name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _at_level(hook: Callable, seq: int | None, leaf_level: int = 0) -> Callable:
    """A hook on the node numbered ``seq`` (None: a leaf's AccumulateGrad, of the transform at
    ``leaf_level``): one recorded inside a holoflow.func transform fires in that transform's
    backward passes alone, as torch.func's, whose node there is the transform's own (a node
    recorded outside belongs to the code outside). The transform is the innermost one that began
    before the node was recorded (core/tensor._LevelHook)."""
    state = grad_mode.STATE
    level = state.level
    if seq is None:
        level = min(level, leaf_level)
    else:
        while level > 0 and state.starts.get(level, seq + 1) > seq:
            level -= 1
    return _LevelHook(hook, level) if level > 0 else hook


def _run_node_hooks(hooks: list, n: int, *args) -> list:
    """Node pre-hooks (``args``: the output gradients) or post-hooks (the input gradients, the
    output gradients), in order, those of the running backward pass's level (``_at_level``);
    each may return a replacement of its first argument."""
    first = list(args[0])
    level = grad_mode.STATE.level
    for h in hooks:
        if getattr(h, "transform_level", 0) != level:
            continue
        r = h(tuple(first), *args[1:])
        if r is None:
            continue
        if not isinstance(r, (tuple, list)) or len(r) != n:
            got = len(r) if isinstance(r, (tuple, list)) else type(r).__name__
            raise RuntimeError(f"holoflow.autograd.graph: hook '{_hook_name(h)}' has returned an incorrect "
                               f"number of values (got {got}, but expected {n})")
        first = list(r)
    return first
