"""Tensors sharing a storage in a holoflow checkpoint: stored once, loaded sharing again.

``torch.save`` stores each storage once and each tensor as (storage, offset, shape, stride), so
``torch.load`` gives views back their sharing (a write through one loaded tensor shows in the
others), their strides and storage offsets, and the whole storage even of a small slice. A
holoflow file does the same inside safetensors, which holds only dense tensors:

- a storage is one entry of the file's tensor table: the first tensor saved from it, as is,
  when that tensor covers it exactly (a fresh layout, offset 0, every byte; the common case, written
  as format version 1 wrote every tensor), else the storage's bytes as a flat tensor of the
  tensors' dtype;
- a tensor that is not its storage's entry as is carries a ``"view"`` in its manifest node,
  ``{"id": n, "offset": elements, "shape": [...], "stride": [...]}`` over the entry's storage;
  ``id`` (1, 2, ...) tells apart the tensor objects of one storage, the entry itself being 0.

Dtypes safetensors lacks but torch.save keeps (complex128 and complex32 as their real pairs;
float8_e8m0fnu, float4_e2m1fn_x2 and the bits types as bytes or uint16) are stored flat as a dtype
it has, the manifest's ``"dtypes"`` naming each such entry's dtype (so their tensors are all
views). A shard of a sharded checkpoint (an n-d box, read by slices) keeps its dims instead, one
trailing dim added for the parts of an element (:func:`storable`, :func:`from_storable`).

Where a storage lives is recorded as ``torch.save`` records it, by its location tag (``"cuda:0"``;
the manifest's ``"locations"`` names each entry not on the CPU), and loading restores it there as
``torch.load`` does (:func:`restore`): to that device, or where ``map_location`` sends it, and on
a machine without that device torch's RuntimeError saying to pass ``map_location``. A file
without ``"locations"`` (every file older code wrote) is all CPU.

A file holding a view is format version 2 (a version 1 reader would load the entry in the
view's place); a version 1 file has none and loads as before. As ``torch.save``, tensors of two
dtypes over one storage are refused (RuntimeError), and the storage's bytes past its last whole
element (unreachable by its tensors) are not kept.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["StorageTable", "identity", "owned", "view_of", "retyped", "STORED_AS", "storable", "stored_shape",
           "from_storable", "restore", "checked_locations"]

# dtypes safetensors can't hold -> the dtype their elements' bytes are stored as (torch.save keeps
# them all; a torch lacking one of the newer names simply has no such tensors to save)
STORED_AS = {torch.complex128: torch.float64, torch.complex32: torch.float16,
             **{dt: torch.uint8 for dt in (getattr(torch, n, None) for n in (
                 "float8_e8m0fnu", "float4_e2m1fn_x2", "bits8", "bits1x8", "bits2x4", "bits4x2")) if dt is not None},
             **({torch.bits16: torch.uint16} if hasattr(torch, "bits16") else {})}


def _parts(dtype: torch.dtype) -> int:
    """How many stored elements one element of ``dtype`` is (2 for a complex128's float64 pair)."""
    return dtype.itemsize // STORED_AS[dtype].itemsize


def storable(data: torch.Tensor) -> torch.Tensor:
    """``data`` as a tensor safetensors can hold, keeping its dims: itself, or (a dtype in
    ``STORED_AS``) its bytes as that dtype with a trailing dim for the parts of an element."""
    real = STORED_AS.get(data.dtype)
    if real is None:
        return data
    data = data.resolve_conj().resolve_neg().contiguous()
    return data.unsqueeze(-1).view(real) if _parts(data.dtype) > 1 else data.view(real)


def stored_shape(shape: list, dtype: torch.dtype) -> list:
    """The shape :func:`storable` gives a tensor of ``shape`` and ``dtype``."""
    return list(shape) + [_parts(dtype)] if dtype in STORED_AS and _parts(dtype) > 1 else list(shape)


def from_storable(part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`storable`: a slice of a stored shard back as ``dtype``."""
    if dtype not in STORED_AS or part.dtype == dtype:
        return part.to(dtype)
    part = _aligned(part.contiguous(), dtype).view(dtype)
    return part.squeeze(-1) if _parts(dtype) > 1 else part


def _aligned(data: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``data`` at an address that ``dtype``'s elements may start at (a safetensors entry read from
    a file is aligned for its stored dtype only: a complex128 read there at a mere 8-byte boundary
    makes torch's vectorized kernels fault), copied when it is not."""
    return data if data.data_ptr() % dtype.itemsize == 0 else data.clone()


class _Group:
    """One storage seen while saving: its table entry and how many views named it so far."""

    __slots__ = ("name", "nbytes", "dtype", "views")

    def __init__(self, name: str, nbytes: int, dtype: torch.dtype) -> None:
        self.name, self.nbytes, self.dtype, self.views = name, nbytes, dtype, 0


def _dense_strides(shape: torch.Size) -> tuple:
    """The strides of a fresh tensor of ``shape`` (what safetensors' entries load with)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _covers(data: torch.Tensor, nbytes: int) -> bool:
    """Whether ``data`` is its whole storage, laid out as a fresh tensor (is_contiguous() is not
    enough: it overlooks the strides of size-1 and empty dims, which torch.load keeps)."""
    return (data.storage_offset() == 0 and data.numel() * data.element_size() == nbytes
            and data.stride() == _dense_strides(data.shape))


def _flat(data: torch.Tensor) -> torch.Tensor:
    """The whole storage of ``data`` as a 1-d tensor of its dtype."""
    storage = data.untyped_storage()
    n = storage.nbytes() // data.element_size()
    return torch.empty(0, dtype=data.dtype, device=data.device).set_(storage, 0, (n,), (1,))


class StorageTable:
    """The save side: maps each tensor's data to (table entry, view or None); ``entries`` are
    the dense CPU tensors to write, ``has_views`` whether any tensor needed a view."""

    def __init__(self, new_name: Callable[[], str]) -> None:
        self.new_name = new_name
        self.entries: dict[str, torch.Tensor] = {}
        self.groups: dict[tuple, _Group] = {}
        self.entry_ptrs: set[int] = set()
        self.dtypes: dict[str, str] = {}   # entries stored as another dtype: their own
        self.locations: dict[str, str] = {}   # entries saved from another device than the CPU: its tag
        self.has_views = False

    def add(self, data: torch.Tensor) -> tuple[str, dict | None]:
        """The entry name and view node of one tensor object's data (each object added once)."""
        data = data.detach()
        if data.is_conj() or data.is_neg():   # lazy bits safetensors can't hold: a resolved copy
            data = data.resolve_conj().resolve_neg()
        nbytes = data.untyped_storage().nbytes()
        key = (str(data.device), data.untyped_storage().data_ptr()) if nbytes else None
        g = self.groups.get(key) if key is not None else None
        if g is not None and g.dtype != data.dtype:
            raise RuntimeError(f"holoflow.save: cannot save multiple tensors that view the same data as "
                               f"different types ({g.dtype} and {data.dtype}), as torch.save; save a "
                               f".clone() of one of them")
        if g is None or g.nbytes < nbytes:   # (a second storage object at the same address, larger)
            return self._new_group(data, key, nbytes)
        return g.name, self._view(g, data)

    def _new_group(self, data: torch.Tensor, key: tuple | None, nbytes: int) -> tuple[str, dict | None]:
        g = _Group(self.new_name(), nbytes, data.dtype)
        if key is not None:
            self.groups[key] = g
        location = torch.serialization.location_tag(data.untyped_storage())   # (torch.save's record)
        if location != "cpu":
            self.locations[g.name] = location
        real = STORED_AS.get(data.dtype)
        whole = _covers(data, nbytes) and real is None
        entry = (data if whole else _flat(data)).cpu()
        if real is not None:
            entry = entry.view(real)
            self.dtypes[g.name] = str(data.dtype).removeprefix("torch.")
        ptr = entry.untyped_storage().data_ptr() if entry.numel() else None
        if ptr in self.entry_ptrs:
            entry = entry.clone()   # safetensors refuses two entries over one buffer
        elif ptr is not None:
            self.entry_ptrs.add(ptr)
        self.entries[g.name] = entry
        return g.name, None if whole else self._view(g, data)

    def _view(self, g: _Group, data: torch.Tensor) -> dict:
        g.views += 1
        self.has_views = True
        return {"id": g.views, "offset": data.storage_offset(), "shape": list(data.shape),
                "stride": list(data.stride())}


def identity(node: dict) -> tuple:
    """Which loaded tensor object a tensor node stands for: nodes of one object are equal here."""
    if "view" not in node:
        return node.get("key"), 0
    view = node["view"]
    vid = view.get("id") if isinstance(view, dict) else None
    ok = isinstance(vid, int) and not isinstance(vid, bool) and vid >= 1
    return node.get("key"), vid if ok else -1   # (-1: malformed, refused by view_of, never cached)


def _ints(v: Any, n: int | None = None) -> bool:
    return (isinstance(v, list) and (n is None or len(v) == n)
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v))


def retyped(tensors: dict[str, torch.Tensor], dtypes: Any, bad: Callable[[str], Exception]) -> None:
    """Gives the entries a manifest's ``"dtypes"`` names their own dtype back (in place)."""
    if not isinstance(dtypes, dict):
        raise bad(f"\"dtypes\" is {str(dtypes)[:60]}, not a map of entry names to dtypes")
    for name, text in dtypes.items():
        dt = next((d for d in STORED_AS if str(d) == f"torch.{text}"), None)
        entry = tensors.get(name)
        if dt is None or entry is None or entry.dim() != 1 or entry.dtype != STORED_AS[dt] \
                or entry.numel() % _parts(dt):
            raise bad(f"entry {name!r} can't be read as {str(text)[:40]} (stored as a flat tensor of the "
                      f"real pairs of complex128 or complex32, or of the bytes of a dtype safetensors lacks)")
        tensors[name] = _aligned(entry, dt).view(dt)


def owned(entry: torch.Tensor) -> torch.Tensor:
    """``entry`` as the whole of its own storage (what views' offsets count from)."""
    if entry.storage_offset() == 0 and entry.untyped_storage().nbytes() == entry.numel() * entry.element_size() \
            and entry.is_contiguous():
        return entry
    return entry.contiguous().clone()


def view_of(entry: torch.Tensor, view: Any, bad: Callable[[str], Exception]) -> torch.Tensor:
    """The tensor a ``"view"`` node describes over the storage of ``entry`` (an :func:`owned`
    table entry), sharing it; ``bad`` makes the error for a malformed or out-of-bounds view."""
    if not isinstance(view, dict) or not _ints([view.get("id"), view.get("offset")]) or view["id"] < 1:
        raise bad(f"a tensor view is not {{id >= 1, offset, shape, stride}} of non-negative ints: "
                  f"{str(view)[:80]}")
    shape, stride, offset = view.get("shape"), view.get("stride"), view["offset"]
    if not (_ints(shape) and _ints(stride, len(shape))):
        raise bad(f"a tensor view's shape {shape!r} and stride {stride!r} are not lists of non-negative "
                  f"ints of one length")
    storage = entry.untyped_storage()
    size = storage.nbytes() // entry.element_size()
    span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    if offset + span > size:
        raise bad(f"a tensor view (offset {offset}, shape {shape}, stride {stride}) reaches element "
                  f"{offset + span} of a storage of {size}")
    try:
        return torch.empty(0, dtype=entry.dtype, device=entry.device).set_(storage, offset, shape, stride)
    except (RuntimeError, OverflowError, TypeError) as e:   # (sizes past int64)
        raise bad(f"a tensor view (offset {offset}, shape {shape}, stride {stride}) is not a valid "
                  f"layout: {str(e).splitlines()[0]}") from e


# -- where storages go on load ------------------------------------------------------------------
def checked_locations(locations: Any, bad: Callable[[str], Exception]) -> dict[str, str]:
    """A manifest's ``"locations"`` (entry name -> location tag), or ``bad``'s error."""
    if locations is None:
        return {}
    if not (isinstance(locations, dict) and all(isinstance(v, str) for v in locations.values())):
        raise bad(f"\"locations\" is {str(locations)[:60]}, not a map of entry names to device names")
    return locations


def restore(entry: torch.Tensor, location: str, map_location: Any) -> torch.Tensor:
    """``entry`` (the whole of a storage read on the CPU) where ``torch.load`` puts a storage saved
    at ``location`` (``"cpu"``, ``"cuda:0"``, ...) given ``map_location``: a device, a dict of
    locations, or ``(storage, location) -> storage | None``; the same tensor when it stays."""
    storage = entry.untyped_storage()
    if map_location is None:
        moved = _restore_location(storage, location)
    elif isinstance(map_location, dict):
        target = {str(k): v for k, v in map_location.items()}.get(location, location)
        moved = _restore_location(storage, str(target))
    elif callable(map_location):
        moved = map_location(storage, location)
        moved = _restore_location(storage, location) if moved is None else moved
    else:
        moved = _restore_location(storage, str(map_location))
    if isinstance(moved, torch.TypedStorage):
        moved = moved.untyped()
    if moved is storage:
        return entry
    return torch.empty(0, dtype=entry.dtype, device=moved.device).set_(moved, entry.storage_offset(), entry.shape,
                                                                       entry.stride())


def _restore_location(storage: torch.UntypedStorage, location: str) -> torch.UntypedStorage:
    """torch.load's own restore (its device checks and errors), naming holoflow.load."""
    try:
        return torch.serialization.default_restore_location(storage, location)
    except RuntimeError as e:
        raise RuntimeError(f"holoflow.load: {e}".replace("use torch.load with", "use holoflow.load with")) from None
