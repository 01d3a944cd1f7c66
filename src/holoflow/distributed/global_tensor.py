"""Global tensors: a Tensor whose ``_data`` is this rank's shard and whose ``_global`` says how
the logical tensor maps onto the placement (docs/architecture.md, "SBP and the global view").

``x.to_global(placement, sbp)`` makes a global tensor from a local one (the local tensor becomes
this rank's shard; with broadcast, the first rank's data is what every rank holds) or boxes a
global one; ``x.to_local()`` returns the shard. Autograd runs on the local shards: every global
op records a local node, boxing is a differentiable op, and a gradient arriving at a tensor of
SBP s has SBP dual(s) — which is boxed to the leaf's SBP (or ``grad_sbp``) at accumulation.

One program on every rank (docs/architecture.md, "Ranks outside a placement"): on a rank that
is not in a tensor's placement the tensor is *absent*: its local tensor is empty, its logical
shape, placement and SBP are known, ops on it skip their kernels (an ``absent`` node keeps the
autograd graph's shape, so a move's backward still runs on every rank it involves).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch

from ..core import grad_mode, interpret
from ..core.dispatch import fresh_copy, local_alias, run_local
from ..core.errors import HoloflowError, UnsupportedError
from ..core.registry import defop
from ..core.sbp import B
from ..core.tensor import Tensor, _repr_with
from . import env, world
from .boxing import apply_box
from .moves import move
from .sharding import check_placement, dual, local_shape, nd_str, normalize_sbp, shard_of, split_rule
from .placement import placement
from .placement_types import as_nd_sbp, as_placement


@dataclass(frozen=True)
class GlobalMeta:
    """What makes a tensor global: its placement, nd-SBP and logical shape. The class attribute
    ``interpreter`` (set in global_dispatch.py) evaluates ops on such tensors. ``strides``: the
    strides torch's whole tensor would have, known for what stands for a view (a view's are its
    base's, replayed through its chain of view ops: global_dispatch ``_views``), so a later view op
    decides view or copy as torch does; None for the others (dense, in the shard's order of dims)."""

    placement: placement
    sbp: tuple
    shape: torch.Size
    grad_sbp: tuple | None = None
    strides: tuple | None = field(default=None, compare=False, repr=False)
    interpreter: ClassVar[Any]

    def box_grad(self, t: Tensor, g: Tensor) -> Tensor:
        if g._global is not None and hasattr(g._global, "tracer"):  # traced: every rank holds the logical graph
            return g._global.leaf_grad(t, g)
        if self.placement.coords(world.rank()) is None:  # an absent leaf's gradient is absent too
            empty = absent_outputs((g,), (g._data.dtype,), True) if g._rg and grad_mode.STATE.enabled \
                else Tensor._make(torch.empty((0,), dtype=g._data.dtype, device=g._data.device))
            return make_global(empty, self.placement, self.grad_sbp or self.sbp, self.shape)
        if g._global is not None:  # a gradient traced as a logical global value has its own SBP
            return g._global.leaf_grad(t, g)
        return box_grad(t, g)

    def grad_view(self, g: Tensor) -> Tensor:
        """The local gradient ``g`` flowing to a tensor of this meta, as the global tensor it is
        this rank's piece of (SBP ``dual(sbp)``, no communication): what hooks and ``retain_grad``
        see, as OneFlow's hooks see global gradients."""
        if g._global is not None:
            return g
        return make_global(local_alias(g), self.placement, dual(self.sbp), self.shape)

    def grad_local(self, g: Tensor) -> Tensor:
        """A hook's returned gradient (global, of any SBP) back to the local piece backward
        continues with."""
        if g._global is None or hasattr(g._global, "tracer"):
            return g
        want = dual(self.sbp)
        if g._global.placement != self.placement or tuple(g.shape) != tuple(self.shape):
            raise HoloflowError(f"holoflow: a hook on a global tensor of shape {tuple(self.shape)} on "
                                f"{self.placement} returned a gradient of shape {tuple(g.shape)} on "
                                f"{g._global.placement}; return one like the gradient it was given")
        if g._global.sbp != want:
            g = g.to_global(sbp=want)
        return linked_alias(g)

    def leaf_grad(self, t: Tensor, g: Tensor) -> Tensor:
        """Gradient ``g`` (of this meta) of leaf ``t``, in the SBP ``t``'s ``.grad`` takes."""
        return self.box_to(g, t._global.grad_sbp or t._global.sbp)

    def box_to(self, t: Tensor, nd: tuple, grad_sbp=None) -> Tensor:
        """``t`` (of this meta) redistributed to ``nd`` on the same placement (an absent ``t``
        stays absent: nothing to send)."""
        r = world.rank()
        out = apply_box(t, self.placement, self.sbp, nd, self.shape, r, world.comm())
        if out is t:
            out = linked_alias(t)
        return make_global(out, self.placement, nd, self.shape, grad_sbp)

    def move_to(self, t: Tensor, place: placement, nd: tuple, grad_sbp=None) -> Tensor:
        """``t`` (of this meta) moved to another placement; differentiable (moves.py)."""
        out = move(t, self.placement, self.sbp, place, nd, self.shape, world.rank(), world.comm())
        return make_global(out, place, nd, self.shape, grad_sbp)

    def seed_grad(self, t: Tensor, g: Tensor | None) -> Tensor:
        return seed_grad(t, g)

    def full(self, t: Tensor) -> torch.Tensor:
        """The whole logical tensor on this rank, as OneFlow's ``numpy()``: boxed to broadcast on
        its placement, and when the placement leaves ranks out, moved to every rank of the world
        (a collective every rank calls: one program on every rank), so ``numpy()``, ``item()``
        and ``bool()`` answer on ranks outside the placement too."""
        ranks = world_ranks()
        # (a DeviceMesh's tensors follow torch: each rank's program holds its own sub-mesh's, so
        # ranks outside one hold other tensors; the whole value is gathered among its ranks only)
        if leaves_ranks_out(self.placement, ranks) and not self.placement.torch_conventions:
            every = placement(self.placement.type, list(ranks))
            with grad_mode.no_grad():
                out = move(t, self.placement, self.sbp, every, (B,), self.shape, world.rank(), world.comm())
            return out._data
        return self.gather(t)

    def gather(self, t: Tensor) -> torch.Tensor:
        """The whole logical tensor on ranks of the placement (a collective among them only)."""
        if all(s == B for s in self.sbp):
            return t._data
        r = world.rank()
        out = apply_box(local_alias(t).detach(), self.placement, self.sbp, (B,) * len(self.sbp),
                        self.shape, r, world.comm())
        return out._data

    def repr(self, t: Tensor) -> str:
        if self.placement.torch_conventions:   # torch's DTensor repr: this rank's shard
            placements = tuple(as_placement(s) for s in self.sbp)
            return (f"DTensor(local_tensor={local_alias(t).detach()!r}, device_mesh={self.placement!r}, "
                    f"placements={placements})")
        body = repr(self.gather(t).detach()) if self.placement.coords(world.rank()) is not None \
            else f"tensor(<not on this rank>, shape={tuple(self.shape)})"
        body = body[:-1] + f", placement={self.placement}, sbp={self.sbp})"
        return _repr_with(body, t)


def leaves_ranks_out(place: placement, ranks: tuple) -> bool:
    """Whether ``place`` lies inside this world of ``ranks`` and leaves some of them out."""
    return len(ranks) > len(place.flat_ranks) and max(place.flat_ranks) < len(ranks)


def world_ranks() -> tuple[int, ...]:
    """Every rank of this world (a simulated world's size, else the process group's)."""
    n = getattr(world.comm(), "world_size", None)
    return tuple(range(n if n is not None else env.get_world_size()))


def fresh(x: Tensor, strict: bool = False) -> None:
    """Re-derives what ``x`` reads when it stands for a view whose source changed since: ``x``
    itself as a :class:`CopyOf` (``dispatch.fresh_copy``), or the copy ``x`` is a view of (its
    storage takes the new values, so ``x``, aliasing it, reads them; its history follows)."""
    fresh_copy(x, strict)
    vi = x._view
    if vi is not None and "_copy_of" in vi.base.__dict__:
        fresh_copy(vi.base, strict)
    reads = x.__dict__.get("_reads_copy")   # a detach() of a view of such a copy (aliasing its storage)
    if reads is not None:
        fresh_copy(reads)


def make_global(local: Tensor, place: placement, nd: tuple, shape, grad_sbp=None) -> Tensor:
    local._global = GlobalMeta(place, nd, torch.Size(shape), grad_sbp)
    return local


# -- autograd links of conversions -------------------------------------------------------------

def _alias_grad(ctx, dy):
    return (dy,)


def _absent_kernel(*inputs, dtypes: tuple, device, single: bool, shapes: tuple | None = None, flat: bool = False):
    outs = tuple(torch.zeros(s, dtype=d, device=device) if shapes is not None else
                 torch.empty((0,), dtype=d, device=device) for d, s in zip(dtypes, shapes or dtypes))
    return outs[0] if single else outs


def _absent_grad(ctx, *dys):
    """Inputs of an op skipped on this rank get empty gradients (zeros for a real local input,
    whose value the op never read), so the backward pass still reaches every move. Under
    ``create_graph`` they are recorded against ``dys`` (an absent op again), so this rank's
    gradients require grad as the ranks' inside do and a double backward runs the same program.
    None where the op's rule gives none (``flat``: ``Op.grad_none``), as inside."""
    if ctx.attrs.get("flat"):
        return (None,) * len(ctx.shapes)
    dev = next(d._data.device for d in dys if d is not None)
    live = tuple(d for d in dys if d is not None)
    if not (grad_mode.STATE.enabled and any(d._rg for d in live)):
        return tuple(None if s is None else Tensor._make(torch.zeros(s, dtype=dt, device=dev))
                     for s, dt in zip(ctx.shapes, ctx.dtypes))
    at = [i for i, s in enumerate(ctx.shapes) if s is not None]
    # recorded against the op's inputs too, as a gradient inside reads them in general: stand-ins
    # with their edges (the kernel reads no input; nothing saved, so no version checks either)
    ins = []
    for e, shape, dt in zip(ctx.edges, ctx.shapes, ctx.dtypes):
        if type(e) is tuple:
            stand_in = Tensor._make(torch.zeros((), dtype=dt, device=dev).expand(tuple(shape)), e[0], e[1])
            stand_in._rg = True
            ins.append(stand_in)
        elif e is not None and e._rg:   # a leaf: itself
            ins.append(e)
    outs = run_local(ABSENT, live + tuple(ins), {"dtypes": tuple(ctx.dtypes[i] for i in at), "device": dev,
                                                 "single": False, "shapes": tuple(tuple(ctx.shapes[i]) for i in at)})
    got = dict(zip(at, outs))
    return tuple(got.get(i) for i in range(len(ctx.shapes)))


def _from_local_kernel(t, place, nd, rank, comm, shape, copy=False, broadcast=True):
    src = t
    for axis, s in enumerate(nd):  # broadcast axes take the first rank's data (OneFlow's rule)
        if s == B and broadcast:
            group = place.axis_group(rank, axis)
            t = comm.broadcast(t.contiguous(), group[0], group)
    return t.clone() if copy and t.untyped_storage().data_ptr() == src.untyped_storage().data_ptr() else t


def _from_local_grad(ctx, dy):
    """The local gradient arrives as dual(nd); the local tensor's gradient is its piece of the
    logical gradient: a split keeps its shard, a broadcast (partial sum) replica gets the whole
    (all-reduced, as OneFlow boxes it to the forward's SBP), a partial-sum piece the whole."""
    whole = tuple(s if hasattr(s, "axis") else B for s in ctx.nd)
    return (apply_box(dy, ctx.place, dual(ctx.nd), whole, ctx.shape, ctx.rank, ctx.comm),)


# a global tensor's local view linked to it in autograd (to_local, a no-op to_global of a leaf)
ALIAS = defop("global_alias", lambda t: t, grad=_alias_grad, family="boxing")
# what an op on tensors absent from this rank records: empty outputs, no kernel
ABSENT = defop("absent", _absent_kernel, grad=_absent_grad, family="boxing")
# a local tensor taken as this rank's component of a global one
FROM_LOCAL = defop("from_local", _from_local_kernel, grad=_from_local_grad, family="boxing")


def linked_alias(x: Tensor) -> Tensor:
    """A local view of global ``x`` whose gradient reaches ``x`` (a leaf too)."""
    if x._rg and x.grad_fn is None and grad_mode.STATE.enabled:
        return run_local(ALIAS, (x,), {})
    return local_alias(x)


def absent_outputs(inputs: tuple, dtypes: tuple, single: bool, flat: bool = False):
    """Empty local outputs of an op this rank skips, recorded against ``inputs`` (``flat``: giving
    them no gradient, as the op's rule)."""
    dev = next((x._data.device for x in inputs if isinstance(x, Tensor)), torch.device("cpu"))
    attrs = {"dtypes": tuple(dtypes), "device": dev, "single": single}
    return run_local(ABSENT, inputs, {**attrs, "flat": True} if flat else attrs)


def _from_local(x: Tensor, place: placement, nd: tuple, check_meta: bool, grad_sbp, copy: bool = False,
                broadcast: bool = True, shape: tuple | None = None) -> Tensor:
    """``x`` as this rank's component of a global tensor. ``broadcast=False`` (torch's
    ``DTensor.from_local`` without ``run_check``): broadcast axes keep each rank's own data, which
    the caller promises is the same everywhere. ``shape``: the logical shape, known to the caller
    (an uneven split's), taken without communication."""
    r = world.rank()
    data = x._data
    if place.coords(r) is None:  # absent here: the logical shape from this rank's local shape
        shape = shape or _outside_shape(tuple(data.shape), place, nd)
        out = absent_outputs((x,), (data.dtype,), True)
        return make_global(out, place, nd, shape, grad_sbp)
    comm = world.comm()
    # check_meta=False: the caller promises every rank's local shape and dtype are the same, so
    # the logical shape needs no communication (OneFlow's local_to_global)
    if shape is not None:
        check_meta = False
    else:
        shape = _outside_shape(tuple(data.shape), place, nd)
    if check_meta:
        shapes = comm.all_gather_shapes((tuple(data.shape), str(data.dtype)), place.flat_ranks)
        if len({(len(s), d) for s, d in shapes}) != 1:
            raise HoloflowError(f"holoflow.to_global: ranks disagree on the local tensor's rank or "
                                f"dtype: {dict(zip(place.flat_ranks, shapes))}")
        shape = _logical_shape(shapes, place, nd, check_meta)
    attrs = {"place": place, "nd": nd, "rank": r, "comm": comm, "shape": tuple(shape), "copy": copy,
             "broadcast": broadcast}
    out = run_local(FROM_LOCAL, (x,), attrs)
    return make_global(out, place, nd, shape, grad_sbp)


def from_local_replica(x: Tensor, place: placement) -> Tensor:
    """Local ``x`` as a broadcast global tensor of ``place``: every rank's own replica, trusted
    (no communication; its gradient is all-reduced, as a replica's)."""
    return _from_local(x, place, (B,) * place.ndim, False, None, broadcast=False)


def _outside_shape(local: tuple, place: placement, nd: tuple) -> list:
    """A rank outside the placement sees no shard: as OneFlow's one-program premise has every
    rank pass a local tensor of the same shape, a split dim is that size times its mesh axis."""
    shape = list(local)
    for axis, s in enumerate(nd):
        if hasattr(s, "axis"):
            shape[s.axis] *= place.hierarchy[axis]
    return shape


def _logical_shape(shapes: list, place: placement, nd: tuple, check: bool) -> list:
    """Logical shape from every rank's local shape: split dims add up along their mesh axis."""
    by_rank = dict(zip(place.flat_ranks, [s for s, _ in shapes]))
    r0 = place.flat_ranks[0]
    shape = list(by_rank[r0])
    for axis, s in enumerate(nd):
        if hasattr(s, "axis"):
            group = place.axis_group(r0, axis)
            shape[s.axis] = sum(by_rank[g][s.axis] for g in group)
    if check:
        for rk, got in by_rank.items():
            want = local_shape(shape, nd, place, rk)
            if tuple(got) != tuple(want):
                raise HoloflowError(
                    f"holoflow.to_global: rank {rk} holds a local tensor of shape {tuple(got)}, but "
                    f"a logical shape {tuple(shape)} with sbp {nd_str(nd)} on {place} gives it "
                    f"{tuple(want)}; {split_rule(place)}")
    return shape


def to_global(self: Tensor, placement=None, sbp=None, *, grad_sbp=None, check_meta: bool = True,
              copy: bool = False) -> Tensor:
    """Makes this tensor global (from a local shard) or converts a global one (boxing)."""
    if self._global is None:
        if placement is None or sbp is None:
            raise HoloflowError(f"holoflow.to_global: a local tensor (shape {tuple(self.shape)}) becomes global "
                                f"with both placement= and sbp=; got placement={placement!r}, sbp={sbp!r}")
        nd = normalize_sbp(sbp, placement, self.dim())
        gs = normalize_sbp(grad_sbp, placement, self.dim()) if grad_sbp is not None else None
        return _from_local(self, placement, nd, check_meta, gs, copy)
    fresh(self, strict=True)   # (a conversion reads it with autograd, as an op)
    g = self._global
    place = placement or g.placement
    check_placement(place)
    if sbp is None and len(g.sbp) != place.ndim:
        raise HoloflowError(f"holoflow.to_global: moving from a {g.placement.ndim}-D to a "
                            f"{place.ndim}-D placement {place} needs sbp= with {place.ndim} "
                            f"value(s); the source's sbp {nd_str(g.sbp)} doesn't fit the mesh")
    nd = normalize_sbp(sbp, place, self.dim()) if sbp is not None else g.sbp
    gs = normalize_sbp(grad_sbp, place, self.dim()) if grad_sbp is not None else None
    if gs is not None and self._rg and self.grad_fn is None and place == g.placement:
        # OneFlow: grad_sbp is the SBP of this tensor's gradient; a leaf's .grad takes it
        self._global = replace(g, grad_sbp=gs)
    if not hasattr(g, "tracer") and (place != g.placement or nd != g.sbp):
        # a parameter or buffer (a real global tensor) converted inside nn.Graph's build(): the
        # trace records the conversion of the live state, as it records ops reading it; boxing
        # it now would make a constant of this call's value that backward cannot pass through
        traced = interpret.current().convert_global(self, place, nd)
        if traced is not None:
            return traced
    if place != g.placement:
        out = g.move_to(self, place, nd, gs)
    elif nd == g.sbp and not copy and gs is None:
        return self
    else:
        out = g.box_to(self, nd, gs)
    # a new layout is a new tensor: a shard that came out as a view of this one's (B -> S is a local
    # slice, B -> P keeps rank 0's values) is copied, so a later in-place write to either tensor
    # never reaches the other; an empty slice too (its write would move this one's version on
    # some ranks only: autograd would then refuse a backward there alone)
    d = out._data
    if (copy or nd != g.sbp or place != g.placement) and (d.numel() or d._base is not None) and \
            d.untyped_storage().data_ptr() == self._data.untyped_storage().data_ptr():
        meta = out._global
        out = local_alias(out).clone()
        out._global = meta
    return out


def to_local(self: Tensor, *, copy: bool = False, grad_placements=None) -> Tensor:
    """This rank's shard as a local tensor (autograd continues through it, to a leaf too); an
    empty tensor on a rank outside the placement.

    The gradient arriving at the local tensor is taken, as OneFlow takes it, as this rank's piece
    of a gradient of SBP ``dual(sbp)`` (a broadcast tensor's replicas each contribute: their
    gradients are summed). On a :class:`DeviceMesh` (torch's DTensor conventions) it is taken as
    laid out like the tensor itself (a replica's gradient is the replicated gradient), as torch's
    ``DTensor.to_local``; ``grad_placements`` (placements or SBPs, one per mesh dimension) says
    how it is laid out instead."""
    if self._global is None:
        if grad_placements is not None:
            raise HoloflowError("holoflow.to_local: grad_placements= is for a global tensor (a DTensor); this "
                                "tensor is local")
        return self
    if hasattr(self._global, "tracer"):
        # a value traced inside nn.Graph's build(): the program computes logical tensors, so a
        # local alias would go on as the whole logical value (y.to_local().sum() summing every
        # rank's shard, unlike eager), silently
        g = self._global
        raise UnsupportedError(
            f"holoflow.to_local: inside nn.Graph's build(), the global tensor (shape {tuple(g.shape)}, sbp "
            f"{nd_str(g.sbp)} on {g.placement}) is a traced logical value, and a rank's shard of it is no "
            f"value of the graph's one program; return the global tensor from build() and call .to_local() "
            f"on the result, or keep computing on it globally (.to_global(sbp=...) to change its layout)")
    if interpret.is_lazy():
        # a parameter or buffer (live global state) inside nn.Graph's build(): its shard taken now
        # would be a constant of this rank's storage that backward cannot pass through (its
        # gradient went to .grad while tracing) and that a re-layout (ZeRO-3) leaves stale; the
        # graph's one program computes logical values, so it is refused as a traced value's is
        g = self._global
        raise UnsupportedError(
            f"holoflow.to_local: inside nn.Graph's build(), a global tensor made outside it (a parameter or "
            f"buffer; shape {tuple(g.shape)}, sbp {nd_str(g.sbp)} on {g.placement}) cannot become this rank's "
            f"local shard: "
            f"the graph's one program computes logical values, and a shard read while tracing would not be "
            f"trained through nor follow later re-layouts. Compute on it globally inside build() "
            f"(.to_global(sbp=...) to change its layout), or call .to_local() outside build()")
    fresh(self)
    g = self._global
    layout = None
    if grad_placements is not None or g.placement.torch_conventions:
        layout = as_nd_sbp(grad_placements if grad_placements is not None else g.sbp, g.placement.ndim,
                           len(g.shape), "to_local")
    if layout is None or layout == dual(g.sbp) or not (self._rg and grad_mode.STATE.enabled) or \
            g.placement.coords(world.rank()) is None:
        t = linked_alias(self)
    else:
        t = run_local(LOCAL_AS, (self,), {"place": g.placement, "nd": g.sbp, "layout": layout,
                                         "shape": tuple(g.shape), "rank": world.rank(), "comm": world.comm()})
    return t.clone() if copy else t


def _local_as_grad(ctx, dy):
    """The local gradient, laid out as ``layout`` says, as the piece of a ``dual(nd)`` gradient
    the global tensor's history takes (Replicate's gradient to partial sum: one rank's copy)."""
    return (apply_box(dy, ctx.place, ctx.layout, dual(ctx.nd), ctx.shape, ctx.rank, ctx.comm),)


# to_local whose gradient is laid out otherwise than dual(sbp) (torch's DTensor.to_local)
LOCAL_AS = defop("to_local_as", lambda t, place, nd, layout, shape, rank, comm: t, grad=_local_as_grad,
                 family="boxing")


def box_grad(self: Tensor, g: Tensor) -> Tensor:
    """A local gradient arriving at this leaf has SBP dual(sbp); box it to grad_sbp or sbp."""
    meta = self._global
    target = meta.grad_sbp or meta.sbp
    src = dual(meta.sbp)
    r = world.rank()
    out = apply_box(g, meta.placement, src, target, meta.shape, r, world.comm())
    if out is g:
        out = local_alias(g)  # keeps g's history (double backward)
    return make_global(out, meta.placement, target, meta.shape)


def seed_grad(t: Tensor, g: Tensor | None) -> Tensor:
    """Turns a gradient given for a global output (None: ones) into the local value backward
    starts from."""
    meta = t._global
    if meta.placement.coords(world.rank()) is None:  # absent: an empty seed reaches the moves
        if g is not None and g._global is not None and g._rg and not g._data.numel():
            return linked_alias(g)   # (double backward: linked to the seed, as inside)
        return Tensor._make(torch.empty((0,), dtype=t._data.dtype, device=t._data.device))
    if g is None:
        ones = torch.ones(tuple(meta.shape), dtype=t._data.dtype, device=t._data.device)
        g = from_full(ones, meta.placement, (B,) * len(meta.sbp))
    if g._global is None:
        raise HoloflowError(f"holoflow.backward: the gradient for a global tensor of shape {tuple(meta.shape)} "
                            f"(sbp {nd_str(meta.sbp)} on {meta.placement}) must be global on the same placement; "
                            f"got a local tensor of shape {tuple(g.shape)}: use gradient.to_global(placement, sbp)")
    g = to_global(g, meta.placement, None)
    out = apply_box(g, meta.placement, g._global.sbp, dual(meta.sbp), meta.shape, world.rank(),
                    world.comm())
    # (a gradient that is itself a leaf requiring grad, double backward's ``dy``, stays linked)
    return linked_alias(out) if out._global is not None else out


def from_full(data: torch.Tensor, place: placement, sbp) -> Tensor:
    """A global tensor from the logical tensor every rank computed identically (creation ops)."""
    nd = normalize_sbp(sbp, place, data.dim())
    r = world.rank()
    return make_global(Tensor._make(shard_of(data, nd, place, r)), place, nd, data.shape)


def install() -> None:
    Tensor.to_global = to_global
    Tensor.to_local = to_local
    Tensor.global_to_global = to_global
