"""torch.autograd's engine switches that holoflow's engine answers: ``set_multithreading_enabled``
(holoflow's backward always runs on the calling thread, so the switch is kept, per thread, and
changes nothing) and ``is_view_replay_enabled`` (holoflow always re-derives a view's history by
replaying its view ops: True)."""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

__all__ = ["set_multithreading_enabled", "is_multithreading_enabled", "is_view_replay_enabled"]


class _State(threading.local):
    multithreading = True


_STATE = _State()


def is_multithreading_enabled() -> bool:
    """Whether multithreaded backward is on (this thread's switch; True by default)."""
    return _STATE.multithreading


def is_view_replay_enabled() -> bool:
    """True: holoflow regenerates a view's grad_fn by replaying its chain of view ops
    (core/views.py), what torch does with view replay enabled."""
    return True


class set_multithreading_enabled:
    """Sets multithreaded backward on or off from construction (per thread); as a context manager
    it restores the previous setting on exit, as a decorator it sets it around each call (and, as
    torch's, constructing the decorator has already set it)."""

    def __init__(self, mode: bool) -> None:
        self.prev = is_multithreading_enabled()
        _STATE.multithreading = bool(mode)
        self.mode = mode

    def __enter__(self) -> None:
        pass

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        _STATE.multithreading = self.prev

    def clone(self) -> set_multithreading_enabled:
        return self.__class__(self.mode)

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.clone():
                return fn(*args, **kwargs)
        return wrapper
