"""Gradient bucketing for data parallelism: the engine behind ``nn.parallel.DistributedDataParallel``.

Parameters are packed into buckets of about ``bucket_cap_mb`` in *reverse* order (the order
backward produces their gradients). A post-accumulate-grad hook marks a parameter ready; when a
bucket is complete it is flattened and all-reduced asynchronously, so communication overlaps
the rest of backward. Buckets are launched strictly in index order, so every rank issues the
same collectives in the same order. A callback queued on the first hook waits for every bucket at
the end of backward, averages, and writes the gradients back.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch

from ..core.autograd import queue_callback
from ..core.errors import HoloflowError
from ..core.tensor import Tensor
from . import comm, env


class _Bucket:
    __slots__ = ("params", "ready", "handle", "flat", "dirty")

    def __init__(self, params: list[Tensor]) -> None:
        self.params = params
        self.ready: set[int] = set()
        self.handle = None
        self.flat: torch.Tensor | None = None
        self.dirty = False  # a gradient grew after the bucket was launched (a parameter used twice)

    def launch(self, ranks: tuple[int, ...]) -> None:
        self.flat = torch.cat([_grad_or_zeros(p).reshape(-1) for p in self.params])
        self.handle = comm.all_reduce(self.flat, ranks, async_op=True)


class GradReducer:
    """All-reduces (averages) the gradients of ``params`` over ``ranks`` during backward."""

    def __init__(self, params: Sequence[Tensor], ranks: Sequence[int] | None = None,
                 bucket_cap_mb: float = 25.0) -> None:
        self.ranks = tuple(range(env.get_world_size())) if ranks is None else tuple(ranks)
        self.params = [p for p in params if p.requires_grad]
        self.buckets = _make_buckets(self.params, int(bucket_cap_mb * 2 ** 20))
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.enabled = True
        self._active = False
        self._next = 0
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self.params]

    # -- during backward -------------------------------------------------------------------
    def _hook(self, p: Tensor) -> None:
        if not self.enabled or len(self.ranks) == 1:
            return
        if not self._active:
            self._active = True
            queue_callback(self.finish)
        b = self._bucket_of[id(p)]
        if id(p) in b.ready:  # a second contribution to the same leaf in this backward
            b.dirty = b.dirty or b.handle is not None
            return
        b.ready.add(id(p))
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if len(b.ready) < len(b.params) and not force:
                return
            b.launch(self.ranks)
            self._next += 1

    def finish(self) -> None:
        """Waits for every bucket (launching those whose parameters got no gradient, with zeros),
        averages, and writes the gradients back. Called at the end of backward."""
        self._launch_ready(force=True)
        n = len(self.ranks)
        for b in self.buckets:
            b.handle.wait()
            if b.dirty:  # reduce again with the complete gradients (same on every rank: same graph)
                b.launch(self.ranks)
                b.handle.wait()
            b.flat.div_(n)
            off = 0
            for p in b.params:
                k = p.numel()
                g = b.flat[off:off + k].view(p._data.shape)
                if p.grad is None:
                    p.grad = Tensor._make(g.clone())
                else:
                    p.grad._data.copy_(g)
                off += k
            b.flat, b.handle, b.dirty = None, None, False
            b.ready.clear()
        self._next, self._active = 0, False

    # -- set-up and control ----------------------------------------------------------------
    def broadcast_from_first(self, tensors: Sequence[Tensor]) -> None:
        """Copies the first rank's values of ``tensors`` to every rank (one broadcast per bucket)."""
        if len(self.ranks) == 1:
            return
        for group in _make_buckets(list(tensors), 25 * 2 ** 20):
            flat = torch.cat([t._data.reshape(-1) for t in group.params])
            comm.broadcast(flat, self.ranks[0], self.ranks)
            off = 0
            for t in group.params:
                t._data.copy_(flat[off:off + t.numel()].view(t._data.shape))
                off += t.numel()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients accumulate locally inside; the next synchronised backward reduces them all."""
        old, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = old

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def verify_same_model(named: Sequence[tuple[str, Tensor]], ranks: Sequence[int] | None = None,
                      who: str = "holoflow.nn.parallel.DistributedDataParallel") -> None:
    """Checks that every rank of ``ranks`` holds tensors of the same names, shapes and dtypes (as
    torch's DDP does at construction); raises a ``HoloflowError`` naming the first difference and
    the ranks, on every rank, before any gradient is reduced."""
    r = tuple(range(env.get_world_size())) if ranks is None else tuple(ranks)
    if len(r) == 1:
        return
    mine = [(n, tuple(t.shape), str(t.dtype).split('.')[-1]) for n, t in named]
    every = comm.all_gather_object(mine, r)
    first = every[0]
    for rank, theirs in zip(r[1:], every[1:]):
        if theirs == first:
            continue
        if len(theirs) != len(first):
            names = {n for n, _, _ in first} ^ {n for n, _, _ in theirs}
            raise HoloflowError(f"{who}: every rank must hold the same model, but rank {r[0]} has "
                                f"{len(first)} parameters/buffers and rank {rank} has {len(theirs)} "
                                f"(present on one only: {sorted(names)[:8]})")
        for (n0, s0, d0), (n1, s1, d1) in zip(first, theirs):
            if (n0, s0, d0) != (n1, s1, d1):
                raise HoloflowError(f"{who}: every rank must hold the same model, but {n0!r} is "
                                    f"{d0}{list(s0)} on rank {r[0]} and {n1!r} is "
                                    f"{d1}{list(s1)} on rank {rank}")


def _grad_or_zeros(p: Tensor) -> torch.Tensor:
    return p.grad._data if p.grad is not None else torch.zeros_like(p._data)


def _make_buckets(params: list[Tensor], cap_bytes: int) -> list[_Bucket]:
    """Reverse order, one dtype/device per bucket, about ``cap_bytes`` each."""
    buckets: list[_Bucket] = []
    cur: list[Tensor] = []
    size = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if cur and (size + nbytes > cap_bytes or p._data.dtype != cur[0]._data.dtype
                    or p._data.device != cur[0]._data.device):
            buckets.append(_Bucket(cur))
            cur, size = [], 0
        cur.append(p)
        size += nbytes
    if cur:
        buckets.append(_Bucket(cur))
    return buckets
