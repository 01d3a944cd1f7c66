"""Moving a global tensor to another placement (subset, superset, disjoint, 1-D <-> N-D).

The source ranks box to broadcast, the first source rank broadcasts the whole tensor over the
union of both rank sets, and the destination ranks take their shards. Simple and correct for
every pair; it moves the whole tensor once (a direct shard-to-shard plan is a later
optimisation). It is not differentiable yet: the result is detached, and an input that
requires grad raises instead of silently cutting the graph.
"""
from __future__ import annotations

import torch

from ..core.errors import UnsupportedError
from ..core.sbp import B
from ..core.tensor import Tensor
from . import world
from .boxing import apply_box
from .sharding import shard_of


def move(x: Tensor, place, nd: tuple, grad_sbp) -> Tensor:
    from .global_tensor import make_global
    src = x._global
    if x.requires_grad and __import__("holoflow").is_grad_enabled():
        raise UnsupportedError(
            f"holoflow.to_global: moving a tensor that requires grad from {src.placement} to {place} "
            f"is not differentiable yet; detach() it or move it before it joins the graph")
    r = world.rank()
    comm = world.comm()
    union = tuple(sorted(set(src.placement.flat_ranks) | set(place.flat_ranks)))
    if r not in union:
        raise UnsupportedError(f"holoflow.to_global: rank {r} is in neither placement")
    full = None
    if src.placement.coords(r) is not None:
        full = apply_box(x.detach(), src.placement, src.sbp, (B,) * src.placement.ndim, src.shape, r, comm)._data
    else:
        full = torch.empty(tuple(src.shape), dtype=x._data.dtype, device=x._data.device)
    root = src.placement.flat_ranks[0]
    full = comm.broadcast(full, root, union)
    local = shard_of(full, nd, place, r) if place.coords(r) is not None else full.new_empty((0,))
    return make_global(Tensor._make(local.contiguous()), place, nd, src.shape, grad_sbp)
