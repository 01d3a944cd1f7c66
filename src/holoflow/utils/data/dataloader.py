"""``DataLoader``: batches from a dataset, in the main process or in worker processes.

Index order is drawn exactly as torch's DataLoader draws it (a base seed from the loader's
generator when an epoch starts, then the sampler), so the same seed gives the same batches.
Workers fetch and collate into torch tensors (``collate_fn.in_worker``); the main process puts
results back in order and wraps them as holoflow tensors (``collate_fn.in_main``).
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import queue
import time
from typing import Any, Callable, Iterator

import torch

from ._worker import ExceptionWrapper, Fetcher, IterableEnd, Packed, worker_loop
from .collate import default_collate, default_convert
from .dataset import Dataset, IterableDataset, drawing_generator
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler
from ...core.tensor import Tensor

__all__ = ["DataLoader"]

_POLL_S = 1.0
_PENDING = object()


class _InfiniteSampler(Sampler):
    def __iter__(self) -> Iterator[None]:
        while True:
            yield None


class DataLoader:
    """Iterates over ``dataset`` in batches, as ``torch.utils.data.DataLoader``.

    >>> loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, num_workers=2)
    >>> for xb, yb in loader: ...
    """

    def __init__(self, dataset: Dataset, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Sampler | None = None, batch_sampler: Sampler | None = None, num_workers: int = 0,
                 collate_fn: Callable | None = None, pin_memory: bool = False, drop_last: bool = False,
                 timeout: float = 0, worker_init_fn: Callable | None = None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor: int | None = None, persistent_workers: bool = False,
                 pin_memory_device: str = "") -> None:
        name = "holoflow.utils.data.DataLoader"
        if num_workers < 0:
            raise ValueError(f"{name}: num_workers must be >= 0, got {num_workers}")
        if num_workers == 0 and (prefetch_factor is not None or persistent_workers):
            raise ValueError(f"{name}: prefetch_factor and persistent_workers need num_workers > 0")
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable and (shuffle or sampler is not None or batch_sampler is not None):
            raise ValueError(f"{name}: an IterableDataset takes no shuffle, sampler or batch_sampler")
        if sampler is not None and shuffle:
            raise ValueError(f"{name}: sampler is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(f"{name}: batch_sampler is mutually exclusive with batch_size, shuffle, "
                                 f"sampler and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError(f"{name}: batch_size=None (no batching) is incompatible with drop_last")
        if sampler is None:
            if self._iterable:
                sampler = _InfiniteSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.sampler, self.batch_sampler, self.generator = sampler, batch_sampler, generator
        self.num_workers, self.pin_memory, self.timeout = num_workers, pin_memory, timeout
        self.pin_memory_device = pin_memory_device
        self.worker_init_fn, self.multiprocessing_context = worker_init_fn, multiprocessing_context
        self.prefetch_factor = 2 if num_workers > 0 and prefetch_factor is None else prefetch_factor
        self.persistent_workers = persistent_workers
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self._workers_iter: _MultiProcessIter | None = None

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)  # raises TypeError for an unsized stream, as torch
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
            return n
        return len(self._index_sampler)

    def _fetcher(self, in_worker: bool) -> Fetcher:
        collate = getattr(self.collate_fn, "in_worker", self.collate_fn) if in_worker else self.collate_fn
        return Fetcher(self.dataset, self._auto_collation, collate, self._iterable, self.drop_last,
                       self.batch_size)

    def _base_seed(self) -> int:
        return int(torch.empty((), dtype=torch.int64).random_(generator=drawing_generator(self.generator)).item())

    def __iter__(self) -> Iterator[Any]:
        sampler_iter = iter(self._index_sampler)   # lazy: the base seed is drawn first, as torch
        if self.persistent_workers and self._workers_iter is not None and self._workers_iter.alive:
            self._workers_iter.reset(sampler_iter)
            return self._workers_iter
        base_seed = self._base_seed()
        if self.num_workers == 0:
            return self._single_process(sampler_iter)
        it = _MultiProcessIter(self, sampler_iter, base_seed)
        if self.persistent_workers:
            self._workers_iter = it
        return it

    def _single_process(self, sampler_iter) -> Iterator[Any]:
        fetcher = self._fetcher(in_worker=False)
        fetcher.reset()
        for request in sampler_iter:
            try:
                data = fetcher.fetch(request)
            except StopIteration:
                return
            yield _pin(data) if self.pin_memory else data


def _pin(data):
    if torch.cuda.is_available():
        if isinstance(data, Tensor) and data.is_local:
            return Tensor._make(data._data.pin_memory())
        if isinstance(data, dict):
            return type(data)({k: _pin(v) for k, v in data.items()})
        if isinstance(data, (list, tuple)) and not hasattr(data, "_fields"):
            return type(data)(_pin(v) for v in data)
    return data


class _MultiProcessIter:
    """Worker processes fed round-robin with requests; results are re-ordered by request number."""

    def __init__(self, loader: DataLoader, sampler_iter, base_seed: int) -> None:
        ctx = loader.multiprocessing_context
        ctx = mp.get_context(ctx) if ctx is None or isinstance(ctx, str) else ctx
        self.loader, self.n = loader, loader.num_workers
        self.post = getattr(loader.collate_fn, "in_main", None)
        self.result_q = ctx.Queue()
        self.index_qs, self.workers = [], []
        fetcher = loader._fetcher(in_worker=True)
        for wid in range(self.n):
            q = ctx.Queue()
            w = ctx.Process(target=worker_loop, daemon=True,
                            args=(fetcher, q, self.result_q, wid, self.n, base_seed + wid, loader.worker_init_fn))
            w.start()
            self.index_qs.append(q)
            self.workers.append(w)
        self.alive = True
        self._send_idx = self._rcvd_idx = 0
        self.reset(sampler_iter, first=True)

    def reset(self, sampler_iter, first: bool = False) -> None:
        self.sampler_iter, self.buffer, self.active = sampler_iter, {}, [True] * self.n
        self._rcvd_idx = self._send_idx
        self._next_worker = itertools.cycle(range(self.n))
        if not first and self.loader._iterable:
            for q in self.index_qs:
                q.put("reset")
        for _ in range(self.loader.prefetch_factor * self.n):
            self._put_request()

    def _put_request(self) -> None:
        if not any(self.active):
            return
        try:
            request = next(self.sampler_iter)
        except StopIteration:
            return
        for _ in range(self.n):
            w = next(self._next_worker)
            if self.active[w]:
                break
        self.index_qs[w].put((self._send_idx, request))
        self._send_idx += 1

    def __iter__(self) -> "_MultiProcessIter":
        return self

    def __next__(self) -> Any:
        while True:
            if self._rcvd_idx == self._send_idx:
                if not self.loader.persistent_workers:
                    self.shutdown()
                raise StopIteration
            data = self.buffer.pop(self._rcvd_idx) if self._rcvd_idx in self.buffer else self._get()
            if data is _PENDING:
                continue
            self._rcvd_idx += 1
            if isinstance(data, IterableEnd):
                self.active[data.worker_id] = False
                continue
            self._put_request()
            if isinstance(data, ExceptionWrapper):
                self.shutdown()
                data.reraise()
            if self.post is not None:
                data = self.post(data)
            return _pin(data) if self.loader.pin_memory else data

    def _get(self) -> Any:
        """The result for ``_rcvd_idx`` if it arrives next; others are buffered (``_PENDING``)."""
        waited = 0.0
        while True:
            try:
                idx, data = self.result_q.get(timeout=_POLL_S)
                break
            except queue.Empty:
                waited += _POLL_S
                dead = [f"worker {wid} (pid {w.pid}, exit code {w.exitcode})"
                        for wid, w in enumerate(self.workers) if not w.is_alive()]
                if dead:
                    self.shutdown()
                    raise RuntimeError(f"holoflow.utils.data.DataLoader: {', '.join(dead)} exited "
                                       "unexpectedly (killed, out of memory, or os._exit in the dataset)") from None
                if self.loader.timeout and waited >= self.loader.timeout:
                    self.shutdown()
                    raise RuntimeError(f"holoflow.utils.data.DataLoader: timed out after {waited:.0f}s "
                                       f"waiting for a batch from the workers") from None
        data = self._unpack(data)
        if idx == self._rcvd_idx:
            return data
        self.buffer[idx] = data
        return _PENDING

    def _unpack(self, data: Any) -> Any:
        if not isinstance(data, Packed):
            return data
        try:
            return data.unpack()
        except Exception as e:
            # a worker that died after sending (its shared-memory handles gone with it) shows up
            # here as a reset connection: name the death, which is the cause
            dead: list = []
            for _ in range(40):   # up to 2 s for the dying worker to be reaped
                dead = [f"worker {wid} (pid {w.pid}, exit code {w.exitcode})"
                        for wid, w in enumerate(self.workers) if not w.is_alive()]
                if dead or not isinstance(e, (ConnectionError, EOFError, OSError)):
                    break
                time.sleep(0.05)
            self.shutdown()
            if dead:
                raise RuntimeError(f"holoflow.utils.data.DataLoader: {', '.join(dead)} exited unexpectedly "
                                   f"(killed, out of memory, or os._exit in the dataset)") from e
            raise RuntimeError(f"holoflow.utils.data.DataLoader: the batch from worker {data.worker_id} "
                               f"could not be unpickled in the main process: {type(e).__name__}: {e}") from e

    def shutdown(self) -> None:
        if not self.alive:
            return
        self.alive = False
        for q in self.index_qs:
            q.put(None)
        for w in self.workers:
            w.join(timeout=5)
            if w.is_alive():
                w.terminate()
        for q in [*self.index_qs, self.result_q]:
            q.cancel_join_thread()
            q.close()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
