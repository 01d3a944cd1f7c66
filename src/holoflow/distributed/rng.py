"""Random draws of global tensors: broadcast where the tensor is broadcast, distinct where it is split.

A random op on global tensors (dropout, bernoulli, the in-place samplers, attention dropout) runs
its kernel on every rank's shard. Drawn from each rank's own default generator, a broadcast result
would hold different values on different ranks wherever their generators differ (processes, or
simulated ranks, seeded apart), and a split one would repeat the same pattern on every shard
wherever they agree. OneFlow's rule fixes both, and holoflow follows it: one *initial seed* per
random op, the first rank's draw, agreed by every rank of the placement; each rank's kernel then
draws from a generator of its own seeded by :func:`rank_seed`, which numbers the rank by its mesh
coordinates along the split axes only. Ranks that differ only along broadcast axes draw the same
numbers; ranks on different shards draw different ones. A partial-sum output of a random op has no
meaning and is refused.

Eager: :func:`agreed_seed` per op call (one broadcast of 8 bytes among the placement's ranks).
nn.Graph: one seed per compiled graph, agreed with the program fingerprint; every random node of
the rank's plan gets a generator of its own (graph/global_graph.py ``localize``), advanced by each
run, so steps draw fresh numbers and broadcast ranks stay equal.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..core import generators
from ..core.errors import HoloflowError
from ..core.sbp import SBP, broadcast, split
from . import world

_MASK = (1 << 64) - 1


def draw(generator: torch.Generator | None = None) -> int:
    """One 63-bit integer from ``generator`` (when None, the default CPU generator: torch's, or a
    simulated rank's own, as each process draws from its own)."""
    if generator is None:
        generator = generators.default(generators.CPU)
    dev = generator.device if generator is not None else "cpu"
    return int(torch.empty((), dtype=torch.int64, device=dev).random_(generator=generator))


def mix(seed: int, index: int) -> int:
    """A seed derived from ``seed`` and ``index`` (splitmix64's finaliser over their sum): the
    ``index``-th of a family of well-separated seeds, non-negative and below 2**63."""
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) >> 1


def shard_index(place, nd_sbp: Sequence[SBP], rank: int, op: str = "a random op") -> int:
    """This rank's shard number for a random output of ``nd_sbp``: its mesh coordinates along the
    split axes in mixed radix (broadcast axes do not count: their ranks hold the same values)."""
    coords = place.coords(rank)
    index, stride = 0, 1
    for axis in reversed(range(place.ndim)):
        s = nd_sbp[axis]
        if isinstance(s, split):
            index += coords[axis] * stride
            stride *= place.hierarchy[axis]
        elif s != broadcast:
            raise HoloflowError(f"holoflow.{op}: a random output can be broadcast or split on each mesh "
                                f"axis, not {s} (axis {axis} of {place}); its values are drawn, not summed")
    return index


def rank_seed(seed: int, place, nd_sbp: Sequence[SBP], rank: int, op: str = "a random op") -> int:
    """The seed of ``rank``'s generator for a random output of ``nd_sbp`` whose initial seed is
    ``seed`` (equal for ranks holding the same shard, different across shards)."""
    return mix(seed, shard_index(place, nd_sbp, rank, op))


def generator_for(seed: int, device) -> torch.Generator:
    """A fresh generator on ``device`` seeded with ``seed``."""
    return torch.Generator(device=device).manual_seed(seed)


def agreed_seed(place, generator: torch.Generator | None = None) -> int:
    """An initial seed every rank of ``place`` agrees on: each draws one from ``generator`` (its
    own stream advances alike) and takes the placement's first rank's (OneFlow broadcasts it too)."""
    mine = draw(generator)
    ranks = tuple(place.flat_ranks)
    if len(ranks) < 2:
        return mine
    got = world.comm().broadcast(torch.tensor([mine], dtype=torch.int64), ranks[0], ranks)
    return int(got[0])
