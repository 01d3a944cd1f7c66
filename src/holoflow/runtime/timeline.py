"""The timeline: every act as (actor, stream, iteration, start, end), written as a Chrome/Perfetto trace.

Each stream thread appends to its own list (no lock on the hot path); readers merge after the run.
Open the JSON in https://ui.perfetto.dev or chrome://tracing: one row (tid) per stream.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import NamedTuple


class Act(NamedTuple):
    """One recorded act; times in seconds from the timeline's start."""

    actor: str
    stream: str
    iteration: int
    start: float
    end: float


@dataclass
class TaskStats:
    """Per-actor totals over a trace."""

    count: int
    total: float
    mean: float
    percent_of_wall: float


class Timeline:
    """The acts of one run (``Runtime(plan, trace=True).timeline``): each stream thread appends to
    its own ``lane``; ``acts``, ``stats``, ``table`` and ``write`` read them after the run."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self._per_stream: dict[str, list[Act]] = {}

    def lane(self, stream: str) -> list[Act]:
        """The list a stream thread appends its acts to (created before the threads start)."""
        return self._per_stream.setdefault(stream, [])

    def acts(self) -> list[Act]:
        """All acts, ordered by start time."""
        return sorted((a for lane in self._per_stream.values() for a in lane), key=lambda a: a.start)

    def clear(self) -> None:
        """Forgets the recorded acts (keeps the lanes)."""
        for lane in self._per_stream.values():
            lane.clear()

    def chrome_trace(self) -> dict:
        """The trace as a Chrome trace-event dict: one complete ('X') event per act, tid per stream."""
        tids = {s: i for i, s in enumerate(self._per_stream)}
        events: list[dict] = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": s}}
                              for s, tid in tids.items()]
        for a in self.acts():
            events.append({"name": a.actor, "cat": "act", "ph": "X", "pid": 0, "tid": tids[a.stream],
                           "ts": a.start * 1e6, "dur": (a.end - a.start) * 1e6,
                           "args": {"iteration": a.iteration, "stream": a.stream}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path: str) -> None:
        """Writes `chrome_trace` as JSON to ``path``."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)

    def stats(self) -> dict[str, TaskStats]:
        """Per-actor count, total and mean seconds, and share of the wall span of the trace."""
        acts = self.acts()
        if not acts:
            return {}
        wall = max(a.end for a in acts) - acts[0].start or 1e-12
        by: dict[str, list[float]] = {}
        for a in acts:
            by.setdefault(a.actor, []).append(a.end - a.start)
        return {k: TaskStats(len(v), sum(v), sum(v) / len(v), 100 * sum(v) / wall) for k, v in by.items()}

    def table(self) -> str:
        """`stats` as a text table, busiest actor first."""
        rows = sorted(self.stats().items(), key=lambda kv: -kv[1].total)
        lines = [f"{'task':<24} {'count':>7} {'total ms':>10} {'mean ms':>9} {'% wall':>7}"]
        lines += [f"{k:<24} {s.count:>7} {s.total * 1e3:>10.3f} {s.mean * 1e3:>9.4f} {s.percent_of_wall:>7.1f}"
                  for k, s in rows]
        return "\n".join(lines)
