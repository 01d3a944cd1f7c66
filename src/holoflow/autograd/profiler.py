"""``holoflow.autograd.profiler``: a small host-side profiler (``profile``, ``record_function``)
with ``torch.autograd.profiler``'s API; ``holoflow.profiler`` builds torch.profiler's
``profile`` (activities, schedules, trace handlers) on the same machinery.

While a profiler is active, every holoflow op applied on its thread (forward and backward) and
every ``record_function`` range is timed on the host::

    with holoflow.autograd.profiler.profile() as prof:
        with holoflow.autograd.profiler.record_function("forward"):
            loss = model(x).sum()
        loss.backward()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))

What it measures, honestly: the time from an op's dispatch to its return on the calling thread.
On CPU that is the op's compute; CUDA kernels run asynchronously, so for them it is launch
overhead, and no device (CUDA) times are recorded or shown. Sorting by a device column
(``sort_by="cuda_time_total"``) sorts by host total time instead. Ops run on other threads (a
data loader's workers) are not seen. Traces are written in Chrome's trace-event JSON format.
"""
from __future__ import annotations

import contextvars
import functools
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..core import interpret

__all__ = ["profile", "record_function", "FunctionEvent", "FunctionEventAvg", "EventList", "kineto_available",
           "ProfilerActivity", "ProfilerAction"]

#: torch's enums, so ``activities=[ProfilerActivity.CPU]`` and schedule actions compare with torch's
ProfilerActivity = torch.profiler.ProfilerActivity
ProfilerAction = torch.profiler.ProfilerAction

_ACTIVE: contextvars.ContextVar[tuple["ProfilerBase", ...]] = contextvars.ContextVar("holoflow_profilers", default=())


def kineto_available() -> bool:
    """False: holoflow's profiler does not use Kineto."""
    return False


@dataclass
class FunctionEvent:
    """One recorded op or ``record_function`` range: times in microseconds from the profile's start."""

    name: str
    start_us: float
    end_us: float
    self_us: float
    kind: str = "op"            # "op" (a holoflow op) or "range" (a record_function)
    input_shapes: tuple = ()

    @property
    def cpu_time_total(self) -> float:
        return self.end_us - self.start_us

    @property
    def self_cpu_time_total(self) -> float:
        return self.self_us

    key = property(lambda self: self.name)


class FunctionEventAvg:
    """The events of one name (and input shapes, when grouped so) summed: ``count``,
    ``cpu_time_total`` and ``self_cpu_time_total`` in microseconds, ``cpu_time`` their mean."""

    def __init__(self, key: str, input_shapes: tuple = ()) -> None:
        self.key, self.input_shapes = key, input_shapes
        self.count = 0
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0

    def add(self, ev: FunctionEvent) -> None:
        self.count += 1
        self.cpu_time_total += ev.cpu_time_total
        self.self_cpu_time_total += ev.self_cpu_time_total

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / self.count if self.count else 0.0

    def __repr__(self) -> str:
        return (f"<FunctionEventAvg key={self.key} count={self.count} cpu_time_total={self.cpu_time_total:.3f}us "
                f"self_cpu_time_total={self.self_cpu_time_total:.3f}us>")


def _fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


_SORT_KEYS = {"cpu_time_total": "cpu_time_total", "self_cpu_time_total": "self_cpu_time_total",
              "cpu_time": "cpu_time", "count": "count"}
_DEVICE_KEYS = {"cuda_time_total", "self_cuda_time_total", "cuda_time", "device_time_total",
                "self_device_time_total", "device_time", "xpu_time_total", "self_xpu_time_total"}


class EventList(list):
    """A list of :class:`FunctionEvent` (``prof.events()``) or :class:`FunctionEventAvg`
    (``prof.key_averages()``), with torch's ``table``."""

    def table(self, sort_by: str | None = None, row_limit: int = 100, max_name_column_width: int = 55,
              header: str | None = None, top_level_events_only: bool = False, **kwargs: Any) -> str:
        """A text table: name, self and total host time (and their share of the whole), mean
        time per call and call count. ``sort_by`` is a column key (``"cpu_time_total"``,
        ``"self_cpu_time_total"``, ``"cpu_time"``, ``"count"``); device keys sort by host total."""
        rows = list(self)
        if sort_by is not None:
            if sort_by in _DEVICE_KEYS:
                sort_by = "cpu_time_total"   # device times are not measured (see the module doc)
            if sort_by not in _SORT_KEYS:
                raise AttributeError(f"holoflow.profiler: cannot sort by {sort_by!r}; use one of "
                                     f"{sorted(_SORT_KEYS)}")
            rows.sort(key=lambda r: getattr(r, _SORT_KEYS[sort_by]), reverse=True)
        if row_limit is not None and row_limit > 0:
            rows = rows[:row_limit]
        self_total = sum(r.self_cpu_time_total for r in self) or 1.0
        width = min(max([len("Name")] + [len(r.key) for r in rows]), max_name_column_width)
        cols = ["Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls"]
        widths = [12] * len(cols)
        line = "-" * width + "  " + "  ".join("-" * w for w in widths)
        out = [header] if header else []
        out += [line, "Name".ljust(width) + "  " + "  ".join(c.rjust(w) for c, w in zip(cols, widths)), line]
        for r in rows:
            name = r.key if len(r.key) <= width else r.key[:width - 3] + "..."
            cpu_avg = r.cpu_time if isinstance(r, FunctionEventAvg) else r.cpu_time_total
            count = r.count if isinstance(r, FunctionEventAvg) else 1
            vals = [f"{100 * r.self_cpu_time_total / self_total:.2f}%", _fmt_us(r.self_cpu_time_total),
                    f"{100 * r.cpu_time_total / self_total:.2f}%", _fmt_us(r.cpu_time_total), _fmt_us(cpu_avg),
                    str(count)]
            out.append(name.ljust(width) + "  " + "  ".join(v.rjust(w) for v, w in zip(vals, widths)))
        out += [line, f"Self CPU time total: {_fmt_us(sum(r.self_cpu_time_total for r in self))}",
                "(host wall-clock times; device (CUDA) times are not measured by holoflow's profiler)"]
        return "\n".join(out) + "\n"

    def total_average(self) -> FunctionEventAvg:
        avg = FunctionEventAvg("Total")
        for r in self:
            avg.count += getattr(r, "count", 1)
            avg.cpu_time_total += r.cpu_time_total
            avg.self_cpu_time_total += r.self_cpu_time_total
        return avg


class _Recorder(interpret.Interpreter):
    """Times every op that reaches it, then binds on unchanged."""

    def __init__(self, prof: "ProfilerBase") -> None:
        super().__init__()
        self.prof = prof

    def bind(self, op, inputs: tuple, attrs: dict):
        if not self.prof._recording:
            return self.parent.bind(op, inputs, attrs)
        shapes = tuple(tuple(x.shape) if hasattr(x, "shape") else () for x in inputs) if self.prof.record_shapes else ()
        frame = self.prof._open()
        try:
            return self.parent.bind(op, inputs, attrs)
        finally:
            self.prof._close(frame, op.name, "op", shapes)


class ProfilerBase:
    """What both profilers share: the recorder pushed on ``start()`` and popped on ``stop()``,
    torch's step/schedule semantics, and the results (``events``, ``key_averages``,
    ``export_chrome_trace``)."""

    def __init__(self, *, schedule: Callable[[int], Any] | None = None,
                 on_trace_ready: Callable[[Any], Any] | None = None, record_shapes: bool = False,
                 acc_events: bool = False) -> None:
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.record_shapes = record_shapes
        self.acc_events = acc_events
        self.step_num = 0
        self._events: list[FunctionEvent] = []
        self._frames: list[list[float]] = []
        self._t0 = 0
        self._recording = False
        self._ctx = None
        self._token = None

    # -- recording -------------------------------------------------------------------------------
    def _now_us(self) -> float:
        return (time.perf_counter_ns() - self._t0) / 1e3

    def _open(self) -> list[float]:
        frame = [self._now_us(), 0.0]   # start, time spent in children
        self._frames.append(frame)
        return frame

    def _close(self, frame: list[float], name: str, kind: str, shapes: tuple = ()) -> None:
        end = self._now_us()
        while self._frames and self._frames[-1] is not frame:   # a child left unclosed (an exception)
            self._frames.pop()
        if self._frames:
            self._frames.pop()
        total = end - frame[0]
        if self._frames:
            self._frames[-1][1] += total
        self._events.append(FunctionEvent(name, frame[0], end, max(total - frame[1], 0.0), kind, shapes))

    def _action(self) -> Any:
        return ProfilerAction.RECORD if self.schedule is None else self.schedule(self.step_num)

    def _apply_action(self) -> None:
        self._recording = self._action() in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Starts profiling (pushes the recorder; ops applied on this thread are timed)."""
        if self._ctx is not None:
            raise RuntimeError(f"holoflow.profiler: start() called on a {type(self).__name__} already running")
        self._t0 = time.perf_counter_ns()
        self._ctx = interpret.pushed(_Recorder(self))
        self._ctx.__enter__()
        self._token = _ACTIVE.set(_ACTIVE.get() + (self,))
        self._apply_action()

    def stop(self) -> None:
        """Stops profiling; with a schedule, a cycle still recording is handed to ``on_trace_ready``."""
        if self._ctx is None:
            return
        saving = self.schedule is not None and self._recording
        self._recording = False
        _ACTIVE.reset(self._token)
        self._ctx.__exit__(None, None, None)
        self._ctx = self._token = None
        if self.on_trace_ready is not None and (self.schedule is None or saving):
            self.on_trace_ready(self)

    def step(self) -> None:
        """Marks the end of a training step: advances the schedule (``torch.profiler`` semantics)."""
        prev = self._action()
        self.step_num += 1
        if prev == ProfilerAction.RECORD_AND_SAVE and self.on_trace_ready is not None:
            self.on_trace_ready(self)
        nxt = self._action()
        if prev != ProfilerAction.RECORD and nxt in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            if not self.acc_events:
                self._events = []   # a new active cycle starts from an empty trace, as torch's
            self._frames = []
        if self._ctx is not None:
            self._apply_action()

    def __enter__(self) -> "ProfilerBase":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- results ---------------------------------------------------------------------------------
    def events(self) -> EventList:
        """Every recorded event, in completion order."""
        return EventList(self._events)

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> EventList:
        """The events summed per name (and input shapes with ``group_by_input_shape``), in
        first-seen order."""
        groups: dict[Any, FunctionEventAvg] = {}
        for ev in self._events:
            key = (ev.name, ev.input_shapes) if group_by_input_shape else ev.name
            if key not in groups:
                groups[key] = FunctionEventAvg(ev.name, ev.input_shapes if group_by_input_shape else ())
            groups[key].add(ev)
        return EventList(groups.values())

    def export_chrome_trace(self, path: str) -> None:
        """Writes the events in Chrome's trace-event JSON format (``chrome://tracing``, Perfetto)."""
        pid = os.getpid()
        trace = {"traceEvents": [{"name": ev.name, "ph": "X", "ts": ev.start_us, "dur": ev.cpu_time_total,
                                  "pid": pid, "tid": 0, "cat": "cpu_op" if ev.kind == "op" else "user_annotation",
                                  **({"args": {"Input Dims": [list(s) for s in ev.input_shapes]}}
                                     if ev.input_shapes else {})} for ev in self._events],
                 "displayTimeUnit": "ms"}
        with open(path, "w") as f:
            json.dump(trace, f)



class record_function:
    """Names a region in the active profilers' traces, as ``torch.profiler.record_function``:
    a context manager (``with record_function("data"):``) or a decorator. Outside a profile it
    only runs the code."""

    def __init__(self, name: str, args: str | None = None) -> None:
        self.name, self.args = name, args
        self._open: list[tuple[ProfilerBase, list[float]]] = []

    def __enter__(self) -> "record_function":
        self._open = [(p, p._open()) for p in _ACTIVE.get() if p._recording]
        return self

    def __exit__(self, *exc: Any) -> None:
        for p, frame in self._open:
            p._close(frame, self.name, "range")
        self._open = []

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with record_function(self.name, self.args):
                return fn(*args, **kwargs)
        return wrapped


class profile(ProfilerBase):
    """``torch.autograd.profiler.profile``: records holoflow ops and ``record_function`` ranges
    with host wall-clock times while active (``enabled=False``: records nothing). Results:
    ``key_averages().table(...)``, ``events()``, ``export_chrome_trace(path)``. Device (CUDA)
    times are not measured; ``use_cuda``, ``profile_memory``, ``with_stack`` ... are accepted
    for compatibility."""

    def __init__(self, enabled: bool = True, *, use_cuda: bool = False, use_device: Any = None,
                 record_shapes: bool = False, with_flops: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_modules: bool = False, use_kineto: bool = False,
                 use_cpu: bool = True, experimental_config: Any = None, acc_events: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(record_shapes=record_shapes, acc_events=acc_events)
        self.enabled = enabled

    def start(self) -> None:
        if self.enabled:
            super().start()

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False) -> EventList:
        """The events summed per name (and input shapes with ``group_by_input_shape``)."""
        return super().key_averages(group_by_input_shape, group_by_stack_n)

    def table(self, sort_by: str | None = None, row_limit: int = 100, **kwargs: Any) -> str:
        """``key_averages().table(...)``, as torch's ``profile.table``."""
        return self.key_averages().table(sort_by=sort_by, row_limit=row_limit, **kwargs)
