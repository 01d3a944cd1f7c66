"""What runs inside a DataLoader worker process: fetch, collate to torch, send back."""
from __future__ import annotations

import pickle
import random
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

import numpy as np
import torch

_INFO: list = [None]


@dataclass(frozen=True)
class WorkerInfo:
    """What :func:`get_worker_info` returns inside a worker: ``id, num_workers, seed, dataset``."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


def get_worker_info() -> WorkerInfo | None:
    """The current worker's :class:`WorkerInfo`, or None in the main process."""
    return _INFO[0]


class ExceptionWrapper:
    """An exception raised in a worker, re-raised in the main process with the worker's traceback."""

    def __init__(self, where: str) -> None:
        exc_type, exc, _ = sys.exc_info()
        self.where = where
        self.msg = "".join(traceback.format_exception(exc_type, exc, exc.__traceback__))
        try:  # a class the main process cannot unpickle (defined in a function) becomes RuntimeError
            pickle.loads(pickle.dumps(exc_type))
            self.exc_type = exc_type
        except Exception:
            self.exc_type = RuntimeError

    def reraise(self):
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.msg}"
        try:
            err = self.exc_type(msg)
        except Exception:
            err = RuntimeError(msg)
        raise err


@dataclass(frozen=True)
class Packed:
    """A result pickled by the worker itself, so that a batch that cannot be pickled fails in
    the worker (and is reported) instead of in the queue's feeder thread, whose errors the
    main process never sees."""

    worker_id: int
    payload: bytes

    def unpack(self) -> Any:
        return ForkingPickler.loads(self.payload)


def pack(data: Any, worker_id: int) -> Packed:
    """Pickles ``data`` for the main process; a pickling failure is sent as an ExceptionWrapper."""
    try:
        return Packed(worker_id, bytes(ForkingPickler.dumps(data)))
    except Exception:
        err = ExceptionWrapper(f"in DataLoader worker process {worker_id} while pickling its batch for "
                               f"the main process (a collate_fn or dataset returned something "
                               f"that cannot be pickled)")
        return Packed(worker_id, bytes(ForkingPickler.dumps(err)))


class IterableEnd:
    """Sent by a worker whose copy of an IterableDataset is exhausted."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id


@dataclass
class Fetcher:
    """Turns a request (a list of indices, one index, or None for an IterableDataset) into data."""

    dataset: Any
    auto_collation: bool
    collate: Callable
    iterable: bool
    drop_last: bool
    batch_size: int | None
    _it: Any = None

    def reset(self) -> None:
        self._it = iter(self.dataset) if self.iterable else None

    def fetch(self, request):
        if self.iterable:
            if self._it is None:
                self.reset()
            if not self.auto_collation:
                return self.collate(next(self._it))
            batch = [x for _, x in zip(range(self.batch_size), self._it)]
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                raise StopIteration
            return self.collate(batch)
        if not self.auto_collation:
            return self.collate(self.dataset[request])
        getitems = getattr(self.dataset, "__getitems__", None)
        return self.collate(getitems(request) if callable(getitems) else [self.dataset[i] for i in request])


def worker_loop(fetcher: Fetcher, index_q, result_q, worker_id: int, num_workers: int, seed: int,
                init_fn: Callable | None) -> None:
    """A worker: seeds its RNGs, runs ``init_fn``, then answers ``(idx, request)`` messages with
    ``(idx, data)`` until it gets None. ``"reset"`` restarts an IterableDataset (next epoch)."""
    torch.set_num_threads(1)
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed % 2 ** 32)
    _INFO[0] = WorkerInfo(worker_id, num_workers, seed, fetcher.dataset)
    init_error = None
    if init_fn is not None:
        try:
            init_fn(worker_id)
        except Exception:
            init_error = ExceptionWrapper(f"in DataLoader worker process {worker_id} (worker_init_fn)")
    fetcher.reset()
    exhausted = False
    while True:
        msg = index_q.get()
        if msg is None:
            return
        if msg == "reset":
            fetcher.reset()
            exhausted = False
            continue
        idx, request = msg
        if init_error is not None:
            result_q.put((idx, pack(init_error, worker_id)))
            continue
        if exhausted:
            result_q.put((idx, pack(IterableEnd(worker_id), worker_id)))
            continue
        try:
            data = fetcher.fetch(request)
        except StopIteration:
            exhausted = True
            data = IterableEnd(worker_id)
        except Exception:
            data = ExceptionWrapper(f"in DataLoader worker process {worker_id}")
        result_q.put((idx, pack(data, worker_id)))
