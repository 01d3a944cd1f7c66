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

import torch.distributed as dist

from ..core.errors import HoloflowError
from ..core.tensor import Tensor
from . import comm as _c
from . import comm_api, env, world
from .futures import Future

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
    """What ``async_op=True`` returns for a collective holoflow runs synchronously: finished;
    ``get_future()``'s value is the collective's output tensors, as torch's."""

    def __init__(self, result: list | None = None) -> None:
        self.result = result

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> Future:
        return Future._completed(self.result)


class _InFlight:
    """An asynchronous collective in flight (torch's Work): ``wait()`` finishes it."""

    def __init__(self, handle, result: list) -> None:
        self.handle, self.result = handle, result

    def wait(self, timeout=None) -> bool:
        self.handle.wait()
        return True

    def is_completed(self) -> bool:
        return self.handle.is_completed()

    def get_future(self) -> Future:
        """A future of the output tensors, complete once the collective is waited for."""
        return Future._of(lambda: (self.wait(), self.result)[1])


def _work(async_op: bool, *result: Tensor) -> _Done | None:
    return _Done(list(result)) if async_op else None


def is_available() -> bool:
    return dist.is_available()


def is_initialized() -> bool:
    """Whether the default group exists (a simulated world is one, set up by ``simulate``)."""
    return world.simulated_rank() is not None or (dist.is_available() and dist.is_initialized())


def is_torchelastic_launched() -> bool:
    return dist.is_torchelastic_launched()


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: datetime.timedelta | None = None, world_size: int = -1, rank: int = -1,
                       store=None, group_name: str = "", pg_options=None, device_id=None) -> None:
    """torch's ``init_process_group``; the backend defaults to Gloo on the CPU and NCCL for CUDA
    tensors, the timeout to holoflow's communication timeout (``set_comm_timeout``). On a
    simulated rank the simulated world is the group: nothing to set up, but ``rank`` and
    ``world_size``, when given, must be that rank's."""
    if world.simulated_rank() is not None:
        _check_simulated(rank, world_size)
        return
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


def _check_simulated(rank: int, world_size: int) -> None:
    me, n = env.get_rank(), env.get_world_size()
    if rank not in (-1, me) or world_size not in (-1, n):
        raise ValueError(f"holoflow.distributed.init_process_group: rank={rank}, world_size={world_size} on simulated "
                         f"rank {me} of a simulated world of {n}; pass this rank's own (or neither)")


def destroy_process_group(group: RankGroup | None = None) -> None:
    """The default group (``group=None``): every group is destroyed once the collectives in flight
    finished (``env.shutdown``). A group of some ranks stays cached (holoflow creates a group
    once per set of ranks); nothing to free. A simulated world lives as long as ``simulate``."""
    if group is None and world.simulated_rank() is None and is_initialized():
        env.shutdown()


def get_backend(group: RankGroup | None = None) -> str:
    """The default group's backend (a simulated world's collectives give the values Gloo's do)."""
    return "gloo" if world.simulated_rank() is not None else dist.get_backend()


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
    handle = comm_api.all_reduce(tensor, op, group, async_op)
    return _InFlight(handle, [tensor]) if async_op else None


def reduce(tensor: Tensor, dst: int, op=ReduceOp.SUM, group: Sequence[int] | None = None,
           async_op: bool = False) -> _Done | None:
    """Only ``dst``'s result is defined (torch's contract); the others get it too (an all-reduce)."""
    comm_api.all_reduce(tensor, op, group)
    return _work(async_op, tensor)


def broadcast(tensor: Tensor, src: int, group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    comm_api.broadcast(tensor, src, group)
    return _work(async_op, tensor)


def all_gather(tensor_list: list[Tensor], tensor: Tensor, group: Sequence[int] | None = None,
               async_op: bool = False) -> _Done | None:
    comm_api.all_gather(tensor_list, tensor, group)
    return _work(async_op, *tensor_list)


def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, group: Sequence[int] | None = None,
                           async_op: bool = False) -> _Done | None:
    """``output_tensor`` = the ranks' ``input_tensor`` concatenated along dim 0 (or stacked, when
    ``output_tensor`` has one more dim), as torch's."""
    comm_api.all_gather_into_tensor(output_tensor, input_tensor, group)
    return _work(async_op, output_tensor)


def reduce_scatter(output: Tensor, input_list: list[Tensor], op=ReduceOp.SUM,
                   group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    comm_api.reduce_scatter(output, input_list, op, group)
    return _work(async_op, output)


def reduce_scatter_tensor(output: Tensor, input: Tensor, op=ReduceOp.SUM,  # noqa: A002 (torch's name)
                          group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    """``output`` = this rank's piece of the sum of every rank's ``input`` (the pieces
    concatenated along dim 0, or stacked)."""
    comm_api.reduce_scatter_tensor(output, input, op, group)
    return _work(async_op, output)


def all_to_all(output_tensor_list: list[Tensor], input_tensor_list: list[Tensor],
               group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    comm_api.all_to_all(output_tensor_list, input_tensor_list, group)
    return _work(async_op, *output_tensor_list)


def gather(tensor: Tensor, gather_list: list[Tensor] | None = None, dst: int = 0,
           group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    comm_api.gather(tensor, gather_list, dst, group)
    return _work(async_op, *(gather_list or ()))


def scatter(tensor: Tensor, scatter_list: list[Tensor] | None = None, src: int = 0,
            group: Sequence[int] | None = None, async_op: bool = False) -> _Done | None:
    comm_api.scatter(tensor, scatter_list, src, group)
    return _work(async_op, tensor)


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


def all_to_all_single(output: Tensor, input: Tensor, output_split_sizes: Sequence[int] | None = None,  # noqa: A002
                      input_split_sizes: Sequence[int] | None = None, group: Sequence[int] | None = None,
                      async_op: bool = False) -> _Done | None:
    """Rank ``i`` of ``group`` gets piece ``i`` (along dim 0) of every rank's ``input``, stacked in
    rank order into ``output``; the split sizes default to equal pieces, as torch's."""
    n = get_world_size(group)

    def pieces(t: Tensor, sizes, what: str) -> list:
        if sizes is None:
            if t.shape[0] % n:
                raise ValueError(f"holoflow.distributed.all_to_all_single: {what} dim 0 ({t.shape[0]}) does not "
                                 f"split into {n} equal pieces; give {what}_split_sizes")
            sizes = [t.shape[0] // n] * n
        if len(sizes) != n or sum(sizes) != t.shape[0]:
            raise ValueError(f"holoflow.distributed.all_to_all_single: {what}_split_sizes {list(sizes)} must be "
                             f"{n} sizes summing to {what} dim 0 ({t.shape[0]})")
        return list(t.split(list(sizes), 0))
    outs = pieces(output, output_split_sizes, "output")
    comm_api.all_to_all(outs, pieces(input, input_split_sizes, "input"), group)
    return _work(async_op, output)


def all_gather_object(object_list: list, obj, group: Sequence[int] | None = None) -> None:
    """``object_list[i]`` = the picklable ``obj`` of the group's rank ``i``."""
    got = comm_api.functions().all_gather_object(obj, group)
    if len(object_list) != len(got):
        raise ValueError(f"holoflow.distributed.all_gather_object: object_list has {len(object_list)} entries for "
                         f"a group of {len(got)}")
    object_list[:] = got


def broadcast_object_list(object_list: list, src: int = 0, group: Sequence[int] | None = None,
                          device=None) -> None:
    """Every rank's ``object_list`` becomes global rank ``src``'s (its length must match)."""
    ranks = get_process_group_ranks(group)
    mine = list(object_list) if env.get_rank() == src else None
    got = comm_api.functions().all_gather_object(mine, group)[ranks.index(src)]
    if len(got) != len(object_list):
        raise ValueError(f"holoflow.distributed.broadcast_object_list: rank {src} sent {len(got)} objects, this "
                         f"rank's object_list has {len(object_list)}")
    object_list[:] = got


def gather_object(obj, object_gather_list: list | None = None, dst: int = 0,
                  group: Sequence[int] | None = None) -> None:
    """On global rank ``dst``, ``object_gather_list[i]`` = the group's rank ``i``'s ``obj``."""
    got = comm_api.functions().all_gather_object(obj, group)
    if env.get_rank() == dst:
        if object_gather_list is None or len(object_gather_list) != len(got):
            raise ValueError(f"holoflow.distributed.gather_object: rank {dst} needs an object_gather_list of "
                             f"{len(got)} entries")
        object_gather_list[:] = got


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: list | None = None,
                        src: int = 0, group: Sequence[int] | None = None) -> None:
    """``scatter_object_output_list[0]`` = entry ``i`` of global rank ``src``'s input list, on the
    group's rank ``i``."""
    ranks = get_process_group_ranks(group)
    sent = list(scatter_object_input_list) if env.get_rank() == src and scatter_object_input_list is not None \
        else None
    got = comm_api.functions().all_gather_object(sent, group)[ranks.index(src)]
    if got is None or len(got) != len(ranks):
        raise ValueError(f"holoflow.distributed.scatter_object_list: rank {src} needs a scatter_object_input_list "
                         f"of {len(ranks)} entries")
    if not scatter_object_output_list:
        raise ValueError("holoflow.distributed.scatter_object_list: scatter_object_output_list needs one entry")
    scatter_object_output_list[0] = got[ranks.index(env.get_rank())]


def monitored_barrier(group: Sequence[int] | None = None, timeout: datetime.timedelta | None = None,
                      wait_all_ranks: bool = False) -> None:
    """A barrier; a rank that does not arrive within the communication timeout is named in the
    error (holoflow's barriers always report the ranks that are late)."""
    comm_api.barrier(group)


class _P2PWork:
    """A point-to-point transfer in flight (torch's Work): ``wait()`` finishes it. ``what`` names
    it (``"isend from rank 0 to rank 1"``) in the error of a wait that fails or times out."""

    def __init__(self, work, finish=None, simulated: bool = False, what: str = "") -> None:
        self.work, self.finish, self.simulated, self.what = work, finish, simulated, what

    def wait(self, timeout=None) -> bool:
        if self.simulated:   # (the simulated world's timeout, as its collectives'; its errors name the ranks)
            self.work.wait(timeout=timeout)
        else:
            limit = timeout or env.comm_timeout()
            try:
                self.work.wait(timeout=limit)
            except Exception as e:  # noqa: BLE001 - Gloo's text names no rank
                from .comm_track import CommError
                text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                verb = "timed out" if "timed out" in text.lower() or "timeout" in text.lower() else "failed"
                secs = limit.total_seconds() if hasattr(limit, "total_seconds") else limit
                raise CommError(f"holoflow.distributed.{self.what} {verb} (timeout {secs:g}s); the peer did not "
                                f"post the matching transfer in time, or failed. Cause: {text}") from e
        if self.finish is not None:
            self.finish()
            self.finish = None
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed()


def _p2p(fn, tensor: Tensor, peer: int, what: str):
    t = comm_api._local(tensor, what)
    if world.simulated_rank() is not None:   # the simulated world's messages, paired as Gloo pairs them
        sim = comm_api.functions()
        return _P2PWork(sim.isend(t, peer) if fn is dist.isend else sim.irecv(t, peer), simulated=True)
    env.ensure_initialized()
    buf = t if t.is_contiguous() else t.contiguous()
    work = fn(buf, peer)
    me = env.get_rank()
    src, dst = (me, peer) if fn is dist.isend else (peer, me)
    return _P2PWork(work, (lambda: t.copy_(buf)) if buf is not t and fn is dist.irecv else None,
                    what=f"{what} from rank {src} to rank {dst}")


def isend(tensor: Tensor, dst: int, group: Sequence[int] | None = None, tag: int = 0) -> _P2PWork:
    """Starts sending ``tensor`` to global rank ``dst``; ``wait()`` on the result (torch's)."""
    return _p2p(dist.isend, tensor, dst, "isend")


def irecv(tensor: Tensor, src: int | None = None, group: Sequence[int] | None = None, tag: int = 0) -> _P2PWork:
    """Starts receiving into ``tensor`` from global rank ``src``; ``wait()`` before reading it."""
    if src is None:
        raise HoloflowError("holoflow.distributed.irecv: give src (receiving from any rank is not supported)")
    return _p2p(dist.irecv, tensor, src, "irecv")


class P2POp:
    """One transfer of :func:`batch_isend_irecv`: ``op`` is ``isend`` or ``irecv``."""

    def __init__(self, op, tensor: Tensor, peer: int | None = None, group: Sequence[int] | None = None,
                 tag: int = 0, group_peer: int | None = None) -> None:
        if op not in (isend, irecv):
            raise ValueError("holoflow.distributed.P2POp: op must be isend or irecv")
        if peer is None and group_peer is None:
            raise ValueError("holoflow.distributed.P2POp: give peer (or group_peer)")
        self.op, self.tensor, self.group, self.tag = op, tensor, group, tag
        self.peer = peer if peer is not None else get_global_rank(group, group_peer)


def batch_isend_irecv(p2p_op_list: list) -> list:
    """Starts every transfer of ``p2p_op_list``; the works to ``wait()`` on, in order."""
    if not p2p_op_list or not all(isinstance(o, P2POp) for o in p2p_op_list):
        raise ValueError("holoflow.distributed.batch_isend_irecv: expects a non-empty list of P2POp")
    return [o.op(o.tensor, o.peer) for o in p2p_op_list]


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its node (``LOCAL_RANK``; ``fallback_rank`` when unset); a
    simulated rank's (one node holds the simulated world)."""
    import os
    if world.simulated_rank() is not None:
        return env.get_local_rank()
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("holoflow.distributed.get_node_local_rank: LOCAL_RANK is not set and no fallback_rank "
                       "was given (launch with holoflow.distributed.launch or torchrun)")


__all__ = ["Backend", "ReduceOp", "group", "GroupMember", "RankGroup", "ProcessGroup", "is_available", "is_initialized",
           "is_torchelastic_launched", "init_process_group", "destroy_process_group", "get_backend", "new_group",
           "get_rank", "get_world_size", "get_global_rank", "get_process_group_ranks", "barrier", "all_reduce",
           "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
           "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv", "isend",
           "irecv", "P2POp", "batch_isend_irecv", "all_gather_object", "broadcast_object_list", "gather_object",
           "scatter_object_list", "monitored_barrier", "get_node_local_rank"]
