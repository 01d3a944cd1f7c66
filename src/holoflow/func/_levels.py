"""The levels of holoflow.func's transforms, as torch.func numbers them: each transform runs
its function one level below the code that called it. A tensor hook registered at a level fires
only in that level's backward passes (torch.func's hooks sit on that level's wrapped tensors,
which no other level's backward reaches); forward mode, computed here by reverse mode, runs its
backward passes at level -1, where none fires (torch's forward-mode AD runs no hook). Inside a
vmap or a forward-mode transform (jvp, jacfwd, linearize: its level in
``no_hook_levels``) a hook is refused: torch.func's tensors don't require grad there.
The state is this thread's (``grad_mode.STATE``: ``level``, ``no_hook_levels``), as torch's
levels are, read by ``Tensor.register_hook``, the engine and ``autograd.Function``."""
from __future__ import annotations

import contextlib

import torch

from typing import Any, Iterator

from ..core import saved
from ..core.grad_mode import STATE, forward_mode_runs, next_seq


@contextlib.contextmanager
def level(n: int, kind: str = "reverse") -> Iterator[None]:
    """Code inside runs at level ``n``, a transform's of ``kind``: "reverse" (grad, vjp, jacrev),
    "forward" (jvp, jacfwd), "linearize" (forward, on plain autograd's flags: ``plain_levels``)
    or "vmap" (all but reverse refuse hooks)."""
    state = STATE
    plain = kind == "linearize"
    kind = "forward" if plain else kind
    if plain:
        state.plain_levels.add(n)
    old, state.level = state.level, n
    old_start, state.starts[n] = state.starts.get(n), next_seq()
    kinds = state.reverse_levels if kind == "reverse" else state.forward_levels if kind == "forward" else None
    if kind != "reverse":
        state.no_hook_levels.add(n)
    if kinds is not None:
        kinds.add(n)
    try:
        yield
    finally:
        state.level = old
        if old_start is None:
            state.starts.pop(n, None)
        else:
            state.starts[n] = old_start
        if kind != "reverse":
            state.no_hook_levels.discard(n)
        if kinds is not None:
            kinds.discard(n)
        if plain:
            state.plain_levels.discard(n)
        if kind == "forward" and not state.forward_levels:
            state.regions.clear()   # (no forward mode left to see through its no_grad regions)
            state.snapshots.clear()


def _snapshot(x: Any) -> tuple:
    d = x._data
    packed = (x.detach().clone(), d, d._version)   # (pack hooks run under no_grad)
    STATE.snapshots.append(packed)
    return packed


def mark_stale() -> None:
    """Once the outermost forward-mode transform's passes are done: a copy whose original was
    written in place since it was saved gets a new version, so a reverse pass around that reads
    it (through the tangents' record) raises the saved-version error, as torch's reverse mode,
    which saved the original, does."""
    for copy, d, version in STATE.snapshots:
        if d._version != version:
            torch.autograd.graph.increment_version(copy._data)
    STATE.snapshots.clear()


def _read(packed: tuple) -> Any:
    """The copy for forward mode's own reverse passes (level -1); a reverse pass around it reads
    what was saved as holoflow's engine does, refusing it once written in place (torch's too)."""
    copy, d, version = packed
    if STATE.level != -1 and d._version != version:
        raise RuntimeError(f"holoflow: one of the tensors needed for gradient computation has been modified by an "
                           f"in-place operation: a tensor of shape {tuple(d.shape)} saved inside a forward-mode "
                           f"transform is at version {d._version}; expected version {version}. Use an "
                           f"out-of-place op (e.g. x = x + y instead of x += y) before this point.")
    return copy


@contextlib.contextmanager
def forward_saves() -> Iterator[None]:
    """Forward mode's function runs inside: what its nodes save is a copy, taken when saved, as
    long as forward mode is the nearest differentiating transform. torch's forward mode computes
    each tangent as the op runs, so a later in-place write of an input it read changes nothing;
    here the tangents come from reverse passes after the function returned, which must still
    read the values the ops saw (``_read``)."""
    saved.push(_snapshot, _read, applies=forward_mode_runs)
    try:
        yield
    finally:
        saved.pop()


def in_region(node: object) -> bool:
    """Whether a grad node was recorded in a no_grad region that forward mode alone sees through
    (``grad_mode._State``)."""
    seq = getattr(node, "seq", None)
    return seq is not None and any(a <= seq < b for a, b in STATE.regions)


def inner() -> int:
    """The level of a transform starting now: one below the code calling it."""
    return max(STATE.level, 0) + 1
