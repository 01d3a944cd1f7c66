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

from typing import Iterator

from ..core.grad_mode import STATE


@contextlib.contextmanager
def level(n: int, kind: str = "reverse") -> Iterator[None]:
    """Code inside runs at level ``n``, a transform's of ``kind``: "reverse" (grad, vjp, jacrev),
    "forward" (jvp, jacfwd, linearize) or "vmap" (the last two refuse hooks)."""
    state = STATE
    old, state.level = state.level, n
    kinds = state.reverse_levels if kind == "reverse" else state.forward_levels if kind == "forward" else None
    if kind != "reverse":
        state.no_hook_levels.add(n)
    if kinds is not None:
        kinds.add(n)
    try:
        yield
    finally:
        state.level = old
        if kind != "reverse":
            state.no_hook_levels.discard(n)
        if kinds is not None:
            kinds.discard(n)
        if kind == "forward" and not state.forward_levels:
            state.regions.clear()   # (no forward mode left to see through its no_grad regions)


def in_region(node: object) -> bool:
    """Whether a grad node was recorded in a no_grad region that forward mode alone sees through
    (``grad_mode._State``)."""
    seq = getattr(node, "seq", None)
    return seq is not None and any(a <= seq < b for a, b in STATE.regions)


def inner() -> int:
    """The level of a transform starting now: one below the code calling it."""
    return max(STATE.level, 0) + 1
