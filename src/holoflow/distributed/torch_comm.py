"""The communicator boxing uses in a real multi-process world: holoflow.distributed.comm
(torch.distributed, counted, with timeouts) behind the small interface of ``world.SimComm``.

Even splits over a group listed in rank order (the common case) take fast paths that run the
flat torch collective straight into the result's storage: no padding buffer, no per-rank clones,
no concatenation (bench/boxing.py measures them against raw torch.distributed). Everything else
goes through :mod:`.comm`'s general collectives.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import comm, env
from .comm_track import run
from .groups import group_for, normalize


def _sorted_group(group: tuple) -> bool:
    """Is ``group`` already its key's order (so position i is the i-th rank of the torch group)?"""
    return len(group) > 1 and tuple(group) == normalize(group)


def _even(t: torch.Tensor, group: tuple, d: int, sizes) -> bool:
    """Whether ``t`` splits evenly along ``d`` over the ranks of ``group`` listed in order."""
    return _sorted_group(group) and t.dim() > 0 and t.shape[d] % len(group) == 0 and \
        all(s == t.shape[d] // len(group) for s in sizes)


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    """``t`` with dim ``d`` moved to the front, dense: the row collectives' layout (one copy
    unless ``d`` is 0 and ``t`` is already dense)."""
    return t.movedim(d, 0).contiguous() if d else t.contiguous()


def _unrow(out: torch.Tensor, d: int) -> torch.Tensor:
    """A row collective's result with the front dim moved back to ``d``, dense."""
    return out.movedim(0, d).contiguous() if d else out


def _join(rows: torch.Tensor, shape: tuple, d: int, p: int) -> torch.Tensor:
    """Rank-major gathered shards (``p`` blocks of ``shape`` back to back) joined along ``d``: a
    view for dim 0, one copy otherwise."""
    if d == 0:
        return rows
    return rows.view((p,) + shape).movedim(0, d).reshape(shape[:d] + (p * shape[d],) + shape[d + 1:])


class TorchComm:
    """Boxing's collectives; inputs are never modified (shards belong to their tensors)."""

    def all_gather(self, t: torch.Tensor, group: tuple, dim: int, sizes) -> torch.Tensor:
        if _sorted_group(group) and t.dim() > 0 and all(s == t.shape[dim] for s in sizes):
            return _join(comm.all_gather_rows(t.contiguous(), group), tuple(t.shape), dim % t.dim(), len(group))
        return torch.cat(comm.all_gather(t.contiguous(), group, dim, sizes), dim=dim)

    def all_reduce(self, t: torch.Tensor, group: tuple) -> torch.Tensor:
        return comm.all_reduce(t.clone(memory_format=torch.contiguous_format), group)

    def reduce_scatter(self, t: torch.Tensor, group: tuple, dim: int, sizes) -> torch.Tensor:
        d = dim % max(t.dim(), 1)
        if _even(t, group, d, sizes):
            return _unrow(comm.reduce_scatter_rows(_rows(t, d), group), d)
        return comm.reduce_scatter(t.contiguous(), group, dim)

    def all_reduce_async(self, t: torch.Tensor, group: tuple) -> comm.Handle:
        """Starts reducing ``t`` in place (the caller hands it over); ``wait()`` returns it."""
        return comm.all_reduce(t, group, async_op=True)

    def all_reduce_many_async(self, ts: list[torch.Tensor], group: tuple) -> comm.Handle:
        """Starts summing the concatenation of ``ts`` (flattened) into a new flat tensor, which
        ``wait()`` returns; the inputs are read while it runs (the caller keeps them unchanged)."""
        return comm.all_reduce_many(ts, group, async_op=True)

    def reduce_scatter_async(self, t: torch.Tensor, group: tuple, dim: int, sizes) -> comm.Handle:
        """Starts ``reduce_scatter`` (``t`` handed over); ``wait()`` returns this rank's shard.
        Row shards of unequal sizes (a vocabulary not divisible by the ranks) are padded to the
        largest, reduced as even rows and cut back by ``wait()``; other shards run at once (the
        general path) and are handed back by ``wait()``."""
        sizes = list(sizes)
        d = dim % max(t.dim(), 1)
        if d and _even(t, group, d, sizes):   # another dim: its rows moved to the front once
            return comm.reduce_scatter_rows(_rows(t, d), group, async_op=True).then(lambda out: _unrow(out, d))
        if _sorted_group(group) and d == 0 and t.dim() > 0 and sum(sizes) == t.shape[0]:
            if t.is_contiguous() and all(s == sizes[0] for s in sizes):
                return comm.reduce_scatter_rows(t, group, async_op=True)
            m, mine = max(sizes), sizes[list(group).index(env.get_rank())]
            padded = t.new_zeros((m * len(sizes),) + tuple(t.shape[1:]))
            for block, part in zip(padded.split(m), t.split(sizes)):
                block[:part.shape[0]] = part
            return comm.reduce_scatter_rows(padded, group, async_op=True).then(lambda out: out[:mine])
        out = self.reduce_scatter(t, group, dim, sizes)
        return comm.Handle(None, None, lambda: out)

    def all_gather_async(self, t: torch.Tensor, group: tuple, dim: int, sizes) -> comm.Handle:
        """Starts ``all_gather`` (``t`` handed over); ``wait()`` returns the gathered tensor.
        Row shards of unequal sizes are padded to the largest, gathered as even rows and joined
        by ``wait()``; other shards run at once (the general path) and are handed back by ``wait()``."""
        sizes = list(sizes)
        if _sorted_group(group) and t.dim() > 0 and dim % t.dim() and all(s == t.shape[dim] for s in sizes):
            shape, d = tuple(t.shape), dim % t.dim()   # another dim: gathered as rows, joined by wait()
            return comm.all_gather_rows(t.contiguous(), group, async_op=True).then(
                lambda out: _join(out, shape, d, len(group)))
        if _sorted_group(group) and t.dim() > 0 and dim % t.dim() == 0:
            if t.is_contiguous() and all(s == t.shape[0] for s in sizes):
                return comm.all_gather_rows(t, group, async_op=True)
            m = max(sizes)
            padded = t.new_zeros((m,) + tuple(t.shape[1:]))
            padded[:t.shape[0]] = t
            return comm.all_gather_rows(padded, group, async_op=True).then(
                lambda out: torch.cat([b[:s] for b, s in zip(out.split(m), sizes)]))
        out = self.all_gather(t, group, dim, sizes)
        return comm.Handle(None, None, lambda: out)

    def all_to_all(self, chunks: list, group: tuple, out_shapes=None) -> list:
        if _sorted_group(group) and out_shapes is not None:
            return self._all_to_all_packed(chunks, group, out_shapes)
        return comm.all_to_all([c.contiguous() for c in chunks], group, out_shapes)

    def _all_to_all_packed(self, chunks: list, group: tuple, out_shapes) -> list:
        """One copy packs the (possibly strided) chunks; results are views of one buffer."""
        in_splits = [c.numel() for c in chunks]
        out_splits = [int(torch.Size(s).numel()) for s in out_shapes]
        send = chunks[0].new_empty(sum(in_splits))
        for c, part in zip(chunks, send.split(in_splits)):
            part.view(c.shape).copy_(c)
        recv = send.new_empty(sum(out_splits))
        g = group_for(group)
        even = len(set(in_splits)) == 1 and len(set(out_splits)) == 1
        # even splits take the backend's plain all-to-all (Gloo's alltoallv path is much slower)
        o, i = (None, None) if even else (out_splits, in_splits)
        run("all_to_all", tuple(group), send.numel() * send.element_size(),
            lambda: dist.all_to_all_single(recv, send, o, i, group=g, async_op=True), send,
            splits=(in_splits, out_splits))
        return [part.view(tuple(s)) for part, s in zip(recv.split(out_splits), out_shapes)]

    def broadcast(self, t: torch.Tensor, src: int, group: tuple) -> torch.Tensor:
        return comm.broadcast(t.clone(memory_format=torch.contiguous_format), src, group)

    def all_gather_shapes(self, obj, group: tuple) -> list:
        return comm.all_gather_object(obj, group)
