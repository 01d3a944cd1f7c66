"""``holoflow.dtensor.checkpoint``: torch's distributed checkpoint API (``torch.distributed.checkpoint``,
DCP) on holoflow's sharded checkpoints.

``save(state_dict, checkpoint_id=dir)`` writes the tree with ``holoflow.checkpoint``'s sharded
format (every rank its shards, atomically); ``load(state_dict, checkpoint_id=dir)`` reads into the
tensors of ``state_dict`` in place, each rank only the pieces of its shards, resharding to their
layouts. Values with ``state_dict()`` / ``load_state_dict()`` (torch's ``Stateful``) are saved
through them and loaded back into them. The directory is holoflow's format, not torch's
``.distcp`` files: a checkpoint written by one library is read by the same library.
"""
from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any

from ...checkpoint import reshard, sharded
from ...core.grad_mode import no_grad
from ...core.tensor import Tensor
from ...serialization import CheckpointError

__all__ = ["save", "load", "async_save", "FileSystemWriter", "FileSystemReader", "state_dict", "stateful"]


class FileSystemWriter:
    """Where ``save`` writes (its ``path``)."""

    def __init__(self, path: str | os.PathLike, single_file_per_rank: bool = True, sync_files: bool = True,
                 thread_count: int = 1, per_thread_copy_ahead: int = 10_000_000, cache_staged_state_dict: bool = False,
                 overwrite: bool = True) -> None:
        self.path = os.fspath(path)


class FileSystemReader:
    """Where ``load`` reads (its ``path``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)


def _stateful(v: Any) -> bool:
    return not isinstance(v, Tensor) and callable(getattr(v, "state_dict", None)) and \
        callable(getattr(v, "load_state_dict", None))


def _flatten_stateful(state_dict: dict) -> dict:
    return {k: (v.state_dict() if _stateful(v) else v) for k, v in state_dict.items()}


def _path(checkpoint_id, storage, op: str) -> str:
    if checkpoint_id is None and storage is None:
        raise ValueError(f"holoflow.distributed.checkpoint.{op}: give checkpoint_id= (a directory) or a "
                         f"storage_{'writer' if op == 'save' else 'reader'} with a path")
    return os.fspath(checkpoint_id if checkpoint_id is not None else storage.path)


def save(state_dict: dict, *, checkpoint_id: str | os.PathLike | None = None, storage_writer=None, planner=None,
         process_group=None, no_dist: bool = False) -> None:
    """Every rank calls it: writes ``state_dict`` (global tensors as their shards, local ones as
    rank 0's) to the directory ``checkpoint_id``."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"holoflow.distributed.checkpoint.save: state_dict must be a dict, got "
                        f"{type(state_dict).__name__}")
    sharded.save_sharded(_flatten_stateful(state_dict), _path(checkpoint_id, storage_writer, "save"))


def async_save(state_dict: dict, *, checkpoint_id=None, storage_writer=None, planner=None, process_group=None,
               **kwargs) -> Future:
    """:func:`save`, finished when it returns (a done future)."""
    save(state_dict, checkpoint_id=checkpoint_id, storage_writer=storage_writer)
    done: Future = Future()
    done.set_result(None)
    return done


def load(state_dict: dict, *, checkpoint_id: str | os.PathLike | None = None, storage_reader=None, planner=None,
         process_group=None, no_dist: bool = False) -> None:
    """Every rank calls it: fills the tensors of ``state_dict`` in place from the checkpoint (each
    in its own layout: the checkpoint is resharded), replaces its other values, and loads
    ``Stateful`` values through ``load_state_dict``."""
    path = _path(checkpoint_id, storage_reader, "load")
    like = _flatten_stateful(state_dict)
    got = reshard.load_sharded(path, like=like)
    with no_grad():
        for k, v in state_dict.items():
            new = _fill(like[k], _entry(got, k, path), k, repr(path))
            if _stateful(v):
                v.load_state_dict(new)
            else:
                state_dict[k] = new


def _entry(got: Any, key: Any, path: str) -> Any:
    if not isinstance(got, dict) or key not in got:
        raise CheckpointError(f"holoflow.distributed.checkpoint.load({path!r}): missing key in checkpoint "
                              f"state_dict: {key!r}")
    return got[key]


def _fill(like: Any, new: Any, key: Any, where: str) -> Any:
    """``like`` with its tensors overwritten in place by ``new``'s (dicts and lists walked)."""
    if isinstance(like, Tensor) and isinstance(new, Tensor):
        if tuple(like.shape) != tuple(new.shape):
            raise CheckpointError(f"holoflow.distributed.checkpoint.load({where}): {key!r} has shape "
                                  f"{tuple(new.shape)} in the checkpoint, {tuple(like.shape)} here")
        like._data.copy_(new._data)
        return like
    if isinstance(like, dict) and isinstance(new, dict):
        for k in list(like):
            like[k] = _fill(like[k], _entry(new, k, where), k, where)
        return like
    if isinstance(like, list) and isinstance(new, list) and len(like) == len(new):
        for i in range(len(like)):
            like[i] = _fill(like[i], new[i], i, where)
        return like
    return new


from . import state_dict, stateful  # noqa: E402  (torch.distributed.checkpoint.state_dict, .stateful)
