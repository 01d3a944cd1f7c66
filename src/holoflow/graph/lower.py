"""Lowering: the IR becomes tasks — straight-line runs of nodes on one stream — each generated
as a Python function of direct kernel calls (no dispatch, no autograd at run time), and a
runtime ``Plan`` connecting them (DESIGN §7-8).

Streams: ordinary nodes run on ``compute``; nodes tagged ``comm`` on ``comm``; effect nodes
(the optimizer update) form the ``update`` task. Tasks that read state wait for the previous
iteration's update through a loop-carried token regst, so parameters are never read while
being written, while the source prefetches the next iteration's feeds.
"""
from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from ..core.errors import HoloflowError
from ..core.tensor import Tensor
from ..runtime import Plan, TaskError, TaskSpec
from .ir import Graph, Node, Value

TOKEN = "state_token"


def _name(v) -> str:
    return f"v{v.id}" if isinstance(v, Value) else repr(v)


def _stream(n: Node) -> str:
    return "update" if n.effect else "compute"


@dataclass
class Task:
    name: str
    stream: str
    nodes: list
    inputs: list      # Values read from other tasks or feeds
    outputs: list     # Values other tasks, outputs or updates read
    state: list       # (Value, tensor) read from live state
    fn: Callable | None = None
    source: str = ""
    filename: str = ""
    lines: dict = field(default_factory=dict)   # line number in the generated code -> Node
    prof: list = field(default_factory=list)    # seconds per node (profiling)


def _assign_kernel(target):
    def assign(v):
        target._data.copy_(v)
    return assign


def effects_last(g: Graph) -> list[Node]:
    """Effect nodes (optimizer updates, state write-backs) gathered into one final run: they
    only read values, so moving them after every other node keeps the program's meaning."""
    assigns = [Node("assign", (v,), {}, (), "state update", effect=True, kernel=_assign_kernel(t))
               for t, v in g.updates]
    return [n for n in g.nodes if not n.effect] + [n for n in g.nodes if n.effect] + assigns


def split_tasks(g: Graph) -> list[Task]:
    """Cuts the node list into straight-line runs on one stream."""
    tasks: list[Task] = []
    for n in effects_last(g):
        s = _stream(n)
        if not tasks or tasks[-1].stream != s:
            tasks.append(Task(f"{s}{len(tasks)}", s, [], [], [], []))
        tasks[-1].nodes.append(n)
    state_vals = {v: t for v, t in g.state}
    feeds = set(g.feeds)
    exported: set = {o for o in g.outputs if isinstance(o, Value)}
    for t in tasks:
        local = {v for n in t.nodes for v in n.outputs}
        seen: set = set()
        for n in t.nodes:
            for v in n.value_inputs():
                if v in local or v in seen:
                    continue
                seen.add(v)
                if v in state_vals:
                    t.state.append((v, state_vals[v]))
                else:
                    t.inputs.append(v)
                    if v not in feeds:
                        exported.add(v)
        t.source = next((n.source for n in t.nodes if n.source), "")
    for t in tasks:
        t.outputs = [v for n in t.nodes for v in n.outputs if v in exported]
    return tasks


def codegen(task: Task, frees: dict | None = None, profile: bool = False) -> tuple[str, dict]:
    """Python source of one task and its namespace (kernels with attrs bound, state tensors).

    ``task.lines`` maps each kernel call's line number to its node, so a failure is traced back
    to the op and the user's source line; with ``profile`` every call is timed into ``task.prof``.
    """
    ns: dict[str, Any] = {}
    lines = [f"def {task.name}({', '.join(_name(v) for v in task.inputs)}):"]
    task.lines, task.prof = {}, [0.0] * len(task.nodes)
    if profile:
        ns["_pc"], ns["_tick"] = time.perf_counter, _ticker(task.prof)
        lines.append("    _t = _pc()")
    for j, (v, t) in enumerate(task.state):
        ns[f"s{j}"] = t
        lines.append(f"    {_name(v)} = s{j}._data")
    for k, n in enumerate(task.nodes):
        fn = n.fn()
        ns[f"k{k}"] = functools.partial(fn, **n.attrs) if n.attrs else fn
        args = ", ".join(_name(x) if isinstance(x, Value) else f"c{k}_{i}" for i, x in enumerate(n.inputs))
        for i, x in enumerate(n.inputs):
            if not isinstance(x, Value):
                ns[f"c{k}_{i}"] = x
        outs = ", ".join(_name(v) for v in n.outputs)
        task.lines[len(lines) + 1] = n
        if not n.outputs:
            lines.append(f"    k{k}({args})  # {n.op}")
        elif len(n.outputs) == 1:
            lines.append(f"    {outs} = k{k}({args})  # {n.op}")
        else:
            lines.append(f"    {outs}, = k{k}({args})  # {n.op}")
        if profile:
            lines.append(f"    _t = _tick({k}, _t)")
        for v in (frees or {}).get(id(n), ()):
            lines.append(f"    del {_name(v)}")
    lines.append(f"    return ({''.join(_name(v) + ', ' for v in task.outputs)})")
    return "\n".join(lines), ns


def _ticker(prof: list) -> Callable:
    def tick(k: int, t: float) -> float:
        now = time.perf_counter()
        prof[k] += now - t
        return now
    return tick


_FILES = itertools.count()


def compile_task(task: Task, frees: dict | None = None, profile: bool = False) -> Callable:
    src, ns = codegen(task, frees, profile)
    task.filename = f"<holoflow graph task {task.name} #{next(_FILES)}>"
    code = compile(src, task.filename, "exec")
    exec(code, ns)
    task.fn = ns[task.name]
    task.fn.__holoflow_source__ = src
    return task.fn


def failing_node(tasks: list, error: BaseException) -> Node | None:
    """The node whose kernel raised ``error``: the generated frame's line, looked up per task."""
    by_file = {t.filename: t for t in tasks}
    tb, hit = error.__traceback__, None
    while tb is not None:
        t = by_file.get(tb.tb_frame.f_code.co_filename)
        if t is not None:
            hit = t.lines.get(tb.tb_lineno, hit)
        tb = tb.tb_next
    return hit


def profile_table(tasks: list, iterations: int, top: int = 25) -> str:
    """Per-op time (summed over nodes of that op) and the slowest nodes with their source lines."""
    by_op: dict[str, list] = {}
    nodes = []
    for t in tasks:
        for n, s in zip(t.nodes, t.prof):
            e = by_op.setdefault(n.op, [0, 0.0])
            e[0] += 1
            e[1] += s
            nodes.append((s, n))
    total = sum(e[1] for e in by_op.values()) or 1e-12
    it = max(iterations, 1)
    lines = [f"{'op':<28} {'nodes':>5} {'ms/iter':>9} {'%':>6}"]
    for op, (cnt, s) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{op:<28} {cnt:>5} {s * 1e3 / it:>9.3f} {100 * s / total:>6.1f}")
    lines.append(f"{'total':<28} {sum(e[0] for e in by_op.values()):>5} {total * 1e3 / it:>9.3f}")
    lines.append("slowest nodes:")
    for s, n in sorted(nodes, key=lambda p: -p[0])[:10]:
        lines.append(f"  {s * 1e3 / it:8.3f} ms  {n.op:<24} {n.scope or '-':<28} {n.source}")
    return "\n".join(lines)


@dataclass
class Lowered:
    graph: Graph
    tasks: list
    plan: Plan
    feed_names: tuple
    output_names: tuple


def lower(g: Graph, frees: dict | None = None, register_num: int = 2, profile: bool = False) -> Lowered:
    """Tasks with generated functions, wired into a runtime Plan."""
    tasks = split_tasks(g)
    for t in tasks:
        compile_task(t, frees, profile)
    has_update = any(t.stream == "update" for t in tasks)
    specs = []
    for t in tasks:
        consumes = [_name(v) for v in t.inputs]
        produces = [_name(v) for v in t.outputs]
        if has_update and t.state:
            consumes.append(TOKEN)
        fn = t.fn
        if has_update and t.state:
            fn = _drop_last(fn)
        if t.stream == "update":
            produces.append(TOKEN)
            fn = _with_token(fn)
        specs.append(TaskSpec(t.name, t.stream, fn, tuple(consumes), tuple(produces),
                              register_num=register_num, source=t.source or None,
                              meta={"nodes": len(t.nodes)}))
    feeds = tuple(_name(v) for v in g.feeds)
    outs = tuple(dict.fromkeys(_name(o) for o in g.outputs if isinstance(o, Value)))
    initial = {TOKEN: None} if has_update else {}
    plan = Plan(tuple(specs), inputs=feeds, outputs=outs, initial=initial)
    return Lowered(g, tasks, plan, feeds, outs)


def _drop_last(fn: Callable) -> Callable:
    return lambda *args: fn(*args[:-1])


def _with_token(fn: Callable) -> Callable:
    return lambda *args: (*fn(*args), None)


class GraphRunError(HoloflowError):
    """An op failed while a compiled graph ran; names the op, its module and the user's line."""


class Compiled:
    """One compiled plan (per input signature) and its executor, re-created after a failure."""

    def __init__(self, ir: Graph, lowered: Lowered, executor: str, compile_s: float, profile: bool) -> None:
        from .passes.memory_plan import peak_bytes
        self.ir, self.lowered, self.compile_s = ir, lowered, compile_s
        self.kind, self.profile = executor, profile
        self.feed_names = lowered.feed_names
        self.peak_bytes = peak_bytes(ir, ir.frees)
        self.iterations = 0
        self._executor = None

    @property
    def executor(self):
        from ..runtime import Runtime, SequentialExecutor
        ex = self._executor
        if ex is None or getattr(ex, "_closed", False):
            plan = self.lowered.plan
            ex = self._executor = Runtime(plan, trace=self.profile) if self.kind == "actor" else \
                SequentialExecutor(plan, trace=self.profile)
        return ex

    def feeds(self, leaves: list) -> dict:
        return dict(zip(self.feed_names, (x._data for x in leaves if isinstance(x, Tensor))))

    def outputs(self, got: dict) -> list:
        return [Tensor._make(got[f"v{o.id}"]) if isinstance(o, Value) else o for o in self.ir.outputs]

    def run(self, feeds: dict) -> list:
        return list(self.stream([feeds]))[0]

    def stream(self, feeds: Iterable[dict]) -> Iterator[list]:
        """Output leaves per feed; the actor runtime prefetches feed i+1 while i runs."""
        try:
            for got in self.executor.stream(feeds):
                self.iterations += 1
                yield self.outputs(got)
        except TaskError as e:
            self._executor = None
            raise self.error(e) from e.__cause__

    def error(self, e: TaskError) -> BaseException:
        cause = e.__cause__ or e
        n = failing_node(self.lowered.tasks, cause)
        if n is None:
            return e
        scope = f" in module {n.scope!r}" if n.scope else ""
        where = f"\n  source: {n.source}" if n.source else ""
        return GraphRunError(f"holoflow.nn.Graph: op {n.op!r}{scope} failed at run time (task {e.task!r}, "
                             f"iteration {e.iteration}): {type(cause).__name__}: {cause}{where}")

    def profile_table(self) -> str:
        table = profile_table(self.lowered.tasks, self.iterations)
        ex = self._executor
        if ex is not None and getattr(ex, "timeline", None) is not None:
            table += "\nactors:\n" + ex.trace_table()
        return table

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
