"""``holoflow.profiler``: torch.profiler's API on holoflow's host-side profiler
(holoflow/autograd/profiler.py, which says what is measured and what is not)::

    with holoflow.profiler.profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with holoflow.profiler.record_function("forward"):
            loss = model(x).sum()
        loss.backward()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))

``schedule`` and ``tensorboard_trace_handler`` follow torch's step semantics; traces are written in
Chrome's trace-event JSON format. No device (CUDA) times are measured, whatever ``activities``
asks for.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable, Iterable

from .autograd.profiler import (EventList, FunctionEvent, FunctionEventAvg, ProfilerAction, ProfilerActivity,
                                ProfilerBase, kineto_available, record_function)

__all__ = ["profile", "record_function", "schedule", "tensorboard_trace_handler", "ProfilerActivity",
           "ProfilerAction", "supported_activities", "kineto_available", "FunctionEvent", "FunctionEventAvg",
           "EventList"]


def supported_activities() -> set:
    """What this profiler measures: host (CPU) time only."""
    return {ProfilerActivity.CPU}


class profile(ProfilerBase):
    """Records holoflow ops and ``record_function`` ranges with host wall-clock times, as
    ``torch.profiler.profile`` (a context manager, or ``start()``/``stop()``; ``step()`` advances
    ``schedule``, calling ``on_trace_ready(prof)`` at the end of each active cycle).

    ``activities``, ``profile_memory``, ``with_stack``, ``with_flops`` and ``with_modules`` are
    accepted for compatibility; only host times (and, with ``record_shapes``, input shapes) are
    recorded."""

    def __init__(self, *, activities: Iterable[Any] | None = None, schedule: Callable[[int], Any] | None = None,
                 on_trace_ready: Callable[["profile"], Any] | None = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config: Any = None,
                 execution_trace_observer: Any = None, acc_events: bool = False, use_cuda: bool | None = None,
                 **kwargs: Any) -> None:
        super().__init__(schedule=schedule, on_trace_ready=on_trace_ready, record_shapes=record_shapes,
                         acc_events=acc_events)
        self.activities = set(activities) if activities is not None else supported_activities()


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0,
             skip_first_wait: int = 0) -> Callable[[int], Any]:
    """The step -> action function of torch's profiler schedule: after ``skip_first`` steps, cycles
    of ``wait`` idle, ``warmup`` and ``active`` recorded steps (the last one saves), ``repeat``
    times (0: forever). ``skip_first_wait=1`` skips the first cycle's wait."""
    if wait < 0 or warmup < 0 or active <= 0 or repeat < 0 or skip_first < 0:
        raise ValueError(f"holoflow.profiler.schedule: need wait, warmup, repeat, skip_first >= 0 and active > 0, "
                         f"got wait={wait} warmup={warmup} active={active} repeat={repeat} skip_first={skip_first}")
    cycle = wait + warmup + active

    def action(step: int) -> Any:
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait:
            step += wait
        if repeat > 0 and step // cycle >= repeat:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < wait:
            return ProfilerAction.NONE
        if pos < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if pos < cycle - 1 else ProfilerAction.RECORD_AND_SAVE
    return action


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None,
                              use_gzip: bool = False) -> Callable[[profile], None]:
    """An ``on_trace_ready`` writing each trace to ``dir_name/<worker>.<ms>.pt.trace.json[.gz]``
    (the file names TensorBoard's profiler plugin looks for)."""
    def handler(prof: profile) -> None:
        os.makedirs(dir_name, exist_ok=True)
        worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        stamp = time.time_ns() // 1_000_000
        # two traces within one millisecond would share torch's name: the later takes the next
        # free stamp instead of overwriting the earlier
        while any(os.path.exists(os.path.join(dir_name, f"{worker}.{stamp}.pt.trace.json{gz}"))
                  for gz in ("", ".gz")):
            stamp += 1
        path = os.path.join(dir_name, f"{worker}.{stamp}.pt.trace.json")
        prof.export_chrome_trace(path)
        if use_gzip:
            import gzip
            with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
                dst.write(src.read())
            os.remove(path)
    return handler
