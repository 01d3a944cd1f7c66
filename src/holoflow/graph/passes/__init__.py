"""IRGraph passes: pure functions ``IRGraph -> IRGraph``, one file each, run in a fixed pipeline.

Each pass is registered with :func:`register` under its name with the config flag that turns it
on; :func:`run` applies the enabled ones in order, checks the IR after each (``ir.check``; a pass
must also keep every node's source line) and keeps a :class:`PassRecord` per pass — the IR after
it, how long it took and what it changed — for ``graph.passes_log`` and ``graph.debug(3)``.
"""
from __future__ import annotations

import importlib
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from ..ir import IRGraph, check


@dataclass(frozen=True)
class PassInfo:
    name: str
    fn: Callable
    enabled: Callable  # (config) -> bool


@dataclass(frozen=True)
class PassRecord:
    """One step of the pipeline: ``graph`` is the IR after it; ``before``/``after`` node counts,
    ``rewritten`` the nodes it made or changed, ``ops`` the change in node count per op."""

    name: str
    graph: IRGraph
    seconds: float
    before: int
    after: int
    rewritten: int
    ops: tuple = ()   # (op, +/- count) pairs, largest change first

    def summary(self) -> str:
        ops = ", ".join(f"{op} {d:+d}" for op, d in self.ops[:6]) + (", ..." if len(self.ops) > 6 else "")
        return (f"pass {self.name:<20} {self.before:>5} -> {self.after:<5} nodes, {self.rewritten:>4} rewritten "
                f"{self.seconds * 1e3:7.1f} ms" + (f"  ({ops})" if ops else ""))

    def __str__(self) -> str:
        return f"# after {self.summary()}\n{self.graph}"


def record(name: str, before: IRGraph, after: IRGraph, seconds: float) -> PassRecord:
    """What a pass did: node counts, nodes it rewrote, per-op count changes."""
    old = {id(n) for n in before.nodes}
    delta = Counter(n.op for n in after.nodes)
    delta.subtract(Counter(n.op for n in before.nodes))
    ops = tuple(sorted(((op, d) for op, d in delta.items() if d), key=lambda kv: (-abs(kv[1]), kv[0])))
    return PassRecord(name, after, seconds, len(before.nodes), len(after.nodes),
                      sum(id(n) not in old for n in after.nodes), ops)


PIPELINE: list[PassInfo] = []
ORDER = ["grad_acc", "amp", "checkpointing", "zero_regather", "cse", "dce", "recompute", "fuse_add_to_output",
         "fuse_elementwise", "fuse_update", "bucket_grads", "bucket_gathers",
         "schedule", "shard_elementwise", "memory_plan"]


def register(name: str, enabled: Callable = lambda cfg: True):
    def deco(fn: Callable) -> Callable:
        PIPELINE.append(PassInfo(name, fn, enabled))
        PIPELINE.sort(key=lambda p: ORDER.index(p.name) if p.name in ORDER else len(ORDER))
        return fn
    return deco


def load_all() -> None:
    for name in ORDER:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise


def run(g: IRGraph, config, log: list | None = None) -> IRGraph:
    """The enabled passes in order, each checked; appends a :class:`PassRecord` per pass to ``log``."""
    load_all()
    sources = all(n.source for n in g.nodes)   # a traced graph's nodes all have one: keep it so
    for p in PIPELINE:
        if not p.enabled(config):
            continue
        t0 = time.perf_counter()
        out = check(p.fn(g, config), where=p.name, sources=sources)
        if log is not None:
            log.append(record(p.name, g, out, time.perf_counter() - t0))
        g = out
    return g
