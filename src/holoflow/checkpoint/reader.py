"""Reading a sharded checkpoint directory's rank files: each rank only the byte ranges of the shards
overlapping the box it needs (``safe_open(...).get_slice``), and local tensors whole over their
storage's entry (see :mod:`holoflow.checkpoint.sharded` for the layout)."""
from __future__ import annotations

import math
import os
from typing import Any

import safetensors
import torch

from ..serialization_storage import (checked_locations, from_storable, owned, restore, retyped, stored_shape,
                                     view_of)
from ..serialization_tree import CheckpointError
from .sharded import _dtype_from

__all__ = ["ShardReader"]


class ShardReader:
    """Reads boxes of saved tensors from the rank files (opened once, on first use). A local
    tensor is read whole, over its storage's entry (read once, restored to the device it was
    saved on, or where ``map_location`` sends it), so views of one storage load sharing it."""

    def __init__(self, directory: str, name: str, manifest: dict, map_location: Any = None) -> None:
        self.dir, self.name, self.files, self.entries = directory, name, {}, {}
        self.dtypes, self.map_location = manifest.get("dtypes", {}), map_location
        if not isinstance(self.dtypes, dict):
            raise self.corrupt(f"\"dtypes\" is {str(self.dtypes)[:60]}, not a map of entry names to dtypes")
        self.locations = checked_locations(manifest.get("locations"), self.corrupt)

    def bad(self, what: str) -> CheckpointError:
        return CheckpointError(f"holoflow.load({self.name}): {what}")

    def file(self, fname: Any) -> Any:
        if not isinstance(fname, str) or os.path.basename(fname) != fname or not fname.endswith(".safetensors"):
            raise self.bad(f"corrupt manifest: bad shard file name {fname!r}")
        if fname not in self.files:
            full = os.path.join(self.dir, fname)
            try:
                self.files[fname] = safetensors.safe_open(full, framework="pt")
            except (OSError, safetensors.SafetensorError) as e:
                raise self.bad(f"shard file {fname} is missing or unreadable: {e}") from e
        return self.files[fname]

    def local(self, n: dict, where: str) -> torch.Tensor:
        """The whole local tensor ``n``: its storage's entry, or a view of it (sharing it)."""
        shards, key = n.get("shards"), n["key"]
        if not (isinstance(shards, list) and len(shards) == 1 and isinstance(shards[0], dict)):
            raise self.bad(f"corrupt manifest: the local tensor {where} is not one shard of one file")
        fname = shards[0].get("file")
        entry = self.entries.get((fname, key))
        if entry is None:
            f = self.file(fname)
            try:
                entries = {key: owned(f.get_tensor(key))}
            except Exception as e:  # noqa: BLE001 - safetensors raises several kinds
                raise self.bad(f"shard file {fname} lacks {where} (key {key!r}): {e}") from e
            if key in self.dtypes:
                retyped(entries, {key: self.dtypes[key]}, self.corrupt)
            entry = restore(entries[key], self.locations.get(key, "cpu"), self.map_location)
            self.entries[(fname, key)] = entry
        data = view_of(entry, n["view"], self.corrupt) if "view" in n else entry
        dtype = _dtype_from(n.get("dtype"), self.name)
        if data.dtype != dtype or list(data.shape) != n["shape"]:
            raise self.bad(f"{where} in {fname} is {data.dtype} of shape {list(data.shape)}, the manifest says "
                           f"{dtype} of shape {n['shape']}")
        return data

    def corrupt(self, what: str) -> CheckpointError:
        return self.bad(f"corrupt manifest: {what}")

    def read(self, n: dict, box: list[tuple[int, int]], where: str, whole: bool = False) -> torch.Tensor:
        """The box ``[(start, size)] per dim`` of the saved tensor ``n``, a tensor of its own; with
        ``whole`` (the box is all of it) a local one comes back sharing its storage."""
        dtype = _dtype_from(n.get("dtype"), self.name)
        if n.get("placement") is None:
            data = self.local(n, where)
            return data if whole else data[tuple(slice(a, a + s) for a, s in box)].clone()
        if math.prod(size for _, size in box) == 0:
            return torch.empty([s for _, s in box], dtype=dtype)
        shards = n.get("shards")
        if not isinstance(shards, list):
            raise self.bad(f"corrupt manifest: {where} lists no shards")
        parts, covered = [], 0   # checked against the files' headers before anything is allocated
        for sh in shards:
            off, size = (sh.get("offset"), sh.get("size")) if isinstance(sh, dict) else (None, None)
            if not (isinstance(off, list) and isinstance(size, list) and len(off) == len(size) == len(box)
                    and all(isinstance(v, int) and v >= 0 for v in off + size)
                    and all(o + z <= d for o, z, d in zip(off, size, n["shape"]))):
                raise self.bad(f"corrupt manifest: a shard of {where} has a bad offset/size: {str(sh)[:80]}")
            lo = [max(a, o) for (a, _), o in zip(box, off)]
            hi = [min(a + s, o + z) for (a, s), o, z in zip(box, off, size)]
            if any(h <= l for l, h in zip(lo, hi)):
                continue
            f = self.file(sh.get("file"))
            try:
                sl = f.get_slice(n["key"])
            except Exception as e:  # noqa: BLE001 - safetensors raises several kinds
                raise self.bad(f"shard file {sh.get('file')} lacks {where} (key {n['key']!r}): {e}") from e
            if list(sl.get_shape()) != stored_shape(size, dtype):
                raise self.bad(f"shard of {where} in {sh.get('file')} has shape {sl.get_shape()}, the manifest "
                               f"says {stored_shape(size, dtype)}")
            parts.append((f, sl, lo, hi, off))
            covered += math.prod(h - l for l, h in zip(lo, hi))
        need = math.prod(s for _, s in box)
        if covered != need:
            raise self.bad(f"the shards of {where} cover {covered} of the {need} elements this rank needs; "
                           f"the checkpoint is incomplete or corrupt")
        out = torch.empty([s for _, s in box], dtype=dtype)
        for f, sl, lo, hi, off in parts:
            src = tuple(slice(l - o, h - o) for l, h, o in zip(lo, hi, off))
            src += (slice(None),) * (len(stored_shape(size, dtype)) - len(size))   # (an element's parts)
            part = sl[src] if src else f.get_tensor(n["key"])
            dst = tuple(slice(l - a, h - a) for l, h, (a, _) in zip(lo, hi, box))
            out[dst] = from_storable(part, dtype)
        return out
