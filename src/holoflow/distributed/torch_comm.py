"""The communicator boxing uses in a real multi-process world: holoflow.distributed.comm
(torch.distributed, counted, with timeouts) behind the small interface of ``world.SimComm``."""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import comm
from .groups import group_for


class TorchComm:
    """Boxing's collectives; inputs are never modified (shards belong to their tensors)."""

    def all_gather(self, t: torch.Tensor, group: tuple, dim: int, sizes) -> torch.Tensor:
        return torch.cat(comm.all_gather(t.contiguous(), group, dim, sizes), dim=dim)

    def all_reduce(self, t: torch.Tensor, group: tuple) -> torch.Tensor:
        return comm.all_reduce(t.clone(memory_format=torch.contiguous_format), group)

    def reduce_scatter(self, t: torch.Tensor, group: tuple, dim: int, sizes) -> torch.Tensor:
        return comm.reduce_scatter(t.contiguous(), group, dim)

    def all_to_all(self, chunks: list, group: tuple, out_shapes=None) -> list:
        return comm.all_to_all(chunks, group, out_shapes)

    def broadcast(self, t: torch.Tensor, src: int, group: tuple) -> torch.Tensor:
        return comm.broadcast(t.clone(memory_format=torch.contiguous_format), src, group)

    def all_gather_shapes(self, obj, group: tuple) -> list:
        if len(group) == 1:
            return [obj]
        out: list = [None] * len(group)
        dist.all_gather_object(out, obj, group=group_for(group))
        return out
