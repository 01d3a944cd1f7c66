"""The graph IR: a list of equations in SSA form (DESIGN §7).

A :class:`Graph` has ``feeds`` (values given per call), ``state`` (values read from live tensors:
parameters, buffers, optimizer state, captured constants), ``nodes`` (``outs = op(ins, attrs)``)
and ``outputs``; ``updates`` writes values back into state tensors after a step. Values are
immutable and carry their meta. ``str(graph)`` prints readable Python; :func:`check` verifies
the invariants every pass must keep.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..core.errors import HoloflowError
from ..core.registry import REGISTRY

_IDS = itertools.count()


@dataclass(frozen=True, eq=False)
class Value:
    """One SSA value: its meta (shape, dtype, device) and a readable name."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device = torch.device("cpu")
    name: str = ""
    id: int = field(default_factory=lambda: next(_IDS))

    def __repr__(self) -> str:
        return self.name or f"v{self.id}"

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.dtype.itemsize

    @staticmethod
    def like(t: torch.Tensor, name: str = "") -> "Value":
        return Value(tuple(t.shape), t.dtype, t.device, name)


@dataclass(frozen=True, eq=False)
class Node:
    """``outputs = op(*inputs, **attrs)``; inputs are Values or Python constants.

    ``effect`` marks nodes kept for what they do to state (optimizer updates); ``scope`` is the
    module path that produced it (for activation checkpointing and stage placement); ``kernel``
    overrides the registry kernel (fused nodes carry their own).
    """

    op: str
    inputs: tuple
    attrs: dict
    outputs: tuple
    source: str = ""
    scope: str = ""
    effect: bool = False
    kernel: Any = None
    tags: frozenset = frozenset()

    def fn(self):
        return self.kernel if self.kernel is not None else REGISTRY[self.op].kernel

    def value_inputs(self) -> list[Value]:
        return [v for v in self.inputs if isinstance(v, Value)]

    def with_(self, **changes) -> "Node":
        return replace(self, **changes)


@dataclass(frozen=True, eq=False)
class Graph:
    feeds: tuple
    state: tuple          # (Value, tensor object) pairs
    nodes: tuple
    outputs: tuple        # Values (or constants)
    updates: tuple = ()   # (tensor object, Value): state written back after the step
    out_spec: Any = None  # how to rebuild the user's nested output structure
    frees: Any = None     # memory plan: id(node) -> values dead after it (set by memory_plan)

    def with_(self, **changes) -> "Graph":
        return replace(self, **changes)

    def __str__(self) -> str:
        return to_python(self)

    def producers(self) -> dict[Value, Node]:
        return {v: n for n in self.nodes for v in n.outputs}

    def users(self) -> dict[Value, list[Node]]:
        out: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in n.value_inputs():
                out.setdefault(v, []).append(n)
        return out


def _fmt(x) -> str:
    if isinstance(x, Value):
        return repr(x)
    if isinstance(x, torch.dtype):
        return str(x)
    return repr(x)


def to_python(g: Graph, max_nodes: int | None = None) -> str:
    """The graph as readable Python: one line per node, with shapes as comments."""
    lines = [f"def graph({', '.join(map(repr, g.feeds))}):"]
    for v, _t in g.state:
        lines.append(f"    {v!r} = state()  # {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}")
    nodes = g.nodes if max_nodes is None else g.nodes[:max_nodes]
    for n in nodes:
        outs = ", ".join(map(repr, n.outputs)) or "_"
        args = ", ".join(_fmt(x) for x in n.inputs)
        kw = "".join(f", {k}={_fmt(v)}" for k, v in n.attrs.items() if not k.startswith("_"))
        shapes = "; ".join(f"{tuple(o.shape)}" for o in n.outputs)
        where = f"  @ {n.source}" if n.source else ""
        eff = "  [effect]" if n.effect else ""
        lines.append(f"    {outs} = {n.op}({args}{kw})  # {shapes}{eff}{where}")
    if max_nodes is not None and len(g.nodes) > max_nodes:
        lines.append(f"    ...  # {len(g.nodes) - max_nodes} more nodes")
    for _t, v in g.updates:
        lines.append(f"    assign(state, {v!r})")
    lines.append(f"    return {', '.join(_fmt(o) for o in g.outputs)}")
    return "\n".join(lines)


def check(g: Graph, where: str = "") -> Graph:
    """Verifies SSA and meta invariants; raises naming the first broken node. Returns ``g``."""
    defined: set = set(g.feeds) | {v for v, _ in g.state}
    ctx = f" after {where}" if where else ""
    if len(defined) != len(g.feeds) + len(g.state):
        raise HoloflowError(f"IR check{ctx}: a feed or state value is defined twice")
    for i, n in enumerate(g.nodes):
        if n.kernel is None and n.op not in REGISTRY:
            raise HoloflowError(f"IR check{ctx}: node {i} uses unknown op {n.op!r} and has no kernel")
        for v in n.value_inputs():
            if v not in defined:
                raise HoloflowError(f"IR check{ctx}: node {i} ({n.op}) reads {v!r} before it is defined")
        for v in n.outputs:
            if not isinstance(v, Value):
                raise HoloflowError(f"IR check{ctx}: node {i} ({n.op}) has a non-Value output {v!r}")
            if v in defined:
                raise HoloflowError(f"IR check{ctx}: node {i} ({n.op}) redefines {v!r} (not SSA)")
            defined.add(v)
    for o in g.outputs:
        if isinstance(o, Value) and o not in defined:
            raise HoloflowError(f"IR check{ctx}: output {o!r} is never defined")
    for t, v in g.updates:
        if v not in defined:
            raise HoloflowError(f"IR check{ctx}: state update reads undefined {v!r}")
        if tuple(t.shape) != tuple(v.shape):
            raise HoloflowError(f"IR check{ctx}: state update of shape {tuple(v.shape)} into a tensor "
                                f"of shape {tuple(t.shape)}")
    return g
