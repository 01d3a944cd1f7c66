"""The graph IR: a list of equations in SSA form (docs/architecture.md), and the one
Python program it lowers to.

A :class:`IRGraph` has ``feeds`` (values given per call), ``state`` (values read from live tensors:
parameters, buffers, optimizer state, captured constants), ``nodes`` (``outs = op(ins, attrs)``)
and ``outputs``; ``updates`` writes values back into state tensors after a step. Values are
immutable and carry their meta; every node carries the user's source line it was traced from
(nodes made by passes inherit the line of the node they derive from). :func:`check` verifies
the invariants every pass must keep.

:func:`program` turns a graph into Python source: one function per *task* (a straight-line run
of nodes on one stream) made of direct kernel calls, plus ``program(*feeds)`` calling the tasks
as the runtime's plan wires them. Lowering executes exactly this source, and ``str(graph)`` is
this source, so the printed IR is the program that runs (as Thunder's traces are).
"""
from __future__ import annotations

import itertools
import keyword
import linecache
import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ..core.errors import HoloflowError
from ..core.registry import REGISTRY

_IDS = itertools.count()


@dataclass(frozen=True, eq=False)
class Value:
    """One SSA value: its meta (shape, dtype, device) and a readable name. A global value also
    has a placement and an nd-SBP, and ``shape`` is its logical shape (graph/global_graph.py)."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device = torch.device("cpu")
    name: str = ""
    id: int = field(default_factory=lambda: next(_IDS))
    placement: Any = None
    sbp: tuple | None = None

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
    sbp: tuple | None = None   # a global node's chosen signature: (input nd-SBPs, output nd-SBPs)

    def fn(self):
        return self.kernel if self.kernel is not None else REGISTRY[self.op].kernel

    def value_inputs(self) -> list[Value]:
        return [v for v in self.inputs if isinstance(v, Value)]

    def with_(self, **changes) -> "Node":
        return replace(self, **changes)


@dataclass(frozen=True, eq=False)
class IRGraph:
    feeds: tuple
    state: tuple          # (Value, tensor object) pairs
    nodes: tuple
    outputs: tuple        # Values (or constants)
    updates: tuple = ()   # (tensor object, Value): state written back, before the update effects
    out_spec: Any = None  # how to rebuild the user's nested output structure
    frees: Any = None     # memory plan: id(node) -> values dead after it (set by memory_plan)

    def with_(self, **changes) -> "IRGraph":
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


def check(g: IRGraph, where: str = "", sources: bool = False) -> IRGraph:
    """Verifies SSA and meta invariants; raises naming the first broken node. Returns ``g``.

    With ``sources``, every node must also carry a user source line (a pass that makes a node
    gives it the line of the node it derives from)."""
    defined: set = set(g.feeds) | {v for v, _ in g.state}
    ctx = f" after {where}" if where else ""
    if len(defined) != len(g.feeds) + len(g.state):
        raise HoloflowError(f"IR check{ctx}: a feed or state value is defined twice")
    for i, n in enumerate(g.nodes):
        if n.kernel is None and n.op not in REGISTRY:
            raise HoloflowError(f"IR check{ctx}: node {i} uses unknown op {n.op!r} and has no kernel")
        if sources and not n.source:
            raise HoloflowError(f"IR check{ctx}: node {i} ({n.op}) has no source line; a pass gives a new "
                                f"node the source of the node it derives from")
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


# -- the program -----------------------------------------------------------------------------------

SEQ1 = "seq1"   # a node tag: its kernel returns its one output inside a tuple
TOKEN = "state_token"   # loop-carried: tasks reading state wait for the previous step's update
ENTRY = "program"       # the function running every task in order
_RESERVED = frozenset({"torch", "state", ENTRY, TOKEN, "_pc", "_tick", "_t"})


def assign(target, value) -> None:
    """A state update: the live tensor takes the step's new value."""
    target._data.copy_(value)


def stream_of(n: Node) -> str:
    """``update`` for effect nodes (optimizer updates, state write-backs), else ``compute``.

    Collectives are on ``compute`` too: one thread issues every collective in program order, so
    every rank issues them alike with no ordering edges; a collective whose result is not needed
    at once is issued there and waited for at its first reader (global_graph.issue_collectives),
    Gloo working meanwhile on its own threads."""
    return "update" if n.effect else "compute"


def talks(n: Node) -> bool:
    """Whether ``n`` runs a collective (its op declares it) or waits for one (tagged ``comm``)."""
    if "comm" in n.tags:
        return True
    op = REGISTRY.get(n.op) if n.kernel is None else None
    return op is not None and op.collective


def uncompilable(n: Node) -> bool:
    """Whether torch.compile cannot take ``n``: it talks, draws from a generator of its own (a
    global graph's random node), or its op declares its kernel opaque on the node's device
    (``Op.opaque``)."""
    if talks(n) or draws(n):
        return True
    op = REGISTRY.get(n.op) if n.kernel is None else None
    return op is not None and op.opaque_on(next((v.device.type for v in n.value_inputs()), "cpu"))


def may_alias(n: Node) -> bool:
    """Whether an output of ``n`` may share memory with one of its inputs."""
    if "fresh" in n.tags:
        return False
    if "inplace" in n.tags:
        return True
    op = REGISTRY.get(n.op)
    return op is None or n.kernel is not None or not op.fresh


class AliasGroups:
    """Union-find over the values of ``nodes``: one set per group of values that may share memory
    (joined through every node that :func:`may_alias`)."""

    def __init__(self, nodes=()) -> None:
        self.parent: dict = {}
        for n in nodes:
            if may_alias(n):
                ins = n.value_inputs()
                if ins and n.outputs:   # its outputs and inputs in one set: each joined to the first input
                    first = ins[0]
                    for v in (*n.outputs, *ins[1:]):
                        self.union(v, first)

    def find(self, v: Value) -> Value:
        parent = self.parent
        p = parent.get(v, v)
        while p is not v:   # path splitting: each value on the way now points to its grandparent
            up = parent.get(p, p)
            parent[v] = up
            v, p = p, up
        return v

    def union(self, a: Value, b: Value) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self.parent[ra] = rb


def execution_order(g: IRGraph) -> list[Node]:
    """The nodes in the order the program runs them: the computing nodes, then one ``assign`` node
    per state update, then the effect nodes (they only read values, so gathering them last keeps
    the meaning).

    The write-backs run before the effects because that is ``build()``'s program order: every
    state write a trace records (``self.w.mul_(0.5)`` under ``no_grad``, through a ``detach()``,
    BatchNorm's running statistics) happens inside ``build()``, while the effects (the optimizer's
    step, its hooks, the LR scheduler: graph/optimizer.py) are added after ``build()`` returned and
    act on the live state tensors, as eager's ``opt.step()`` after the user's code. Effects first
    would step the parameter, then overwrite it with the value written in ``build()``: the step
    would be lost."""
    producer = g.producers()
    assigns = [Node("assign", (t, v), {}, (), producer[v].source if v in producer else "", effect=True,
                    kernel=assign) for t, v in g.updates]
    return [n for n in g.nodes if not n.effect] + assigns + [n for n in g.nodes if n.effect]


@dataclass
class Task:
    """A straight-line run of nodes on one stream: one function of the program, one actor."""

    name: str
    stream: str
    nodes: list
    inputs: list = field(default_factory=list)    # Values read from feeds or other tasks
    outputs: list = field(default_factory=list)   # Values read by other tasks, outputs or updates
    state: list = field(default_factory=list)     # state Values read
    token: bool = False                           # waits for the previous step's update
    after: set = field(default_factory=set)       # indices of the tasks it reads values from
    body: str = ""   # for compiling: the function of its kernels, state passed in (``_Gen.task``)

    @property
    def source(self) -> str:
        return next((n.source for n in self.nodes if n.source), "")


def _phase(n: Node) -> str | None:
    """``"bw"`` (backward, recomputation included) or ``"fw"`` for a node computing from values;
    None for one that only creates (a constant, the gradient seed): it joins either side."""
    return None if not n.value_inputs() else "bw" if "bw" in n.tags else "fw"


def split_tasks(g: IRGraph, for_compile: bool = False) -> list[Task]:
    """Cuts the execution order into straight-line runs on one stream. A task waits for all its
    inputs before it starts, so a compute run is also cut before a node that reads a value
    another stream made after the run began.

    ``for_compile``: the compute tasks will be compiled by Inductor (graph/compile_tasks.py),
    which cannot take a collective: runs of collectives and waits (``talks``), and of nodes whose
    kernels are opaque to it (``uncompilable``), are tasks of their own, those that talk chained
    in program order, so the compute between them compiles. In a graph holding an op whose layout
    Inductor chooses (``Op.layout``: convolutions), forward and backward runs are cut apart too,
    as AOTAutograd partitions a model: in one region Inductor fuses the backward's reads of
    forward activations into the forward's kernels and writes their results out there (on the
    CNN's conv/batch-norm blocks: three more activation-sized buffers per block, slower kernels),
    while the activations cross between two compiled tasks in channels-last. Elsewhere the cut
    costs one more compiled call per step and gains nothing (GPT-mini: ~0.2 ms of 2.5)."""
    tasks: list[Task] = []
    made_by: dict = {}   # Value -> index of the task making it
    cut_phase = for_compile and any(getattr(REGISTRY.get(n.op), "layout", False) for n in g.nodes)
    phase = None         # of the current compute run (cut_phase)
    for n in execution_order(g):
        s, p = stream_of(n), _phase(n)
        cur = len(tasks) - 1
        if not tasks or tasks[-1].stream != s or (s != "update" and tasks[-1].nodes and any(
                tasks[made_by.get(v, cur)].stream != s and made_by[v] not in tasks[-1].after
                for v in n.value_inputs())) or (
                for_compile and s == "compute" and tasks[-1].nodes
                and (uncompilable(n) != uncompilable(tasks[-1].nodes[-1])
                     or cut_phase and None not in (phase, p) and phase != p)):
            tasks.append(Task(f"{s}{len(tasks)}", s, []))
            phase = None
        phase = p or phase
        t = tasks[-1]
        t.after.update(made_by[v] for v in n.value_inputs() if v in made_by)
        t.nodes.append(n)
        made_by.update((v, len(tasks) - 1) for v in n.outputs)
    wire_tasks(tasks, g, {o for o in g.outputs if isinstance(o, Value)})
    has_update = any(t.stream == "update" for t in tasks)
    # a task issuing collectives also waits for the previous step's update, as every task reading
    # state does: the next step's collectives are then issued after this step's, on every rank
    for t in tasks:
        t.token = has_update and (bool(t.state) or any(map(talks, t.nodes)))
    if for_compile:
        _chain(tasks, talks)
        _chain(tasks, draws)
    return tasks


def draws(n: Node) -> bool:
    """Whether ``n`` draws from a generator given to it (its draws depend on the order it runs in
    among the others drawing from it)."""
    return isinstance(n.attrs.get("generator"), torch.Generator)


def _chain(tasks: list, pred: Callable[[Node], bool]) -> None:
    """Each task holding a node of ``pred`` (collectives; draws from a generator) also takes an
    output of the one before it (unused, an ordering edge): they run in program order (on every
    rank), whatever order their inputs are ready in."""
    prev = None
    for t in tasks:
        if not any(map(pred, t.nodes)):
            continue
        if prev is not None and prev.outputs[0] not in t.inputs:
            t.inputs.append(prev.outputs[0])
        made = [v for n in t.nodes for v in n.outputs]
        if made and not t.outputs:
            t.outputs.append(made[0])
        prev = t if t.outputs else prev


def wire_tasks(tasks: list, g: IRGraph, exported: set) -> None:
    """Each task's inputs (read, made elsewhere), state reads, and outputs (values in
    ``exported`` or read by another task)."""
    state, feeds = {v for v, _ in g.state}, set(g.feeds)
    exported = set(exported)
    for t in tasks:
        seen = {v for n in t.nodes for v in n.outputs}
        for v in (v for n in t.nodes for v in n.value_inputs()):
            if v not in seen:
                seen.add(v)
                (t.state if v in state else t.inputs).append(v)
                if v not in state and v not in feeds:
                    exported.add(v)
    for t in tasks:
        t.outputs = [v for n in t.nodes for v in n.outputs if v in exported]


_SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128"}


def meta_str(v: Value) -> str:
    """``f32[2, 3]`` (the device in front when it is not the CPU)."""
    dt = _SHORT.get(v.dtype) or str(v.dtype).replace("torch.", "")
    return f"{'' if v.device.type == 'cpu' else f'{v.device} '}{dt}[{', '.join(map(str, v.shape))}]"


def literal(x: Any) -> str | None:
    """Source text evaluating to ``x`` (same type and value), or None: ``x`` is then bound as a
    named constant (tensors, lists, slices, non-finite floats, anything else)."""
    t = type(x)
    if x is None or t in (bool, int, str, bytes) or (t is float and math.isfinite(x)):
        return repr(x)
    if x is Ellipsis:
        return "..."
    if isinstance(x, torch.dtype):
        return str(x)
    if t is tuple:
        parts = [literal(e) for e in x]
        if all(p is not None for p in parts):
            return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    return None


class _Names:
    """Unique Python identifiers from readable bases (``model.fc.weight`` -> ``model_fc_weight``)."""

    def __init__(self, reserved: frozenset) -> None:
        self.used = set(reserved)

    def take(self, base: str) -> str:
        base = re.sub(r"\W", "_", base) or "_"
        if not base.isidentifier():
            base = "_" + base
        if keyword.iskeyword(base):
            base += "_"
        name, k = base, 1
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name


@dataclass
class Program:
    """A graph as Python. ``source`` runs in ``namespace`` (kernels, constants, ``state``: the live
    state tensors by name): each task is a function of direct kernel calls, and
    ``program(*feeds)`` runs the tasks in order and returns the graph's outputs.

    >>> ns = prog.load(); outs = ns["program"](x)
    """

    source: str
    namespace: dict
    tasks: list
    names: dict         # Value -> its name in the source
    nodes: list         # every node in program order (``prof`` is indexed alike)
    lines: dict         # line number in the source -> the node that line calls
    prof: list          # seconds per node, when generated with ``profile=True``
    filename: str

    def __str__(self) -> str:
        return self.source

    def load(self) -> dict:
        """Executes the source in a copy of the namespace; returns it (tasks and ``program``).
        Tracebacks through the program show its lines (the source is registered with linecache)."""
        linecache.cache[self.filename] = (len(self.source), None, self.source.splitlines(True), self.filename)
        ns = dict(self.namespace)
        exec(compile(self.source, self.filename, "exec"), ns)
        return ns

    def name(self, x: Any) -> str:
        """The name of a Value in the source (regst names in the runtime plan)."""
        return self.names[x]


_FILES = itertools.count()


def program(g: IRGraph, profile: bool = False, for_compile: bool = False) -> Program:
    """The program of ``g`` (frees after last use as ``g.frees`` plans; per-node timing into
    ``Program.prof`` with ``profile``; ``for_compile``: see `split_tasks`)."""
    return _Gen(g, profile, for_compile).build()


def to_python(g: IRGraph) -> str:
    """The source of :func:`program` — what lowering executes."""
    return program(g).source


class _Gen:
    def __init__(self, g: IRGraph, profile: bool, for_compile: bool = False) -> None:
        self.g, self.profile, self.frees = g, profile, g.frees or {}
        self.for_compile = for_compile
        self.tasks = split_tasks(g, for_compile)
        self.names = _Names(_RESERVED)
        self.ns: dict[str, Any] = {"torch": torch, "state": {}}
        self.kernels: dict = {}   # kernel key -> global name
        self.consts: dict = {}    # id(constant) -> global name
        self.vals: dict = {}      # Value -> local name
        self.state_ids = {id(t) for _, t in g.state} | {id(t) for t, _ in g.updates}
        self.state_key: dict = {}  # id(state tensor) -> its key in ``state``
        self.header: list[str] = []
        self.out: list[str] = []
        self.lines: dict = {}
        self.nodes: list = []
        self.bound: set = set()   # the values the task being written holds in its locals

    def build(self) -> Program:
        for t in self.tasks:
            t.name = self.names.take(t.name)
        for n in (n for t in self.tasks for n in t.nodes):
            self.kernel(n)
            for x in (*n.inputs, *n.attrs.values(), *([n.attrs] if not _kwargs_ok(n.attrs) else [])):
                self.const(x)
        for o in self.g.outputs:
            self.const(o)
        self.name_values()
        prof = [0.0] * sum(len(t.nodes) for t in self.tasks)
        if self.profile:
            self.ns["_pc"], self.ns["_tick"] = time.perf_counter, _ticker(prof)
        self.out = self.intro()
        for t in self.tasks:
            self.task(t)
        self.driver()
        return Program("\n".join(self.out) + "\n", self.ns, self.tasks, self.vals, self.nodes, self.lines,
                       prof, f"<holoflow program #{next(_FILES)}>")

    # -- globals ------------------------------------------------------------------------------------
    def kernel(self, n: Node) -> str:
        op = REGISTRY.get(n.op)
        if n.kernel is None:
            key, base, fn = ("op", n.op), n.op, op.kernel
        elif op is not None and n.kernel is op.inplace_kernel:   # (``x_``, unless an op has that name)
            key, base, fn = ("inplace", n.op), n.op + ("_inplace" if n.op + "_" in REGISTRY else "_"), n.kernel
        else:
            key, base, fn = ("fn", id(n.kernel)), n.op, n.kernel
        name = self.kernels.get(key)
        if name is None:
            name = self.kernels[key] = self.names.take(base)
            self.ns[name] = fn
            if key[0] == "fn":
                self.header.append(f"#   {name} = {_describe(fn)}")
                src = getattr(fn, "source", None)
                if isinstance(src, str):
                    self.header += [f"#     {line}" for line in src.splitlines()]
        return name

    def const(self, x: Any) -> None:
        if isinstance(x, Value) or id(x) in self.state_ids or id(x) in self.consts or literal(x) is not None:
            return
        name = self.consts[id(x)] = self.names.take(f"const{len(self.consts)}")
        self.ns[name] = x
        self.header.append(f"#   {name} = {_short(x)}")

    def name_values(self) -> None:
        state = self.ns["state"]
        for v, t in self.g.state:
            self.vals[v] = self.state_key[id(t)] = self.names.take(v.name or f"v{v.id}")
            state[self.vals[v]] = t
        for t, _v in self.g.updates:
            if id(t) not in self.state_key:
                key = self.state_key[id(t)] = self.names.take("updated")
                state[key] = t
        for v in (*self.g.feeds, *(v for t in self.tasks for n in t.nodes for v in n.outputs)):
            self.vals[v] = self.names.take(v.name or f"v{v.id}")

    def arg(self, x: Any) -> str:
        if isinstance(x, Value):
            return self.vals[x]
        key = self.state_key.get(id(x))
        if key is not None:
            return f"state[{key!r}]"
        return literal(x) if id(x) not in self.consts else self.consts[id(x)]

    # -- source -------------------------------------------------------------------------------------
    def intro(self) -> list[str]:
        names = ", ".join(t.name for t in self.tasks) or "none"
        lines = [f"# holoflow program: {len(self.tasks)} task(s) ({names}); the runtime runs each task as an",
                 f"# actor on its stream, wired as `{ENTRY}` calls them. Globals: op kernels by op name",
                 "# (REGISTRY[op].kernel; `op_` its in-place kernel), `state` (live tensors by name), and:"]
        return lines + (self.header or ["#   (nothing else)"])

    def emit(self, line: str, n: Node | None = None) -> None:
        if n is not None:
            line += f"  # {n.source or '?'}"
        self.out.append(line)

    def task(self, t: Task) -> None:
        params = [self.vals[v] for v in t.inputs] + ([TOKEN] if t.token else [])
        self.bound = {*t.inputs, *t.state, *(v for n in t.nodes for v in n.outputs)}
        self.out += ["", "", f"def {t.name}({', '.join(params)}):"]
        if self.profile:
            self.emit("    _t = _pc()")
        if self.for_compile and t.state:
            # the function Inductor compiles takes the state as arguments (read live each call)
            t.body = self.names.take(f"{t.name}_kernels")
            reads = [f"state[{self.vals[v]!r}]._data" for v in t.state]
            self.emit(f"    return {t.body}({', '.join(params + reads)})")
            self.out += ["", "", f"def {t.body}({', '.join(params + [self.vals[v] for v in t.state])}):"]
        else:
            for v in t.state:
                self.emit(f"    {self.vals[v]} = state[{self.vals[v]!r}]._data  # state {meta_str(v)}")
        for n in t.nodes:
            self.node(n)
        rets = [self.vals[v] for v in t.outputs] + (["None"] if t.stream == "update" else [])
        self.emit(f"    return ({''.join(r + ', ' for r in rets)[:-2]}{',' if len(rets) == 1 else ''})")

    def node(self, n: Node) -> None:
        args = [self.arg(x) for x in n.inputs]
        if _kwargs_ok(n.attrs):
            args += [f"{k}={self.arg(v)}" for k, v in n.attrs.items()]
        else:
            args.append(f"**{self.arg(n.attrs)}")
        call = f"{self.kernel(n)}({', '.join(args)})"
        outs = ", ".join(self.vals[v] for v in n.outputs) + ("," if SEQ1 in n.tags else "")
        self.lines[len(self.out) + 1] = n
        metas = "  " + ", ".join(meta_str(v) for v in n.outputs) if n.outputs else ""
        self.out.append(f"    {outs + ' = ' if outs else ''}{call}  # {n.source or '?'}{metas}")
        if self.profile:
            self.emit(f"    _t = _tick({len(self.nodes)}, _t)", n)
        self.nodes.append(n)
        # a value freed after a node that does not read it (a collective's input, dead once its
        # wait returns: global_graph.issue_collectives) may live in another task's function
        dead = [self.vals[v] for v in self.frees.get(id(n), ()) if v in self.bound]
        if dead:
            self.emit(f"    del {', '.join(dead)}", n)

    def driver(self) -> None:
        has_update = any(t.stream == "update" for t in self.tasks)
        self.out += ["", "", f"def {ENTRY}({', '.join(self.vals[v] for v in self.g.feeds)}):"]
        if has_update:
            self.emit(f"    {TOKEN} = None")
        for t in self.tasks:
            params = [self.vals[v] for v in t.inputs] + ([TOKEN] if t.token else [])
            rets = [self.vals[v] for v in t.outputs] + ([TOKEN] if t.stream == "update" else [])
            lhs = ", ".join(rets) + ("," if len(rets) == 1 else "") + " = " if rets else ""
            self.emit(f"    {lhs}{t.name}({', '.join(params)})")
        made = set(self.g.feeds) | {v for t in self.tasks for v in t.outputs}
        for v in dict.fromkeys(o for o in self.g.outputs if isinstance(o, Value) and o not in made):
            self.emit(f"    {self.vals[v]} = state[{self.vals[v]!r}]._data")
        outs = [self.arg(o) for o in self.g.outputs]
        self.emit(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")


def _kwargs_ok(attrs: dict) -> bool:
    return all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in attrs)


def _describe(fn: Any) -> str:
    mod = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{mod}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _short(x: Any) -> str:
    """One line describing a named constant in the program's comments (a numpy array's repr
    spans lines)."""
    if isinstance(x, torch.Tensor):
        return f"tensor {meta_str(Value.like(x))}"
    r = " ".join(repr(x).split())
    return r if len(r) <= 80 else r[:77] + "..."


def _ticker(prof: list) -> Callable:
    def tick(k: int, t: float) -> float:
        now = time.perf_counter()
        prof[k] += now - t
        return now
    return tick
