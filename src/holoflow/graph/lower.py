"""Lowering: the graph's :func:`~holoflow.graph.ir.program` — one Python function of direct
kernel calls per task (no dispatch, no autograd at run time) — is executed, and its tasks are
wired into a runtime ``Plan`` (docs/architecture.md).

Streams: ordinary nodes run on ``compute``; effect nodes (the optimizer update) and state
write-backs form the ``update`` task. Collectives are compute nodes: one whose result is not
needed at once is split into an issue (hands the payload to the communicator, whose own threads
move it) and a wait just before its first reader (``global_graph.issue_collectives``), so one
thread issues every collective in program order, identically on every rank. Tasks that read state wait
for the previous iteration's update through a loop-carried token regst, so parameters are never
read while being written, while the source prefetches the next iteration's feeds. The source the
plan runs is kept verbatim on :class:`Compiled` (``compiled.program.source``).

Threads (`make_executor`): on a CPU device every stream runs on the caller's thread (one thread
launches the device's kernels, one intra-op pool, no hand-off per act; a collective in flight
costs no thread of ours, as torch DDP's buckets). On a CUDA device every stream is a CUDA
stream ordered by events (graph/cuda_streams.py), all launched from the caller's thread, and a
``copy`` task moves the next batch to the device while the current one computes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from ..core import generators
from ..core.errors import HoloflowError
from ..core.registry import REGISTRY
from ..core.tensor import Tensor
from ..runtime import CALLER, SOURCE_STREAM, Plan, Runtime, SequentialExecutor, TaskError, TaskSpec
from .compile_tasks import PLAIN_STREAMS, compile_task
from .cuda_streams import cuda_streams, with_h2d_copies
from .global_graph import issue_collectives, state_views, wrap_outputs
from .ir import ENTRY, TOKEN, IRGraph, Node, Program, Value, program, uncompilable
from .passes.memory_plan import peak_bytes


def failing_line(prog: Program, error: BaseException) -> int | None:
    """The program line whose kernel call raised ``error`` (innermost in the traceback)."""
    tb, hit = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == prog.filename and tb.tb_lineno in prog.lines:
            hit = tb.tb_lineno
        tb = tb.tb_next
    return hit


def profile_table(prog: Program, iterations: int, top: int = 25) -> str:
    """Per-op time (summed over nodes of that op) and the slowest nodes with their source lines."""
    by_op: dict[str, list] = {}
    for n, s in zip(prog.nodes, prog.prof):
        e = by_op.setdefault(n.op, [0, 0.0])
        e[0] += 1
        e[1] += s
    total = sum(e[1] for e in by_op.values()) or 1e-12
    it = max(iterations, 1)
    lines = [f"{'op':<28} {'nodes':>5} {'ms/iter':>9} {'%':>6}"]
    for op, (cnt, s) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{op:<28} {cnt:>5} {s * 1e3 / it:>9.3f} {100 * s / total:>6.1f}")
    lines.append(f"{'total':<28} {sum(e[0] for e in by_op.values()):>5} {total * 1e3 / it:>9.3f}")
    lines.append("slowest nodes:")
    for s, n in sorted(zip(prog.prof, prog.nodes), key=lambda p: -p[0])[:10]:
        lines.append(f"  {s * 1e3 / it:8.3f} ms  {n.op:<24} {n.scope or '-':<28} {n.source}")
    return "\n".join(lines)


@dataclass
class Lowered:
    graph: IRGraph
    program: Program
    plan: Plan
    feed_names: tuple
    output_names: tuple
    device: torch.device = torch.device("cpu")
    compiled: dict = field(default_factory=dict)   # task name -> its CompiledTask (enable_compile)
    entry: Any = None   # the program's driver (every task in order, on the caller's thread)

    @property
    def tasks(self) -> list:
        return self.program.tasks


def lower(g: IRGraph, register_num: int = 2, profile: bool = False, compile_tasks: bool = False,
          gather_ahead: bool = True, keep_layouts: frozenset = frozenset()) -> Lowered:
    """The graph's program, executed, its task functions wired into a runtime Plan (each compiled by
    Inductor with ``compile_tasks``: graph/compile_tasks.py; ``gather_ahead``: see
    global_graph.issue_collectives). Graph outputs in ``keep_layouts`` keep the layout compiled
    code gave them (holoflow.compile's saved values, read only by its compiled backward)."""
    g = bind_default_generators(issue_collectives(g, gather_ahead))
    prog = program(g, profile, for_compile=compile_tasks and not profile)
    ns = prog.load()
    # a task issuing collectives, or running kernels opaque to tracing, stays plain
    plain = [profile or not compile_tasks or t.stream in PLAIN_STREAMS or any(map(uncompilable, t.nodes))
             for t in prog.tasks]
    read_plain = {v for t, p in zip(prog.tasks, plain) if p for v in t.inputs} | \
        {o for o in g.outputs if isinstance(o, Value) and o not in keep_layouts}
    specs, compiled = [], {}
    for t, p in zip(prog.tasks, plain):
        consumes = [prog.name(v) for v in t.inputs] + ([TOKEN] if t.token else [])
        produces = [prog.name(v) for v in t.outputs] + ([TOKEN] if t.stream == "update" else [])
        leaving = tuple(i for i, v in enumerate(t.outputs) if v in read_plain)
        fn = ns[t.name]
        if not p:   # a task reading state calls its kernels' function (t.body) with it: compiled
            compiled[t.name] = compile_task(t.name, t.stream, ns[t.body or t.name], leaving)
            ns[t.body or t.name] = compiled[t.name]
            fn = ns[t.name]
        specs.append(TaskSpec(t.name, t.stream, fn, tuple(consumes), tuple(produces),
                              register_num=register_num, source=t.source or None,
                              meta={"nodes": len(t.nodes)}))
    feeds = tuple(prog.name(v) for v in g.feeds)
    state = {v for v, _ in g.state}   # an output that is state (``return self.weight``) is read live
    outs = tuple(dict.fromkeys(prog.name(o) for o in g.outputs if isinstance(o, Value) and o not in state))
    has_update = any(t.stream == "update" for t in prog.tasks)
    device = device_of(g)
    inputs = feeds
    if device.type == "cuda":
        specs, inputs = with_h2d_copies(specs, feeds, device, register_num)
    plan = Plan(tuple(specs), inputs=inputs, outputs=outs, initial={TOKEN: None} if has_update else {})
    return Lowered(g, prog, plan, inputs, outs, device, compiled, ns[ENTRY])


def bind_default_generators(g: IRGraph) -> IRGraph:
    """``g`` with each node of a random op that draws from the default generator (it was given
    none) bound to the lowering thread's default generator where that is a simulated rank's
    (core/generators.py), as eager's random ops are handed it: the rank's plan draws from the
    rank's stream, as a process's plan draws from the process's. Elsewhere ``g`` is unchanged (the
    kernels draw from torch's). Bound after the passes and the ranks' program check, so simulated
    ranks plan what processes plan; with ``enable_compile`` such a node runs plain, as every node
    drawing from a generator given to it does (``ir.draws``)."""
    if generators.current() is None:
        return g
    nodes = tuple(_bound_generator(n) for n in g.nodes)
    if all(a is b for a, b in zip(nodes, g.nodes)):
        return g
    frees = None if g.frees is None else {id(new): g.frees[id(old)] for old, new in zip(g.nodes, nodes)
                                          if id(old) in g.frees}
    return g.with_(nodes=nodes, frees=frees)


def _bound_generator(n: Node) -> Node:
    op = REGISTRY.get(n.op)
    if op is None or not op.random or n.kernel not in (None, op.inplace_kernel) or \
            isinstance(n.attrs.get("generator"), torch.Generator):
        return n
    device = next((v.device for v in (*n.outputs, *n.value_inputs())), torch.device("cpu"))
    gen = generators.default(device)
    return n if gen is None else n.with_(attrs={**n.attrs, "generator": gen})


def device_of(g: IRGraph) -> torch.device:
    """The device a graph computes on: its feeds' and state's (the CPU when it has neither)."""
    for v in (*g.feeds, *(v for v, _ in g.state)):
        if v.device.type != "cpu":
            return torch.device(v.device)
    return torch.device("cpu")


def make_executor(plan: Plan, kind: str = "actor", trace: bool = False,
                  device: torch.device | None = None) -> Runtime | SequentialExecutor:
    """The executor of a lowered plan: the sequential reference, or the actor runtime with the
    threads (and, on CUDA, the device streams) of the module docstring."""
    if kind == "sequential":
        return SequentialExecutor(plan, trace=trace)
    streams = tuple(dict.fromkeys((SOURCE_STREAM, *(t.stream for t in plan.tasks))))
    if device is not None and device.type == "cuda":
        return Runtime(plan, trace=trace, threads={s: CALLER for s in streams},
                       devices=cuda_streams(streams, device))
    return Runtime(plan, trace=trace, threads={s: CALLER for s in streams})


class GraphRunError(HoloflowError):
    """An op failed while a compiled graph ran; names the op, its module and the user's line."""


class Compiled:
    """One compiled plan (per input signature) and its executor, re-created after a failure.

    ``program`` is the source that runs, ``passes_log`` the IR after each pass (passes.PassRecord).
    """

    def __init__(self, ir: IRGraph, lowered: Lowered, executor: str, compile_s: float, profile: bool,
                 passes_log: list | None = None, logical: IRGraph | None = None) -> None:
        self.ir, self.lowered, self.compile_s = ir, lowered, compile_s
        self.logical = logical if logical is not None else ir   # a global graph before localize
        self.program = lowered.program
        self.passes_log = passes_log or []
        self.kind, self.profile = executor, profile
        self.feed_names = lowered.feed_names
        self.peak_bytes = peak_bytes(ir, ir.frees)
        self.iterations = 0
        self._executor = None
        self._state = dict(ir.state)   # state Value -> live tensor (outputs that are state)
        self._state_views = state_views(self.logical) if self.logical is not ir else {}
        self.written_inputs: tuple = ()   # leaves written in place by build: trailing outputs (graph.py)

    @property
    def executor(self) -> Runtime | SequentialExecutor:
        ex = self._executor
        if ex is None or getattr(ex, "_closed", False):
            ex = self._executor = make_executor(self.lowered.plan, self.kind, self.profile, self.lowered.device)
        return ex

    def feeds(self, leaves: list) -> dict:
        return dict(zip(self.feed_names, (x._data for x in leaves if isinstance(x, Tensor))))

    def outputs(self, got: dict, live_views: bool = False) -> list:
        """The graph's outputs from a run's values; ``live_views`` (the step is done): outputs that
        view state are read from the state now (``global_graph.wrap_outputs``)."""
        name, state = self.program.names, self._state
        outs = [(Tensor._make(state[o]._data) if o in state else Tensor._make(got[name[o]]))
                if isinstance(o, Value) else o for o in self.ir.outputs]
        if self.logical is self.ir:
            return outs
        return wrap_outputs(self.logical, outs, self._state_views if live_views else {})

    def run(self, feeds: dict) -> list:
        """One step: its outputs once every task of it ran (the optimizer's update included: the
        runtime hands the outputs over as soon as they exist)."""
        got = list(self._values([feeds]))[0]
        return self.outputs(got, live_views=True)

    def stream(self, feeds: Iterable[dict]) -> Iterator[list]:
        """Output leaves per feed; the actor runtime prefetches feed i+1 while i runs (an output
        viewing state that had to be boxed is then its value in that step's forward)."""
        for got in self._values(feeds):
            yield self.outputs(got)

    def _values(self, feeds: Iterable[dict]) -> Iterator[dict]:
        try:
            for got in self.executor.stream(feeds):
                self.iterations += 1
                yield got
        except TaskError as e:
            self._executor = None
            raise self.error(e) from e.__cause__

    def error(self, e: TaskError) -> BaseException:
        """The graph's error for a failed task: the op whose program line raised, with its module and
        the user's source line. A compiled task's exception comes from Inductor's code; its wrapper
        re-ran the task plain to raise from the failing op's line (compile_tasks.py), and where that
        run did not fail, the error names every op of the task with its line."""
        cause = e.__cause__ or e
        compiled = self.lowered.compiled.get(e.task)
        k = failing_line(self.program, cause)
        if k is None:
            return e if compiled is None else self._compiled_error(e, cause)
        n = self.program.lines[k]
        scope = f" in module {n.scope!r}" if n.scope else ""
        where = f"\n  source: {n.source}" if n.source else ""
        where += f"\n  program line {k}: {self.program.source.splitlines()[k - 1].strip()}"
        if getattr(compiled, "state", None) == "compiled" and cause.__cause__ is not None:
            where += ("\n  (the task runs compiled by Inductor; this op was located by running the task "
                      "uncompiled after the compiled code failed)")
        return GraphRunError(f"holoflow.nn.Graph: op {n.op!r}{scope} failed at run time (task {e.task!r}, "
                             f"iteration {e.iteration}): {type(cause).__name__}: {cause}{where}")

    def _compiled_error(self, e: TaskError, cause: BaseException, most: int = 20) -> GraphRunError:
        """A compiled task failed where its uncompiled run did not (or could not be re-run): the
        failing op cannot be known, so the error names each op of the task and its source line."""
        task = next(t for t in self.program.tasks if t.name == e.task)
        ops = list(dict.fromkeys(f"{n.op} at {n.source or '?'}" + (f" in module {n.scope!r}" if n.scope else "")
                                 for n in task.nodes))
        shown = "".join(f"\n    {o}" for o in ops[:most])
        if len(ops) > most:
            shown += f"\n    ... and {len(ops) - most} more"
        return GraphRunError(f"holoflow.nn.Graph: compiled task {e.task!r} failed at run time (iteration "
                             f"{e.iteration}): {type(cause).__name__}: {cause}\n  Inductor's code gives no op; "
                             f"the task's ops:{shown}")

    def profile_table(self) -> str:
        table = profile_table(self.program, self.iterations)
        ex = self._executor
        if ex is not None and getattr(ex, "timeline", None) is not None:
            table += "\nactors:\n" + ex.trace_table()
        return table

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
