"""torch.distributed's process-group API on holoflow Tensors: what ``import torch.distributed as
dist`` gives a PyTorch script under mock_torch (``init_process_group``, ``all_reduce``,
``new_group``, ``barrier``, ...).

The default group is torch's own (holoflow's communication layer uses it as the world, so global
tensors and these calls share it); a group is the tuple of its global ranks (:class:`RankGroup`),
which every collective of ``holoflow.comm`` takes. Collectives work on local tensors and record no
autograd, as torch's.
"""
from __future__ import annotations

import datetime
import types
from typing import Sequence

import torch
import torch.distributed as dist

from ..core.errors import HoloflowError
from ..core.tensor import Tensor
from . import comm as _c
from . import comm_api, env

Backend = dist.Backend
ReduceOp = dist.ReduceOp
group = types.SimpleNamespace(WORLD=None)   # (``dist.group.WORLD``: the default group)
GroupMember = group


class RankGroup(tuple):
    """A process group: its global ranks, sorted (a rank's place is its group rank, as torch's
    ``new_group`` numbers them)."""

    def rank(self) -> int:
        return get_rank(self)

    def size(self) -> int:
        return len(self)


ProcessGroup = RankGroup


class _Done:
    """What ``async_op=True`` returns for a collective holoflow runs synchronously: finished."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _work(async_op: bool) -> _Done | None:
    return _Done() if async_op else None


def is_available() -> bool:
    return dist.is_available()


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def is_torchelastic_launched() -> bool:
    return dist.is_torchelastic_launched()


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: datetime.timedelta | None = None, world_size: int = -1, rank: int = -1,
                       store=None, group_name: str = "", pg_options=None, device_id=None) -> None:
    """torch's ``init_process_group``; the backend defaults to Gloo on the CPU and NCCL for CUDA
    tensors, the timeout to holoflow's communication timeout (``set_comm_timeout``)."""
    if is_initialized():
        raise RuntimeError("holoflow.distributed.init_process_group: the default process group is already "
                           "initialized (torch: 'trying to initialize the default process group twice'); "
                           "call destroy_process_group() first")
    extra = {} if device_id is None else {"device_id": device_id}
    env._import_group_pinning_modules()
    dist.init_process_group(backend or env.backend(), init_method=init_method, timeout=timeout or env.comm_timeout(),
                            world_size=world_size, rank=rank, store=store, group_name=group_name,
                            pg_options=pg_options, **extra)
    env.announce()


def destroy_process_group(group: RankGroup | None = None) -> None:
    """The default group (``group=None``): every group is destroyed once the collectives in flight
    finished (``env.shutdown``). A group of some ranks stays cached (holoflow creates a group
    once per set of ranks); nothing to free."""
    if group is None and is_initialized():
        env.shutdown()


def get_backend(group: RankGroup | None = None) -> str:
    return dist.get_backend()


def new_group(ranks: Sequence[int] | None = None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization: bool = False, group_desc: str | None = None) -> RankGroup:
    """A group of ``ranks`` (the world when None), numbered in increasing global rank as torch's.
    Holoflow creates the process group itself on its first collective, with the member ranks
    only."""
    members = tuple(sorted(_c._ranks(ranks)))
    world = env.get_world_size()
    bad = [r for r in members if not 0 <= r < world]
    if bad:
        raise ValueError(f"holoflow.distributed.new_group: ranks {bad} are outside the world of {world}")
    return RankGroup(members)


def get_rank(group: Sequence[int] | None = None) -> int:
    """This process's rank in ``group`` (its global rank for the world), -1 outside it (torch's)."""
    me = env.get_rank()
    if group is None:
        return me
    members = tuple(group)
    return members.index(me) if me in members else -1


def get_world_size(group: Sequence[int] | None = None) -> int:
    return env.get_world_size() if group is None else len(tuple(group))


def get_global_rank(group: Sequence[int] | None, group_rank: int) -> int:
    return group_rank if group is None else tuple(group)[group_rank]


def get_process_group_ranks(group: Sequence[int] | None) -> list[int]:
    return list(range(env.get_world_size())) if group is None else list(group)


def barrier(group: Sequence[int] | None = None, async_op: bool = False, device_ids=None) -> _Done | None:
    comm_api.barrier(group)
    return _work(async_op)


def all_reduce(tensor: Tensor, op=ReduceOp.SUM, group: Sequence[int] | None = None, async_op: bool = False):
    return comm_api.all_reduce(tensor, op, group, async_op)


def reduce(tensor: Tensor, dst: int, op=ReduceOp.SUM, group: Sequence[int] | None = None,
           async_op: bool = False) -> _Done | None:
    """Only ``dst``'s result is defined (torch's contract); the others get it too (an all-reduce)."""
    comm_api.all_reduce(tensor, op, group)
    return _work(async_op)


def broadcast(tensor: Tensor, src: int, group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    comm_api.broadcast(tensor, src, group)
    return _work(async_op)


def all_gather(tensor_list: list[Tensor], tensor: Tensor, group: Sequence[int] | None = None,
               async_op: bool = False) -> _Done | None:
    comm_api.all_gather(tensor_list, tensor, group)
    return _work(async_op)


def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, group: Sequence[int] | None = None,
                           async_op: bool = False) -> _Done | None:
    """``output_tensor`` = the ranks' ``input_tensor`` concatenated along dim 0 (or stacked, when
    ``output_tensor`` has one more dim), as torch's."""
    pieces = _c.all_gather(comm_api._local(input_tensor, "all_gather_into_tensor"), group)
    out = comm_api._local(output_tensor, "all_gather_into_tensor")
    whole = torch.stack(pieces) if out.dim() == pieces[0].dim() + 1 else torch.cat(pieces)
    if whole.shape != out.shape:
        raise HoloflowError(f"holoflow.distributed.all_gather_into_tensor: output of shape {tuple(out.shape)} for "
                            f"{len(pieces)} inputs of shape {tuple(pieces[0].shape)}; expected {tuple(whole.shape)}")
    out.copy_(whole)
    return _work(async_op)


def reduce_scatter(output: Tensor, input_list: list[Tensor], op=ReduceOp.SUM,
                   group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    comm_api.reduce_scatter(output, input_list, op, group)
    return _work(async_op)


def reduce_scatter_tensor(output: Tensor, input: Tensor, op=ReduceOp.SUM,  # noqa: A002 (torch's name)
                          group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    """``output`` = this rank's chunk (along dim 0) of the sum of every rank's ``input``."""
    n = get_world_size(group)
    if input.shape[0] != n * output.shape[0] or tuple(input.shape[1:]) != tuple(output.shape[1:]):
        raise HoloflowError(f"holoflow.distributed.reduce_scatter_tensor: input of shape {tuple(input.shape)} "
                            f"must be {n} chunks of the output's shape {tuple(output.shape)} along dim 0")
    comm_api.reduce_scatter(output, list(input.chunk(n)), op, group)
    return _work(async_op)


def all_to_all(output_tensor_list: list[Tensor], input_tensor_list: list[Tensor],
               group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    comm_api.all_to_all(output_tensor_list, input_tensor_list, group)
    return _work(async_op)


def gather(tensor: Tensor, gather_list: list[Tensor] | None = None, dst: int = 0,
           group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    comm_api.gather(tensor, gather_list, dst, group)
    return _work(async_op)


def scatter(tensor: Tensor, scatter_list: list[Tensor] | None = None, src: int = 0,
            group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    comm_api.scatter(tensor, scatter_list, src, group)
    return _work(async_op)


def send(tensor: Tensor, dst: int, group: Sequence[int] | None = None, tag: int = 0) -> None:
    """Sends ``tensor`` to global rank ``dst`` (torch's: global whatever the group)."""
    comm_api.send(tensor, dst)


def recv(tensor: Tensor, src: int | None = None, group: Sequence[int] | None = None, tag: int = 0) -> int:
    """Receives into ``tensor`` from global rank ``src``; returns the sender's rank, as torch's (a
    source is required: holoflow has no receive-from-any)."""
    if src is None:
        raise HoloflowError("holoflow.distributed.recv: give src (receiving from any rank is not supported)")
    comm_api.recv(tensor, src)
    return src


__all__ = ["Backend", "ReduceOp", "group", "GroupMember", "RankGroup", "ProcessGroup", "is_available", "is_initialized",
           "is_torchelastic_launched", "init_process_group", "destroy_process_group", "get_backend", "new_group",
           "get_rank", "get_world_size", "get_global_rank", "get_process_group_ranks", "barrier", "all_reduce",
           "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
           "reduce_scatter_tensor", "all_to_all", "gather", "scatter", "send", "recv"]
