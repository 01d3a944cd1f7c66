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
from dataclasses import dataclass
from typing import Any, Callable

from ..runtime import Plan, TaskSpec
from .ir import Graph, Node, Value

TOKEN = "state_token"


def _name(v) -> str:
    return f"v{v.id}" if isinstance(v, Value) else repr(v)


def _stream(n: Node) -> str:
    if n.effect:
        return "update"
    return "comm" if "comm" in n.tags else "compute"


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


def codegen(task: Task, frees: dict | None = None) -> tuple[str, dict]:
    """Python source of one task and its namespace (kernels with attrs bound, state tensors)."""
    ns: dict[str, Any] = {}
    lines = [f"def {task.name}({', '.join(_name(v) for v in task.inputs)}):"]
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
        if not n.outputs:
            lines.append(f"    k{k}({args})  # {n.op}")
        elif len(n.outputs) == 1:
            lines.append(f"    {outs} = k{k}({args})  # {n.op}")
        else:
            lines.append(f"    {outs}, = k{k}({args})  # {n.op}")
        for v in (frees or {}).get(id(n), ()):
            lines.append(f"    del {_name(v)}")
    lines.append(f"    return ({''.join(_name(v) + ', ' for v in task.outputs)})")
    return "\n".join(lines), ns


def compile_task(task: Task, frees: dict | None = None) -> Callable:
    src, ns = codegen(task, frees)
    code = compile(src, f"<holoflow graph task {task.name}>", "exec")
    exec(code, ns)
    task.fn = ns[task.name]
    task.fn.__holoflow_source__ = src
    return task.fn


@dataclass
class Lowered:
    graph: Graph
    tasks: list
    plan: Plan
    feed_names: tuple
    output_names: tuple


def lower(g: Graph, frees: dict | None = None, register_num: int = 2) -> Lowered:
    """Tasks with generated functions, wired into a runtime Plan."""
    tasks = split_tasks(g)
    for t in tasks:
        compile_task(t, frees)
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
