"""Loading checkpoints of global tensors into a (possibly different) layout; see sharded.py.

Target layout of each loaded tensor, first match wins:

1. ``like``: a tree walked alongside the saved one. A global tensor there gives placement and
   SBP (the logical shapes must agree); a local tensor there asks for the whole tensor, local. A
   module stands for its ``state_dict()``; an optimizer for its state, each state tensor shaped
   like its parameter taking the parameter's layout.
2. The saved layout, when this world has all of its ranks.
3. In a world of one process, the whole tensor as a local tensor.

Otherwise loading fails, naming the tensor and asking for ``like``.

Devices: in its saved layout (2.), each rank's part goes where ``torch.load`` puts a storage saved
on the device that rank has on the saved placement (``placement.device_for``, e.g. ``"cuda:0"``):
there, or where ``map_location`` sends it (the placement then takes that device's type), and on
a machine without that device torch's RuntimeError asking for ``map_location``. ``like``'s layout
(1.) brings its own devices (as torch's DCP loads into the tensors it is given).
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import Any

import torch

from ..core.grad_mode import no_grad
from ..core.sbp import B, P
from ..core.tensor import Tensor
from ..distributed.global_tensor import from_full, make_global
from ..distributed.sharding import local_ranges
from ..distributed.placement import placement
from ..serialization import load_file
from ..serialization_storage import identity, restore
from ..serialization_tree import CheckpointError, Decoder, as_parameter, is_parameter
from .reader import ShardReader
from .shared import joined, parts_of
from .sharded import FORMAT, MANIFEST, OLD_TAG, VERSION, _ctx, _dtype_from, _gather, _map_tensors, _sbp_from


class _ParamLike:
    """Stands for an optimizer state entry of parameter ``p``: tensors shaped like ``p`` take
    its layout, others keep their default."""

    def __init__(self, p: Tensor) -> None:
        self.p = p


def _like_view(like: Any) -> Any:
    if like is None or isinstance(like, (Tensor, _ParamLike, dict, list, tuple)):
        return like
    if hasattr(like, "param_groups") and hasattr(like, "state"):   # an optimizer
        index: dict = {}
        for g in like.param_groups:
            for p in g["params"]:
                index.setdefault(id(p), (len(index), p))
        return {"state": {i: _ParamLike(p) for i, p in index.values()}}
    if hasattr(like, "state_dict") and callable(like.state_dict):   # a module
        return like.state_dict()
    return None


def _like_child(like: Any, key: Any) -> Any:
    like = _like_view(like)
    if isinstance(like, _ParamLike):
        return like
    if isinstance(like, dict):
        return _like_view(like.get(key))
    if isinstance(like, (list, tuple)) and isinstance(key, int) and 0 <= key < len(like):
        return _like_view(like[key])
    return None


def _like_tensor(like: Any, shape: list, where: str) -> Tensor | None:
    like = _like_view(like)
    if isinstance(like, _ParamLike):
        like = like.p if list(like.p.shape) == list(shape) else None
    if not isinstance(like, Tensor):
        return None
    if list(like.shape) != list(shape):
        raise CheckpointError(f"holoflow.load: {where} has shape {tuple(shape)} in the checkpoint, but like= "
                              f"gives a tensor of shape {tuple(like.shape)}")
    return like


def _walk(obj: Any, like: Any, fn, where: str = "obj") -> Any:
    """``obj`` with each tensor replaced by ``fn(tensor, like leaf, where)``."""
    if isinstance(obj, (Tensor, _Pending, _Spec)):
        return fn(obj, like, where)
    if isinstance(obj, dict):
        items = ((k, _walk(v, _like_child(like, k), fn, f"{where}[{k!r}]")) for k, v in obj.items())
        return OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_walk(v, _like_child(like, i), fn, f"{where}[{i}]") for i, v in enumerate(obj))
    return obj


# -- directory checkpoints -------------------------------------------------------------------
class _Pending:
    """A tensor node of the manifest, read once its target layout is known."""

    def __init__(self, node: dict) -> None:
        self.node = node


class _Tree(Decoder):
    """The manifest's tree with tensors left as :class:`_Pending` (one object per saved tensor,
    in ``made``); the walk is the file decoder's."""

    def __init__(self, name: str) -> None:
        super().__init__({}, name)

    def tensor(self, n: dict) -> _Pending:
        if not isinstance(n.get("key"), str):
            raise self.bad(f"a tensor node without a key: {str(n)[:80]}")
        return self.made.setdefault(identity(n), _Pending(n))   # (views of one storage: one key)

    def module(self, n: dict) -> Any:
        # (modules saved whole: plain files only; older holoflow wrote some here, with global tensors)
        raise CheckpointError(
            f"holoflow.load({self.name}): the checkpoint holds a whole module ({str(n.get('class', '?'))[:80]}) "
            f"that older holoflow saved beside global tensors; a sharded checkpoint can't rebuild it. Save "
            f"model.state_dict() instead and load it with like=model")


def _target(n: dict, like: Any, where: str, name: str) -> tuple | None:
    """(placement, nd-SBP, whether it is the saved layout rather than ``like``'s) for a saved
    tensor node, or None for a local whole tensor."""
    shape = n.get("shape")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise CheckpointError(f"holoflow.load({name}): corrupt manifest: bad shape {shape!r} for {where}")
    lk = _like_tensor(like, shape, where)
    if lk is not None:
        return (lk._global.placement, tuple(lk._global.sbp), False) if lk._global is not None else None
    saved = n.get("placement")
    if saved is None:
        return None
    try:
        place = placement(saved["type"], saved["ranks"])
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"holoflow.load({name}): corrupt manifest: bad placement for {where}: {e}") from e
    sbp = n.get("sbp")
    if not isinstance(sbp, list) or len(sbp) != place.ndim:
        raise CheckpointError(f"holoflow.load({name}): corrupt manifest: bad sbp {sbp!r} for {where}")
    nd = tuple(_sbp_from(s, name) for s in sbp)
    _, world_size = _ctx()
    if max(place.flat_ranks) < world_size:
        return place, nd, True
    if world_size == 1:
        return None
    raise CheckpointError(f"holoflow.load({name}): {where} was saved on {place}, but this world has "
                          f"{world_size} ranks; pass like= (a tree of global tensors, a module or an "
                          f"optimizer) to choose its layout here")


def _build(data: torch.Tensor | None, n: dict, target: tuple | None, map_location) -> Tensor:
    r, _ = _ctx()
    if target is None:   # (a local tensor was restored with its storage, by the reader)
        t = Tensor._make(data if n.get("placement") is None else restore(data, _location(n), map_location))
    else:
        place, nd, saved = target
        if data is None:   # (a rank outside the placement: an empty part, on the CPU)
            local = torch.empty((0,), dtype=_dtype_from(n.get("dtype"), "manifest"))
            place = _restored(local, place, map_location)[1] if saved else place
        elif saved:
            local, place = _restored(data, place, map_location)
        else:   # (like's layout: its devices, as torch's DCP loads into the tensors it is given)
            local = data.to(place.device_for(r))
        t = make_global(Tensor._make(local), place, nd, n["shape"])
    return _finish(t, n)


def _finish(t: Tensor, n: dict) -> Tensor:
    """A loaded tensor marked as the node says: requires_grad, a Parameter."""
    if n.get("requires_grad"):
        if not (t.is_floating_point() or t.is_complex()):
            raise CheckpointError(f"holoflow.load: corrupt manifest: tensor {n['key']!r} of dtype {t.dtype} is "
                                  f"marked requires_grad (only floating point and complex tensors can be)")
        t.requires_grad_(True)
    if n.get("parameter"):
        t = as_parameter(t, bool(n.get("requires_grad")))
    return t


def _restored(data: torch.Tensor, place: placement, map_location: Any) -> tuple[torch.Tensor, placement]:
    """(this rank's part, its placement) of a global tensor loaded in its saved layout, its
    storage restored as ``torch.load`` restores one (:func:`restore`): to the device this rank has
    on the saved placement, or where ``map_location`` sends it (the placement takes that
    device's type), and on a machine without that device torch's RuntimeError asking for
    ``map_location``."""
    r, _ = _ctx()
    local = restore(data, str(place.device_for(r)), map_location)
    return local, _typed(place, local.device)


def _typed(place: placement, device: torch.device) -> placement:
    """``place`` on the type of ``device`` (where ``map_location`` moved a part saved on it)."""
    return place if device.type == place.type else placement(device.type, place.ranks.tolist())


def _location(n: dict) -> str:
    """Where a global tensor loaded whole goes (as torch.load, before ``map_location``): the
    device type of the placement it was saved on."""
    saved = n.get("placement")
    kind = saved.get("type") if isinstance(saved, dict) else None
    return kind if isinstance(kind, str) else "cpu"


def load_sharded(path: Any, map_location=None, like: Any = None) -> Any:
    """Each rank reads its boxes of a directory checkpoint; see the module doc."""
    directory = os.path.abspath(os.fspath(path))
    name = repr(os.fspath(path))
    try:
        with open(os.path.join(directory, MANIFEST)) as f:
            manifest = json.load(f)
    except ValueError as e:
        raise CheckpointError(f"holoflow.load({name}): {MANIFEST} is not valid JSON: {e}") from e
    except RecursionError as e:
        raise CheckpointError(f"holoflow.load({name}): {MANIFEST} is nested too deeply") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "root" not in manifest:
        raise CheckpointError(f"holoflow.load({name}): {MANIFEST} is not a holoflow sharded manifest")
    if not isinstance(manifest.get("version"), int) or manifest["version"] > VERSION:
        raise CheckpointError(f"holoflow.load({name}): format version {manifest.get('version')!r} is not one "
                              f"this holoflow reads ({VERSION}); upgrade holoflow")
    decoder = _Tree(name)
    tree = decoder.node(manifest["root"])
    reader = ShardReader(directory, name, manifest, map_location)
    planned: dict = {}   # id(pending) -> (pending, target, where): the layout where a tensor is met first

    def plan(p: _Pending, like: Any, where: str) -> _Pending:
        if id(p) not in planned:
            planned[id(p)] = (p, _target(p.node, like, where, name), where)
        return p
    try:
        _walk(tree, like, plan)
        made = _load_shared(decoder.made, manifest, planned, reader, map_location)
        for key, (p, target, where) in planned.items():
            if key not in made:
                made[key] = _build(_read_part(reader, p.node, target, where), p.node, target, map_location)
        return _walk(tree, None, lambda p, _like, _where: made[id(p)])
    finally:
        reader.files.clear()


def _read_part(reader: ShardReader, n: dict, target: tuple | None, where: str) -> torch.Tensor | None:
    """This rank's part of the saved tensor ``n`` in ``target`` (the whole tensor for a local
    one; None outside the placement), read from the shards."""
    if target is None:
        return reader.read(n, [(0, d) for d in n["shape"]], where, whole=True)
    place, nd, _ = target
    coords = place.coords(_ctx()[0])
    if coords is None:
        return None
    data = reader.read(n, local_ranges(n["shape"], nd, place, coords), where)
    if any(s == P and coords[a] != 0 for a, s in enumerate(nd)):
        data.zero_()   # a partial sum: the value lives on the first rank of each P axis
    return data


def _load_shared(pending: dict, manifest: dict, planned: dict, reader: ShardReader, map_location: Any) -> dict:
    """id(pending) -> tensor for the tensors that shared a local storage on this rank when saved
    (global tensors, and rank 0's local tensors over its part of one) and load in that layout:
    views of one storage again (:mod:`.shared`). ``pending``: the manifest's tensors by identity,
    ``planned``: their targets."""
    r, _ = _ctx()
    by_part = {key if vid == 0 else f"{key}#{vid}": p for (key, vid), p in pending.items()}
    made: dict = {}
    for group in parts_of(manifest, r, reader.corrupt):
        members = [planned.get(id(by_part.get(key))) for key, *_ in group]
        if not all(_in_saved_part(m, part, reader.name) for m, part in zip(members, group)) or \
                len({m[0].node.get("dtype") for m in members}) != 1:
            continue   # (some of them load in another layout: apart)
        anchor = next((m for m in members if m[1] is not None), None)
        if anchor is None:   # (local tensors alone: sharing their entry already)
            continue
        views = joined([(off, shape, stride, _read_part(reader, p.node, target, where))
                        for (p, target, where), (_, off, shape, stride) in zip(members, group)])
        if views is None:
            continue
        place, _, saved = anchor[1]   # (the storage, moved once: as saved, or to like's device)
        first, _ = _restored(views[0], place, map_location if saved else str(place.device_for(r)))
        storage = first.untyped_storage()
        for (p, target, _), v in zip(members, views):
            local = Tensor._make(torch.empty(0, dtype=v.dtype, device=first.device).set_(
                storage, v.storage_offset(), v.shape, v.stride()))
            if target is not None:
                local = make_global(local, _typed(target[0], first.device), target[1], p.node["shape"])
            made[id(p)] = _finish(local, p.node)
    return made


def _in_saved_part(member: tuple | None, part: tuple, name: str) -> bool:
    """Whether a tensor of a shared storage loads, on this rank, the part it saved there (in its
    saved layout, which ``like`` may give too; a local tensor: whole, local)."""
    if member is None:   # (not in the tree)
        return False
    p, target, where = member
    if target is None:   # (loaded whole: a local tensor saved local, not a global one)
        return p.node.get("placement") is None and p.node.get("shape") == part[2]
    place, nd, saved = target
    if not saved:
        try:
            saved = _target(p.node, None, where, name)
        except CheckpointError:   # (saved on ranks this world lacks)
            return False
        if saved is None or saved[:2] != (place, nd):
            return False
    coords = place.coords(_ctx()[0])
    return coords is not None and [s for _, s in local_ranges(p.node["shape"], nd, place, coords)] == part[2]


def missing_hint(path: Any) -> str | None:
    """If a save replacing ``path`` was interrupted, where the previous checkpoint went."""
    p = os.path.abspath(os.fspath(path))
    d, base = os.path.dirname(p), os.path.basename(p) + OLD_TAG
    try:
        olds = [x for x in os.listdir(d) if x.startswith(base)]
    except OSError:
        return None
    return os.path.join(d, olds[0]) if olds else None


# -- file checkpoints and OneFlow's global_src_rank --------------------------------------------
def relayout(obj: Any, like: Any) -> Any:
    """A tree of local (whole) tensors given ``like``'s layout: each rank keeps its slice."""
    memo: dict = {}

    def one(t: Tensor, lk: Any, where: str) -> Tensor:
        if id(t) in memo:
            return memo[id(t)]
        lk = _like_tensor(lk, list(t.shape), where)
        out = t
        if lk is not None and lk._global is not None and t._global is None:
            g = lk._global
            with no_grad():
                out = from_full(t._data, g.placement, g.sbp)
            if is_parameter(t):   # (a Parameter stays one, as in a sharded directory's load)
                out = as_parameter(out, t.requires_grad)
            elif t.requires_grad:
                out.requires_grad_(True)
        memo[id(t)] = out
        return out
    return _walk(obj, like, one)


class _Spec:
    """What other ranks learn of a tensor rank ``global_src_rank`` read."""

    def __init__(self, shape: list, dtype: str, requires_grad: bool, parameter: bool = False) -> None:
        self.shape, self.dtype, self.requires_grad, self.parameter = shape, dtype, requires_grad, parameter


def load_from_rank(path: Any, src: int, map_location=None, like: Any = None) -> Any:
    """OneFlow's ``load(path, global_src_rank=src)``: rank ``src`` reads whole tensors; they come
    back global, broadcast on ``placement([src])`` — then moved to ``like``'s layout if given.
    Every rank calls it."""
    r, n = _ctx()
    if not 0 <= src < n:
        raise ValueError(f"holoflow.load: global_src_rank={src} is not a rank of this world of {n}")
    obj, skeleton, err = None, None, None
    if r == src:
        try:
            obj = load_sharded(path, map_location) if _is_dir(path) else load_file(path, map_location)
            obj = _map_tensors(obj, lambda t: t if t._global is None else Tensor._make(t._local_full()), {})
            skeleton = _map_tensors(obj, lambda t: _Spec(list(t.shape), str(t._data.dtype).replace("torch.", ""),
                                                         t.requires_grad, is_parameter(t)), {})
        except Exception as e:  # noqa: BLE001 - every rank raises
            err = e
    skeleton, err_text = _gather((skeleton, None if err is None else f"{type(err).__name__}: {err}"), n)[src]
    if err is not None:
        raise err
    if err_text:
        raise CheckpointError(f"holoflow.load({os.fspath(path)!r}, global_src_rank={src}): rank {src} failed: "
                              f"{err_text}")
    place = placement("cpu", [src])
    globals_: dict = {}   # id(spec) -> the tensor, global on placement([src])
    for t, spec in zip(_flatten(obj if r == src else skeleton), _flatten(skeleton)):
        if id(spec) not in globals_:
            data = t._data if r == src else torch.empty((0,), dtype=_dtype_from(spec.dtype, "manifest"))
            globals_[id(spec)] = (make_global(Tensor._make(data), place, (B,), spec.shape), spec)

    done: dict = {}   # id(spec) -> its tensor, once (a tensor saved under two names stays one)

    def finish(spec: Any, lk: Any, where: str) -> Tensor:
        if id(spec) in done:
            return done[id(spec)]
        g, spec = globals_[id(spec)]
        lk = _like_tensor(lk, spec.shape, where)
        if lk is not None and lk._global is not None:
            tg = lk._global
            union = set(tg.placement.flat_ranks) | {src}
            with no_grad():
                if r in union:
                    g = g.to_global(placement=tg.placement, sbp=tg.sbp)
                else:
                    g = make_global(Tensor._make(torch.empty((0,), dtype=g._data.dtype)), tg.placement,
                                    tuple(tg.sbp), spec.shape)
        if spec.parameter:
            g = as_parameter(g, spec.requires_grad)
        elif spec.requires_grad:
            g.requires_grad_(True)
        done[id(spec)] = g
        return g
    return _walk(skeleton, like, finish)


def _is_dir(path: Any) -> bool:
    return not hasattr(path, "read") and os.path.isdir(os.fspath(path))


def _flatten(obj: Any) -> list:
    out: list = []
    _visit(obj, out)
    return out


def _visit(x: Any, out: list) -> None:
    # (module-level, not a closure calling itself: that is a cycle holding the tensors until a
    # collection)
    if isinstance(x, (Tensor, _Spec)):
        out.append(x)
    elif isinstance(x, dict):
        for v in x.values():
            _visit(v, out)
    elif isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        for v in x:
            _visit(v, out)
