"""``holoflow.save`` / ``holoflow.load``: checkpoints that load without running code.

File format
-----------
One `safetensors <https://github.com/huggingface/safetensors>`_ file. Its tensors are named
``"0"``, ``"1"``, ...; its string metadata holds one key, ``"holoflow"``: a JSON manifest

    {"format": "holoflow", "version": 1, "root": NODE}

where a NODE is a value, a tensor, a container or a module, as :mod:`holoflow.serialization_tree`
describes (files holding a tensor stored as a view of another's storage are version 2).

A tensor object that appears several times is stored once and loads as one object again.
Tensors sharing a storage (views, tied weights) store it once and load sharing it, with their
strides and storage offsets, as ``torch.load`` gives them back
(:mod:`holoflow.serialization_storage`). Saving is atomic: a temporary file next to the target,
fsynced and renamed over it, so a crash mid-save leaves the previous checkpoint intact; a temp
file left by a killed process is deleted by the next save of that target
(:mod:`holoflow.serialization_files`).

Global tensors: a tree holding them is saved by every rank together into a *directory* (one
safetensors file per rank plus a manifest) and loads resharded to another layout; see
:mod:`holoflow.checkpoint.sharded` (registered through ``register_sharded``). ``global_dst_rank``
/ ``global_src_rank`` are OneFlow's form: one rank writes / reads whole tensors.

``load`` recognises the format by content (safetensors, a torch zip, a legacy ``torch.save``
pickle). It also reads a plain safetensors file (a dict of tensors) and files written by
``torch.save`` (through ``torch.load(weights_only=True)``: no code runs), converting torch
tensors to holoflow tensors. Anything else — a pickle with code in it, a truncated file, a bad
manifest — raises :class:`CheckpointError` naming the file and the problem.
"""
from __future__ import annotations

import io
import json
import os
import struct
from typing import Any, Protocol

import safetensors
import safetensors.torch
import torch

from .core.errors import UnsupportedError
from .core.tensor import Tensor
from . import serialization_module as _whole
from .serialization_files import clean_stale_temps, fsync_dir, read_header, sniff, temp_path
from .serialization_storage import checked_locations, owned, restore, retyped
from .serialization_tree import (CODECS, FORMAT, META_KEY, VERSION, CheckpointError, Decoder, Encoder, TensorCodec,
                                 from_torch, has_global, register_codec)

__all__ = ["save", "load", "CheckpointError", "TensorCodec", "register_codec", "CODECS", "register_sharded"]


def save(obj: Any, path: str | os.PathLike, global_dst_rank: int | None = None, *, pickle_module: Any = None,
         pickle_protocol: Any = None, _use_new_zipfile_serialization: bool = True,
         _disable_byteorder_record: bool = False) -> None:
    """Saves tensors and nested dicts/lists/tuples of tensors and plain values to ``path``
    (atomically: the previous file survives a crash). See the module doc for the format.
    torch.save's pickle and zip options are accepted and have no effect: the file is holoflow's.

    A tree holding global tensors is saved by every rank together: into the directory ``path``
    (each rank writes its own shards), or, with ``global_dst_rank=r``, as one ordinary file that
    rank ``r`` alone writes with whole tensors (OneFlow's form).

    >>> flow.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 10}, "ckpt.hf")
    """
    if global_dst_rank is not None or has_global(obj):
        if _SHARDED is None:
            raise UnsupportedError("holoflow.save: saving global tensors needs holoflow.checkpoint "
                                   "(import holoflow); or save t.to_local()")
        _SHARDED.save(obj, path, global_dst_rank)
        return
    save_file(obj, path)


def save_file(obj: Any, path: str | os.PathLike) -> None:
    """:func:`save` of a tree of local tensors into one file (or file object)."""
    enc = Encoder()
    root = enc.node(obj, "obj")
    manifest = {"format": FORMAT, "version": enc.version, "root": root}
    if enc.table.dtypes:
        manifest["dtypes"] = enc.table.dtypes
    if enc.table.locations:
        manifest["locations"] = enc.table.locations
    metadata = {META_KEY: json.dumps(manifest)}
    if hasattr(path, "write"):
        path.write(safetensors.torch.save(enc.tensors, metadata=metadata))
        return
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"holoflow.save: {path!r} is a directory (a sharded checkpoint?); "
                                f"a tree of local tensors is saved to a file")
    directory = os.path.dirname(os.path.abspath(path))
    clean_stale_temps(path)
    tmp = temp_path(path)
    try:
        _write(enc.tensors, tmp, metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def _write(tensors: dict, path: str, metadata: dict) -> None:
    safetensors.torch.save_file(tensors, path, metadata=metadata)


# -- sharded (global-tensor) checkpoints: registered by holoflow.checkpoint ------------------
class ShardedFormat(Protocol):
    """Saves/loads trees of global tensors (directories, one file per rank)."""

    def save(self, obj: Any, path: Any, global_dst_rank: int | None) -> None: ...

    def load(self, path: Any, map_location: Any, global_src_rank: int | None, like: Any) -> Any: ...

    def is_sharded(self, path: Any) -> bool: ...

    def relayout(self, obj: Any, like: Any) -> Any: ...

    def missing_hint(self, path: Any) -> str | None: ...


_SHARDED: ShardedFormat | None = None


def register_sharded(fmt: ShardedFormat) -> None:
    """Installs the global-tensor checkpoint format (done by holoflow.checkpoint)."""
    global _SHARDED
    _SHARDED = fmt


# -- load ------------------------------------------------------------------------------------
def load(path: str | os.PathLike, map_location=None, pickle_module: Any = None, *, weights_only: bool = True,
         mmap: bool | None = None, global_src_rank: int | None = None, like: Any = None, **pickle_load_args) -> Any:
    """Loads what :func:`save` wrote (or a safetensors / ``torch.save`` file) without running any
    code. As ``torch.load``, tensors go back to the device they were saved on (a CUDA checkpoint
    on a machine without CUDA raises torch's RuntimeError asking for ``map_location``), unless
    ``map_location`` says otherwise: a device (``"cpu"``, ``"cuda:0"``, a holoflow/torch device),
    a dict ``{"cuda:0": "cpu"}`` moving tensors saved on one device to another, or torch's
    function ``(storage, location) -> storage`` (None: the default).
    ``mmap`` and ``pickle_load_args`` (``encoding=...``) reach torch.load for torch files; a
    holoflow file is read through safetensors, which maps the file anyway.

    Global tensors: ``like`` is a tree shaped like the saved one (a state dict, a module, an
    optimizer, ...) whose global tensors give each loaded tensor its placement and SBP; each
    rank reads only its shard. ``global_src_rank=r`` (OneFlow's form): rank ``r`` alone reads,
    and tensors load as global tensors broadcast on ``placement([r])`` (then ``like``'s layout).

    >>> ckpt = flow.load("ckpt.hf", map_location="cpu")
    >>> ckpt = flow.load("ckpt_dir", like={"model": model, "optim": opt})
    """
    if pickle_module is not None and weights_only:
        raise RuntimeError("holoflow.load: can not safely load weights when explicit pickle_module is specified "
                           "(as torch.load)")
    torch_args = dict(pickle_load_args, **({} if mmap is None else {"mmap": mmap}))
    with _whole.allowing_code(not weights_only):   # modules saved whole may be rebuilt (their code runs)
        return _load(path, map_location, torch_args, global_src_rank, like)


def _load(path, map_location, torch_args: dict, global_src_rank: int | None, like: Any) -> Any:
    if global_src_rank is not None or (_SHARDED is not None and _SHARDED.is_sharded(path)):
        if _SHARDED is None:
            raise UnsupportedError("holoflow.load: global checkpoints need holoflow.checkpoint (import holoflow)")
        return _SHARDED.load(path, map_location, global_src_rank, like)
    obj = load_file(path, map_location, torch_args)
    if like is not None and _SHARDED is not None:
        obj = _SHARDED.relayout(obj, like)
    return obj


def load_file(path, map_location=None, torch_args: dict | None = None) -> Any:
    """:func:`load` of one file or file object (no global layout); ``torch_args`` go to
    torch.load for a torch.save file."""
    name = repr(getattr(path, "name", path)) if hasattr(path, "read") else repr(os.fspath(path))
    data = path.read() if hasattr(path, "read") else None
    if data is None:
        if os.path.isdir(path):
            raise CheckpointError(f"holoflow.load({name}): a directory without a holoflow manifest "
                                  f"(manifest.json); not a checkpoint")
        try:
            with open(path, "rb") as f:
                kind = sniff(f, os.fstat(f.fileno()).st_size)
        except OSError as e:
            hint = _SHARDED.missing_hint(path) if _SHARDED is not None and not os.path.exists(path) else None
            hint = f"; a save replacing it was interrupted: the previous checkpoint is {hint!r}" if hint else ""
            raise FileNotFoundError(f"holoflow.load({name}): {e.strerror}{hint}") from e
    else:
        kind = sniff(io.BytesIO(data), len(data))
    if kind == "empty":
        raise CheckpointError(f"holoflow.load({name}): the file is empty")
    if kind in ("zip", "pickle"):
        return _load_torch(path if data is None else data, name, map_location, torch_args or {})
    if kind != "safetensors":
        raise CheckpointError(f"holoflow.load({name}): not a valid checkpoint (safetensors, torch.save "
                              f"zip or pickle): {kind}")
    return _load_safetensors(path, data, name, map_location)


def _load_safetensors(path, data: bytes | None, name: str, map_location) -> Any:
    try:
        if data is None:
            with safetensors.safe_open(os.fspath(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        else:
            meta = read_header(data).get("__metadata__") or {}
            tensors = safetensors.torch.load(data)
    except (safetensors.SafetensorError, ValueError, OSError, struct.error) as e:
        raise CheckpointError(f"holoflow.load({name}): not a valid checkpoint (safetensors, torch.save "
                              f"zip or pickle): {e}") from e
    tensors = {k: owned(v) for k, v in tensors.items()}
    if META_KEY not in meta:   # a plain safetensors file
        return {k: Tensor._make(restore(v, "cpu", map_location)) for k, v in tensors.items()}
    try:
        manifest = json.loads(meta[META_KEY])
    except json.JSONDecodeError as e:
        raise CheckpointError(f"holoflow.load({name}): the manifest is not valid JSON: {e}") from e
    except RecursionError as e:
        raise CheckpointError(f"holoflow.load({name}): corrupt manifest: nested too deeply") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "root" not in manifest:
        raise CheckpointError(f"holoflow.load({name}): the manifest is not a holoflow manifest")
    if not isinstance(manifest.get("version", 0), int):
        raise CheckpointError(f"holoflow.load({name}): corrupt manifest: version {manifest['version']!r} is not "
                              f"an int")
    if manifest.get("version", 0) > VERSION:
        raise CheckpointError(f"holoflow.load({name}): format version {manifest['version']} is newer than "
                              f"this holoflow reads ({VERSION}); upgrade holoflow")
    dec = Decoder(tensors, name)
    if "dtypes" in manifest:
        retyped(tensors, manifest["dtypes"], dec.bad)
    locations = checked_locations(manifest.get("locations"), dec.bad)
    for k, v in tensors.items():   # (each storage as torch.load restores it: views made after share it)
        tensors[k] = restore(v, locations.get(k, "cpu"), map_location)
    return dec.node(manifest["root"])


def _load_torch(src, name: str, map_location, torch_args: dict) -> Any:
    if isinstance(map_location, dict):
        map_location = {str(k): str(v) for k, v in map_location.items()}
    elif map_location is not None and not callable(map_location):
        map_location = str(map_location)
    if isinstance(src, bytes):
        src, torch_args = io.BytesIO(src), {k: v for k, v in torch_args.items() if k != "mmap"}  # (files only)
    try:
        obj = torch.load(src, map_location=map_location, weights_only=True, **torch_args)
    except Exception as e:  # UnpicklingError for code, RuntimeError/EOFError for truncation
        if type(e) is RuntimeError and "map_location" in str(e):
            raise   # torch's own: a device this machine lacks (a CUDA file on a CPU-only machine)
        reason = str(e).split("\n")[0]
        raise CheckpointError(f"holoflow.load({name}): refused: a torch.save/pickle file that "
                              f"torch.load(weights_only=True) can't load safely ({type(e).__name__}: "
                              f"{reason})") from e
    return from_torch(obj)
