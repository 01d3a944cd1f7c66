"""Collectives on local torch tensors over a group named by its global ranks (what boxing calls).

``ranks`` is a tuple of global ranks in the *caller's order* (e.g. a mesh axis): list results and
list inputs are indexed by position in ``ranks``, and ``reduce_scatter`` gives shard ``i`` to
``ranks[i]``. ``ranks=None`` is the whole world. Every rank in ``ranks`` must make the same call;
ranks outside it make none. A one-rank group communicates nothing (and counts nothing).

Uneven sizes are padded internally, so a split of 5 rows over 2 ranks works everywhere. Every
call waits with the configured timeout and raises :class:`CommError` naming the laggards.
"""
from __future__ import annotations

import pickle
from typing import Sequence

import torch
import torch.distributed as dist

from ..core.errors import HoloflowError
from . import env, shm_comm
from .comm_check import call_site
from .comm_track import ALL_GATHER, CommError, Handle, begin, count, launch_checked, run
from .groups import group_for, normalize

# torch >= 2.13 renamed the flat collectives
_ALL_GATHER = ALL_GATHER
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN", "prod": "PRODUCT", "product": "PRODUCT", "avg": "SUM"}


def _ranks(ranks: Sequence[int] | None) -> tuple[int, ...]:
    if ranks is None:
        return tuple(range(env.get_world_size()))
    r = tuple(int(x) for x in ranks)
    if len(set(r)) != len(r):
        raise HoloflowError(f"holoflow.comm: duplicate ranks in group {list(r)}")
    return r


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _index(ranks: tuple[int, ...]) -> int:
    me = env.get_rank()
    if me not in ranks:
        raise HoloflowError(f"holoflow.comm: rank {me} called a collective over ranks {list(ranks)} "
                            f"it is not a member of")
    return ranks.index(me)


def balanced_sizes(n: int, p: int) -> list[int]:
    """The split of ``n`` over ``p`` ranks: the first ``n % p`` get one more."""
    return [n // p + (1 if i < n % p else 0) for i in range(p)]


def all_reduce(t: torch.Tensor, ranks: Sequence[int] | None = None, op: str = "sum",
               async_op: bool = False) -> torch.Tensor | Handle:
    """Reduces ``t`` in place over ``ranks`` (``op``: sum, avg, max, min, prod); returns ``t``, or a
    :class:`Handle` whose ``wait()`` returns ``t`` when ``async_op``."""
    r = _ranks(ranks)
    if op not in _OPS:
        raise HoloflowError(f"holoflow.comm.all_reduce: op {op!r} is not one of {sorted(_OPS)}")
    n = len(r)
    _index(r)
    finish = (lambda: t.div_(n) if op == "avg" else t)
    if n == 1:
        return Handle(None, None, finish) if async_op else t
    key = normalize(r)
    buf = t if t.is_contiguous() else t.contiguous()
    info = begin("all_reduce", key, _nbytes(t), buf, detail=op, defer=async_op)
    g = group_for(key)

    def launch():
        shm = shm_comm.transport(key, buf)   # ranks of one host: through shared memory (decided once per group)
        if shm is not None:
            return shm.all_reduce(buf, op)
        return dist.all_reduce(buf, getattr(dist.ReduceOp, _OPS[op]), group=g, async_op=True)
    work = launch_checked(info, launch)

    def done():
        if buf is not t:
            t.copy_(buf)
        return finish()
    h = Handle(work, info, done)
    return h if async_op else h.wait()


def all_reduce_many(ts: Sequence[torch.Tensor], ranks: Sequence[int] | None = None,
                    async_op: bool = False) -> torch.Tensor | Handle:
    """Sums the concatenation of ``ts`` (each flattened; one dtype and device) over ``ranks`` by one
    collective into a new flat tensor, which is returned (or a :class:`Handle` whose ``wait()``
    returns it); the inputs are only read, and must not change until then. Through shared memory
    the inputs are copied straight into the segment (no concatenated copy first)."""
    r = _ranks(ranks)
    if not ts:
        raise HoloflowError("holoflow.comm.all_reduce_many: no tensors given")
    kinds = {(t.dtype, t.device) for t in ts}
    if len(kinds) > 1:
        raise HoloflowError(f"holoflow.comm.all_reduce_many: the tensors must share one dtype and device, got "
                            f"{sorted(str(k) for k in kinds)}")
    _index(r)
    flats = [t.reshape(-1) for t in ts]
    total = sum(f.numel() for f in flats)
    key = normalize(r)
    shm = shm_comm.transport(key, ts[0]) if len(r) > 1 else None
    if shm is None:
        out = torch.cat(flats) if len(flats) > 1 else flats[0].clone()
        return all_reduce(out, r, async_op=async_op)
    out = ts[0].new_empty(total)
    info = begin("all_reduce", key, total * out.element_size(), out, detail="sum", defer=async_op)
    h = Handle(launch_checked(info, lambda: shm.all_reduce_parts(flats, out)), info, lambda: out)
    return h if async_op else h.wait()


def _exchange_shapes(t: torch.Tensor, r: tuple[int, ...]) -> list[torch.Size]:
    """Every rank's shape of ``t`` (a small all-gather, counted as ``meta``)."""
    meta = torch.tensor([t.dim(), *t.shape], dtype=torch.int64)
    pad = torch.zeros(9, dtype=torch.int64)
    if t.dim() > 8:
        raise HoloflowError(f"holoflow.comm: tensors of more than 8 dims are not supported (got {t.dim()})")
    pad[:meta.numel()] = meta
    got = _gather_equal(pad, r, "meta", "all_gather")
    return [torch.Size(g[1:1 + int(g[0])].tolist()) for g in got]


def _gather_equal(t: torch.Tensor, r: tuple[int, ...], kind: str, detail: str = "") -> list[torch.Tensor]:
    """All-gathers same-shaped tensors; result indexed by position in ``r``."""
    key = normalize(r)
    flat = t.contiguous().view(-1)
    out = flat.new_empty(len(key) * flat.numel())
    g = group_for(key)
    run(kind, key, _nbytes(t), lambda: _ALL_GATHER(out, flat, group=g, async_op=True), t, detail=detail)
    out = out.view((len(key),) + tuple(t.shape))
    return [out[key.index(x)] for x in r]


def all_gather(t: torch.Tensor, ranks: Sequence[int] | None = None, dim: int = 0,
               sizes: Sequence[int] | None = None) -> list[torch.Tensor]:
    """Every rank's ``t``, as a list indexed by position in ``ranks``.

    Shapes may differ along ``dim`` (padded internally); pass ``sizes`` (each rank's length
    along ``dim``) when known to skip the shape exchange.
    """
    r = _ranks(ranks)
    _index(r)
    if len(r) == 1:
        return [t]
    d = dim % max(t.dim(), 1)
    if sizes is None:
        shapes = _exchange_shapes(t, r)
        sizes = [s[d] if len(s) else 1 for s in shapes]
    sizes = list(sizes)
    if t.dim() == 0 or all(s == sizes[0] for s in sizes):
        return [x.clone() for x in _gather_equal(t, r, "all_gather")]
    m = max(sizes)
    moved = t.movedim(d, 0)
    padded = moved.new_zeros((m,) + tuple(moved.shape[1:]))
    padded[:moved.shape[0]] = moved
    parts = _gather_equal(padded, r, "all_gather")
    return [p[:s].movedim(0, d).clone() for p, s in zip(parts, sizes)]


def reduce_scatter_chunks(chunks: Sequence[torch.Tensor], ranks: Sequence[int] | None = None) -> torch.Tensor:
    """The sum over ranks of ``chunks[i]``, delivered to ``ranks[i]`` (chunks may differ in shape,
    consistently on every rank)."""
    r = _ranks(ranks)
    me = _index(r)
    if len(chunks) != len(r):
        raise HoloflowError(f"holoflow.comm.reduce_scatter: {len(chunks)} chunks for {len(r)} ranks")
    if len(r) == 1:
        return chunks[0].clone()
    key = normalize(r)
    m = max(c.numel() for c in chunks)
    c0 = chunks[0]
    buf = c0.new_zeros((len(key), m))
    for i, c in enumerate(chunks):
        buf[key.index(r[i]), :c.numel()] = c.reshape(-1)
    out = c0.new_empty(m)
    g = group_for(key)
    run("reduce_scatter", key, _nbytes(buf),
        lambda: _REDUCE_SCATTER(out, buf.view(-1), group=g, async_op=True), buf)
    mine = chunks[me]
    return out[:mine.numel()].view(mine.shape)


def reduce_scatter_rows(t: torch.Tensor, ranks: Sequence[int], async_op: bool = False) -> torch.Tensor | Handle:
    """Block ``i`` of the sum of ``t`` over ``ranks`` along dim 0, delivered to ``ranks[i]``: the
    flat collective straight into the result (``ranks`` in sorted order, ``t`` contiguous with rows
    a multiple of their number). ``t`` is read until the collective completes: with ``async_op``
    the caller hands it over and ``wait()`` returns the block."""
    r = _ranks(ranks)
    _index(r)
    if len(r) == 1:
        return Handle(None, None, lambda: t) if async_op else t
    if normalize(r) != r or not t.is_contiguous() or t.shape[0] % len(r):
        raise HoloflowError(f"holoflow.comm.reduce_scatter_rows: needs sorted ranks and rows divisible by "
                            f"{len(r)} (got ranks {list(r)}, shape {tuple(t.shape)})")
    out = t.new_empty((t.shape[0] // len(r),) + tuple(t.shape[1:]))
    return _rows("reduce_scatter", r, t, out, _REDUCE_SCATTER, async_op)


def all_gather_rows(t: torch.Tensor, ranks: Sequence[int], async_op: bool = False) -> torch.Tensor | Handle:
    """Every rank's ``t`` stacked along dim 0 (``ranks`` in sorted order, the same shape on each):
    the flat collective straight into the result. ``t`` is read until the collective completes:
    with ``async_op`` the caller hands it over and ``wait()`` returns the gathered tensor."""
    r = _ranks(ranks)
    _index(r)
    if len(r) == 1:
        return Handle(None, None, lambda: t) if async_op else t
    if normalize(r) != r or t.dim() == 0 or not t.is_contiguous():
        raise HoloflowError(f"holoflow.comm.all_gather_rows: needs sorted ranks and a contiguous tensor of at "
                            f"least one dim (got ranks {list(r)}, shape {tuple(t.shape)})")
    out = t.new_empty((len(r) * t.shape[0],) + tuple(t.shape[1:]))
    return _rows("all_gather", r, t, out, _ALL_GATHER, async_op)


def _rows(kind: str, key: tuple[int, ...], t: torch.Tensor, out: torch.Tensor, gloo, async_op: bool):
    """``kind`` from ``t`` into ``out``, flat: through shared memory between ranks of one host,
    else the backend's collective (``gloo``); counted, checked and timed out as every call is."""
    info = begin(kind, key, _nbytes(t), t, defer=async_op)
    shm = shm_comm.transport(key, t)
    if shm is not None:
        work = launch_checked(info, lambda: getattr(shm, kind)(t, out))
    else:
        g = group_for(key)
        work = launch_checked(info, lambda: gloo(out.view(-1), t.view(-1), group=g, async_op=True))
    h = Handle(work, info, lambda: out)
    return h if async_op else h.wait()


def reduce_scatter(t: torch.Tensor, ranks: Sequence[int] | None = None, dim: int = 0) -> torch.Tensor:
    """This rank's balanced shard along ``dim`` of the sum of ``t`` over ``ranks`` (P -> S(dim))."""
    r = _ranks(ranks)
    d = dim % max(t.dim(), 1)
    return reduce_scatter_chunks(list(t.split(balanced_sizes(t.shape[d], len(r)), dim=d)), r)


def broadcast(t: torch.Tensor, src: int, ranks: Sequence[int] | None = None) -> torch.Tensor:
    """Overwrites ``t`` on every rank of ``ranks`` with ``src``'s (a global rank); returns ``t``."""
    r = _ranks(ranks)
    if src not in r:
        raise HoloflowError(f"holoflow.comm.broadcast: src rank {src} is not in the group {list(r)}")
    _index(r)
    if len(r) == 1:
        return t
    key = normalize(r)
    buf = t if t.is_contiguous() else t.contiguous()
    g = group_for(key)
    run("broadcast", key, _nbytes(buf), lambda: dist.broadcast(buf, src, group=g, async_op=True), buf,
        detail=f"src={src}")
    if buf is not t:
        t.copy_(buf)
    return t


def all_to_all(tensors: Sequence[torch.Tensor], ranks: Sequence[int] | None = None,
               out_shapes: Sequence[Sequence[int]] | None = None) -> list[torch.Tensor]:
    """Sends ``tensors[i]`` to ``ranks[i]``; returns what each rank sent here, indexed likewise.

    Sizes may differ; pass ``out_shapes`` (the shapes this rank receives) to skip the shape
    exchange. All tensors share one dtype.
    """
    r = _ranks(ranks)
    if len(tensors) != len(r):
        raise HoloflowError(f"holoflow.comm.all_to_all: {len(tensors)} tensors for {len(r)} ranks")
    _index(r)
    if len(r) == 1:
        return [tensors[0].clone()]
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise HoloflowError(f"holoflow.comm.all_to_all: all tensors need one dtype, got {sorted(map(str, dtypes))}")
    key = normalize(r)
    if out_shapes is None:
        out_shapes = _a2a_shapes(tensors, r, key)
    order = [r.index(k) for k in key]  # position in r of each group rank
    send = torch.cat([tensors[i].reshape(-1) for i in order]) if tensors else None
    in_splits = [tensors[i].numel() for i in order]
    out_splits = [_numel(out_shapes[i]) for i in order]
    recv = send.new_empty(sum(out_splits))
    g = group_for(key)
    run("all_to_all", key, _nbytes(send),
        lambda: dist.all_to_all_single(recv, send, out_splits, in_splits, group=g, async_op=True), send,
        splits=(in_splits, out_splits))
    parts = dict(zip(order, recv.split(out_splits)))
    return [parts[i].view(tuple(out_shapes[i])) for i in range(len(r))]


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _a2a_shapes(tensors, r, key) -> list[torch.Size]:
    metas = []
    for t in tensors:
        m = torch.zeros(9, dtype=torch.int64)
        m[0] = t.dim()
        m[1:1 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        metas.append(m)
    order = [r.index(k) for k in key]
    send = torch.cat([metas[i] for i in order])
    recv = torch.empty_like(send)
    g = group_for(key)
    run("meta", key, _nbytes(send), lambda: dist.all_to_all_single(recv, send, group=g, async_op=True), send,
        detail="all_to_all")
    got = dict(zip(order, recv.view(len(key), 9)))
    return [torch.Size(got[i][1:1 + int(got[i][0])].tolist()) for i in range(len(r))]


def send(t: torch.Tensor, dst: int) -> None:
    """Sends ``t`` to global rank ``dst`` (which calls :func:`recv`)."""
    if dst == env.get_rank():
        raise HoloflowError(f"holoflow.comm.send: rank {dst} cannot send to itself")
    key = normalize((env.get_rank(), dst))
    buf = t.contiguous()
    env.ensure_initialized()
    run("send", key, _nbytes(buf), lambda: dist.isend(buf, dst), buf, peer=dst)


def recv(t: torch.Tensor, src: int) -> torch.Tensor:
    """Receives into ``t`` from global rank ``src``; returns ``t``."""
    key = normalize((env.get_rank(), src))
    buf = t if t.is_contiguous() else t.contiguous()
    env.ensure_initialized()
    run("recv", key, _nbytes(buf), lambda: dist.irecv(buf, src), buf, peer=src)
    if buf is not t:
        t.copy_(buf)
    return t


def all_gather_object(obj, ranks: Sequence[int] | None = None) -> list:
    """Every rank's picklable ``obj``, indexed by position in ``ranks`` (a shape exchange plus an
    all-gather of the pickled bytes)."""
    r = _ranks(ranks)
    if len(r) == 1:
        return [obj]
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    return [pickle.loads(p.numpy().tobytes()) for p in all_gather(data, r)]


def barrier(ranks: Sequence[int] | None = None) -> None:
    """Waits until every rank of ``ranks`` arrives."""
    r = _ranks(ranks)
    _index(r)
    if len(r) == 1:
        return
    key = normalize(r)
    g = group_for(key)
    run("barrier", key, 0, lambda: dist.barrier(group=g, async_op=True))


def transfer(t: torch.Tensor | None, src: int, dst_ranks: Sequence[int], shape: Sequence[int] | None = None,
             dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> torch.Tensor | None:
    """Moves ``t`` from global rank ``src`` to every rank of ``dst_ranks`` (disjoint sets or not).

    ``src`` passes ``t``; destinations pass ``shape``/``dtype``/``device`` (defaults: ``t``'s if
    given). Returns the tensor on ``src`` and destinations, ``None`` on other ranks. One
    destination is a send/recv pair; several are one broadcast over ``{src} | dst_ranks``.
    """
    me = env.get_rank()
    dsts = [d for d in dict.fromkeys(int(x) for x in dst_ranks) if d != src]
    if me != src and me not in dsts:
        return None
    if me != src:
        if shape is None and t is None:
            raise HoloflowError("holoflow.comm.transfer: a destination rank needs shape and dtype (or a buffer)")
        t = t if t is not None else torch.empty(tuple(shape), dtype=dtype, device=device)
    if not dsts:
        return t
    if len(dsts) == 1:
        if me == src:
            send(t, dsts[0])
        else:
            recv(t, src)
        return t
    return broadcast(t, src, (src, *dsts))


__all__ = ["all_reduce", "all_reduce_many", "all_gather", "reduce_scatter", "reduce_scatter_chunks",
           "reduce_scatter_rows", "broadcast", "all_to_all", "all_gather_object", "send", "recv", "barrier",
           "transfer", "balanced_sizes", "count", "call_site", "CommError", "Handle"]
