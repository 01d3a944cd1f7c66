"""The global interpreter: an op on global tensors (docs/architecture.md, "Global view").

Choose the nd-signature with the least boxing cost from the inputs' nd-SBPs (signatures are
declared for one mesh axis and expanded per axis), box the inputs, run the kernel on the local
shards with attrs mapped to local shapes, and wrap the outputs with their nd-SBP.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import replace

import torch

from ..core.dispatch import EAGER, follows_base, run_local
from ..core import grad_mode
from ..core.errors import HoloflowError, UnsupportedError
from ..core.interpret import Interpreter
from ..core.keys import cache_key
from ..core.registry import Meta, Op, infer_metas, meta_attrs
from ..core.sbp import B, P, split
from ..core.tensor import Tensor
from ..core.views import CopyOf, aliases, make_view
from . import rng, world
from .boxing import apply_box, cost
from .comm_check import user_site
from .global_tensor import (GlobalMeta, absent_outputs, fresh, from_full, from_local_replica, leaves_ranks_out,
                            linked_alias, make_global, world_ranks)
from .sharding import degenerate, local_shape, nd_str
from .placement import placement

_CHOICES: dict = {}   # decide(): (op, metas, attrs, SBPs, placement) -> (signature, logical metas)
_MAX_CHOICES = 1 << 16
_SINGLE: dict = {}   # whether an op returns one tensor, for ranks that skip its kernel


# torch's ``implicit_replication()`` / ``loss_parallel()`` (distributed/dtensor.py): while on in a
# thread, a local tensor among global operands is taken as every rank's replica (broadcast, each
# rank's own data, no communication) instead of refused
IMPLICIT_REPLICATION = threading.local()


def _replicated_locals(inputs: tuple, scalars: bool = False) -> tuple:
    """``inputs`` with local tensors made broadcast on the first global input's placement. With
    ``scalars``, only one-element ones, and only among a DeviceMesh's tensors: torch's DTensor
    takes those as replicas always (a clipping coefficient from a norm made whole, a loss scale);
    OneFlow's placements refuse any local operand."""
    place = next((x._global.placement for x in inputs if isinstance(x, Tensor) and x._global is not None), None)
    if place is None or (scalars and not place.torch_conventions):
        return inputs
    return tuple(from_local_replica(x, place) if isinstance(x, Tensor) and x._global is None and
                 (not scalars or x._data.numel() == 1) else x for x in inputs)


def _placement_of(op: Op, inputs: tuple):
    place = None
    for x in inputs:
        if isinstance(x, Tensor):
            if x._global is None:
                raise HoloflowError(
                    f"holoflow.{op.name} at {user_site()}: mixes a local tensor of shape {tuple(x.shape)} "
                    f"with global tensors; make it global first with .to_global(placement, sbp), or, for "
                    f"tensors the model creates itself (torch.arange(T, device=x.device)), run it inside "
                    f"holoflow.utils.global_view.global_mode(True, placement=..., sbp=...), where creation "
                    f"ops make global tensors")
            if place is None:
                place = x._global.placement
            elif x._global.placement != place:
                other = x._global.placement
                why = "a stage boundary crossed without a move" if place.flat_ranks != other.flat_ranks else \
                    "the same ranks under OneFlow's and torch's conventions, which split uneven sizes differently"
                raise HoloflowError(
                    f"holoflow.{op.name} at {user_site()}: operands are on different placements: "
                    f"{place} and {other} ({why}); move one with .to_global(placement=...)")
    return place


def nd_signatures(op: Op, metas: list, attrs: dict, ndim: int) -> list[tuple]:
    """The op's 1-D signatures expanded to an N-D mesh, each axis chosen independently."""
    if op.sbp is None:
        raise UnsupportedError(
            f"holoflow.{op.name} has no SBP rule, so it cannot run on global tensors; call "
            f".to_local() on the inputs (or box them to broadcast) and use the local op")
    one = op.sbp(metas, attrs)
    sigs = []
    for combo in itertools.product(one, repeat=ndim):
        ins = tuple(tuple(c[0][i] for c in combo) for i in range(len(one[0][0])))
        outs = tuple(tuple(c[1][j] for c in combo) for j in range(len(one[0][1])))
        sigs.append((ins, outs))
    return sigs


def choose(op: Op, metas: list, attrs: dict, cur: list[tuple], place, logical=None) -> tuple:
    """The signature with the least boxing cost; ties prefer no boxing at all, then the first
    declared (the one cost function: docs/architecture.md, "SBP and the global view"). A
    signature with a split is legal only if every rank's shard computes exactly its balanced
    piece of the output: a reshape merging an unevenly split dim does not (attrs that follow the
    shards, ``local_attrs``), nor does ``repeat_interleave`` of a dim of 3 split 2 + 1 into 6
    (4 + 2 where the output's split is 3 + 3)."""
    tens = [m for m in metas if isinstance(m, Meta)]
    nbytes = [_numel(m.shape) * m.dtype.itemsize for m in tens]
    ranked = []
    for i, sig in enumerate(nd_signatures(op, metas, attrs, place.ndim)):
        c = sum(cost(s, d, place.hierarchy, n) for s, d, n in zip(cur, sig[0], nbytes))
        moves = sum(s != d for s, d in zip(cur, sig[0]))
        ranked.append(((_split_to_partial(cur, sig[0]), c, moves, i), sig))
    ranked.sort(key=lambda t: t[0])
    for _, sig in ranked:
        if logical is None:  # data-dependent output shape: only broadcast outputs are knowable
            if all(s == B for nd in sig[1] for s in nd):
                return sig
        elif _consistent(op, metas, attrs, sig, place, logical):
            return sig
    raise HoloflowError(f"holoflow.{op.name}: no signature computes balanced shards for inputs "
                        f"{[tuple(m.shape) for m in tens]} on {place}; box the inputs to broadcast")


def _split_to_partial(cur: list, ins: tuple) -> bool:
    """Whether a signature makes a partial sum out of split inputs alone (on a mesh axis where no
    input is partial yet, a split one padded with zeros): no communication, but a whole-size
    partial output where a split or broadcast one was possible (every later reader pays to reduce
    it, and a DTensor's ``to_local()`` would be a piece of a sum where torch gives a shard). Such
    signatures come last, as OneFlow's SBP inference rules S -> P out (sbp_infer_util.cpp) and
    torch never makes a shard Partial. Padding a split input to join an operand that is partial
    already stays free (the sum is reduced once, later, instead of now and again)."""
    for axis in range(len(cur[0]) if cur else 0):
        if any(src[axis] == P for src in cur):
            continue
        if any(isinstance(src[axis], split) and dst[axis] == P for src, dst in zip(cur, ins)):
            return True
    return False


def _consistent(op: Op, metas: list, attrs: dict, sig: tuple, place, logical) -> bool:
    """Whether every rank's shard computes its balanced piece of each output under ``sig`` (the
    shape rule on the shards' shapes, once per distinct shard). Without a split anywhere every
    shard is whole: the logical shapes answer."""
    if op.local_attrs is None and not any(isinstance(s, split) for nds in sig for nd in nds for s in nd):
        return True
    tens_idx = [i for i, m in enumerate(metas) if isinstance(m, Meta)]
    seen: set = set()
    for rank in place.flat_ranks:
        shapes = [local_shape(metas[i].shape, sig[0][j], place, rank) for j, i in enumerate(tens_idx)]
        wants = [tuple(local_shape(m.shape, nd, place, rank)) for nd, m in zip(sig[1], logical)]
        key = (tuple(map(tuple, shapes)), tuple(wants))
        if op.local_attrs is None:   # (the attrs are the same on every rank: one check per shape)
            if key in seen:
                continue
            seen.add(key)
        la = local_attrs(op, attrs, metas, sig[0], place, rank)
        fake = list(metas)
        for j, i in enumerate(tens_idx):
            fake[i] = torch.empty(shapes[j], dtype=metas[i].dtype, device="meta")
        try:
            outs = infer_metas(op, tuple(fake), meta_attrs(la))
        except Exception:  # the shard's kernel rejects it: not a legal signature here
            return False
        if any(tuple(o.shape) != w for o, w in zip(outs, wants)):
            return False
    return True


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def decide(op: Op, metas: list, attrs: dict, cur: list, place, shape_attrs: dict | None = None) -> tuple:
    """``(signature, logical output metas, cache key)`` of ``op`` on inputs of ``metas`` laid out
    as ``cur``: :func:`choose` after the shape rule (``logical`` None for a data-dependent output
    shape), remembered per key. ``shape_attrs``: the attrs the shape rule runs
    with (a trace names devices as meta)."""
    # A trace's decisions are its rank's own, apart from eager's (whose shape rule names real
    # devices): one table shared by simulated ranks' traces made their programs differ now and
    # then (~1 in 5 runs of test_global_views_inplace; which entry was wrong was not found).
    key = _key(op, metas, attrs, cur, place)
    if key is not None and shape_attrs is not None:
        key = ("trace", world.rank(), key)
    hit = _CHOICES.get(key) if key is not None else None
    if hit is None:
        try:   # (eager attrs name real devices: the shape rule runs on meta tensors, which cannot
            # move there, so they name the meta device; a trace's shape_attrs already do)
            logical = infer_metas(op, tuple(m.empty() if isinstance(m, Meta) else m for m in metas),
                                  meta_attrs(attrs) if shape_attrs is None else shape_attrs)
        except NotImplementedError:  # a data-dependent output shape (nonzero, unique, ...)
            logical = None
        except RuntimeError as e:   # (a kernel reading a value, one_hot's inferred size: .item())
            if "meta tensor" not in str(e):
                raise
            logical = None
        hit = (choose(op, metas, attrs, cur, place, logical), logical)
        if key is not None:
            if len(_CHOICES) >= _MAX_CHOICES:
                _CHOICES.clear()
            _CHOICES[key] = hit
    return hit[0], hit[1], key


def _key(op: Op, metas: list, attrs: dict, cur: list, place):
    """The key of a signature decision: metas, and constants by type and value (``2`` and ``2.0``
    are different inputs); None when a constant is an object known only by identity (a tensor:
    a later one of another shape could reuse the id)."""
    parts = []
    for m in metas:
        k = (m.shape, m.dtype, m.device) if isinstance(m, Meta) else cache_key(m)
        if k is None:
            return None
        parts.append(k)
    a = cache_key(attrs)
    return None if a is None else (op.name, tuple(parts), a, tuple(cur), place)


def local_attrs(op: Op, attrs: dict, metas: list, sig_in: tuple, place, rank: int) -> dict:
    """Maps attrs to this rank's shard, one mesh axis at a time."""
    if op.local_attrs is None:
        return attrs
    tens_idx = [i for i, m in enumerate(metas) if isinstance(m, Meta)]
    cur_metas = list(metas)
    prefix: list[list] = [[] for _ in tens_idx]
    for axis in range(place.ndim):
        nxt = list(cur_metas)
        in_sbps = tuple(sig_in[j][axis] for j in range(len(tens_idx)))
        for j, i in enumerate(tens_idx):
            prefix[j].append(sig_in[j][axis])
            full = tuple(prefix[j]) + (B,) * (place.ndim - axis - 1)
            nxt[i] = Meta(local_shape(metas[i].shape, full, place, rank), metas[i].dtype, metas[i].device)
        attrs = op.local_attrs(attrs, cur_metas, nxt, in_sbps)
        cur_metas = nxt
    return attrs


def global_apply(op: Op, inputs: tuple, attrs: dict):
    if any(isinstance(x, Tensor) and x._global is None for x in inputs):
        inputs = _replicated_locals(inputs, scalars=not getattr(IMPLICIT_REPLICATION, "on", False))
    if op.grad is not None and grad_mode.STATE.enabled:
        follows_base(inputs)   # a view of a base that requires grad since it was taken does too
    place = _placement_of(op, inputs)
    metas = [Meta(tuple(x.shape), x._data.dtype, x._data.device) if isinstance(x, Tensor) else x
             for x in inputs]
    cur = [x._global.sbp for x in inputs if isinstance(x, Tensor)]
    sig, logical, key = decide(op, metas, attrs, cur, place)
    rank = world.rank()
    if place.coords(rank) is None:
        return _absent_apply(op, inputs, attrs, metas, sig, logical, place, key)
    comm = world.comm()
    local_in, saved, j = [], [], 0
    for x in inputs:
        if isinstance(x, Tensor):
            if "_copy_of" in x.__dict__ or "_reads_copy" in x.__dict__ or \
                    (x._view is not None and "_copy_of" in x._view.base.__dict__):
                fresh(x, strict=op.grad is not None)   # (a copy standing for a view, or a view of one)
            want = sig[0][j]
            y = apply_box(x, place, x._global.sbp, want, x.shape, rank, comm) \
                if want != x._global.sbp else x
            local_in.append(y)
            # (a leaf's shard stands for the leaf in what the grad rule records: double backward)
            saved.append(linked_alias(y) if y._global is not None else y)
            j += 1
        else:
            local_in.append(x)
            saved.append(x)
    la = local_attrs(op, attrs, metas, sig[0], place, rank)
    if op.random:   # this shard's own draws: equal across broadcast ranks, distinct across shards
        dev = next(x._data.device for x in local_in if isinstance(x, Tensor))
        seed = rng.rank_seed(rng.agreed_seed(place, attrs.get("generator")), place, sig[1][0], rank, op.name)
        la = {**la, "generator": rng.generator_for(seed, dev)}
    out = run_local(op, tuple(local_in), la, tuple(saved))
    outs = (out,) if isinstance(out, Tensor) else tuple(out)
    if logical is None:
        if any(s != B for nd in sig[1] for s in nd):
            raise UnsupportedError(f"holoflow.{op.name}: its output shape depends on the data, so it "
                                   f"runs on global tensors only with broadcast inputs; box them to B")
        logical = _shared_metas(place, [Meta(tuple(o._data.shape), o._data.dtype) for o in outs])
    for o, nd, m in zip(outs, sig[1], logical):
        make_global(o, place, nd, m.shape)
        _check_local(op, o, place, nd, m.shape, rank)
    if not op.view and any(isinstance(x, Tensor) and degenerate(tuple(x.shape), x._global.sbp, place)
                           for x in (*inputs, *outs)):
        _keep_logical_strides(op, inputs, attrs, outs)
    if op.view:
        _views(op, inputs[0], local_in[0] is inputs[0], attrs, la, outs, isinstance(out, Tensor))
    return out


def _views(op: Op, x: Tensor, in_place: bool, attrs: dict, la: dict, outs: tuple, single: bool) -> None:
    """A view op's outputs on a global ``x``, as torch's on the whole tensor (:func:`_logical_outs`
    says which it views): a view of its shard where the kernel aliased it (the chain holds the
    local attrs the shard was viewed with), else a :class:`CopyOf` ``x`` (the logical attrs), which
    writes back and re-derives itself as a view would; where torch copies (a reshape no view can
    do), a copy, even where the shard's kernel aliased (a reshape of a sliced shard can). What
    stands for a view keeps torch's strides (``GlobalMeta.strides``) for the view ops after it."""
    whole = all(s == B or s == P for s in x._global.sbp)   # the shard has the logical layout
    if in_place and whole and x._global.strides is None:   # (the shard's kernel answers as torch's)
        for i, o in enumerate(outs):
            if aliases(o._data, x._data):
                make_view(o, x, op, la, None if single else i)
                o._global = replace(o._global, strides=tuple(o._data.stride()))
        return
    logical = _logical_outs(op, x, attrs)
    for i, o in enumerate(outs):
        idx = None if single else i
        if logical is None:   # (attrs the meta kernel refuses: a view, as before)
            lm, view = None, True
        else:
            lm, view = logical[i] if i < len(logical) else (None, False)
        if in_place and aliases(o._data, x._data):
            if not view:   # torch copies where the shard could alias (a reshape of a sliced shard)
                o._data = o._data.clone(memory_format=torch.contiguous_format)
                continue
            make_view(o, x, op, la, idx)
        elif (in_place and whole) or not view:
            continue   # torch's kernel itself copies (a reshape of a tensor no view can reshape): a copy
        else:
            o.__dict__["_copy_of"] = CopyOf(x, ((op, attrs, idx),), x._data._version)
        if lm is not None:
            o._global = replace(o._global, strides=tuple(lm.stride()))


def _keep_logical_strides(op: Op, inputs: tuple, attrs: dict, outs: tuple) -> None:
    """Outputs of tensors some rank holds a degenerate shard of (a split dim of 0 or 1 there)
    keep the strides torch's tensor has, from the op on meta tensors of its inputs' logical
    layouts: a shard's strides along such a dim say nothing (torch lays an empty result out
    row-major whatever its inputs, and a dim of one has any stride), and whether a reshape views
    or copies is read from them (:func:`_logical_meta`), a decision every rank must make alike
    (6 columns over a DeviceMesh of 4 ranks, 2,2,2,0, or over a placement, 2,2,1,1: the ranks
    holding less took a copy for a view and issued a collective their peers did not)."""
    try:
        got = op.kernel(*[_logical_meta(x) if isinstance(x, Tensor) else x for x in inputs], **meta_attrs(attrs))
    except Exception:   # noqa: BLE001 -- the meta kernel refuses: the shards' strides answer, as before
        return
    got = (got,) if isinstance(got, torch.Tensor) else tuple(got)
    for o, m in zip(outs, got):
        if isinstance(o, Tensor) and isinstance(m, torch.Tensor) and tuple(m.shape) == tuple(o.shape):
            o._global = replace(o._global, strides=tuple(m.stride()))


def _logical_meta(x: Tensor) -> torch.Tensor:
    """A meta tensor with ``x``'s logical shape and the strides torch's tensor would have: those
    kept for what stands for a view (its base's replayed through its view ops), else dense in the
    shard's order of dims (a transposed tensor stays transposed)."""
    d = x._data
    shape = tuple(x.shape)
    strides = x._global.strides
    if strides is None or len(strides) != len(shape):
        order = sorted(range(d.dim()), key=lambda k: d.stride()[k], reverse=True)   # outermost first
        strides, acc = [0] * len(shape), 1
        for k in reversed(order):
            strides[k] = acc
            acc *= max(shape[k], 1)
    return torch.empty_strided(shape, tuple(strides), dtype=d.dtype, device="meta")


def _logical_outs(op: Op, x: Tensor, attrs: dict) -> list | None:
    """``(meta output, whether it views)`` per output of ``op`` on ``x``'s whole logical tensor,
    as torch answers it: run on a meta tensor of ``x``'s logical layout (:func:`_logical_meta`);
    None where the meta kernel refuses the attrs."""
    m = _logical_meta(x)
    # device attrs name the meta device (a meta tensor cannot move to a real one); one naming
    # another device than the shard's is a move, which copies
    dev = x._data.device
    moves = any(isinstance(v, torch.device) and (v.type != dev.type or v.index not in (None, dev.index))
                for v in attrs.values())
    try:
        out = op.kernel(m, **meta_attrs(attrs))
    except Exception:
        return None
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    return [(o, not moves and aliases(o, m)) if isinstance(o, torch.Tensor) else (None, False) for o in outs]


def _absent_apply(op: Op, inputs: tuple, attrs: dict, metas: list, sig: tuple, logical, place, key=None):
    """A rank outside the placement skips the kernel: empty outputs that know their logical
    shape, placement and SBP (docs/architecture.md, "Ranks outside a placement")."""
    if logical is None:  # a data-dependent shape: the placement's first rank tells it
        logical = _shared_metas(place, None)
    tensors = tuple(x for x in inputs if isinstance(x, Tensor))
    single = _SINGLE.get(key) if key is not None else None
    if single is None:
        single = _returns_single(op, metas, attrs, logical)
        if key is not None:
            _SINGLE[key] = single
    out = absent_outputs(tensors, tuple(m.dtype for m in logical), single,
                         op.grad_none is not None and op.grad_none(attrs))
    outs = (out,) if single else tuple(out)
    for o, nd, m in zip(outs, sig[1], logical):
        make_global(o, place, nd, m.shape)
    if single:
        return out
    return op.out_type(*outs) if op.out_type is not None else outs


def _shared_metas(place, mine: list | None) -> list:
    """Output metas only the placement's ranks know (a data-dependent shape), handed to every
    rank of the world when the placement leaves some out (they run the same program)."""
    ranks = world_ranks()
    if not leaves_ranks_out(place, ranks):
        return mine
    plain = None if mine is None else [(tuple(m.shape), m.dtype) for m in mine]
    got = world.comm().all_gather_shapes(plain, ranks)[ranks.index(place.flat_ranks[0])]
    return [Meta(shape, dtype) for shape, dtype in got]


def _returns_single(op: Op, metas: list, attrs: dict, logical) -> bool:
    """Whether ``op`` returns one tensor (not a sequence): its kernel on meta tensors says."""
    try:
        out = op.kernel(*(m.empty() if isinstance(m, Meta) else m for m in metas), **attrs)
    except Exception:  # a kernel that can't run on meta tensors: its output count says
        return len(logical) == 1 and op.out_type is None
    return isinstance(out, torch.Tensor)


def _check_local(op: Op, o: Tensor, place, nd, shape, rank) -> None:
    want = local_shape(shape, nd, place, rank)
    if tuple(o._data.shape) != tuple(want):
        raise HoloflowError(
            f"holoflow.{op.name}: internal SBP error: the shard has shape {tuple(o._data.shape)} but "
            f"logical shape {tuple(shape)} with sbp {nd_str(nd)} gives {want} on rank {rank}. "
            f"This is a bug in the op's SBP rule or local_attrs; please report it.")


class GlobalInterpreter(Interpreter):
    """Evaluates ops whose inputs are global: chooses the signature, boxes, binds the local
    shards to the eager interpreter. Global tensors point at it (``x._global.interpreter``), and
    placements too, so creation ops with ``placement=`` build their shards here."""

    def __init__(self) -> None:
        super().__init__()
        self.parent = EAGER

    def bind(self, op: Op, inputs: tuple, attrs: dict):
        return global_apply(op, inputs, attrs)

    @staticmethod
    def from_full(data: torch.Tensor, place: placement, sbp) -> Tensor:
        """A global tensor from the logical tensor every rank computed identically."""
        return from_full(data, place, sbp)


GLOBAL = GlobalInterpreter()
GlobalMeta.interpreter = GLOBAL  # a global tensor knows the interpreter of its kind (JAX's tracer.trace)
placement.interpreter = GLOBAL
