"""``holoflow.save`` / ``holoflow.load``: checkpoints that load without running code.

File format
-----------
One `safetensors <https://github.com/huggingface/safetensors>`_ file. Its tensors are named
``"0"``, ``"1"``, ...; its string metadata holds one key, ``"holoflow"``: a JSON manifest

    {"format": "holoflow", "version": 1, "root": NODE}

where a NODE is one of

    {"t": "value", "v": <null | bool | int | float | str>}
    {"t": "tensor", "key": "<tensor name>", "codec": "local", "requires_grad": bool, ...codec info}
        (+ "parameter": true for a Parameter; + "view": {...} for a tensor stored as a view of
        another's storage, see :mod:`holoflow.serialization_storage`; files with views are version 2)
    {"t": "list" | "tuple", "items": [NODE, ...]}
    {"t": "dict" | "odict", "items": [[KEY_NODE, NODE], ...]}     (keys: values or tuples)

A tensor object that appears several times is stored once and loads as one object again.
Tensors sharing a storage (views, tied weights) store it once and load sharing it, with their
strides and storage offsets, as ``torch.load`` gives them back.
Saving writes a temporary file ``<target>.holoflow-tmp-<pid>`` next to the target, fsyncs it and
``os.replace``-s it over the target, so a crash mid-save leaves the previous checkpoint intact. A
temp file left by a killed process (its pid is gone) is deleted by the next save of that target.

Global tensors: a tree holding them is saved by every rank together into a *directory* (one
safetensors file per rank plus a manifest) and loads resharded to another layout; see
:mod:`holoflow.checkpoint.sharded` (registered through ``register_sharded``). ``global_dst_rank``
/ ``global_src_rank`` are OneFlow's form: one rank writes / reads whole tensors.

``load`` recognises the format by content: a safetensors file is one whose header parses as JSON
with tensor entries inside the file; a torch zip starts with the zip signature; a legacy
``torch.save`` file is a pickle (first byte 0x80). It also reads a plain safetensors file (a dict
of tensors) and files written by ``torch.save`` (through ``torch.load(weights_only=True)``: no
code runs), converting torch tensors to holoflow tensors. Anything else — a pickle with code in
it, a truncated file, a bad manifest — raises :class:`CheckpointError` naming the file and the
problem.

Extension point: how a tensor is stored is decided by a :class:`TensorCodec` in ``CODECS``
(first match wins). The default ``local`` codec stores the storage as is; the distributed layer
registers a codec for global tensors (``register_codec``) to save/load shards with placement and
SBP in the codec info. Without one, saving a global tensor is an error, never a silent gather.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
from collections import OrderedDict
from typing import Any, Protocol

import safetensors
import safetensors.torch
import torch

from .core.errors import HoloflowError, UnsupportedError
from .core.tensor import Tensor
from . import serialization_module as _whole
from .serialization_storage import StorageTable, identity, owned, retyped, view_of

__all__ = ["save", "load", "CheckpointError", "TensorCodec", "register_codec", "CODECS", "register_sharded"]

FORMAT, VERSION, META_KEY = "holoflow", 2, "holoflow"   # (VERSION: the newest this code reads)
MAX_DEPTH = 200   # nesting a manifest may have (deeper is corrupt or hostile)


class CheckpointError(HoloflowError, ValueError):
    """A file that is not a checkpoint holoflow can load safely."""


class TensorCodec(Protocol):
    """How one kind of tensor is written to and read from a checkpoint."""

    name: str

    def claims(self, t: Tensor) -> bool: ...

    def encode(self, t: Tensor) -> tuple[torch.Tensor, dict]: ...

    def decode(self, data: torch.Tensor, info: dict) -> Tensor: ...


class LocalCodec:
    """A local tensor: its storage, as is."""

    name = "local"

    def claims(self, t: Tensor) -> bool:
        return t.is_local

    def encode(self, t: Tensor) -> tuple[torch.Tensor, dict]:
        return t._data.detach(), {}

    def decode(self, data: torch.Tensor, info: dict) -> Tensor:
        return Tensor._make(data)


CODECS: list = [LocalCodec()]


def register_codec(codec: TensorCodec) -> None:
    """Adds a codec, tried before those already registered (e.g. global tensors)."""
    CODECS.insert(0, codec)


# -- save ------------------------------------------------------------------------------------
class _Encoder:
    def __init__(self) -> None:
        self.table = StorageTable(lambda: str(len(self.tensors)))
        self.tensors: dict[str, torch.Tensor] = self.table.entries   # one entry per storage
        self.seen: dict = {}   # id of a tensor object -> its node
        self.storages: set[int] = set()   # (the sharded encoder's)
        self.keep: list = []   # holds encoded objects alive so ids stay unique
        self.from_torch: dict[int, Tensor] = {}   # a torch tensor saved twice is one object too

    @property
    def version(self) -> int:
        """The format version a reader needs: 2 once a tensor is stored as a view."""
        return 2 if self.table.has_views else 1

    def node(self, obj: Any, where: str) -> dict:
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return {"t": "value", "v": obj}
        if isinstance(obj, torch.Tensor):
            if id(obj) not in self.from_torch:
                self.keep.append(obj)
                self.from_torch[id(obj)] = _from_torch(obj)
            obj = self.from_torch[id(obj)]
        if isinstance(obj, Tensor):
            return self.tensor(obj, where)
        if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
            kind = "list" if isinstance(obj, list) else "tuple"
            return {"t": kind, "items": [self.node(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
        if isinstance(obj, dict):
            kind = "odict" if isinstance(obj, OrderedDict) else "dict"
            return {"t": kind, "items": [[self.key(k, where), self.node(v, f"{where}[{k!r}]")]
                                         for k, v in obj.items()]}
        if _whole.is_module(obj):   # a whole module: see serialization_module.py
            return _whole.encode_module(self.tensor, obj, where)
        raise TypeError(f"holoflow.save: can't save {type(obj).__name__} at {where}; checkpoints hold "
                        f"tensors, dicts, lists, tuples, and None/bool/int/float/str")

    def key(self, k: Any, where: str) -> dict:
        if k is None or isinstance(k, (bool, int, float, str)):
            return {"t": "value", "v": k}
        if isinstance(k, tuple):
            return {"t": "tuple", "items": [self.key(v, where) for v in k]}
        raise TypeError(f"holoflow.save: can't save a dict key of type {type(k).__name__} in {where}")

    def tensor(self, t: Tensor, where: str) -> dict:
        codec = next((c for c in CODECS if c.claims(t)), None)
        if codec is None:
            raise UnsupportedError(f"holoflow.save: no checkpoint codec for the global tensor at {where}; "
                                   f"holoflow.distributed registers one, or save t.to_local()")
        node = self.seen.get(id(t))
        if node is not None:
            return node
        data, info = codec.encode(t)
        name, view = self.table.add(data)
        self.keep.append(t)
        node = self.seen[id(t)] = {"t": "tensor", "key": name, "codec": codec.name,
                                   "requires_grad": t.requires_grad, **info}
        if view is not None:
            node["view"] = view
        if _is_parameter(t):   # (loads as a Parameter again, as torch's)
            node["parameter"] = True
        return node


def _is_parameter(t: Tensor) -> bool:
    from .nn.parameter import Parameter   # (nn imports this module's layer; imported when used)
    return isinstance(t, Parameter)


def _as_parameter(t: Tensor, requires_grad: bool) -> Tensor:
    from .nn.parameter import Parameter
    return Parameter(t, requires_grad=requires_grad)


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
    if global_dst_rank is not None or _has_global(obj):
        if _SHARDED is None:
            raise UnsupportedError("holoflow.save: saving global tensors needs holoflow.checkpoint "
                                   "(import holoflow); or save t.to_local()")
        _SHARDED.save(obj, path, global_dst_rank)
        return
    save_file(obj, path)


def save_file(obj: Any, path: str | os.PathLike) -> None:
    """:func:`save` of a tree of local tensors into one file (or file object)."""
    enc = _Encoder()
    root = enc.node(obj, "obj")
    manifest = {"format": FORMAT, "version": enc.version, "root": root}
    if enc.table.dtypes:
        manifest["dtypes"] = enc.table.dtypes
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


def _has_global(obj: Any) -> bool:
    if isinstance(obj, Tensor):
        return obj._global is not None
    if isinstance(obj, dict):
        return any(_has_global(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_global(v) for v in obj)
    return False


# -- temp files ------------------------------------------------------------------------------
TEMP_TAG = ".holoflow-tmp-"


def temp_path(target: str) -> str:
    """A fresh temp name next to ``target``: ``<target>.holoflow-tmp-<pid>`` (``-<n>`` added
    while that exists, e.g. another thread of this process saving the same target)."""
    base = f"{target}{TEMP_TAG}{os.getpid()}"
    tmp, n = base, 0
    while os.path.lexists(tmp):
        n += 1
        tmp = f"{base}-{n}"
    return tmp


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True   # someone else's live process (or a pid we can't check): keep its file
    return True


def clean_stale_temps(target: str) -> list[str]:
    """Deletes ``<target>.holoflow-tmp-<pid>[-n]`` files/directories whose process is gone (a
    save killed mid-way); returns what it deleted. Temps of live processes are left alone."""
    directory = os.path.dirname(os.path.abspath(target)) or "."
    prefix = os.path.basename(target) + TEMP_TAG
    pattern = re.compile(re.escape(prefix) + r"(\d+)(-\d+)?$")
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = pattern.match(name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        full = os.path.join(directory, name)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
            removed.append(full)
        except FileNotFoundError:
            pass   # another process cleaned it first
    return removed


def _write(tensors: dict, path: str, metadata: dict) -> None:
    safetensors.torch.save_file(tensors, path, metadata=metadata)


def fsync_dir(directory: str) -> None:
    """Makes a rename inside ``directory`` durable (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
    code. ``map_location``: a device (``"cpu"``, ``"cuda:0"``, a holoflow/torch device), a dict
    ``{"cuda:0": "cpu"}`` moving tensors saved on one device to another, or torch's function
    ``(storage, location) -> storage`` (the tensor goes where the returned storage is).
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
    if not weights_only:   # modules saved whole may be rebuilt (their code runs), as torch.load
        with _whole.allowing_code(True):
            return load_file(path, map_location, torch_args)
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
                kind = _sniff(f, os.fstat(f.fileno()).st_size)
        except OSError as e:
            hint = _SHARDED.missing_hint(path) if _SHARDED is not None and not os.path.exists(path) else None
            hint = f"; a save replacing it was interrupted: the previous checkpoint is {hint!r}" if hint else ""
            raise FileNotFoundError(f"holoflow.load({name}): {e.strerror}{hint}") from e
    else:
        import io
        kind = _sniff(io.BytesIO(data), len(data))
    if kind == "empty":
        raise CheckpointError(f"holoflow.load({name}): the file is empty")
    if kind in ("zip", "pickle"):
        return _load_torch(path if data is None else data, name, map_location, torch_args or {})
    if kind != "safetensors":
        raise CheckpointError(f"holoflow.load({name}): not a valid checkpoint (safetensors, torch.save "
                              f"zip or pickle): {kind}")
    return _load_safetensors(path, data, name, map_location)


_MAX_HEADER = 100 * 1024 * 1024   # safetensors' own limit on the JSON header


def _sniff(f, size: int) -> str:
    """The format of an open file by content: 'safetensors', 'zip', 'pickle', 'empty' or a
    sentence saying why it is none of them. A safetensors file is recognised only if its
    header is JSON whose entries lie inside the file; only then is anything else ruled out."""
    head = f.read(8)
    if not head:
        return "empty"
    st_error = None
    if len(head) == 8:
        (n,) = struct.unpack("<Q", head)
        if 2 <= n <= min(_MAX_HEADER, size - 8):
            is_json, st_error = _check_st_header(f.read(n), size - 8 - n)
            if st_error is None:
                return "safetensors"
            if is_json:   # a JSON header: a (damaged) safetensors file, whatever its first byte
                return st_error
        else:
            st_error = f"the first 8 bytes give a header length of {n} for a file of {size} bytes"
    else:
        st_error = f"only {size} bytes"
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    if head[:1] == b"\x80":
        return "pickle"
    return st_error


def _check_st_header(raw: bytes, body: int) -> tuple[bool, str | None]:
    """(is it a JSON object, None or what is wrong): is ``raw`` a safetensors header whose
    tensors lie in a body of ``body`` bytes?"""
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False, "the safetensors header is not JSON"
    if not isinstance(header, dict):
        return False, "the safetensors header is not a JSON object"
    for k, v in header.items():
        if k == "__metadata__":
            continue
        offs = v.get("data_offsets") if isinstance(v, dict) else None
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                and 0 <= offs[0] <= offs[1]):
            return True, f"safetensors tensor {k!r} has no valid data_offsets"
        if offs[1] > body:
            return True, (f"truncated safetensors file: tensor {k!r} ends at byte {offs[1]} of the data, "
                          f"but the file holds only {body} data bytes")
    return True, None


def _move(t: torch.Tensor, map_location) -> torch.Tensor:
    if map_location is None:
        return t
    if isinstance(map_location, dict):
        target = map_location.get(str(t.device))
        return t if target is None else t.to(str(target))
    if callable(map_location):   # torch's (storage, location) -> storage
        return t.to(map_location(t.untyped_storage(), str(t.device)).device)
    return t.to(str(map_location))


def _load_safetensors(path, data: bytes | None, name: str, map_location) -> Any:
    try:
        if data is None:
            with safetensors.safe_open(os.fspath(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        else:
            meta = _header(data).get("__metadata__") or {}
            tensors = safetensors.torch.load(data)
    except (safetensors.SafetensorError, ValueError, OSError, struct.error) as e:
        raise CheckpointError(f"holoflow.load({name}): not a valid checkpoint (safetensors, torch.save "
                              f"zip or pickle): {e}") from e
    tensors = {k: owned(_move(v, map_location)) for k, v in tensors.items()}
    if META_KEY not in meta:
        return {k: Tensor._make(v) for k, v in tensors.items()}   # a plain safetensors file
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
    dec = _Decoder(tensors, name)
    if "dtypes" in manifest:
        retyped(tensors, manifest["dtypes"], dec.bad)
    return dec.node(manifest["root"])


def _header(data: bytes) -> dict:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n])


CONTAINERS = ("list", "tuple", "dict", "odict")


def decode_container(dec: Any, kind: str, items: list, depth: int) -> Any:
    """A list, tuple or (ordered) dict node of a manifest tree; ``dec.node`` decodes the items and
    ``dec.bad`` makes the error for a malformed one (shared by plain and sharded checkpoints)."""
    if kind in ("list", "tuple"):
        out = [dec.node(v, depth + 1) for v in items]
        return out if kind == "list" else tuple(out)
    d = OrderedDict() if kind == "odict" else {}
    for pair in items:
        if not isinstance(pair, list) or len(pair) != 2:
            raise dec.bad("a dict item is not a [key, value] pair")
        k = dec.node(pair[0], depth + 1)
        try:
            hash(k)
        except TypeError:
            raise dec.bad(f"a dict key holds a list: {str(k)[:60]} (keys are values or tuples)") from None
        d[k] = dec.node(pair[1], depth + 1)
    return d


class _Decoder:
    def __init__(self, tensors: dict[str, torch.Tensor], name: str) -> None:
        self.tensors, self.name, self.made = tensors, name, {}

    def bad(self, what: str) -> CheckpointError:
        return CheckpointError(f"holoflow.load({self.name}): corrupt manifest: {what}")

    def node(self, n: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise self.bad(f"nested more than {MAX_DEPTH} levels")
        kind = n.get("t") if isinstance(n, dict) else None
        if kind == "value":
            v = n.get("v")
            if v is not None and not isinstance(v, (bool, int, float, str)):
                raise self.bad(f"a value node holds {type(v).__name__}")
            return v
        if kind == "tensor":
            return self.tensor(n)
        if kind in CONTAINERS and isinstance(n.get("items"), list):
            return decode_container(self, kind, n["items"], depth)
        if kind == "module":
            return _whole.decode_module(self.tensor, n, self.name)
        raise self.bad(f"unknown node {str(n)[:80]}")

    def tensor(self, n: dict) -> Tensor:
        key = n.get("key")
        if not isinstance(key, str):
            raise self.bad(f"a tensor node's key is {key!r}, not a string")
        ident = identity(n)
        if ident in self.made:
            return self.made[ident]
        if key not in self.tensors:
            raise self.bad(f"tensor {key!r} is referenced but not stored in the file")
        codec = next((c for c in CODECS if c.name == n.get("codec")), None)
        if codec is None:
            raise self.bad(f"unknown tensor codec {n.get('codec')!r} (saved by a layer not loaded here?)")
        info = {k: v for k, v in n.items() if k not in ("t", "key", "codec", "requires_grad", "parameter", "view")}
        data = self.tensors[key] if "view" not in n else view_of(self.tensors[key], n["view"], self.bad)
        t = codec.decode(data, info)
        if n.get("requires_grad"):
            if not (t.is_floating_point() or t.is_complex()):
                raise self.bad(f"tensor {key!r} of dtype {t.dtype} is marked requires_grad (only floating "
                               f"point and complex tensors can be)")
            t.requires_grad_(True)
        if n.get("parameter"):
            t = _as_parameter(t, bool(n.get("requires_grad")))
        self.made[ident] = t
        return t


def _load_torch(src, name: str, map_location, torch_args: dict) -> Any:
    import io
    if isinstance(map_location, dict):
        map_location = {str(k): str(v) for k, v in map_location.items()}
    elif map_location is not None and not callable(map_location):
        map_location = str(map_location)
    if isinstance(src, bytes):
        src, torch_args = io.BytesIO(src), {k: v for k, v in torch_args.items() if k != "mmap"}  # (files only)
    try:
        obj = torch.load(src, map_location=map_location, weights_only=True, **torch_args)
    except Exception as e:  # UnpicklingError for code, RuntimeError/EOFError for truncation
        reason = str(e).split("\n")[0]
        raise CheckpointError(f"holoflow.load({name}): refused: a torch.save/pickle file that "
                              f"torch.load(weights_only=True) can't load safely ({type(e).__name__}: "
                              f"{reason})") from e
    return _from_torch(obj)


def _from_torch(obj: Any, memo: dict | None = None) -> Any:
    """torch tensors in ``obj`` as holoflow tensors (sharing their storages; one torch tensor
    object met twice is one holoflow tensor, as torch.load's tied tensors are one object)."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = _tensor_from_torch(obj)
        return memo[id(obj)]
    if isinstance(obj, dict):
        kind = OrderedDict if isinstance(obj, OrderedDict) else dict
        return kind((k, _from_torch(v, memo)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_from_torch(v, memo) for v in obj)
    return obj


def _tensor_from_torch(obj: torch.Tensor) -> Tensor:
    if isinstance(obj, torch.nn.Parameter):
        return _as_parameter(Tensor._make(obj.detach()), obj.requires_grad)
    t = Tensor._make(obj.detach())
    if obj.requires_grad:
        t.requires_grad_(True)
    return t
