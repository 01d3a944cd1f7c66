"""Graph passes: pure functions ``Graph -> Graph``, one file each, run in a fixed pipeline.

Each pass is registered with :func:`register` under its name with the config flag that turns it
on; :func:`run` applies the enabled ones in order, checks the IR after each (``ir.check``) and
records what each did and how long it took (``graph.debug`` prints it).
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Callable

from ..ir import Graph, check


@dataclass(frozen=True)
class PassInfo:
    name: str
    fn: Callable
    enabled: Callable  # (config) -> bool


PIPELINE: list[PassInfo] = []
ORDER = ["grad_acc", "amp", "checkpointing", "cse", "dce", "fuse_add_to_output",
         "fuse_elementwise", "fuse_update", "memory_plan"]


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


def run(g: Graph, config, log: list | None = None) -> Graph:
    load_all()
    for p in PIPELINE:
        if not p.enabled(config):
            continue
        t0 = time.perf_counter()
        before = len(g.nodes)
        g = check(p.fn(g, config), where=p.name)
        if log is not None:
            log.append((p.name, before, len(g.nodes), time.perf_counter() - t0))
    return g
