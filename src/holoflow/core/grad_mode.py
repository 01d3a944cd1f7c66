"""Grad-mode switches: ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ``inference_mode``."""
from __future__ import annotations

import functools
import threading


class _State(threading.local):
    """This thread's grad mode, and the holoflow.func transform levels its code runs at: torch's
    levels are per thread, so a transform's backward in one thread never changes which hooks fire
    in a backward running in another (func/_levels.py)."""

    enabled = True
    inference = False

    def __init__(self) -> None:
        # the level the code running now belongs to: a tensor hook registered at a level fires
        # only in that level's backward passes; -1: none fires (forward mode's reverse passes)
        self.level = 0
        # the levels of vmaps and forward-mode transforms, which refuse hooks
        self.no_hook_levels: set = set()
        # a vmap's level -> the grad nodes of its samples: a tensor whose history reaches one is batched
        self.vmap_samples: dict = {}


STATE = _State()


def is_grad_enabled() -> bool:
    return STATE.enabled


class _GradMode:
    """Context manager and decorator that sets grad mode, restoring it on exit."""

    mode = True

    def __enter__(self) -> None:
        self._prev, STATE.enabled = STATE.enabled, self.mode

    def __exit__(self, *exc) -> None:
        STATE.enabled = self._prev

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_GradMode):
    """Disables gradient recording: ``with flow.no_grad(): ...`` or ``@flow.no_grad()``."""

    mode = False


class enable_grad(_GradMode):
    """Enables gradient recording inside a ``no_grad`` block."""

    mode = True


class set_grad_enabled(_GradMode):
    """Sets grad mode to ``mode``; takes effect at construction, like torch's."""

    def __init__(self, mode: bool) -> None:
        self.mode = mode
        self._prev, STATE.enabled = STATE.enabled, mode

    def __enter__(self) -> None:
        pass

    def __call__(self, fn):
        STATE.enabled = self._prev
        mode = self.mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)
        return wrapper


class inference_mode(_GradMode):
    """Like ``no_grad`` (holoflow keeps no separate inference tensors); ``is_inference_mode_enabled``
    reports it. Works bare as a decorator (``@inference_mode``), as torch's."""

    def __new__(cls, mode=True):
        if mode is None or isinstance(mode, bool):
            return super().__new__(cls)
        return cls()(mode)   # ``@inference_mode`` without parentheses

    def __init__(self, mode: bool = True) -> None:
        self.mode = not mode
        self.inference = bool(mode)

    def __enter__(self) -> None:
        super().__enter__()
        self._prev_inference, STATE.inference = STATE.inference, self.inference

    def __exit__(self, *exc) -> None:
        STATE.inference = self._prev_inference
        super().__exit__(*exc)

    def __call__(self, fn):
        inference = self.inference   # (the generic wrapper would rebuild it as inference_mode(True))

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with inference_mode(inference):
                return fn(*args, **kwargs)
        return wrapper
