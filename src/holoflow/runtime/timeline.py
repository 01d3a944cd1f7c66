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


# -- several ranks in one trace (pipelines) ---------------------------------------------------------------

def merged_chrome_trace(acts: list[dict]) -> dict:
    """One Chrome/Perfetto trace of several ranks' acts: a process row per rank ("stage s · rank
    r", ordered by stage), a thread lane per stream (``compute``, ``comm.*``, ``update``), each
    act named by its task and micro-batch. ``acts`` are dicts with ``task, lane, phase, mb,
    step, start, end, rank, stage`` (absolute seconds on one clock, e.g. perf_counter)."""
    if not acts:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t0 = min(a["start"] for a in acts)
    events: list[dict] = []
    lanes: dict[tuple, int] = {}
    ranks = sorted({(a["stage"], a["rank"]) for a in acts}, key=lambda sr: (sr[0] is None, sr))
    for stage, rank in ranks:
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"stage {stage} · rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": (stage or 0) * 1000 + rank}})
    order = {"compute": 0, "update": 9}
    for a in sorted(acts, key=lambda a: a["start"]):
        key = (a["rank"], a["lane"])
        if key not in lanes:
            lanes[key] = tid = order.get(a["lane"], 1 + len([k for k in lanes if k[0] == a["rank"]]))
            events.append({"name": "thread_name", "ph": "M", "pid": a["rank"], "tid": tid,
                           "args": {"name": a["lane"]}})
        label = a["phase"] if a["lane"] == "compute" and a["phase"] in ("F", "B", "W") else a["task"]
        events.append({"name": f"{label} mb{a['mb']}" if a["phase"] != "U" else "update", "cat": a["lane"],
                       "ph": "X", "pid": a["rank"], "tid": lanes[key], "ts": (a["start"] - t0) * 1e6,
                       "dur": (a["end"] - a["start"]) * 1e6,
                       "args": {"task": a["task"], "micro_batch": a["mb"], "step": a["step"], "stage": a["stage"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_merged(path: str, acts: list[dict]) -> None:
    """Writes :func:`merged_chrome_trace` as JSON to ``path`` (open it in https://ui.perfetto.dev)."""
    with open(path, "w") as f:
        json.dump(merged_chrome_trace(acts), f)


def bubble_fractions(acts: list[dict], phases: tuple = ("F", "B", "W")) -> dict:
    """Per rank, the idle fraction of its compute lane over each step's makespan (first forward
    anywhere to last backward anywhere), averaged over steps: ``1 - busy / span``."""
    steps: dict[int, list] = {}
    for a in acts:
        if a["phase"] in phases and a["lane"] == "compute":
            steps.setdefault(a["step"], []).append(a)
    out: dict = {}
    for xs in steps.values():
        span = max(a["end"] for a in xs) - min(a["start"] for a in xs)
        for r in {a["rank"] for a in xs}:
            busy = sum(a["end"] - a["start"] for a in xs if a["rank"] == r)
            out.setdefault(r, []).append(1 - busy / span if span > 0 else 0.0)
    return {r: sum(v) / len(v) for r, v in out.items()}


def phase_durations(acts: list[dict], phases: tuple = ("F", "B", "W")) -> dict:
    """Per rank, the mean duration (seconds) of one act of each phase on its compute lane —
    a micro-batch's forward ``F``, backward ``B`` (the input gradient, under zero-bubble
    schedules) and weight gradients ``W`` — over ``acts`` (dicts as for `bubble_fractions`); a
    phase the rank never ran is 0.0 (1F1B and GPipe run W inside B)."""
    sums: dict = {}
    for a in acts:
        if a["phase"] in phases and a["lane"] == "compute":
            tot = sums.setdefault(a["rank"], {ph: [0.0, 0] for ph in phases})[a["phase"]]
            tot[0] += a["end"] - a["start"]
            tot[1] += 1
    return {r: {ph: (t / n if n else 0.0) for ph, (t, n) in v.items()} for r, v in sums.items()}
