"""The manifest of a holoflow checkpoint: a tree of values and tensors as JSON nodes, its tensors
in a table of storages, and back (see :mod:`holoflow.serialization` for the file format).

A NODE is one of

    {"t": "value", "v": <null | bool | int | float | str>}
    {"t": "tensor", "key": "<tensor name>", "codec": "local", "requires_grad": bool, ...codec info}
        (+ "parameter": true for a Parameter; + "view": {...} for a tensor stored as a view of
        another's storage, see :mod:`holoflow.serialization_storage`)
    {"t": "list" | "tuple", "items": [NODE, ...]}
    {"t": "dict" | "odict", "items": [[KEY_NODE, NODE], ...]}     (keys: values or tuples)
    {"t": "module", ...}                                            (see serialization_module.py)

A tensor object that appears several times is one node, and loads as one object again.

Extension point: how a tensor is stored is decided by a :class:`TensorCodec` in ``CODECS``
(first match wins). The default ``local`` codec stores the storage as is; the distributed layer
may register a codec for global tensors (``register_codec``). Without one, saving a global
tensor through the file encoder is an error, never a silent gather.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

import torch

from .core.errors import HoloflowError, UnsupportedError
from .core.tensor import Tensor
from . import serialization_module as _whole
from .serialization_storage import StorageTable, identity, view_of

__all__ = ["FORMAT", "VERSION", "META_KEY", "CheckpointError", "TensorCodec", "LocalCodec", "CODECS",
           "register_codec", "Encoder", "Decoder", "CONTAINERS", "decode_container", "from_torch", "has_global",
           "is_parameter", "as_parameter"]

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
class Encoder:
    """A tree as manifest nodes (:meth:`node`); ``tensors`` is the table of storages to write."""

    def __init__(self) -> None:
        self.table = StorageTable(lambda: str(len(self.tensors)))
        self.tensors: dict[str, torch.Tensor] = self.table.entries   # one entry per storage
        self.seen: dict = {}   # id of a tensor object -> its node
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
                self.from_torch[id(obj)] = from_torch(obj)
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
        if is_parameter(t):   # (loads as a Parameter again, as torch's)
            node["parameter"] = True
        return node


def is_parameter(t: Tensor) -> bool:
    from .nn.parameter import Parameter   # (nn imports this module's layer; imported when used)
    return isinstance(t, Parameter)


def as_parameter(t: Tensor, requires_grad: bool) -> Tensor:
    from .nn.parameter import Parameter
    return Parameter(t, requires_grad=requires_grad)


def has_global(obj: Any) -> bool:
    """Whether a tree (dicts, lists, tuples, modules) holds a global tensor."""
    if isinstance(obj, Tensor):
        return obj._global is not None
    if _whole.is_module(obj):   # (refused by the encoders, on every rank: see serialization_module.py)
        return _whole.holds_global(obj)
    if isinstance(obj, dict):
        return any(has_global(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(has_global(v) for v in obj)
    return False


# -- load ------------------------------------------------------------------------------------
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


class Decoder:
    """Manifest nodes back into a tree, over the file's table of storages ``tensors``. A reader
    of another layout of tensors (the sharded directory's, ``checkpoint/reshard.py``) subclasses it,
    overriding :meth:`tensor` (and :meth:`module`), and keeps the walk, its checks and errors."""

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
            return self.module(n)
        raise self.bad(f"unknown node {str(n)[:80]}")

    def module(self, n: dict) -> Any:
        """A module saved whole (see serialization_module.py)."""
        return _whole.decode_module(self.tensor, n, self.name)

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
            t = as_parameter(t, bool(n.get("requires_grad")))
        self.made[ident] = t
        return t


# -- torch tensors ---------------------------------------------------------------------------
def from_torch(obj: Any, memo: dict | None = None) -> Any:
    """torch tensors in ``obj`` as holoflow tensors (sharing their storages; one torch tensor
    object met twice is one holoflow tensor, as torch.load's tied tensors are one object)."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = _tensor_from_torch(obj)
        return memo[id(obj)]
    if isinstance(obj, dict):
        kind = OrderedDict if isinstance(obj, OrderedDict) else dict
        return kind((k, from_torch(v, memo)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(from_torch(v, memo) for v in obj)
    return obj


def _tensor_from_torch(obj: torch.Tensor) -> Tensor:
    if isinstance(obj, torch.nn.Parameter):
        return as_parameter(Tensor._make(obj.detach()), obj.requires_grad)
    t = Tensor._make(obj.detach())
    if obj.requires_grad:
        t.requires_grad_(True)
    return t
