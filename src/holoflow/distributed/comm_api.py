"""``holoflow.comm``: collectives on local holoflow Tensors, with torch.distributed's signatures.

``group`` is ``None`` (the world) or a sequence of global ranks; in-place where torch is in
place. These work on the local storage of a tensor (``._data``) and record no autograd.

>>> x = flow.ones(4) * (flow.world.rank() + 1)
>>> flow.comm.all_reduce(x)            # x == 3 on both ranks of a world of two
"""
from __future__ import annotations

import pickle
from typing import Sequence

import torch
import torch.distributed as dist

from ..core.errors import HoloflowError
from ..core.tensor import Tensor
from . import comm as _comm_module
from . import world
from .comm_check import call_site
from .comm_track import CommCount, CommError, Handle, count, set_tracking

ReduceOp = dist.ReduceOp
_OP_NAMES = {"SUM": "sum", "MAX": "max", "MIN": "min", "PRODUCT": "prod", "AVG": "avg"}


class _Simulated:
    """The functions of ``distributed/comm.py`` that holoflow.comm (and DDP, Join, ZeRO) call, on a
    simulated world's in-memory communicator (``world.simulate``): the same values as on real ranks
    (checked against Gloo worlds by tests/global/test_comm_simulated.py)."""

    def __init__(self, sim) -> None:
        self.sim = sim

    def _ranks(self, ranks: Sequence[int] | None) -> tuple[int, ...]:
        return tuple(range(self.sim.world_size)) if ranks is None else tuple(int(x) for x in ranks)

    def all_reduce(self, t: torch.Tensor, ranks=None, op: str = "sum", async_op: bool = False):
        r = self._ranks(ranks)
        if op in ("sum", "avg"):
            v = self.sim.all_reduce(t.contiguous(), r)
            if op == "avg":
                v = v / len(r)
        else:
            v = {"max": torch.amax, "min": torch.amin, "prod": torch.prod}[op](torch.stack(self.all_gather(t, r)), 0)
        t.copy_(v)
        return Handle(None, None, lambda: t) if async_op else t

    def all_gather(self, t: torch.Tensor, ranks=None, dim: int = 0, sizes=None) -> list:
        r = self._ranks(ranks)
        flat = t.reshape(1) if t.dim() == 0 else t.contiguous()
        d = dim % flat.dim()
        lengths = [s[d] for s in self.sim.all_gather_shapes(tuple(flat.shape), r)]
        parts = self.sim.all_gather(flat, r, d, lengths).split(lengths, d)
        return [p.reshape(()) if t.dim() == 0 else p for p in parts]

    def reduce_scatter_chunks(self, chunks, ranks=None) -> torch.Tensor:
        got = self.sim.all_to_all([c.contiguous() for c in chunks], self._ranks(ranks))
        return sum(got[1:], got[0].clone())

    def broadcast(self, t: torch.Tensor, src: int, ranks=None) -> torch.Tensor:
        r = self._ranks(ranks)
        if src not in r:
            raise HoloflowError(f"holoflow.comm.broadcast: src rank {src} is not in the group {list(r)}")
        t.copy_(self.sim.broadcast(t.contiguous(), src, r))
        return t

    def all_to_all(self, tensors, ranks=None, out_shapes=None) -> list:
        return self.sim.all_to_all([x.contiguous() for x in tensors], self._ranks(ranks), out_shapes)

    def barrier(self, ranks=None) -> None:
        self.sim.all_reduce(torch.zeros(1), self._ranks(ranks))

    def all_gather_object(self, obj, ranks=None) -> list:
        """As distributed/comm.py's: the pickled bytes all-gathered (after their sizes)."""
        r = self._ranks(ranks)
        if len(r) == 1:
            return [obj]
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        return [pickle.loads(p.numpy().tobytes()) for p in self.all_gather(data, r)]

    def send(self, t: torch.Tensor, dst: int) -> None:
        self.sim.send(t.contiguous(), dst)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        return self.sim.recv(t, src)

    def isend(self, t: torch.Tensor, dst: int):
        """torch.distributed's isend (a Work to ``wait()`` on); see ``world.SimComm.isend``."""
        return self.sim.isend(t, dst)

    def irecv(self, t: torch.Tensor, src: int):
        return self.sim.irecv(t, src)


def functions():
    """The communicator's functions: the processes' (distributed/comm.py), or on a simulated
    rank's thread a simulated world's, with the same signatures and values. Library code talking
    for its rank (DDP, Join, ZeRO, the object collectives) calls them, so it runs on simulated
    ranks too, which answer a world of their own size (env.get_world_size)."""
    return _Simulated(world.comm()) if world.simulated_rank() is not None else _comm_module


_c = functions   # (the short name the functions below call)


def _op(op) -> str:
    if isinstance(op, str):
        return op.lower()
    name = getattr(op, "name", None) or str(op).split(".")[-1]
    if name.upper() not in _OP_NAMES:
        raise HoloflowError(f"holoflow.comm: reduce op {op} is not supported; use sum, avg, max, min or prod")
    return _OP_NAMES[name.upper()]


def _local(t: Tensor, fn: str) -> torch.Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"holoflow.comm.{fn}: expected a holoflow Tensor, got {type(t).__name__}")
    if t.is_global:
        raise HoloflowError(f"holoflow.comm.{fn}: works on local tensors; this one is global "
                            f"(sbp={t.sbp}); use .to_global(...) to change its SBP, or .to_local()")
    return t._data


def _set(dst: Tensor, value: torch.Tensor) -> None:
    if dst._data.shape == value.shape and dst._data.dtype == value.dtype:
        dst._data.copy_(value)
    else:
        dst._data = value


def all_reduce(tensor: Tensor, op=ReduceOp.SUM, group: Sequence[int] | None = None,
               async_op: bool = False) -> Handle | None:
    """Reduces ``tensor`` in place across ``group`` (sum by default)."""
    h = _c().all_reduce(_local(tensor, "all_reduce"), group, _op(op), async_op=async_op)
    return h if async_op else None


def all_gather(tensor_list: list[Tensor], tensor: Tensor, group: Sequence[int] | None = None,
               async_op: bool = False) -> None:
    """Fills ``tensor_list[i]`` with rank ``group[i]``'s ``tensor`` (sizes along dim 0 may differ:
    entries of another shape are resized)."""
    if async_op:
        raise HoloflowError("holoflow.comm.all_gather: async_op=True is not supported; use all_reduce for overlap")
    t = _local(tensor, "all_gather")
    sizes = None
    if tensor_list and all(x.dim() == t.dim() and x.dim() > 0 for x in tensor_list):
        sizes = [x.shape[0] for x in tensor_list]
    got = _c().all_gather(t, group, 0, sizes)
    if len(tensor_list) != len(got):
        raise HoloflowError(f"holoflow.comm.all_gather: tensor_list has {len(tensor_list)} entries for a "
                            f"group of {len(got)}")
    for dst, v in zip(tensor_list, got):
        _set(dst, v)


def reduce_scatter(output: Tensor, input_list: list[Tensor], op=ReduceOp.SUM,
                   group: Sequence[int] | None = None, async_op: bool = False) -> None:
    """``output`` = sum over ranks of ``input_list[i]`` on rank ``group[i]`` (only sum)."""
    if _op(op) != "sum" or async_op:
        raise HoloflowError("holoflow.comm.reduce_scatter: only op=SUM, async_op=False is supported")
    res = _c().reduce_scatter_chunks([_local(x, "reduce_scatter") for x in input_list], group)
    _set(output, res)


def broadcast(tensor: Tensor, src: int, group: Sequence[int] | None = None, async_op: bool = False) -> None:
    """Overwrites ``tensor`` with global rank ``src``'s, on every rank of ``group``."""
    _c().broadcast(_local(tensor, "broadcast"), src, group)


def all_to_all(output_tensor_list: list[Tensor], input_tensor_list: list[Tensor],
               group: Sequence[int] | None = None, async_op: bool = False) -> None:
    """Sends ``input_tensor_list[i]`` to ``group[i]``; receives into ``output_tensor_list[i]``
    (whose shapes say what arrives; sizes may differ)."""
    got = _c().all_to_all([_local(x, "all_to_all") for x in input_tensor_list], group,
                        [tuple(x.shape) for x in output_tensor_list])
    for dst, v in zip(output_tensor_list, got):
        _set(dst, v)


def send(tensor: Tensor, dst: int) -> None:
    """Sends ``tensor`` to global rank ``dst``."""
    _c().send(_local(tensor, "send"), dst)


def recv(tensor: Tensor, src: int) -> Tensor:
    """Receives into ``tensor`` from global rank ``src``."""
    _c().recv(_local(tensor, "recv"), src)
    return tensor


def barrier(group: Sequence[int] | None = None) -> None:
    """Waits until every rank of ``group`` arrives."""
    _c().barrier(group)


def gather(tensor: Tensor, gather_list: list[Tensor] | None = None, dst: int = 0,
           group: Sequence[int] | None = None) -> None:
    """Fills ``gather_list`` on ``dst`` with every rank's ``tensor`` (via all-gather)."""
    got = _c().all_gather(_local(tensor, "gather"), group)
    if world.rank() == dst:
        if gather_list is None or len(gather_list) != len(got):
            raise HoloflowError(f"holoflow.comm.gather: rank {dst} needs a gather_list of {len(got)} tensors")
        for d, v in zip(gather_list, got):
            _set(d, v)


def scatter(tensor: Tensor, scatter_list: list[Tensor] | None = None, src: int = 0,
            group: Sequence[int] | None = None) -> None:
    """Fills ``tensor`` on rank ``group[i]`` with ``scatter_list[i]`` from ``src`` (via all-to-all)."""
    r = _c()._ranks(group)
    t = _local(tensor, "scatter")
    if world.rank() == src:
        if scatter_list is None or len(scatter_list) != len(r):
            raise HoloflowError(f"holoflow.comm.scatter: rank {src} needs a scatter_list of {len(r)} tensors")
        ins = [x._data for x in scatter_list]
    else:
        ins = [t.new_empty(0) for _ in r]
    shapes = [tuple(t.shape) if x == src else (0,) for x in r]
    got = _c().all_to_all(ins, r, shapes)
    _set(tensor, got[r.index(src)])


def reduce(tensor: Tensor, dst: int, op=ReduceOp.SUM, group: Sequence[int] | None = None) -> None:
    """Reduces ``tensor`` over ``group``; only global rank ``dst``'s is overwritten with the result
    (OneFlow's ``comm.reduce``; the others keep theirs)."""
    t = _local(tensor, "reduce")
    r = _c()._ranks(group)
    if dst not in r:
        raise HoloflowError(f"holoflow.comm.reduce: dst {dst} is not a rank of the group {list(r)}")
    total = t.clone()
    _c().all_reduce(total, r, _op(op))
    if world.rank() == dst:
        t.copy_(total)


def _pieces(big: torch.Tensor, small: tuple, n: int, fn: str, big_name: str) -> list[torch.Tensor]:
    """``big`` as ``n`` pieces of shape ``small``: its concatenation along dim 0 or its stack."""
    if tuple(big.shape) == (n,) + small:
        return list(big.unbind(0))
    if small and tuple(big.shape) == (n * small[0],) + small[1:]:
        return list(big.chunk(n, 0))
    stack = (n,) + small
    cat = ((n * small[0],) + small[1:]) if small else None
    raise HoloflowError(f"holoflow.comm.{fn}: {big_name} has shape {tuple(big.shape)}; for {n} ranks and pieces of "
                        f"shape {small} it must be their stack {stack}" + (f" or concatenation {cat}" if cat else ""))


def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, group: Sequence[int] | None = None) -> None:
    """Fills ``output_tensor`` with every rank's ``input_tensor`` (same shape everywhere), as their
    concatenation along dim 0 or their stack, whichever ``output_tensor``'s shape is."""
    x = _local(input_tensor, "all_gather_into_tensor")
    out = _local(output_tensor, "all_gather_into_tensor")
    r = _c()._ranks(group)
    pieces = _pieces(out, tuple(x.shape), len(r), "all_gather_into_tensor", "output_tensor")
    for dst, v in zip(pieces, _c().all_gather(x, r, 0, [x.shape[0]] * len(r) if x.dim() else None)):
        dst.copy_(v)


def reduce_scatter_tensor(output_tensor: Tensor, input_tensor: Tensor, op=ReduceOp.SUM,
                          group: Sequence[int] | None = None) -> None:
    """``output_tensor`` = the sum over ranks of piece ``i`` of ``input_tensor`` on rank
    ``group[i]``; ``input_tensor`` is the pieces' concatenation along dim 0 or their stack."""
    if _op(op) != "sum":
        raise HoloflowError("holoflow.comm.reduce_scatter_tensor: only op=SUM is supported")
    out = _local(output_tensor, "reduce_scatter_tensor")
    r = _c()._ranks(group)
    pieces = _pieces(_local(input_tensor, "reduce_scatter_tensor"), tuple(out.shape), len(r),
                     "reduce_scatter_tensor", "input_tensor")
    out.copy_(_c().reduce_scatter_chunks([p.contiguous() for p in pieces], r))


__all__ = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send", "recv", "barrier",
           "gather", "scatter", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "count", "call_site",
           "CommCount", "CommError", "Handle", "ReduceOp", "set_tracking"]
