"""Global tensors: a Tensor whose ``_data`` is this rank's shard and whose ``_global`` says how
the logical tensor maps onto the placement (docs/architecture.md, "SBP and the global view").

``x.to_global(placement, sbp)`` makes a global tensor from a local one (the local tensor becomes
this rank's shard; with broadcast, the first rank's data is what every rank holds) or boxes a
global one; ``x.to_local()`` returns the shard. Autograd runs on the local shards: every global
op records a local node, boxing is a differentiable op, and a gradient arriving at a tensor of
SBP s has SBP dual(s) — which is boxed to the leaf's SBP (or ``grad_sbp``) at accumulation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..core.dispatch import local_alias
from ..core.errors import HoloflowError
from ..core.sbp import B, P
from ..core.tensor import Tensor, _repr_with
from . import world
from .boxing import apply_box
from .sharding import dual, local_shape, nd_str, normalize_sbp, shard_of
from .placement import placement


@dataclass(frozen=True)
class GlobalMeta:
    """What makes a tensor global: its placement, nd-SBP and logical shape. The class attribute
    ``interpreter`` (set in global_dispatch.py) evaluates ops on such tensors."""

    placement: placement
    sbp: tuple
    shape: torch.Size
    grad_sbp: tuple | None = None
    interpreter: ClassVar[Any]

    def box_grad(self, t: Tensor, g: Tensor) -> Tensor:
        if g._global is not None:  # a gradient traced as a logical global value has its own SBP
            return g._global.leaf_grad(t, g)
        return box_grad(t, g)

    def leaf_grad(self, t: Tensor, g: Tensor) -> Tensor:
        """Gradient ``g`` (of this meta) of leaf ``t``, in the SBP ``t``'s ``.grad`` takes."""
        return self.box_to(g, t._global.grad_sbp or t._global.sbp)

    def box_to(self, t: Tensor, nd: tuple, grad_sbp=None) -> Tensor:
        """``t`` (of this meta) redistributed to ``nd`` on the same placement."""
        r = _check_rank(self.placement, "to_global")
        out = apply_box(t, self.placement, self.sbp, nd, self.shape, r, world.comm())
        if out is t:
            out = local_alias(t)
        return make_global(out, self.placement, nd, self.shape, grad_sbp)

    def seed_grad(self, t: Tensor, g: Tensor | None) -> Tensor:
        return seed_grad(t, g)

    def full(self, t: Tensor) -> torch.Tensor:
        """The whole logical tensor on this rank (boxes a copy to broadcast)."""
        if all(s == B for s in self.sbp):
            return t._data
        r = world.rank()
        out = apply_box(local_alias(t).detach(), self.placement, self.sbp, (B,) * len(self.sbp),
                        self.shape, r, world.comm())
        return out._data

    def repr(self, t: Tensor) -> str:
        body = repr(self.full(t).detach()) if self.placement.coords(world.rank()) is not None \
            else f"tensor(<not on this rank>, shape={tuple(self.shape)})"
        body = body[:-1] + f", placement={self.placement}, sbp={self.sbp})"
        return _repr_with(body, t)


def make_global(local: Tensor, place: placement, nd: tuple, shape, grad_sbp=None) -> Tensor:
    local._global = GlobalMeta(place, nd, torch.Size(shape), grad_sbp)
    return local


def _check_rank(place: placement, what: str) -> int:
    r = world.rank()
    if place.coords(r) is None:
        raise HoloflowError(f"holoflow.{what}: rank {r} is not in {place}; only its ranks "
                            f"{list(place.flat_ranks)} hold shards")
    return r


def _from_local(x: Tensor, place: placement, nd: tuple, check_meta: bool, grad_sbp) -> Tensor:
    r = world.rank()
    data = x._data
    if place.coords(r) is None:
        raise HoloflowError(f"holoflow.to_global: rank {r} is not in {place}; create the local "
                            f"tensor only on its ranks {list(place.flat_ranks)}")
    comm = world.comm()
    shape = list(data.shape)
    if check_meta or any(not (s == B or s == P) for s in nd):
        shapes = comm.all_gather_shapes((tuple(data.shape), str(data.dtype)), place.flat_ranks)
        if check_meta and len({(len(s), d) for s, d in shapes}) != 1:
            raise HoloflowError(f"holoflow.to_global: ranks disagree on the local tensor's rank or "
                                f"dtype: {dict(zip(place.flat_ranks, shapes))}")
        shape = _logical_shape(shapes, place, nd, check_meta)
    if any(s == B for s in nd):
        for axis, s in enumerate(nd):
            if s == B:
                group = place.axis_group(r, axis)
                data = comm.broadcast(data.contiguous(), group[0], group)
    out = Tensor._make(data, x.grad_fn if data is x._data else None, x._out_idx)
    out._rg = x._rg
    return make_global(out, place, nd, shape, grad_sbp)


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
                    f"{tuple(want)}; shards must be balanced (the first n % p ranks one larger)")
    return shape


def to_global(self: Tensor, placement=None, sbp=None, *, grad_sbp=None, check_meta: bool = True,
              copy: bool = False) -> Tensor:
    """Makes this tensor global (from a local shard) or converts a global one (boxing)."""
    if self._global is None:
        if placement is None or sbp is None:
            raise HoloflowError("holoflow.to_global: a local tensor needs both placement= and sbp=")
        nd = normalize_sbp(sbp, placement, self.dim())
        gs = normalize_sbp(grad_sbp, placement, self.dim()) if grad_sbp is not None else None
        return _from_local(self, placement, nd, check_meta, gs)
    g = self._global
    place = placement or g.placement
    if sbp is None and len(g.sbp) != place.ndim:
        raise HoloflowError(f"holoflow.to_global: moving from a {g.placement.ndim}-D to a "
                            f"{place.ndim}-D placement {place} needs sbp= with {place.ndim} "
                            f"value(s); the source's sbp {nd_str(g.sbp)} doesn't fit the mesh")
    nd = normalize_sbp(sbp, place, self.dim()) if sbp is not None else g.sbp
    gs = normalize_sbp(grad_sbp, place, self.dim()) if grad_sbp is not None else None
    if place != g.placement:
        return _move(self, place, nd, gs)
    if nd == g.sbp and not copy and gs is None:
        return self
    return g.box_to(self, nd, gs)


def _move(x: Tensor, place: placement, nd: tuple, gs) -> Tensor:
    """Between placements: gather to broadcast on the source, hand the whole tensor to the
    destination ranks, shard there. (Not differentiable yet: it detaches, and says so.)"""
    from .moves import move
    return move(x, place, nd, gs)


def to_local(self: Tensor, *, copy: bool = False) -> Tensor:
    """This rank's shard as a local tensor (autograd continues through it)."""
    if self._global is None:
        return self
    _check_rank(self._global.placement, "to_local")
    t = local_alias(self)
    return t.clone() if copy else t


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
    if g is None:
        ones = torch.ones(tuple(meta.shape), dtype=t._data.dtype, device=t._data.device)
        g = from_full(ones, meta.placement, (B,) * len(meta.sbp))
    if g._global is None:
        raise HoloflowError("holoflow.backward: the gradient for a global tensor must be global "
                            "(same placement); use gradient.to_global(...)")
    g = to_global(g, meta.placement, None)
    out = apply_box(g, meta.placement, g._global.sbp, dual(meta.sbp), meta.shape, world.rank(),
                    world.comm())
    return local_alias(out) if out._global is not None else out


def from_full(data: torch.Tensor, place: placement, sbp) -> Tensor:
    """A global tensor from the logical tensor every rank computed identically (creation ops)."""
    nd = normalize_sbp(sbp, place, data.dim())
    r = world.rank()
    return make_global(Tensor._make(shard_of(data, nd, place, r)), place, nd, data.shape)


def install() -> None:
    Tensor.to_global = to_global
    Tensor.to_local = to_local
    Tensor.global_to_global = to_global
