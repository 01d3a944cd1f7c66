"""CUDA streams for the actor runtime: a graph on a CUDA device runs its compute, comm, update
and copy streams as CUDA streams ordered by events (runtime/streams.py, `DeviceStream`), all
launched from the caller's thread; the host only enqueues, so the copy of batch i+1 to the
device (the ``copy`` stream) overlaps the compute of batch i (docs/architecture.md, "Runtime").

Not measured here (no GPU in CI); the ordering logic is tested with a fake device stream in
tests/runtime/test_device_streams.py.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from ..runtime import SOURCE_STREAM, DeviceStream, TaskSpec

COPY_STREAM = "copy"       # host-to-device copies of the feeds
HOST_SUFFIX = "@host"      # a feed as the caller gives it, before the copy


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """The torch tensors inside a regst value (a tensor, or tuples/lists of them, or None)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from tensors(v)


class CudaStream:
    """A `DeviceStream` over one ``torch.cuda.Stream``."""

    def __init__(self, name: str, stream: torch.cuda.Stream) -> None:
        self.name = name
        self._stream = stream

    @property
    def stream(self) -> torch.cuda.Stream:
        return self._stream

    def activate(self) -> AbstractContextManager:
        return torch.cuda.stream(self.stream)

    def record(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, event: torch.cuda.Event) -> None:
        self.stream.wait_event(event)

    def keep(self, value: Any) -> None:
        s = self.stream
        for t in tensors(value):
            if t.is_cuda:
                t.record_stream(s)


class CallerStream(CudaStream):
    """The caller's current stream, looked up at each use: feeds are made and outputs read there."""

    def __init__(self, device: torch.device) -> None:
        self.name, self.device = SOURCE_STREAM, device

    @property
    def stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def activate(self) -> AbstractContextManager:
        return nullcontext()


def cuda_streams(streams: tuple[str, ...], device: torch.device) -> dict[str, DeviceStream]:
    """One CUDA stream per plan stream on ``device``; the source's is the caller's current stream."""
    return {s: CallerStream(device) if s == SOURCE_STREAM else CudaStream(s, torch.cuda.Stream(device))
            for s in streams}


def with_h2d_copies(specs: list[TaskSpec], feeds: tuple[str, ...], device: torch.device,
                    register_num: int = 2) -> tuple[list[TaskSpec], tuple[str, ...]]:
    """Adds a task on the ``copy`` stream moving the caller's feeds to ``device`` (non-blocking:
    asynchronous from pinned memory; a feed already there passes as is). Returns the tasks and
    the plan's new inputs (``name@host``)."""
    if not feeds:
        return specs, feeds
    host = tuple(f + HOST_SUFFIX for f in feeds)

    def copy(*xs: torch.Tensor) -> tuple:
        return tuple(x.to(device, non_blocking=True) for x in xs)
    task = TaskSpec("h2d", COPY_STREAM, copy, host, feeds, register_num=register_num,
                    meta={"nodes": len(feeds)})
    return [task, *specs], host
