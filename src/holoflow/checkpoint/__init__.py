"""holoflow.checkpoint: checkpoints of global models and resuming after failures.

- :mod:`.sharded` / :mod:`.reshard`: ``flow.save(tree, dir)`` of global tensors (every rank
  writes its shards at once, atomically) and ``flow.load(dir, like=...)`` resharding to another
  placement, SBP, mesh or world size; OneFlow's ``global_dst_rank`` / ``global_src_rank``
  (:mod:`.reader` reads the rank files; :mod:`.shared` gives tensors saved over one storage one again).
- :mod:`.manager`: :class:`CheckpointManager` (save ``every`` n steps, keep the last ``keep``,
  an atomic ``latest`` pointer) for jobs restarted by ``launch --max_restarts``.

Importing this package installs the sharded format into ``holoflow.save`` / ``holoflow.load``.
"""
from __future__ import annotations

from typing import Any

from .. import serialization
from . import reshard, sharded
from .manager import CheckpointManager


class _Format:
    """The sharded format as ``serialization`` calls it."""

    def save(self, obj: Any, path: Any, global_dst_rank: int | None) -> None:
        if global_dst_rank is not None:
            sharded.save_to_rank(obj, path, global_dst_rank)
        else:
            if hasattr(path, "write"):
                raise serialization.CheckpointError(
                    "holoflow.save: a tree of global tensors is saved to a directory (each rank writes its "
                    "shards), not to a file object; or pass global_dst_rank=0 for one whole file")
            sharded.save_sharded(obj, path)

    def load(self, path: Any, map_location: Any, global_src_rank: int | None, like: Any) -> Any:
        if global_src_rank is not None:
            return reshard.load_from_rank(path, global_src_rank, map_location, like)
        return reshard.load_sharded(path, map_location, like)

    def is_sharded(self, path: Any) -> bool:
        return sharded.is_sharded(path)

    def relayout(self, obj: Any, like: Any) -> Any:
        return reshard.relayout(obj, like)

    def missing_hint(self, path: Any) -> str | None:
        return reshard.missing_hint(path)


serialization.register_sharded(_Format())

__all__ = ["CheckpointManager", "sharded", "reshard"]
