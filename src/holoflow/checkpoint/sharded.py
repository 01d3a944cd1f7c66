"""Checkpoints of global tensors: a directory written by every rank at once, resharded on load.

Layout of ``flow.save(tree_with_global_tensors, "ckpt")``::

    ckpt/manifest.json              the tree (as holoflow's file manifest) + per tensor: dtype,
                                    logical shape, placement, SBP and its shards
    ckpt/rank-00003.safetensors     the shards rank 3 owns, each named by its tensor key

A shard is a box of the logical tensor (an offset and a size per dim). Each distinct box is
written once, by the first rank holding it (broadcast copies are not repeated); a partial-sum
tensor is reduced (P -> B) before saving. A dtype safetensors lacks (complex128, ...) is stored
as its parts, one trailing dim added (``serialization_storage.storable``).

Global tensors sharing a local storage (a global tensor and a global view of it, tied tensors) keep
it: the manifest's ``"shared"`` lists, per rank, each storage's tensors with their parts' offset,
shape and stride there, and a load in the saved layout writes their parts into one storage again
(:mod:`holoflow.checkpoint.reshard`); older code ignores it and loads them apart, as it saved them.
Rank 0's list also names its local tensors over such a storage (``g.to_local()`` beside ``g``; a
local tensor's key there is its node's identity, ``key`` or ``key#view id``), so on rank 0 they
load as views of ``g``'s part again. One storage seen as two dtypes is refused on every rank
(torch.save's RuntimeError), as is a module saved whole (a TypeError: save its ``state_dict()``;
see :mod:`holoflow.serialization_module`).

Local tensors in the tree are rank 0's, kept as ``torch.save`` keeps them: one entry of rank 0's
file per storage, named by the first tensor saved from it, and every other tensor on that storage
a ``"view"`` of it (offset, shape, stride), as in a plain checkpoint
(:mod:`holoflow.serialization_storage`), so views and tied tensors load sharing their storage,
with their strides and offsets. A directory holding such a view or a dtype stored as its parts is
format version 2; one without them is version 1, as older holoflow wrote and reads. Parameters
load as Parameters, as ``torch.load`` gives them.

Atomic as a whole: the ranks write into ``ckpt.holoflow-tmp-<pid of rank 0>``, report to each
other (a collective with the communication timeout), and rank 0 writes the manifest last and
renames the directory into place. A directory without ``manifest.json`` is never loaded.

Load: each tensor gets a target layout — from ``like`` (a tree of global tensors, a module, an
optimizer), else the saved one if the world still has its ranks, else (a world of one process)
a local tensor. Each rank reads, with ``safe_open(...).get_slice``, only the byte ranges of the
shards overlapping its own box: nothing is gathered, no collective runs.
"""
from __future__ import annotations

import json
import os
import shutil
from collections import OrderedDict
from typing import Any

import safetensors
import safetensors.torch
import torch

from ..core.grad_mode import no_grad
from ..core.sbp import B, P, SBP, short, split
from ..core.tensor import Tensor
from ..distributed import env, world
from ..distributed.sharding import local_ranges
from ..distributed.placement import placement
from ..serialization import save_file
from ..serialization_files import clean_stale_temps, fsync_dir, temp_path
from ..serialization_module import is_module, refuse_global, refuse_in_sharded
from ..serialization_storage import STORED_AS, storable
from ..serialization_tree import CheckpointError, Encoder, as_parameter, is_parameter

FORMAT, VERSION, MANIFEST = "holoflow-sharded", 2, "manifest.json"   # (VERSION: the newest read)
OLD_TAG = ".holoflow-old-"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.safetensors"


def _ctx() -> tuple[int, int]:
    """(this rank, world size) — real processes or ``world.simulate`` threads."""
    n = getattr(world.comm(), "world_size", None) if env.get_world_size() == 1 else None
    return world.rank(), n or env.get_world_size()


def _gather(obj: Any, n: int) -> list:
    """Every rank's ``obj`` (a collective with the communication timeout; also the barrier)."""
    if n == 1:
        return [obj]
    return world.comm().all_gather_shapes(obj, tuple(range(n)))


def _raise_failed(errs: list, what: str) -> None:
    bad = [(r, e) for r, e in enumerate(errs) if e]
    if bad:
        raise CheckpointError(f"holoflow.save({what}): " + "; ".join(f"rank {r}: {e}" for r, e in bad))


def _sbp_from(text: Any, where: str) -> SBP:
    if text == "B":
        return B
    if text == "P":
        return P
    if isinstance(text, str) and text.startswith("S(") and text.endswith(")") and text[2:-1].isdigit():
        return split(int(text[2:-1]))
    raise CheckpointError(f"holoflow.load({where}): corrupt manifest: bad SBP {text!r}")


def _dtype_from(text: Any, where: str) -> torch.dtype:
    dt = getattr(torch, text, None) if isinstance(text, str) else None
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"holoflow.load({where}): corrupt manifest: bad dtype {text!r}")
    return dt


# -- save ------------------------------------------------------------------------------------
def _two_dtypes(first: torch.dtype, then: torch.dtype, where: str) -> RuntimeError:
    """torch.save's refusal of one storage seen as two dtypes (a global tensor and g.view(int32))."""
    return RuntimeError(f"holoflow.save: cannot save multiple tensors that view the same data as different types "
                        f"({first} and {then}, at {where}), as torch.save; save a .clone() of one of them")


class _ShardEncoder(Encoder):
    """Walks the tree like the file encoder; a global tensor becomes a node listing its shards,
    and this rank keeps the shards it owns in ``self.tensors``. Local tensors (rank 0's) go to
    rank 0's file as in a plain checkpoint: one entry per storage, the others views of it."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank, self.next_key, self.stored_as = rank, "0", False
        self.failed: Exception | None = None
        self.parts: dict[tuple, list] = {}   # a local storage -> this rank's tensors' parts on it
        self.dtypes: dict[tuple, torch.dtype] = {}   # a local storage -> the dtype its first tensor saw it as
        self.local_keys: set[str] = set()   # parts of local tensors (rank 0's)
        self.table.new_name = lambda: self.next_key   # a storage's entry: its first tensor's key

    @property
    def version(self) -> int:
        """2 once a local tensor is a view or a shard is stored as another dtype (older code
        would misread those), else 1."""
        return 2 if self.table.has_views or self.stored_as else 1

    def _store(self, name: str, data: torch.Tensor) -> None:
        data = data.detach().cpu()
        if data.dtype in STORED_AS:
            data, self.stored_as = storable(data), True
        data = data.resolve_conj().resolve_neg()
        ptr = data.untyped_storage().data_ptr() if data.numel() else None
        if ptr in self.table.entry_ptrs or not data.is_contiguous():
            data = data.contiguous().clone()   # safetensors refuses tensors sharing memory
            ptr = data.untyped_storage().data_ptr() if data.numel() else None
        if ptr is not None:
            self.table.entry_ptrs.add(ptr)
        self.tensors[name] = data

    def node(self, obj: Any, where: str) -> dict:
        if is_module(obj):   # (refused on every rank, before any collective)
            refuse_in_sharded(obj, where)
        return super().node(obj, where)

    def tensor(self, t: Tensor, where: str) -> dict:
        node = self.seen.get(id(t))
        if node is not None:
            return node
        name = self.next_key = str(len(self.seen))   # (every rank numbers the tensors alike)
        self.keep.append(t)
        node = {"t": "tensor", "key": name, "codec": "sharded", "requires_grad": t.requires_grad,
                "dtype": str(t._data.dtype).replace("torch.", "")}
        g = t._global
        if g is None:
            shape = list(t._data.shape)
            node.update(shape=shape, placement=None, sbp=None,
                        shards=[{"file": rank_file(0), "offset": [0] * len(shape), "size": shape}])
            if self.rank == 0:
                try:
                    node["key"], view = self.table.add(t._data)
                except RuntimeError as e:   # (two dtypes over one storage) raised on every rank, after
                    self.failed = self.failed or e   # the walk: the others are in its collectives
                    view = None
                if view is not None:
                    node["view"] = view
                part = node["key"] if view is None else f"{node['key']}#{view['id']}"   # (its identity)
                self.local_keys.add(part)
                self._note_part(part, t._data, where)
        else:
            node.update(self._global(t, name, g, where))
        if is_parameter(t):   # (loads as a Parameter again, as torch.load's)
            node["parameter"] = True
        self.seen[id(t)] = node
        return node

    def _note_part(self, name: str, data: torch.Tensor, where: str) -> None:
        """Where this rank's part of a global tensor (or rank 0's local tensor) lies in its local
        storage (see :meth:`shared`). Two dtypes over one storage are refused, as ``torch.save``."""
        if data.numel() == 0 or data.is_conj() or data.is_neg():   # (lazy bits: not the storage's values)
            return
        key = (str(data.device), data.untyped_storage().data_ptr())
        seen = self.dtypes.setdefault(key, data.dtype)
        if seen != data.dtype:
            self.failed = self.failed or _two_dtypes(seen, data.dtype, where)
            return
        self.parts.setdefault(key, []).append([name, data.storage_offset(), list(data.shape), list(data.stride())])

    def shared(self) -> list:
        """This rank's tensors that share a local storage (global views, tied tensors, rank 0's local
        tensors over its part of a global one), one list per storage holding a global tensor's part,
        of ``[key, offset, shape, stride]`` of each part: the manifest's ``"shared"``. A local
        tensor's key is its node's identity: ``key`` or ``key#view id``."""
        return [group for group in self.parts.values()
                if len(group) > 1 and any(part[0] not in self.local_keys for part in group)]

    def _global(self, t: Tensor, name: str, g, where: str) -> dict:
        place, shape = g.placement, list(g.shape)
        nd = tuple(B if s == P else s for s in g.sbp)   # partial sums are reduced before saving
        owners: dict = {}
        for rk in place.flat_ranks:
            box = tuple(local_ranges(shape, nd, place, place.coords(rk)))
            if box not in owners and all(n > 0 for _, n in box):
                owners[box] = rk
        coords = place.coords(self.rank)
        if coords is not None:
            self._note_part(name, t._data, where)
        if coords is not None and owners.get(tuple(local_ranges(shape, nd, place, coords))) == self.rank:
            x = t.detach()
            if nd != tuple(g.sbp):
                with no_grad():
                    x = x.to_global(sbp=nd)
            self._store(name, x._data)
        elif coords is not None and nd != tuple(g.sbp):
            with no_grad():
                t.detach().to_global(sbp=nd)   # every rank of the placement joins the reduction
        return {"shape": shape, "placement": {"type": place.type, "ranks": place.ranks.tolist()},
                "sbp": [short(s) for s in g.sbp],
                "shards": [{"file": rank_file(rk), "offset": [a for a, _ in box], "size": [n for _, n in box]}
                           for box, rk in owners.items()]}


def save_sharded(obj: Any, path: str | os.PathLike) -> None:
    """Every rank calls it: writes ``path`` (a directory) atomically; see the module doc."""
    path = os.path.abspath(os.fspath(path))
    r, n = _ctx()
    enc = _ShardEncoder(r)
    root = enc.node(obj, "obj")
    tmp = err = None
    if r == 0 and enc.failed is None:
        try:
            if os.path.isfile(path):
                raise CheckpointError(f"{path!r} is a file; a checkpoint of global tensors is a directory")
            clean_stale_temps(path)
            tmp = temp_path(path)
            os.makedirs(tmp)
        except Exception as e:  # noqa: BLE001 - reported on every rank
            err = f"{type(e).__name__}: {e}"
    failed = None if enc.failed is None else str(enc.failed)
    started = _gather((tmp, err, enc.shared(), failed), n)
    tmp, err0, _, _ = started[0]
    shared = {str(rk): groups for rk, (_, _, groups, _) in enumerate(started) if groups}
    if r == 0 and tmp is not None and any(f for *_, f in started):
        shutil.rmtree(tmp, ignore_errors=True)
    _raise_refused(enc.failed, [f for *_, f in started], repr(path))
    if err0:
        raise CheckpointError(f"holoflow.save({path!r}): rank 0 could not start: {err0}")
    err = None
    try:
        if enc.tensors:
            _write_synced(tmp, rank_file(r), enc.tensors)
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {e}"
    errs = _gather(err, n)
    err = None
    if r == 0:
        try:
            if any(errs):
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                manifest = {"format": FORMAT, "version": enc.version, "world_size": n, "root": root}
                if enc.table.dtypes:
                    manifest["dtypes"] = enc.table.dtypes
                if enc.table.locations:
                    manifest["locations"] = enc.table.locations
                if shared:
                    manifest["shared"] = shared
                _write_synced(tmp, MANIFEST, manifest)
                _commit(tmp, path)
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}"
    _raise_failed(errs, repr(path))
    _raise_failed([e if i == 0 else None for i, e in enumerate(_gather(err, n))], repr(path))


def _raise_refused(mine: Exception | None, failed: list, what: str) -> None:
    """A tree some rank refused while walking it (two dtypes over one storage): its own error on
    that rank, a RuntimeError naming it on the others (nothing was written)."""
    if mine is not None:
        raise mine
    bad = [(r, f) for r, f in enumerate(failed) if f]
    if bad:
        raise RuntimeError(f"holoflow.save({what}): " + "; ".join(f"rank {r}: {f}" for r, f in bad))


def _write_synced(directory: str, name: str, content: Any) -> None:
    full = os.path.join(directory, name)
    if isinstance(content, dict) and name == MANIFEST:
        with open(full, "w") as f:
            json.dump(content, f)
    else:
        safetensors.torch.save_file(content, full, metadata={FORMAT: name})
    with open(full, "rb") as f:
        os.fsync(f.fileno())


def _commit(tmp: str, path: str) -> None:
    fsync_dir(tmp)
    if os.path.lexists(path):   # replacing a checkpoint: move the old one aside, then delete it
        old = f"{path}{OLD_TAG}{os.getpid()}"
        os.rename(path, old)
        os.rename(tmp, path)
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old)
        else:
            os.unlink(old)
    else:
        os.rename(tmp, path)
    fsync_dir(os.path.dirname(path))


def save_to_rank(obj: Any, path: str | os.PathLike, dst: int) -> None:
    """OneFlow's ``save(obj, path, global_dst_rank=dst)``: global tensors are gathered whole to
    rank ``dst``, which alone writes one ordinary checkpoint file. Every rank calls it. A
    Parameter stays one (as ``torch.save`` keeps it); global tensors that are one tensor on every
    rank (a state dict's detached entries of a tied Parameter: one local storage, one layout) are
    gathered once and written as one storage, as ``torch.save`` writes the whole tensors."""
    r, n = _ctx()
    if not 0 <= dst < n:
        raise ValueError(f"holoflow.save: global_dst_rank={dst} is not a rank of this world of {n}")
    _refuse_global_modules(obj, "obj")   # (on every rank, before any collective)
    clash = _retyped_storage(obj, r, dst)
    _raise_refused(clash, _gather(None if clash is None else str(clash), n), repr(os.fspath(path)))
    ties = _agreed_ties(_gather(_tie_answers(obj, r), n))
    memo: dict = {}
    wholes: dict = {}   # tensor's place in the tree -> the whole local tensor gathered for it

    def whole(t: Tensor, k: int) -> Tensor | None:
        g = t._global
        if g is None:
            return t
        first = ties.get(k)
        if first is not None:   # one tensor with an earlier one: a new tensor over its whole storage
            base = wholes.get(first)
            out = None if base is None else Tensor._make(base._data.view(base._data.shape))
        elif r not in g.placement.flat_ranks and r != dst:
            out = None
        else:
            with no_grad():
                if dst in g.placement.flat_ranks:
                    x = t.detach().to_global(sbp=(B,) * g.placement.ndim)
                else:
                    x = t.detach().to_global(placement=placement(g.placement.type, [dst]), sbp=(B,))
            out = Tensor._make(x._data.clone()) if r == dst else None
        wholes[k] = out
        if out is not None and is_parameter(t):
            out = as_parameter(out, t.requires_grad)
        elif out is not None and t.requires_grad:
            out.requires_grad_(True)
        return out
    order = _tensor_order(obj)
    tree = _map_tensors(obj, lambda t: whole(t, order[id(t)]), memo)
    err = None
    if r == dst:
        try:
            save_file(tree, path)
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}"
    _raise_failed([e if i == dst else None for i, e in enumerate(_gather(err, n))], repr(os.fspath(path)))


def _tensor_order(obj: Any) -> dict:
    """id of each tensor object of the tree -> its place among them (the first time it appears)."""
    order: dict = {}
    for t, _ in _leaves(obj, "obj"):
        if isinstance(t, Tensor) and id(t) not in order:
            order[id(t)] = len(order)
    return order


def _tie_answers(obj: Any, r: int) -> list:
    """For each global tensor (by place, :func:`_tensor_order`): the place of an earlier one that
    this rank holds as the same tensor (one local storage, offset, strides; the same logical
    shape, dtype, placement and SBP), -1 for none, None where this rank cannot tell (its shard
    is empty, or it holds none)."""
    seen: dict = {}
    answers: list = []
    done: set = set()
    for t, _ in _leaves(obj, "obj"):
        if not isinstance(t, Tensor) or id(t) in done:
            continue
        done.add(id(t))
        g, d = t._global, t._data
        if g is None:
            answers.append(-1)
            continue
        logical = (tuple(g.placement.flat_ranks), g.placement.type, tuple(g.placement.hierarchy), tuple(g.sbp),
                   tuple(g.shape), str(d.dtype))
        if r not in g.placement.flat_ranks or d.numel() == 0:
            answers.append(None)
            continue
        key = (logical, d.untyped_storage().data_ptr(), d.storage_offset(), tuple(d.stride()))
        k = len(answers)
        first = seen.setdefault(key, k)
        answers.append(-1 if first == k else first)
    return answers


def _agreed_ties(every: list) -> dict:
    """place -> the earlier place it is one tensor with, where every rank that can tell says so
    (``every``: each rank's :func:`_tie_answers`; every rank takes the same decision, as the
    gathers it skips are collectives)."""
    ties = {}
    for k in range(len(every[0])):
        said = {a[k] for a in every} - {None}
        if len(said) == 1 and (j := next(iter(said))) >= 0:
            ties[k] = j
    return ties


def _retyped_storage(obj: Any, r: int, dst: int) -> RuntimeError | None:
    """torch.save's refusal of one storage seen as two dtypes, among what this rank gives a
    ``global_dst_rank`` save (its parts of global tensors; on ``dst`` the local tensors it writes
    too), where the gathered copies would hide it."""
    seen: dict = {}
    for t, where in _leaves(obj, "obj"):
        if not isinstance(t, Tensor):
            continue
        g, d = t._global, t._data
        if d.numel() == 0 or (r not in g.placement.flat_ranks if g is not None else r != dst):
            continue
        first = seen.setdefault((str(d.device), d.untyped_storage().data_ptr()), d.dtype)
        if first != d.dtype:
            return _two_dtypes(first, d.dtype, where)
    return None


def _leaves(obj: Any, where: str):
    """(leaf, where) for each leaf of a tree of dicts, lists and tuples (tensors, modules, values)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{where}[{k!r}]")
    elif isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{where}[{i}]")
    else:
        yield obj, where


def _refuse_global_modules(obj: Any, where: str) -> None:
    """A module saved whole holding a global tensor raises :class:`WholeModuleError` (see
    serialization_module.py): the sharded encoder meets it itself, ``save_to_rank`` asks here."""
    for leaf, at in _leaves(obj, where):
        if is_module(leaf):
            refuse_global(leaf, at)


def _map_tensors(obj: Any, fn, memo: dict) -> Any:
    """``obj`` with every Tensor replaced by ``fn(tensor)`` (one call per tensor object)."""
    if isinstance(obj, Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = fn(obj)
        return memo[id(obj)]
    if isinstance(obj, dict):
        return type(obj)((k, _map_tensors(v, fn, memo)) for k, v in obj.items()) \
            if isinstance(obj, OrderedDict) else {k: _map_tensors(v, fn, memo) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_map_tensors(v, fn, memo) for v in obj)
    return obj


# -- load ------------------------------------------------------------------------------------
def is_sharded(path: Any) -> bool:
    if hasattr(path, "read"):
        return False
    p = os.fspath(path)
    return os.path.isdir(p) and os.path.isfile(os.path.join(p, MANIFEST))
