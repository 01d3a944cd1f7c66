"""Boxing: converting a global tensor between nd-SBPs (docs/architecture.md, "Boxing").

``plan(shape, src, dst, placement)`` is a small, cached planner returning steps; each step is
one collective over the ranks that vary along one mesh axis (or a free local slice). The
``BOX`` op runs a plan on a local shard; its gradient is a box back between the dual SBPs
(broadcast and partial_sum swap), so boxing is differentiable.

Per-axis steps are used when the dims they touch are not split by another mesh axis (so the
hierarchical split can't interfere); otherwise the plan gathers to broadcast innermost axis
first (always correct) and then slices locally to the target (free).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import torch

from ..core.dispatch import run_local
from ..core.registry import defop
from ..core.views import dense_layout
from ..core.sbp import B, P, S
from .sharding import dual, local_ranges, piece, shard_of
from .placement import placement


@dataclass(frozen=True)
class Step:
    kind: str            # all_gather | all_reduce | reduce_scatter | all_to_all | slice | zero | pad | reshard
    axis: int            # mesh axis (-1 for reshard)
    dim: int = -1        # tensor dim split before (all_gather, all_to_all, pad) or after (slice, reduce_scatter)
    dim2: int = -1       # all_to_all: the dim split after
    src: tuple = ()      # nd-SBP before the step
    dst: tuple = ()      # nd-SBP after the step

    @property
    def collective(self) -> bool:
        """Whether the step talks to other ranks (slice, zero, pad and reshard are local)."""
        return self.kind in COLLECTIVE_KINDS

    def __repr__(self) -> str:
        return f"{self.kind}(axis={self.axis}{'' if self.dim < 0 else f', dim={self.dim}'})"


COLLECTIVE_KINDS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all")


def _axis_step(axis: int, a, b, cur: tuple) -> Step:
    new = cur[:axis] + (b,) + cur[axis + 1:]
    if isinstance(a, S) and b == B:
        return Step("all_gather", axis, a.axis, src=cur, dst=new)
    if a == P and b == B:
        return Step("all_reduce", axis, src=cur, dst=new)
    if a == P and isinstance(b, S):
        return Step("reduce_scatter", axis, b.axis, src=cur, dst=new)
    if isinstance(a, S) and isinstance(b, S):
        return Step("all_to_all", axis, a.axis, b.axis, src=cur, dst=new)
    if a == B and isinstance(b, S):
        return Step("slice", axis, b.axis, src=cur, dst=new)
    if a == B and b == P:
        return Step("zero", axis, src=cur, dst=new)
    if isinstance(a, S) and b == P:   # the shard in place, zeros around it (OneFlow's symmetric S -> P)
        return Step("pad", axis, a.axis, src=cur, dst=new)
    raise ValueError(f"no single step for {a} -> {b}")


def _dims(s) -> set:
    return {s.axis} if isinstance(s, S) else set()


@functools.lru_cache(maxsize=4096)
def plan(src: tuple, dst: tuple, hierarchy: tuple) -> tuple[Step, ...]:
    """Steps converting nd-SBP ``src`` to ``dst`` on a mesh of shape ``hierarchy``."""
    if src == dst:
        return ()
    diff = [k for k in range(len(src)) if src[k] != dst[k]]
    safe = all(not ((_dims(src[k]) | _dims(dst[k])) &
                    set().union(*(_dims(src[j]) | _dims(dst[j]) for j in range(len(src)) if j != k)))
               for k in diff)
    if safe:
        steps, cur = [], src
        # communication first on partial axes shrinks nothing; slices last keep gathers small
        order = sorted(diff, key=lambda k: (src[k] == B, k))
        for k in order:
            st = _axis_step(k, cur[k], dst[k], cur)
            steps.append(st)
            cur = st.dst
        return tuple(steps)
    steps, cur = [], src
    for k in reversed(range(len(src))):  # innermost first: each gather rebuilds the outer piece
        if cur[k] != B:
            st = _axis_step(k, cur[k], B, cur)
            steps.append(st)
            cur = st.dst
    if dst != cur:
        steps.append(Step("reshard", -1, src=cur, dst=dst))
    return tuple(steps)


# -- running a plan on this rank's shard ------------------------------------------------------

def sizes_along(shape, nd, place: placement, rank: int, axis: int, dim: int) -> list[int]:
    """Local sizes along ``dim`` of every member of ``rank``'s group on mesh ``axis``."""
    coords = list(place.coords(rank))
    sizes = []
    for c in range(place.hierarchy[axis]):
        coords[axis] = c
        sizes.append(local_ranges(shape, nd, place, coords)[dim][1])
    return sizes


def run_step(t: torch.Tensor, step: Step, shape, place: placement, rank: int, comm) -> torch.Tensor:
    kind, axis = step.kind, step.axis
    if kind == "reshard":
        return shard_of(t, step.dst, place, rank).contiguous()
    coords = place.coords(rank)
    group = place.axis_group(rank, axis)
    if kind == "all_gather":
        return comm.all_gather(t, group, step.dim, sizes_along(shape, step.src, place, rank, axis, step.dim))
    if kind == "all_reduce":
        return comm.all_reduce(t, group)
    if kind == "reduce_scatter":
        return comm.reduce_scatter(t, group, step.dim,
                                   sizes_along(shape, step.dst, place, rank, axis, step.dim))
    if kind == "all_to_all":
        n = t.shape[step.dim2]
        chunks = [t.narrow(step.dim2, *piece(n, place, axis, c)) for c in range(place.hierarchy[axis])]
        mine = piece(n, place, axis, coords[axis])[1]   # (comm packs the chunks)
        shapes = []
        for c in range(place.hierarchy[axis]):  # member c's shard (before the step) narrowed to my chunk of dim2
            member = list(coords)
            member[axis] = c
            s_ = [sz for _, sz in local_ranges(shape, step.src, place, member)]
            s_[step.dim2] = mine
            shapes.append(tuple(s_))
        got = comm.all_to_all(chunks, group, shapes)
        return _cat(got, step.dim)
    if kind == "slice":
        return t.narrow(step.dim, *piece(t.shape[step.dim], place, axis, coords[axis]))
    if kind == "zero":
        return t if coords[axis] == 0 else torch.zeros_like(t)
    if kind == "pad":   # every member's shard at its place in zeros: their sum is the whole
        sizes = sizes_along(shape, step.src, place, rank, axis, step.dim)
        out = t.new_zeros(t.shape[:step.dim] + (sum(sizes),) + t.shape[step.dim + 1:])
        out.narrow(step.dim, sum(sizes[:coords[axis]]), sizes[coords[axis]]).copy_(t)
        return out
    raise AssertionError(kind)


def _cat(parts: list, dim: int) -> torch.Tensor:
    """``torch.cat(parts, dim)``, or a view when they already lie back to back along dim 0."""
    first = parts[0]
    if dim == 0 and len(parts) > 1 and all(x.is_contiguous() for x in parts) and all(
            x.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for x in parts):
        size = first.element_size()
        if all(b.data_ptr() == a.data_ptr() + a.numel() * size for a, b in zip(parts, parts[1:])):
            rows = sum(x.shape[0] for x in parts)
            return first.as_strided((rows,) + tuple(first.shape[1:]), first.stride())
    return torch.cat(parts, dim=dim)


def run_plan(t: torch.Tensor, place: placement, src: tuple, dst: tuple, shape, rank: int, comm) -> torch.Tensor:
    """This rank's shard ``t`` (a torch tensor) boxed from ``src`` to ``dst``: the plan's steps.
    The result keeps the shard's layout (its dims in the same stride order) where that order is
    plain: torch's tensor never moved, so an op after the boxing (an elementwise op keeps its
    input's layout) lays its output out as torch's does, and a ``reshape`` of that output copies
    where torch's copies (``b.t().tanh().reshape(-1)`` of a partial sum ``b``)."""
    order = _dim_order(t)
    for step in plan(src, dst, place.hierarchy):
        t = run_step(t, step, shape, place, rank, comm)
    if order is not None and t.dim() == len(order) and not _laid_out(t, order):
        t = t.permute(order).contiguous().permute(sorted(range(len(order)), key=order.__getitem__))
    return t


def _dim_order(t: torch.Tensor) -> tuple | None:
    """A dense, non-contiguous tensor's dims from outermost to innermost (a permutation of a
    contiguous layout), where every dim's size makes the order unambiguous; else None."""
    if t.is_contiguous() or any(n <= 1 for n in t.shape) or not dense_layout(t.shape, t.stride()):
        return None
    return tuple(sorted(range(t.dim()), key=lambda d: -t.stride(d)))


def _laid_out(t: torch.Tensor, order: tuple) -> bool:
    return t.permute(order).is_contiguous()


def _box_grad(ctx, dy):
    return (apply_box(dy, ctx.place, dual(ctx.dst), dual(ctx.src), ctx.shape, ctx.rank, ctx.comm),)


BOX = defop("box", run_plan, grad=_box_grad, family="boxing")


def apply_box(local, place: placement, src: tuple, dst: tuple, shape: Sequence[int], rank: int, comm):
    """Boxes a local shard (a holoflow Tensor) from ``src`` to ``dst``; differentiable. A rank
    outside ``place`` holds no shard: nothing to box (its empty tensor is returned as is)."""
    if src == dst or place.coords(rank) is None:
        return local
    return run_local(BOX, (local,), {"place": place, "src": src, "dst": dst, "shape": tuple(shape),
                                     "rank": rank, "comm": comm})


def cost(src: tuple, dst: tuple, hierarchy: tuple, nbytes: int) -> float:
    """Bytes over links for boxing (docs/architecture.md, "SBP and the global view"): S->B and
    P->S T(p-1), P->B 2T(p-1), S(i)->S(j) T(p-1)/p, B->S and B->P free; T is the tensor's bytes
    per rank at that level."""
    total, level = 0.0, float(nbytes)
    for step in plan(src, dst, hierarchy):
        if step.kind == "reshard":
            continue
        p = hierarchy[step.axis]
        t = level / p
        total += {"all_gather": t * (p - 1), "reduce_scatter": t * (p - 1),
                  "all_reduce": 2 * t * (p - 1), "all_to_all": t * (p - 1) / p}.get(step.kind, 0.0)
    return total
