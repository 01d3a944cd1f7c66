"""``CheckpointManager``: periodic checkpoints, the last ``keep`` kept, an atomic ``latest`` pointer.

    mgr = CheckpointManager("ckpts", every=100, keep=3)
    got = mgr.load(like={"model": model, "optim": opt})     # None on a fresh start
    start = 0 if got is None else got[0]
    ...
    for step in range(start, steps):
        train_one_step()
        mgr.save(step + 1, {"model": model.state_dict(), "optim": opt.state_dict()})  # every 100

Every rank calls ``save`` and ``load``. A tree with global tensors is saved as a sharded
directory ``step-<n>`` by all ranks; a tree of local tensors (replicated, e.g. data parallel) as
one file ``step-<n>.hf`` by rank 0. ``latest`` (JSON ``{"step": n, "path": "step-<n>"}``) is
replaced atomically by rank 0 only after the checkpoint is complete, so a job killed at any
moment resumes from the newest complete checkpoint; older ones beyond ``keep`` and temp files of
killed saves are deleted. Restarting the job is the launcher's part (``--max_restarts``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

from ..serialization import load, save, save_file
from ..serialization_files import TEMP_TAG, clean_stale_temps, fsync_dir, temp_path
from ..serialization_tree import CheckpointError, has_global
from .sharded import _ctx, _gather, _raise_failed

POINTER = "latest"


class CheckpointManager:
    """Saves every ``every`` steps into ``directory``, keeps the last ``keep``; see the module doc."""

    def __init__(self, directory: str | os.PathLike, every: int = 1, keep: int = 3, prefix: str = "step-") -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"holoflow.checkpoint.CheckpointManager: every must be an int >= 1, got {every!r}")
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"holoflow.checkpoint.CheckpointManager: keep must be an int >= 1, got {keep!r}")
        self.directory, self.every, self.keep, self.prefix = os.path.abspath(os.fspath(directory)), every, keep, prefix
        self._entry = re.compile(re.escape(prefix) + r"(\d+)(\.hf)?$")

    def due(self, step: int) -> bool:
        """Would :meth:`save` write at ``step``?"""
        return step % self.every == 0

    # -- save --------------------------------------------------------------------------------
    def save(self, step: int, obj: Any, *, force: bool = False) -> str | None:
        """Saves ``obj`` as the checkpoint of ``step`` if due (or ``force``); returns its path.
        Every rank calls it."""
        if not (force or self.due(step)):
            return None
        r, n = _ctx()
        if r == 0:
            os.makedirs(self.directory, exist_ok=True)
        name = f"{self.prefix}{step:08d}"
        if has_global(obj):
            _gather(None, n)   # the directory exists before any rank writes into it
            save(obj, os.path.join(self.directory, name))
        else:
            name += ".hf"
            err = None
            if r == 0:
                try:
                    save_file(obj, os.path.join(self.directory, name))
                except Exception as e:  # noqa: BLE001 - reported on every rank
                    err = f"{type(e).__name__}: {e}"
            _raise_failed(_gather(err, n), repr(os.path.join(self.directory, name)))
        err = None
        if r == 0:
            try:
                self._point(step, name)
                self._prune(name)
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {e}"
        _raise_failed(_gather(err, n), f"{self.directory!r} latest pointer")
        return os.path.join(self.directory, name)

    def _point(self, step: int, name: str) -> None:
        target = os.path.join(self.directory, POINTER)
        clean_stale_temps(target)
        tmp = temp_path(target)
        with open(tmp, "w") as f:
            json.dump({"step": step, "path": name}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        fsync_dir(self.directory)

    def _prune(self, current: str) -> None:
        entries = sorted(self._entries(), key=lambda e: e[0])
        for _, name in entries[:-self.keep]:
            if name != current:
                full = os.path.join(self.directory, name)
                shutil.rmtree(full) if os.path.isdir(full) else os.unlink(full)
        for name in os.listdir(self.directory):   # temps of saves killed mid-way
            if TEMP_TAG in name and name.startswith(self.prefix):
                clean_stale_temps(os.path.join(self.directory, name.split(TEMP_TAG)[0]))

    def _entries(self) -> list[tuple[int, str]]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return [(int(m.group(1)), name) for name in names if (m := self._entry.match(name))]

    # -- load --------------------------------------------------------------------------------
    def latest(self) -> tuple[int, str] | None:
        """(step, path) of the newest complete checkpoint, or None."""
        try:
            with open(os.path.join(self.directory, POINTER)) as f:
                ptr = json.load(f)
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise CheckpointError(f"holoflow.checkpoint: {os.path.join(self.directory, POINTER)} is not valid "
                                  f"JSON: {e}") from e
        if not (isinstance(ptr, dict) and isinstance(ptr.get("step"), int) and isinstance(ptr.get("path"), str)
                and self._entry.match(ptr["path"])):
            raise CheckpointError(f"holoflow.checkpoint: {os.path.join(self.directory, POINTER)} is not a "
                                  f"checkpoint pointer: {str(ptr)[:100]}")
        path = os.path.join(self.directory, ptr["path"])
        if not os.path.exists(path):
            raise CheckpointError(f"holoflow.checkpoint: the latest pointer names {path}, which is missing")
        return ptr["step"], path

    def steps(self) -> list[int]:
        """Steps of the checkpoints on disk, oldest first."""
        return sorted(s for s, _ in self._entries())

    def load(self, like: Any = None, map_location=None) -> tuple[int, Any] | None:
        """(step, the loaded tree) of the latest checkpoint, or None if there is none yet.
        ``like``: the target layout of global tensors (see ``holoflow.load``)."""
        got = self.latest()
        if got is None:
            return None
        step, path = got
        return step, load(path, map_location=map_location, like=like)
