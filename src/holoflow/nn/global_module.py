"""``nn.Module.to_global``: make every parameter and buffer of a module global, in place.

A freshly built module holds its full parameters on every rank. ``to_global`` takes the first
rank's values (a broadcast per tensor, as OneFlow's ``to_global`` of a local tensor does, so
replicas never differ silently), keeps each rank's shard of that full tensor and records the
placement and SBP, so the module then runs global ops::

    model = GPT(...)                                     # same seed on every rank
    model.to_global(flow.placement("cpu", [0, 1]), flow.sbp.broadcast)
    model.to_global(sbp=lambda name, t: flow.sbp.split(0) if name.endswith("fc.weight") else B)

Parameters keep their identity (an optimizer built before still sees them, though it should be
built after: its state is not converted) and ``requires_grad``. A parameter that is already
global is boxed (or moved) to the new placement and SBP instead. ``broadcast=False`` skips the
broadcast and checks instead that every rank holds the same values (a checksum per tensor),
raising if they differ. A rank outside the placement keeps an empty local tensor (one program on
every rank: docs/architecture.md, "Ranks outside a placement").
"""
from __future__ import annotations

from typing import Callable, Union

import zlib

import torch

from ..core.errors import HoloflowError
from ..core.sbp import SBP
from ..core.tensor import Tensor
from ..distributed import world
from ..distributed.global_tensor import GlobalMeta
from ..distributed.sharding import normalize_sbp, shard_of
from ..utils.global_view import current_global_mode
from .module import Module

SbpSpec = Union[SBP, tuple, list, Callable[[str, Tensor], object]]


def _sbp_required() -> HoloflowError:
    return HoloflowError("holoflow.nn.Module.to_global: sbp= is required: one SBP for every tensor, "
                         "or a function (name, tensor) -> sbp (a module of global tensors may keep "
                         "its SBPs and move with placement= alone)")


def _convert(t: Tensor, place, sbp, broadcast: bool) -> tuple:
    """(local shard, GlobalMeta) of ``t`` under ``place``/``sbp``; ``t`` itself is untouched."""
    if t._global is not None:
        out = t.detach().to_global(place or t._global.placement, sbp)
        return out._data, out._global
    if place is None:
        raise HoloflowError("holoflow.nn.Module.to_global: the module holds local tensors, so "
                            "placement= is required, e.g. flow.placement('cpu', [0, 1])")
    if sbp is None:
        raise _sbp_required()
    nd = normalize_sbp(sbp, place, t.dim(), what="nn.Module.to_global")
    r = world.rank()
    full = t._data
    if place.coords(r) is None:  # absent here: no shard, no communication
        return full.new_empty((0,)), GlobalMeta(place, nd, full.shape)
    if broadcast:
        full = world.comm().broadcast(full.contiguous(), place.flat_ranks[0], place.flat_ranks)
    else:
        _check_identical(full, place)
    local = shard_of(full, nd, place, r)
    # a shard is a narrowed view of the full tensor: copy it so the full storage can be freed
    if local is not full and local.untyped_storage().data_ptr() == full.untyped_storage().data_ptr():
        local = local.clone()
    return local, GlobalMeta(place, nd, full.shape)


def _check_identical(full: torch.Tensor, place) -> None:
    """Every rank of ``place`` holds the same ``full`` tensor, or a clear error (no silent drift)."""
    d = full.detach().contiguous().view(-1)
    mine = (tuple(full.shape), zlib.crc32(d.view(torch.uint8).numpy()) if d.device.type == "cpu"
            else float(d.double().sum()))
    got = world.comm().all_gather_shapes(mine, place.flat_ranks)
    if len(set(got)) != 1:
        differ = [rk for rk, g in zip(place.flat_ranks, got) if g != got[0]]
        raise HoloflowError(f"holoflow.nn.Module.to_global: with broadcast=False every rank of {place} "
                            f"must hold the same values, but ranks {differ} differ from rank "
                            f"{place.flat_ranks[0]}; seed every rank alike or pass broadcast=True")


def _swap(t: Tensor, place, sbp, broadcast: bool) -> None:
    local, meta = _convert(t, place, sbp, broadcast)
    rg = t.requires_grad
    t._data, t._global = local, meta
    if t.grad is not None:  # a stale local gradient would mix with global ones
        t.grad = None
    if t.requires_grad != rg:
        t.requires_grad_(rg)


def module_to_global(self: Module, placement=None, sbp: SbpSpec | None = None, *,
                     broadcast: bool = True) -> Module:
    """Converts every parameter and buffer of this module to a global tensor, in place.

    ``sbp`` is one SBP (or nd-SBP tuple) for every tensor, or a function ``(name, tensor) ->
    sbp`` given each parameter's and buffer's dotted name (``"blocks.0.mlp.fc.weight"``). Local
    tensors are taken as the full logical tensor, the first rank's values broadcast to the others
    (``broadcast=False``: checked identical instead). Global tensors are boxed or moved. Tied
    parameters are converted once (with the first name they are reached by). Gradients are
    dropped. Missing placement/sbp come from an enclosing ``utils.global_view.global_mode``.
    Returns ``self``.
    """
    mode = current_global_mode()
    if mode.is_enabled:
        placement = placement if placement is not None else mode.placement
        sbp = sbp if sbp is not None else mode.sbp
    if sbp is None and placement is None:
        raise _sbp_required()
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
    """Every global parameter/buffer becomes its local tensor on this rank, in place, as
    OneFlow's ``Module.to_local`` (``t.to_local()``): this rank's shard (a broadcast tensor's
    whole value; empty on a rank outside the placement). No communication."""
    for t in list(self.parameters()) + [b for b in self.buffers() if b is not None]:
        if t._global is None:
            continue
        rg = t.requires_grad
        t._data, t._global = t._data, None
        t.grad = None
        if t.requires_grad != rg:
            t.requires_grad_(rg)
    return self


Module.to_global = module_to_global
Module.to_local = module_to_local
