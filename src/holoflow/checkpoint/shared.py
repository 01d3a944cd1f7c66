"""Global tensors of a sharded checkpoint that shared a local storage when saved (a global tensor
and a global view of it, tied tensors) load sharing one again, as ``torch.load`` gives views and
tied tensors back (see the manifest's ``"shared"`` in :mod:`holoflow.checkpoint.sharded`).

On each rank, the saved parts of such tensors (offset, shape and stride in their local storage)
are written into one new storage, each tensor a view of it with its saved layout. Rank 0's
local tensors over its part of a global tensor (``g.to_local()`` saved beside ``g``) join it too,
as the local tensors of a sharded checkpoint are rank 0's. This holds where every tensor of the
storage loads in its saved layout (the same box of it on this rank; a local tensor whole, local)
and their values agree where they overlap (a partial sum is reduced when saved, its part not);
in another layout (``like=``, another world) they load apart, as torch's DCP loads each tensor
into its own.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["Part", "parts_of", "joined"]

Part = tuple[str, int, list, list]   # (tensor key, storage offset, shape, stride) of a rank's part
SPAN_LIMIT = 2   # a storage spanning more than this many times its parts' elements is not rebuilt


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


def parts_of(manifest: dict, rank: int, bad: Callable[[str], Exception]) -> list[list[Part]]:
    """This rank's storages of the manifest's ``"shared"`` (absent in older directories: none),
    each the parts of the global tensors on it; ``bad`` makes the error for a malformed one."""
    shared = manifest.get("shared", {})
    if not isinstance(shared, dict):
        raise bad(f"\"shared\" is {str(shared)[:60]}, not a map of ranks to storages")
    groups = shared.get(str(rank), [])
    ok = isinstance(groups, list) and all(isinstance(g, list) for g in groups)
    for part in (p for g in groups for p in g) if ok else ():
        ok = ok and isinstance(part, list) and len(part) == 4 and isinstance(part[0], str) and \
            _ints([part[1]]) and _ints(part[2]) and _ints(part[3]) and len(part[2]) == len(part[3])
    if not ok:
        raise bad(f"\"shared\" of rank {rank} is not lists of [key, offset, shape, stride]: {str(groups)[:80]}")
    return [[tuple(p) for p in g] for g in groups]


def joined(parts: list[tuple[int, list, list, torch.Tensor]]) -> list[torch.Tensor] | None:
    """``(offset, shape, stride, values)`` of the tensors of one storage, written into a new
    (CPU) storage as views of it with those layouts, in order; None where they can't share one
    (elements overlapping within a view, or a span much larger than the parts: unsaved storage
    between them), and they load apart."""
    base = min(off for off, _, _, _ in parts)
    end = max(off + 1 + sum((n - 1) * s for n, s in zip(shape, stride)) for off, shape, stride, _ in parts)
    if end - base > SPAN_LIMIT * sum(v.numel() for _, _, _, v in parts):
        return None
    store = torch.zeros(end - base, dtype=parts[0][3].dtype)
    views = [store.as_strided(shape, stride, off - base) for off, shape, stride, _ in parts]
    try:
        for view, (_, _, _, values) in zip(views, parts):
            view.copy_(values)
    except RuntimeError:   # (a view whose elements overlap, e.g. an expanded one)
        return None
    if not all(_same(view, values) for view, (_, _, _, values) in zip(views, parts)):
        return None   # (parts that disagree where they overlap: a partial sum's local part, reduced when saved)
    return views


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same values (NaNs where NaNs)."""
    if a.is_floating_point() or a.is_complex():
        return bool(torch.all((a == b) | (torch.isnan(a) & torch.isnan(b))))
    return torch.equal(a, b)
