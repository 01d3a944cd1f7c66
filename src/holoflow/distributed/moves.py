"""Moving a global tensor to another placement (subset, superset, disjoint, 1-D <-> N-D).

Between meshes of the same shape with the same SBP and conventions (a pipeline stage boundary,
also under data parallelism) each shard goes straight to the rank at the same mesh position. Otherwise the
source ranks box to broadcast, the first source rank hands the whole tensor to the destination
ranks (a broadcast over ``{root} | dst``: a send/recv for one destination), and the destination
ranks take their shards: correct for every pair, moving the whole tensor once.

``MOVE`` is an op, so a move is differentiable: its gradient is the move of the gradient back,
from the destination (SBP dual(dst)) to the source (SBP dual(src)). A rank in neither placement
takes no part; a rank on one side only holds an empty local tensor on the other
(docs/architecture.md, "Ranks outside a placement").
"""
from __future__ import annotations

import torch

from ..core.dispatch import run_local
from ..core.registry import defop
from ..core.sbp import B
from ..core.tensor import Tensor
from .boxing import run_plan
from .placement import placement
from .sharding import dual, local_shape, shard_of


def _move_kernel(t: torch.Tensor, src_place: placement, src: tuple, dst_place: placement, dst: tuple,
                 shape: tuple, rank: int, comm) -> torch.Tensor:
    if src == dst and src_place.hierarchy == dst_place.hierarchy and \
            src_place.torch_conventions == dst_place.torch_conventions:   # (the same pieces)
        return _pairwise(t, src_place, dst_place, local_shape(shape, dst, dst_place, rank), rank, comm)
    root = src_place.flat_ranks[0]
    group = tuple(sorted({root} | set(dst_place.flat_ranks)))
    in_src, in_dst = src_place.coords(rank) is not None, dst_place.coords(rank) is not None
    if in_src:  # every source rank takes part in gathering the whole tensor
        full = run_plan(t, src_place, src, (B,) * src_place.ndim, shape, rank, comm)
    else:
        full = t.new_empty(shape)
    if rank not in group:  # a source rank that is not the root and receives nothing
        return t.new_empty((0,))
    if len(group) > 1:
        full = comm.broadcast(full.contiguous(), root, group)
    if not in_dst:
        return t.new_empty((0,))
    local = shard_of(full, dst, dst_place, rank)
    return local if local.is_contiguous() else local.contiguous()


def _pairwise(t: torch.Tensor, src_place: placement, dst_place: placement, mine: tuple, rank: int,
              comm) -> torch.Tensor:
    """Same mesh shape and SBP: the rank at each mesh position sends its shard to the rank at the
    same position of the destination (a stage boundary of PP x DP moves each shard once). Pairs
    run in one global order, so a rank in two pairs (overlapping placements) never deadlocks."""
    out = t.new_empty((0,))
    for s_r, d_r in zip(src_place.flat_ranks, dst_place.flat_ranks):
        if rank == s_r == d_r:
            out = t
        elif rank in (s_r, d_r):
            buf = t if rank == s_r else t.new_empty(mine)
            got = comm.broadcast(buf.contiguous(), s_r, (min(s_r, d_r), max(s_r, d_r)))
            if rank == d_r:
                out = got
    return out


def _move_grad(ctx, dy):
    return (move(dy, ctx.dst_place, dual(ctx.dst), ctx.src_place, dual(ctx.src), ctx.shape,
                 ctx.rank, ctx.comm),)


MOVE = defop("move", _move_kernel, grad=_move_grad, family="boxing")


def move(x: Tensor, src_place: placement, src: tuple, dst_place: placement, dst: tuple, shape,
         rank: int, comm) -> Tensor:
    """The local tensor, on this rank, of ``x`` (local tensor of a global one on ``src_place``
    with SBP ``src``) moved to ``dst_place`` with SBP ``dst``; differentiable. Every rank of
    either placement must call it (one program on every rank)."""
    if src_place.coords(rank) is None and dst_place.coords(rank) is None:
        return run_local(_IDLE, (x,), {})
    return run_local(MOVE, (x,), {"src_place": src_place, "src": src, "dst_place": dst_place,
                                  "dst": dst, "shape": tuple(shape), "rank": rank, "comm": comm})


# a rank in neither placement: nothing to send or receive, the (empty) value passes through
_IDLE = defop("move_idle", lambda t: t, grad=lambda ctx, dy: (dy,), family="boxing")
