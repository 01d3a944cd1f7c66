"""``nn.Module.to_global``: make every parameter and buffer of a module global, in place.

A freshly built module holds its full parameters on every rank (identical when every rank seeded
its generator the same way). ``to_global`` keeps each rank's shard of that full tensor — no
communication — and records the placement and SBP, so the module then runs global ops::

    model = GPT(...)                                     # same seed on every rank
    model.to_global(flow.placement("cpu", [0, 1]), flow.sbp.broadcast)
    model.to_global(sbp=lambda name, t: flow.sbp.split(0) if name.endswith("fc.weight") else B)

Parameters keep their identity (an optimizer built before still sees them, though it should be
built after: its state is not converted) and ``requires_grad``. A parameter that is already
global is boxed to the new SBP instead. Ranks holding different values (unseeded init) silently
give a tensor that is not what any rank holds; pass ``broadcast=True`` to copy the first rank's
values to every rank first (one broadcast per tensor).
"""
from __future__ import annotations

from typing import Callable, Union

from ..core.errors import HoloflowError
from ..core.sbp import SBP, B
from ..core.tensor import Tensor
from ..distributed import world
from ..distributed.global_tensor import GlobalMeta
from ..distributed.sharding import normalize_sbp, shard_of
from ..utils.global_view import current_global_mode
from .module import Module

SbpSpec = Union[SBP, tuple, list, Callable[[str, Tensor], object]]


def _convert(t: Tensor, place, sbp, broadcast: bool) -> tuple:
    """(local shard, GlobalMeta) of ``t`` under ``place``/``sbp``; ``t`` itself is untouched."""
    if t._global is not None:
        out = t.detach().to_global(place or t._global.placement, sbp)
        return out._data, out._global
    if place is None:
        raise HoloflowError("holoflow.nn.Module.to_global: the module holds local tensors, so "
                            "placement= is required, e.g. flow.placement('cpu', [0, 1])")
    nd = normalize_sbp(sbp, place, t.dim(), what="nn.Module.to_global")
    r = world.rank()
    if place.coords(r) is None:
        raise HoloflowError(f"holoflow.nn.Module.to_global: rank {r} is not in {place}; call it "
                            f"only on the placement's ranks {list(place.flat_ranks)}")
    full = t._data
    if broadcast:
        full = world.comm().broadcast(full.contiguous(), place.flat_ranks[0], place.flat_ranks)
    local = shard_of(full, nd, place, r)
    # a shard is a narrowed view of the full tensor: copy it so the full storage can be freed
    if local is not full and local.untyped_storage().data_ptr() == full.untyped_storage().data_ptr():
        local = local.clone()
    return local, GlobalMeta(place, nd, full.shape)


def _swap(t: Tensor, place, sbp, broadcast: bool) -> None:
    local, meta = _convert(t, place, sbp, broadcast)
    rg = t.requires_grad
    t._data, t._global = local, meta
    if t.grad is not None:  # a stale local gradient would mix with global ones
        t.grad = None
    if t.requires_grad != rg:
        t.requires_grad_(rg)


def module_to_global(self: Module, placement=None, sbp: SbpSpec | None = None, *,
                     broadcast: bool = False) -> Module:
    """Converts every parameter and buffer of this module to a global tensor, in place.

    ``sbp`` is one SBP (or nd-SBP tuple) for every tensor, or a function ``(name, tensor) ->
    sbp`` given each parameter's and buffer's dotted name (``"blocks.0.mlp.fc.weight"``). Local
    tensors are taken as the full logical tensor, identical on every rank (as after seeding);
    ``broadcast=True`` copies the first rank's values first. Global tensors are boxed. Tied
    parameters are converted once (with the first name they are reached by). Gradients are
    dropped. Missing placement/sbp come from an enclosing ``utils.global_view.global_mode``.
    Returns ``self``.
    """
    mode = current_global_mode()
    if mode.is_enabled:
        placement = placement if placement is not None else mode.placement
        sbp = sbp if sbp is not None else mode.sbp
    if sbp is None:
        raise HoloflowError("holoflow.nn.Module.to_global: sbp= is required: one SBP for every "
                            "tensor, or a function (name, tensor) -> sbp")
    seen: set[int] = set()
    for kind in ("_parameters", "_buffers"):
        for prefix, mod in self.named_modules(remove_duplicate=False):
            for name, t in getattr(mod, kind).items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                full_name = f"{prefix}.{name}" if prefix else name
                s = sbp(full_name, t) if callable(sbp) else sbp
                try:
                    _swap(t, placement, s, broadcast)
                except HoloflowError as e:
                    raise HoloflowError(f"{e} (while converting {full_name!r} of shape "
                                        f"{tuple(t.shape)})") from e
    return self


def module_to_local(self: Module) -> Module:
    """The inverse for tensors held broadcast: every global parameter/buffer becomes its full
    value on this rank (a gather where split; partial sums are reduced). In place."""
    for t in list(self.parameters()) + [b for b in self.buffers() if b is not None]:
        if t._global is None:
            continue
        full = t.detach().to_global(sbp=(B,) * t._global.placement.ndim)
        rg = t.requires_grad
        t._data, t._global = full._data, None
        t.grad = None
        if t.requires_grad != rg:
            t.requires_grad_(rg)
    return self


Module.to_global = module_to_global
Module.to_local = module_to_local
