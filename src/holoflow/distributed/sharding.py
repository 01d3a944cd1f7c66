"""Sharding math of global tensors (which part of the logical tensor each rank holds): nd-SBP
normalisation, uneven splits, local shapes.

Splitting is hierarchical: mesh axis 0 splits first, axis 1 splits each piece further, ... A
size ``n`` split over ``p`` ranks follows the placement's conventions: balanced on a OneFlow
``placement`` (the first ``n % p`` ranks get one more element: 5 over 4 is 2,1,1,1) and
``torch.chunk``'s pieces on a torch ``DeviceMesh`` (ceil-sized, the last ones short or empty:
2,2,1,0), so a DTensor script sees torch's local shapes and offsets.
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch

from ..core.errors import ArgTypeError, HoloflowError
from ..core.sbp import SBP, B, P, S, short
from .placement import placement


def normalize_sbp(sbp, place: placement, ndim: int | None = None, what: str = "to_global") -> tuple:
    """A single SBP or a sequence -> an nd-SBP tuple with one entry per mesh axis."""
    check_placement(place, what)
    nd = tuple(sbp) if isinstance(sbp, (list, tuple)) else (sbp,)
    if len(nd) != place.ndim:
        raise HoloflowError(f"holoflow.{what}: the placement is a {place.ndim}-D mesh "
                            f"{place.hierarchy}, so sbp needs {place.ndim} value(s); got {len(nd)}: "
                            f"{nd}")
    for s in nd:
        if not isinstance(s, SBP):
            raise ArgTypeError(f"holoflow.{what}: {s!r} (a {type(s).__name__}) is not an SBP; use "
                               f"holoflow.sbp.split(i), .broadcast or .partial_sum")
        if ndim is not None and isinstance(s, S) and s.axis >= ndim:
            legal = f"legal split dims are 0..{ndim - 1}" if ndim else \
                "a 0-dim tensor can't be split; use broadcast or partial_sum"
            raise HoloflowError(f"holoflow.{what}: sbp split(dim={s.axis}) is out of range for a "
                                f"tensor with {ndim} dimension(s); {legal}")
    return nd


def check_placement(place, what: str = "to_global") -> None:
    """``place`` must be a :class:`placement` (a device string is not one): TypeError otherwise."""
    if not isinstance(place, placement):
        raise ArgTypeError(f"holoflow.{what}: placement must be a holoflow.placement, e.g. "
                           f"holoflow.placement('cpu', ranks=[0, 1]); got {place!r} (a {type(place).__name__})")


def nd_str(nd: Sequence[SBP]) -> str:
    return "(" + ", ".join(short(s) for s in nd) + ")"


def balanced(n: int, p: int, i: int) -> tuple[int, int]:
    """(start, size) of part ``i`` when ``n`` items are split over ``p`` parts, OneFlow's way."""
    base, extra = divmod(n, p)
    return i * base + min(i, extra), base + (1 if i < extra else 0)


def chunked(n: int, p: int, i: int) -> tuple[int, int]:
    """(start, size) of part ``i`` of ``torch.chunk(range(n), p)``, with the empty parts it leaves
    out at the end (torch DTensor's ``Shard`` layout)."""
    c = -(-n // p)
    start = min(i * c, n)
    return start, min(c, n - start)


def piece(n: int, place: placement, axis: int, coord: int) -> tuple[int, int]:
    """(start, size) of the part at ``coord`` of ``n`` items split along mesh ``axis`` of
    ``place``, under the placement's conventions."""
    return (chunked if place.torch_conventions else balanced)(n, place.hierarchy[axis], coord)


def split_rule(place: placement) -> str:
    """How ``place`` splits a size unevenly, for error messages."""
    if place.torch_conventions:
        return "a DeviceMesh splits as torch.chunk does (ceil-sized pieces, the last ones short or empty)"
    return "a placement splits balanced (the first n % p ranks one larger)"


def local_ranges(shape: Sequence[int], nd: Sequence[SBP], place: placement,
                 coords: Sequence[int]) -> list[tuple[int, int]]:
    """(start, size) per logical dim of the shard held at mesh ``coords``."""
    ranges = [(0, d) for d in shape]
    for axis, s in enumerate(nd):
        if isinstance(s, S):
            start, size = ranges[s.axis]
            off, n = piece(size, place, axis, coords[axis])
            ranges[s.axis] = (start + off, n)
    return ranges


@functools.lru_cache(maxsize=1 << 12)
def degenerate(shape: tuple, nd: tuple, place: placement) -> bool:
    """Whether some rank holds a shard with a split dim of size 0 or 1 where the logical dim is
    longer: that shard's strides along the dim carry no layout."""
    split_dims = {s.axis for s in nd if isinstance(s, S)}
    if not split_dims:
        return False
    return any(_local_shape(shape, nd, place, r)[d] <= 1 < shape[d]
               for r in place.flat_ranks for d in split_dims)


def local_shape(shape: Sequence[int], nd: Sequence[SBP], place: placement, rank: int) -> tuple:
    """The shape of the shard ``rank`` holds (zeros off the placement)."""
    return _local_shape(tuple(shape), tuple(nd), place, rank)


@functools.lru_cache(maxsize=1 << 14)   # traces and the planner's cost model ask for the same shards often
def _local_shape(shape: tuple, nd: tuple, place: placement, rank: int) -> tuple:
    coords = place.coords(rank)
    if coords is None:
        return (0,) * len(shape)
    return tuple(n for _, n in local_ranges(shape, nd, place, coords))


def shard_of(full: torch.Tensor, nd: Sequence[SBP], place: placement, rank: int) -> torch.Tensor:
    """This rank's local tensor of the logical ``full`` tensor: a slice for S, the whole for B,
    and for P the value on the first rank along each partial axis with zeros elsewhere."""
    coords = place.coords(rank)
    if coords is None:
        return full.new_empty((0,))
    local = full
    for dim, (start, size) in enumerate(local_ranges(full.shape, nd, place, coords)):
        if size != full.shape[dim]:
            local = local.narrow(dim, start, size)
    if any(s == P and coords[a] != 0 for a, s in enumerate(nd)):
        return torch.zeros_like(local)
    return local


def dual(nd: Sequence[SBP]) -> tuple:
    """The SBP of a gradient: broadcast <-> partial_sum, split stays split."""
    return tuple(P if s == B else B if s == P else s for s in nd)
