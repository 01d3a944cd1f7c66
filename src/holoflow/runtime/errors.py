"""Errors raised while a plan runs: each names the task, its stream, the iteration and the source line."""
from __future__ import annotations

from ..core.errors import HoloflowError


class TaskError(HoloflowError):
    """A task's fn raised (or returned the wrong arity); the original exception is ``__cause__``."""

    def __init__(self, task: str, stream: str, iteration: int, source: str | None, cause: BaseException):
        self.task, self.stream, self.iteration, self.source = task, stream, iteration, source
        where = f"\n  source: {source}" if source else ""
        super().__init__(f"task {task!r} on stream {stream!r} failed at iteration {iteration}: "
                         f"{type(cause).__name__}: {cause}{where}")
        self.__cause__ = cause


class RuntimeStall(HoloflowError, TimeoutError):
    """No actor made progress for longer than the runtime's ``timeout``; the message lists what each
    actor waits for."""
