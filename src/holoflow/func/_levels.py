"""The levels of holoflow.func's transforms, as torch.func numbers them: each transform runs
its function one level below the code that called it. A tensor hook registered at a level fires
only in that level's backward passes (torch.func's hooks sit on that level's wrapped tensors,
which no other level's backward reaches); forward mode, computed here by reverse mode, runs its
backward passes at level -1, where none fires (torch's forward-mode AD runs no hook). Inside a
vmap or a forward-mode transform (jvp, jacfwd, linearize: its level in
``grad_mode.NO_HOOK_LEVELS``) a hook is refused: torch.func's tensors don't require grad there.
The state is ``grad_mode.HOOK_LEVEL``, read by ``Tensor.register_hook``, the engine and
``autograd.Function``."""
from __future__ import annotations

import contextlib

from ..core.grad_mode import HOOK_LEVEL, NO_HOOK_LEVELS


@contextlib.contextmanager
def level(n: int, hooks: bool = True):
    """Code inside runs at level ``n`` (without ``hooks``: a vmap's or forward mode's)."""
    old, HOOK_LEVEL[0] = HOOK_LEVEL[0], n
    if not hooks:
        NO_HOOK_LEVELS.add(n)
    try:
        yield
    finally:
        HOOK_LEVEL[0] = old
        if not hooks:
            NO_HOOK_LEVELS.discard(n)


def inner() -> int:
    """The level of a transform starting now: one below the code calling it."""
    return max(HOOK_LEVEL[0], 0) + 1
