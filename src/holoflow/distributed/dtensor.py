"""torch's DTensor API on holoflow's global tensors (what ``torch.distributed.tensor`` gives a
PyTorch script under mock_torch, with the module-level parts in ``holoflow.dtensor``).

A DTensor is a global tensor on a :class:`~.device_mesh.DeviceMesh`: ``placements`` are its SBP
(``Shard(d)`` = ``split(d)``, ``Replicate()`` = ``broadcast``, ``Partial()`` = ``partial_sum``), ops
on it are holoflow's global ops (the SBP each op chooses, the boxing it inserts), and the logical
values are the same as torch's. Where the two conventions differ, a tensor on a DeviceMesh takes
torch's: ``to_local()``'s gradient is laid out like the tensor (global_tensor.to_local),
``from_local`` without ``run_check`` trusts each rank's replica (no broadcast), ``distribute_tensor``
of a ``Partial`` placement divides the value among the ranks, ``repr`` shows this rank's shard,
and uneven shards are ``torch.chunk``'s pieces (the last ones short or empty), so ``to_local()``
shapes are torch's (``sharding.piece``).
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import torch

from ..core import grad_mode
from ..core.errors import HoloflowError
from ..core.sbp import B, P
from ..core.tensor import Tensor
from ..ops import creation
from . import world
from .device_mesh import DeviceMesh, _check_mesh
from .global_dispatch import IMPLICIT_REPLICATION
from .global_tensor import _from_local, make_global, to_global, to_local
from .placement import placement
from .placement_types import Partial, Placement, Replicate, Shard, as_nd_sbp, as_placement
from .sharding import shard_of

__all__ = ["DTensor", "Placement", "Shard", "Replicate", "Partial", "distribute_tensor", "zeros", "ones", "empty",
           "full", "rand", "randn", "implicit_replication"]


class _DTensorType(type):
    """``isinstance(x, DTensor)``: whether ``x`` is a global tensor."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Tensor) and obj._global is not None


class DTensor(metaclass=_DTensorType):
    """torch's DTensor: a holoflow Tensor that is global. Made by :func:`distribute_tensor`,
    :meth:`from_local` or the factories (``zeros(..., device_mesh=, placements=)``); its methods
    (``to_local``, ``redistribute``, ``full_tensor``, ``placements``, ``device_mesh``) are the
    Tensor's."""

    def __new__(cls, *args, **kwargs):
        raise TypeError("holoflow: make a DTensor with DTensor.from_local(local, mesh, placements), "
                        "distribute_tensor(tensor, mesh, placements) or the DTensor factories")

    @staticmethod
    def from_local(local_tensor: Tensor, device_mesh: DeviceMesh | None = None,
                   placements: Sequence[Placement] | None = None, *, run_check: bool = False,
                   shape=None, stride=None) -> Tensor:
        """``local_tensor`` as this rank's piece of a DTensor (differentiable). Without
        ``run_check`` every rank's replica is trusted to be the same and the logical shape comes
        from this rank's (even shards); ``run_check`` compares the ranks' shapes and broadcasts
        replicas from each mesh dimension's first rank, as torch does."""
        mesh = _check_mesh(device_mesh, "DTensor.from_local")
        if not isinstance(local_tensor, Tensor):
            raise TypeError(f"holoflow.DTensor.from_local: expected a Tensor, got {type(local_tensor).__name__}")
        if local_tensor._global is not None:
            raise HoloflowError("holoflow.DTensor.from_local: the tensor is already a DTensor (global); use "
                                ".redistribute(mesh, placements) to change its layout")
        placements = placements if placements is not None else [Replicate()] * mesh.ndim
        nd = as_nd_sbp(placements, mesh.ndim, local_tensor.dim(), "DTensor.from_local")
        out = _from_local(local_tensor, mesh, nd, run_check or shape is not None, None, broadcast=run_check)
        if shape is not None and tuple(out.shape) != tuple(shape):
            raise HoloflowError(f"holoflow.DTensor.from_local: the ranks' local shapes make a tensor of shape "
                                f"{tuple(out.shape)}, not the given {tuple(shape)}")
        return out


def distribute_tensor(tensor: Tensor, device_mesh: DeviceMesh | None = None,
                      placements: Sequence[Placement] | None = None, *, src_data_rank: int | None = 0) -> Tensor:
    """A leaf DTensor whose logical value is ``tensor`` as the mesh's first rank holds it
    (``src_data_rank=0``: broadcast from each dimension's first rank; ``None``: each rank's own
    ``tensor``, no communication); ``requires_grad`` as ``tensor``'s."""
    mesh = _check_mesh(device_mesh, "distribute_tensor")
    placements = tuple(placements) if placements is not None else (Replicate(),) * mesh.ndim
    nd = as_nd_sbp(placements, mesh.ndim, tensor.dim(), "distribute_tensor")
    if tensor._global is not None:
        if tensor._global.placement != mesh:
            raise ValueError(f"holoflow.distribute_tensor: cannot distribute a DTensor on {tensor._global.placement!r} "
                             f"to a different device mesh {mesh!r}")
        if tensor._global.sbp != nd:
            raise ValueError(f"holoflow.distribute_tensor: cannot distribute a DTensor with placements "
                             f"{tensor.placements} to different placements {placements}; do you want to call "
                             f"redistribute instead?")
        return tensor
    if src_data_rank not in (0, None):
        raise HoloflowError(f"holoflow.distribute_tensor: src_data_rank={src_data_rank!r}; holoflow takes the data "
                            f"of each mesh dimension's first rank (0) or each rank's own (None)")
    whole = tuple(B if s == P else s for s in nd)
    with grad_mode.no_grad():
        data = tensor.detach()._data.to(mesh.device_for(world.rank()))
        if src_data_rank == 0 and mesh.coords(world.rank()) is not None:
            data = _from_local(Tensor._make(data), mesh, (B,) * mesh.ndim, False, None)._data
        local = shard_of(data, whole, mesh, world.rank()) if mesh.coords(world.rank()) is not None \
            else data.new_empty((0,))
        pieces = math.prod(n for n, s in zip(mesh.hierarchy, nd) if s == P)
        if pieces > 1:   # torch's Partial of a whole value: every rank an equal share
            local = local / pieces
    out = make_global(Tensor._make(local.clone() if local.data_ptr() == tensor._data.data_ptr() else local),
                      mesh, nd, tensor.shape)
    out.requires_grad_(tensor.requires_grad)
    return out


def redistribute(self: Tensor, device_mesh: DeviceMesh | None = None, placements: Sequence[Placement] | None = None,
                 *, async_op: bool = False, forward_dtype=None, backward_dtype=None) -> Tensor:
    """This DTensor laid out as ``placements`` (differentiable; holoflow's boxing). As torch, a
    placement cannot become ``Partial`` (that is for ops' own outputs)."""
    g = _global_of(self, "redistribute")
    # (without a mesh, the tensor's own placement: a OneFlow placement's tensor keeps its conventions)
    mesh = g.placement if device_mesh is None else \
        device_mesh if isinstance(device_mesh, placement) else _check_mesh(device_mesh, "redistribute")
    nd = as_nd_sbp(placements if placements is not None else self.placements, mesh.ndim, self.dim(),
                   "redistribute")
    src = g.sbp if mesh.ndim == len(g.sbp) else (None,) * mesh.ndim
    for before, after in zip(src, nd):
        if after == P and before != P:
            was = as_placement(before) if before is not None else "another mesh's layout"
            raise RuntimeError(f"holoflow.redistribute: cannot redistribute from {was} "
                               f"to Partial(sum): redistributing to Partial is for ops' own outputs (torch refuses "
                               f"it too); redistribute to Replicate() or Shard(d)")
    if backward_dtype is not None:
        raise HoloflowError("holoflow.redistribute: backward_dtype= is not supported; cast the gradient in a hook")
    x = self.to(forward_dtype) if forward_dtype is not None else self
    return to_global(x, placement=mesh if mesh != g.placement else g.placement, sbp=nd)


def full_tensor(self: Tensor, *, grad_placements: Sequence[Placement] | None = None) -> Tensor:
    """The whole logical tensor as a local tensor on every rank (an all-gather / all-reduce);
    its gradient is taken as replicated (every rank computed the same), as torch's."""
    g = _global_of(self, "full_tensor")
    whole = to_global(self, sbp=(B,) * len(g.sbp))
    return to_local(whole, grad_placements=grad_placements if grad_placements is not None else (B,) * len(g.sbp))


@contextlib.contextmanager
def implicit_replication() -> Iterator[None]:
    """torch's ``implicit_replication()``: inside, a local tensor among a global op's operands is
    taken as every rank's replica (``Replicate()``, no communication) instead of refused."""
    was = getattr(IMPLICIT_REPLICATION, "on", False)
    IMPLICIT_REPLICATION.on = True
    try:
        yield
    finally:
        IMPLICIT_REPLICATION.on = was


def _global_of(t: Tensor, op: str):
    if t._global is None:
        raise AttributeError(f"holoflow.{op}: the tensor is local (not a DTensor); make one with "
                             f"DTensor.from_local(t, mesh, placements) or distribute_tensor(t, mesh, placements)")
    return t._global


def _placements(self: Tensor) -> tuple:
    if self._global is None:
        raise AttributeError("'Tensor' object has no attribute 'placements' (a local tensor: DTensors have them)")
    return tuple(as_placement(s) for s in self._global.sbp)


def _device_mesh(self: Tensor) -> DeviceMesh:
    if self._global is None:
        raise AttributeError("'Tensor' object has no attribute 'device_mesh' (a local tensor: DTensors have one)")
    return DeviceMesh.from_placement(self._global.placement)


# -- factories (torch.distributed.tensor.zeros / ones / empty / full / rand / randn) ------------

def _factory(make, size, kwargs: dict, op: str) -> Tensor:
    mesh = _check_mesh(kwargs.pop("device_mesh", None), op)
    placements = kwargs.pop("placements", None)
    kwargs.pop("layout", None)
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)
    placements = placements if placements is not None else [Replicate()] * mesh.ndim
    nd = as_nd_sbp(placements, mesh.ndim, len(shape), op)
    if P in nd:
        raise HoloflowError(f"holoflow.{op}: a factory makes whole values; use Shard(d) or Replicate() placements "
                            f"(got {tuple(placements)})")
    return make(shape, placement=mesh, sbp=nd, **kwargs)


def zeros(*size, **kwargs) -> Tensor:
    return _factory(creation.zeros, size, kwargs, "distributed.tensor.zeros")


def ones(*size, **kwargs) -> Tensor:
    return _factory(creation.ones, size, kwargs, "distributed.tensor.ones")


def empty(*size, **kwargs) -> Tensor:
    return _factory(creation.empty, size, kwargs, "distributed.tensor.empty")


def full(size, fill_value, **kwargs) -> Tensor:
    return _factory(lambda shape, **kw: creation.full(shape, fill_value, **kw), (size,), kwargs,
                    "distributed.tensor.full")


def rand(*size, **kwargs) -> Tensor:
    """Uniform random values; the logical tensor equals holoflow's ``rand`` of the same seed (not
    torch's DTensor random values, which follow its own offset scheme)."""
    return _factory(creation.rand, size, kwargs, "distributed.tensor.rand")


def randn(*size, **kwargs) -> Tensor:
    """Normal random values (see :func:`rand`)."""
    return _factory(creation.randn, size, kwargs, "distributed.tensor.randn")


def install() -> None:
    """The DTensor methods and properties on holoflow's Tensor."""
    Tensor.redistribute = redistribute
    Tensor.full_tensor = full_tensor
    Tensor.placements = property(_placements)
    Tensor.device_mesh = property(_device_mesh)
