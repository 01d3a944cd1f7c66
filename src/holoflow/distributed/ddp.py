"""Gradient bucketing for data parallelism: the engine behind ``nn.parallel.DistributedDataParallel``.

Parameters are packed into buckets of about ``bucket_cap_mb`` in *reverse* order (the order
backward produces their gradients). A post-accumulate-grad hook marks a parameter ready; when a
bucket is complete it is flattened and all-reduced asynchronously, so communication overlaps
the rest of backward. Buckets are launched strictly in index order, so every rank issues the
same collectives in the same order. A callback queued on the first hook waits for every bucket at
the end of backward, averages, and writes the gradients back. A communication hook
(``register_comm_hook``, torch's) replaces the all-reduce: it gets each bucket as a
:class:`GradBucket` and returns a future of the reduced (averaged) flat gradients.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch

from ..core.autograd import queue_callback
from ..core.errors import HoloflowError
from ..core.tensor import Tensor
from . import comm_api, env
from .comm_check import call_site


class GradBucket:
    """torch's ``dist.GradBucket``: what a communication hook gets, one bucket of flattened
    gradients (not yet averaged)."""

    def __init__(self, index: int, flat: torch.Tensor, params: list[Tensor], last: bool) -> None:
        self._index, self._flat, self._params, self._last = index, flat, params, last

    def index(self) -> int:
        return self._index

    def buffer(self) -> Tensor:
        """The bucket's gradients flattened into one tensor (the hook may reduce it in place)."""
        return Tensor._make(self._flat)

    def gradients(self) -> list[Tensor]:
        """Each parameter's gradient, a view of :meth:`buffer`."""
        out, off = [], 0
        for p in self._params:
            out.append(Tensor._make(self._flat[off:off + p.numel()].view(p._data.shape)))
            off += p.numel()
        return out

    def parameters(self) -> list[Tensor]:
        return list(self._params)

    def is_last(self) -> bool:
        return self._last

    def set_buffer(self, buffer: Tensor) -> None:
        self._flat.copy_(buffer._data if isinstance(buffer, Tensor) else buffer)


BUCKET_SITE = "DistributedDataParallel gradient bucket"


class _Bucket:
    __slots__ = ("params", "ready", "handle", "flat", "dirty", "index", "last")

    def __init__(self, params: list[Tensor], index: int = 0) -> None:
        self.params = params
        self.index, self.last = index, False
        self.ready: set[int] = set()
        self.handle = None   # the all-reduce in flight, or the hook's future
        self.flat: torch.Tensor | None = None
        self.dirty = False  # a gradient grew after the bucket was launched (a parameter used twice)

    def launch(self, ranks: tuple[int, ...], hook=None) -> None:
        self.flat = torch.cat([_grad_or_zeros(p).reshape(-1) for p in self.params])
        with call_site(BUCKET_SITE):   # (a rank out of inputs issues it from elsewhere: Join)
            if hook is None:
                self.handle = comm_api.functions().all_reduce(self.flat, ranks, async_op=True)
                return
            state, fn = hook
            fut = fn(state, GradBucket(self.index, self.flat, self.params, self.last))
        if not hasattr(fut, "wait"):
            raise TypeError(f"holoflow DistributedDataParallel: the communication hook {_name(fn)} must return a "
                            f"torch.futures.Future of the bucket's reduced tensor, got {type(fut).__name__}")
        self.handle = fut

    def result(self, hooked: bool, n: int) -> torch.Tensor:
        """The reduced, averaged flat gradients (a hook's future holds them averaged already)."""
        if not hooked:
            self.handle.wait()
            return self.flat.div_(n)
        got = self.handle.wait()
        got = got[0] if isinstance(got, (list, tuple)) else got
        got = got._data if isinstance(got, Tensor) else got
        if not isinstance(got, torch.Tensor) or got.numel() != self.flat.numel():
            raise RuntimeError(f"holoflow DistributedDataParallel: the communication hook's future must hold a "
                               f"tensor of the bucket's {self.flat.numel()} elements, got "
                               f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
        return got.reshape(-1)


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class GradReducer:
    """All-reduces (averages) the gradients of ``params`` over ``ranks`` during backward."""

    def __init__(self, params: Sequence[Tensor], ranks: Sequence[int] | None = None,
                 bucket_cap_mb: float = 25.0) -> None:
        self.ranks = tuple(range(env.get_world_size())) if ranks is None else tuple(ranks)
        self.params = [p for p in params if p.requires_grad]
        self.buckets = _make_buckets(self.params, int(bucket_cap_mb * 2 ** 20))
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.enabled = True
        self.comm_hook = None   # (state, hook): register_comm_hook's
        self.joining = False    # inside a Join block: the ranks that joined shadow this backward
        self.divide_by: int | None = None   # (Join with divide_by_initial_world_size=False: the ranks training)
        self._active = False
        self._next = 0
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self.params]

    def register_comm_hook(self, state: object, hook) -> None:
        """torch's ``register_comm_hook``: ``hook(state, bucket)`` reduces each bucket instead of the
        averaging all-reduce; once, before training."""
        if self.comm_hook is not None:
            raise RuntimeError("holoflow DistributedDataParallel.register_comm_hook: a communication hook is "
                               "already registered; it can be registered only once")
        if not callable(hook):
            raise TypeError(f"holoflow DistributedDataParallel.register_comm_hook: hook must be callable "
                            f"(state, bucket) -> Future, got {type(hook).__name__}")
        self.comm_hook = (state, hook)

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
            b.launch(self.ranks, self.comm_hook)
            self._next += 1

    def finish(self) -> None:
        """Waits for every bucket (launching those whose parameters got no gradient, with zeros),
        averages, and writes the gradients back. Called at the end of backward."""
        self._launch_ready(force=True)
        n = self.divide_by or len(self.ranks)
        hooked = self.comm_hook is not None
        if self.joining:   # every rank learns which buckets are reduced again (the joined ones shadow them)
            for b, again in zip(self.buckets, self._exchange_dirty([b.dirty for b in self.buckets])):
                b.dirty = again
        for b in self.buckets:
            if b.dirty:  # reduce again with the complete gradients (same on every rank: same graph)
                b.result(hooked, n)
                b.launch(self.ranks, self.comm_hook)
            flat = b.result(hooked, n)
            off = 0
            for p in b.params:
                k = p.numel()
                g = flat[off:off + k].view(p._data.shape)
                if p.grad is None:
                    p.grad = Tensor._make(g.clone())
                else:
                    p.grad._data.copy_(g)
                off += k
            b.flat, b.handle, b.dirty = None, None, False
            b.ready.clear()
        self._next, self._active = 0, False

    # -- uneven inputs (Join) ---------------------------------------------------------------
    def _exchange_dirty(self, dirty: list) -> list:
        flags = torch.tensor([float(d) for d in dirty], dtype=torch.float64)
        with call_site("DistributedDataParallel join: buckets reduced again"):
            comm_api.functions().all_reduce(flags, self.ranks)
        return [bool(f > 0) for f in flags.tolist()]

    def shadow_backward(self) -> None:
        """A rank out of inputs takes part in another rank's backward: each bucket's all-reduce
        with zeros, in order, then the buckets reduced again (a parameter used twice)."""
        def reduce(b: _Bucket):   # (a communication hook runs on the zeros: its own collectives)
            z = torch.zeros(sum(p.numel() for p in b.params), dtype=b.params[0]._data.dtype,
                            device=b.params[0]._data.device)
            with call_site(BUCKET_SITE):
                if self.comm_hook is None:
                    return comm_api.functions().all_reduce(z, self.ranks, async_op=True)
                state, fn = self.comm_hook
                return fn(state, GradBucket(b.index, z, b.params, b.last))
        for pending in [reduce(b) for b in self.buckets]:
            pending.wait()
        for b, again in zip(self.buckets, self._exchange_dirty([False] * len(self.buckets))):
            if again:
                reduce(b).wait()

    # -- set-up and control ----------------------------------------------------------------
    def broadcast_from_first(self, tensors: Sequence[Tensor], src: int | None = None) -> None:
        """Copies the first rank's (or ``src``'s) values of ``tensors`` to every rank."""
        broadcast_tensors(tensors, self.ranks[0] if src is None else src, self.ranks)

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


def broadcast_tensors(tensors: Sequence[Tensor], src: int, ranks: Sequence[int]) -> None:
    """Copies global rank ``src``'s values of local ``tensors`` to every rank of ``ranks``: one
    broadcast per bucket (of one dtype and device, about 25 MB)."""
    if len(ranks) == 1:
        return
    for group in _make_buckets(list(tensors), 25 * 2 ** 20):
        flat = torch.cat([t._data.reshape(-1) for t in group.params])
        comm_api.functions().broadcast(flat, src, tuple(ranks))
        if env.get_rank() == src:
            continue
        off = 0
        for t in group.params:
            t._data.copy_(flat[off:off + t.numel()].view(t._data.shape))
            off += t.numel()


def verify_same_model(named: Sequence[tuple[str, Tensor]], ranks: Sequence[int] | None = None,
                      who: str = "holoflow.nn.parallel.DistributedDataParallel") -> None:
    """Checks that every rank of ``ranks`` holds tensors of the same names, shapes and dtypes (as
    torch's DDP does at construction); raises a ``HoloflowError`` naming the first difference and
    the ranks, on every rank, before any gradient is reduced."""
    r = tuple(range(env.get_world_size())) if ranks is None else tuple(ranks)
    if len(r) == 1:
        return
    mine = [(n, tuple(t.shape), str(t.dtype).split('.')[-1]) for n, t in named]
    every = comm_api.functions().all_gather_object(mine, r)
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
    for i, b in enumerate(buckets):
        b.index, b.last = i, i == len(buckets) - 1
    return buckets
