"""Elementwise fusion: each maximal region of elementwise nodes whose intermediates are read only
inside the region becomes ONE node whose kernel is a generated Python function of the member
kernels, compiled by Inductor (``compile_tasks.inductor``: traced to ATen on fake tensors, static
shapes; an input in another layout than compiled for runs the Python sequence).

Regions grow along single-reader edges: a node joins the region of the producer of one of its
inputs when it is that value's only reader (so the region is a tree rooted at its one output)
and both carry the same tags (a checkpoint's ``recompute`` copy never merges with the original).
Forward and backward nodes are alike here. Members are the ops declared ``elementwise``
(core/registry.py: one device, so ``to`` is not one); random ops, effect nodes and nodes carrying
their own kernel stay outside.

Compilation (``config.fuse_elementwise_compile``):

- ``"background"`` (default): the first call of a region starts the compile in a daemon
  thread and runs the unfused Python sequence until the compiled kernel is ready (Inductor's
  first region on a cold 2-core CPU machine can take minutes of C++ toolchain warm-up);
- ``"sync"``: compile on the first call (benchmarks, tests of the compiled path);
- ``"off"``: the Python sequence only (still one node: fewer dispatches and ``del``\\ s).

Compiled kernels are cached by the region's structure (ops, attrs, constants, input metas), so
equal regions — every layer of a stack — compile once. If compiling fails, the region keeps the
Python sequence and the reason is logged once.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ...core.registry import REGISTRY
from ..compile_tasks import inductor
from ..ir import IRGraph, Node, Value
from . import register
from .cse import const_key

LOG = logging.getLogger("holoflow.graph")
_WARNED: set = set()
_CACHE: dict = {}              # structure key -> _Entry
_LOCK = threading.Lock()


def fusible(n: Node) -> bool:
    op = REGISTRY.get(n.op)
    return (op is not None and op.elementwise and not op.random and not n.effect
            and n.kernel is None and len(n.outputs) == 1)


def regions(g: IRGraph) -> list[list[Node]]:
    """Groups of fusible nodes (in program order); each group's intermediates stay inside."""
    users = g.users()
    outside = {o for o in g.outputs if isinstance(o, Value)} | {v for _, v in g.updates}
    producer = g.producers()
    region_of: dict[int, list[Node]] = {}
    out: list[list[Node]] = []
    for n in g.nodes:
        if not fusible(n):
            continue
        mine: list[Node] | None = None
        for x in n.value_inputs():
            p = producer.get(x)
            if p is None or id(p) not in region_of or x in outside or p.tags != n.tags:
                continue
            if any(u is not n for u in users.get(x, ())):
                continue
            r = region_of[id(p)]
            if mine is None:
                mine = r
            elif r is not mine:           # two regions meet at n: merge them
                mine.extend(r)
                for m in r:
                    region_of[id(m)] = mine
                out.remove(r)
        if mine is None:
            mine = []
            out.append(mine)
        mine.append(n)
        region_of[id(n)] = mine
    order = {id(n): i for i, n in enumerate(g.nodes)}
    return [sorted(r, key=lambda m: order[id(m)]) for r in out if len(r) > 1]


class _Entry:
    """One region structure: its Python function and, once compiled, its Inductor kernel."""

    def __init__(self, fn: Callable, name: str) -> None:
        self.fn, self.name = fn, name
        self.compiled: Callable | None = None
        self.started = False

    def compile(self, example: tuple) -> None:
        try:
            self.compiled = inductor(self.fn, example)
        except Exception as e:  # any compiler failure: keep the exact Python sequence
            _warn_once(f"{type(e).__name__}: {str(e)[:200]}", self.name)

    def start(self, example: tuple, mode: str) -> None:
        with _LOCK:
            if self.started:
                return
            self.started = True
        if mode == "sync":
            self.compile(example)
        else:
            # shapes, strides and dtypes are what tracing reads (on fake tensors): no values kept
            example = tuple(torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                            if isinstance(x, torch.Tensor) else x for x in example)
            threading.Thread(target=self.compile, args=(example,), daemon=True,
                             name=f"holoflow-compile-{self.name}").start()


def _warn_once(reason: str, region: str) -> None:
    """Logs a compile failure once per distinct reason (not once per region)."""
    if reason not in _WARNED:
        _WARNED.add(reason)
        LOG.warning(f"holoflow.nn.Graph fuse_elementwise: Inductor cannot compile {region} ({reason}); "
                    f"running the unfused Python sequence")


class FusedKernel:
    """The kernel of a fused node: the compiled region when ready, else the Python sequence."""

    def __init__(self, entry: _Entry, mode: str, source: str) -> None:
        self.entry, self.mode, self.source = entry, mode, source
        self.__name__ = entry.name

    def __call__(self, *args):
        e = self.entry
        if args and isinstance(args[0], FakeTensor):
            # traced by enable_compile (graph/compile_tasks.py: make_fx on fake tensors), which
            # compiles the whole task: the Python sequence, not a compiled region it cannot trace
            return e.fn(*args)
        if self.mode != "off" and not e.started:
            e.start(args, self.mode)
        if e.compiled is not None:
            try:
                return e.compiled(*args)
            except AssertionError as err:   # Inductor's input checks, before any kernel: another
                if "expected size" not in str(err):   # layout than compiled for (a strided input)
                    raise
        return e.fn(*args)


def build_function(region: list[Node]) -> tuple[Callable, str, list, tuple]:
    """Generated Python for a region: ``(fn, source, external inputs, structure key)``."""
    inside = {v for n in region for v in n.outputs}
    ext: list = []
    ns: dict[str, Any] = {}
    names: dict = {}
    lines, key = [], []
    for k, n in enumerate(region):
        args = []
        for i, x in enumerate(n.inputs):
            if isinstance(x, Value) and x in inside:
                args.append(names[x])
                key.append(("t", names[x]))
            elif isinstance(x, Value):
                if x not in ext:
                    ext.append(x)
                args.append(f"i{ext.index(x)}")
                key.append(("i", ext.index(x)))
            else:
                ns[f"c{k}_{i}"] = x
                args.append(f"c{k}_{i}")
                key.append(("c", const_key(x)))
        ns[f"k{k}"] = REGISTRY[n.op].kernel
        ns[f"a{k}"] = dict(n.attrs)
        names[n.outputs[0]] = f"t{k}"
        lines.append(f"    t{k} = k{k}({', '.join(args)}, **a{k})  # {n.op}")
        key.append((n.op, const_key(n.attrs)))
    name = "fused_" + "_".join(n.op for n in region)[:60]
    src = "\n".join([f"def {name}({', '.join(f'i{j}' for j in range(len(ext)))}):", *lines,
                     f"    return t{len(region) - 1}"])
    exec(compile(src, f"<holoflow fused {name}>", "exec"), ns)
    metas = tuple((v.shape, v.dtype, v.device) for v in ext)
    return ns[name], src, ext, (tuple(key), metas)


def fuse(region: list[Node], mode: str) -> Node:
    """One node for a region, with a cached kernel for its structure."""
    fn, src, ext, key = build_function(region)
    with _LOCK:
        entry = _CACHE.get(key)
        if entry is None:
            entry = _CACHE[key] = _Entry(fn, fn.__name__)
    root = region[-1]
    return Node("fused_elementwise", tuple(ext), {}, root.outputs, root.source, root.scope,
                kernel=FusedKernel(entry, mode, src), tags=root.tags | {"fresh"})


@register("fuse_elementwise", enabled=lambda cfg: getattr(cfg, "fuse_elementwise", False))
def fuse_elementwise(g: IRGraph, config=None) -> IRGraph:
    """Replaces each elementwise region by one fused node (see the module docstring)."""
    mode = getattr(config, "fuse_elementwise_compile", "background")
    if mode not in ("background", "sync", "off"):
        raise ValueError(f"holoflow.nn.Graph: fuse_elementwise_compile must be 'background', 'sync' "
                         f"or 'off', got {mode!r}")
    rs = regions(g)
    if not rs:
        return g
    root_of = {id(r[-1]): r for r in rs}
    members = {id(n) for r in rs for n in r}
    nodes = []
    for n in g.nodes:
        if id(n) in root_of:
            nodes.append(fuse(root_of[id(n)], mode))
        elif id(n) not in members:
            nodes.append(n)
    return g.with_(nodes=tuple(nodes))
