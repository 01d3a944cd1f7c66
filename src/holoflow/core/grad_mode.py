"""Grad-mode switches: ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ``inference_mode``."""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Iterator


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
        # the levels of reverse-mode and of forward-mode transforms (jvp, jacfwd, linearize)
        self.reverse_levels: set = set()
        self.forward_levels: set = set()
        # the levels of linearize, a forward-mode transform whose function torch runs on plain
        # autograd (forward-mode duals): its code reads requires_grad as outside any transform
        self.plain_levels: set = set()
        # forward mode is reverse mode here, yet no_grad stops reverse mode alone (torch's forward
        # AD runs through it): a no_grad region inside a forward-mode transform keeps recording.
        # The spans of its nodes' creation numbers (from ``region`` while it is open) are kept
        # (``regions``) until no forward mode is left: forward mode's passes see through those
        # nodes, reverse transforms' passes and all outside take them as constants
        # (func/_reverse.py: ``_regions_cut``, ``_seal_regions``)
        self.region: int | None = None
        self.regions: list = []
        # what forward mode's functions saved, as copies (func/_levels.forward_saves)
        self.snapshots: list = []
        # a level -> the creation number the transform's run began at: a node numbered from there
        # on was recorded inside it (core/node._at_level)
        self.starts: dict = {}


STATE = _State()

# inference mode was entered in this process: what ops make there is an inference tensor
# (core/tensor.mark_inference), which autograd refuses to save; till then nothing checks
INFERENCE_MADE = [False]


def _note_inference() -> None:
    if not INFERENCE_MADE[0]:
        from .native import FAST   # (the C path marks and checks from now on too)
        INFERENCE_MADE[0] = True
        if FAST is not None:
            FAST.note_inference()


def is_grad_enabled() -> bool:
    """Whether autograd records (library code asks this)."""
    return STATE.enabled


def user_grad_enabled() -> bool:
    """``torch.is_grad_enabled()`` as user code sees it: False inside ``no_grad`` also where
    forward mode keeps recording through it (``_State.region``), as torch's flag there."""
    return STATE.enabled and STATE.region is None


def next_seq() -> int:
    """A grad-node creation number (core/node.SEQ): every node recorded later has a greater one."""
    from .node import SEQ   # (node imports this module)
    return next(SEQ)


def _forward_mode_runs(state: _State) -> bool:
    """Whether the nearest differentiating transform around the code running now is forward mode."""
    return state.level > 0 and bool(state.forward_levels) and \
        max(state.forward_levels) > max(state.reverse_levels, default=0)


def _forward_mode_around(state: _State) -> bool:
    """Whether a forward-mode transform is around the code running now (its transforms' own
    reverse passes, at level -1, aside)."""
    return state.level > 0 and bool(state.forward_levels)


def _close(state: _State) -> None:
    if state.region is not None:
        state.regions.append((state.region, next_seq()))
        state.region = None


def forward_mode_runs() -> bool:
    """Whether the nearest differentiating holoflow.func transform around the code running now
    is forward mode (jvp, jacfwd, linearize)."""
    return _forward_mode_runs(STATE)


@contextlib.contextmanager
def forward_region() -> Iterator[None]:
    """What is recorded inside is a no_grad region's of forward mode (see ``_State``): the
    tangent's terms that forward mode's reverse passes compute from such a region's nodes."""
    state = STATE
    if state.region is not None:
        yield
        return
    state.region = next_seq()
    try:
        yield
    finally:
        _close(state)


def _set(state: _State, mode: bool) -> tuple:
    """Sets grad mode to ``mode``; the state to restore. Turned off under forward mode, recording
    goes on as a region of forward mode's alone (see ``_State``)."""
    prev = (state.enabled, state.region is not None)
    if mode:
        _close(state)   # (enable_grad inside the region: every level records again)
        state.enabled = True
    elif state.enabled and state.region is None and _forward_mode_around(state):
        state.region = next_seq()
    elif state.region is None:
        state.enabled = False
    return prev


def _restore(state: _State, prev: tuple) -> None:
    enabled, in_region = prev
    if not in_region:
        _close(state)
    elif state.region is None:
        state.region = next_seq()
    state.enabled = enabled


class _GradMode:
    """Context manager and decorator that sets grad mode, restoring it on exit."""

    mode = True

    def __enter__(self) -> None:
        self._prev = _set(STATE, self.mode)

    def __exit__(self, *exc) -> None:
        _restore(STATE, self._prev)

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
        self._prev = _set(STATE, mode)

    def __enter__(self) -> None:
        pass

    def __call__(self, fn):
        _restore(STATE, self._prev)
        mode = self.mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)
        return wrapper


class inference_mode(_GradMode):
    """Like ``no_grad``; what ops make inside is an inference tensor (``is_inference()``), which
    autograd refuses to save for backward outside, as torch's; ``is_inference_mode_enabled``
    reports it. Works bare as a decorator (``@inference_mode``), as torch's."""

    def __new__(cls, mode=True):
        if mode is None or isinstance(mode, bool):
            return super().__new__(cls)
        return cls()(mode)   # ``@inference_mode`` without parentheses

    def __init__(self, mode: bool = True) -> None:
        self.mode = not mode
        self.inference = bool(mode)

    def __enter__(self) -> None:
        # (torch's forward AD stops in inference mode: no region, recording stops at every level)
        state = STATE
        self._prev = (state.enabled, state.region is not None)
        _close(state)
        state.enabled = self.mode
        self._prev_inference, state.inference = state.inference, self.inference
        if self.inference:
            _note_inference()

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
