"""torch's ``DeviceMesh`` on holoflow's placements: what ``torch.distributed.device_mesh`` gives a
PyTorch script under mock_torch.

A :class:`DeviceMesh` *is* a :class:`~holoflow.distributed.placement.placement` (equal to, and
hashing like, the placement of the same ranks) that also knows its dimensions' names; global
tensors made on one follow torch's DTensor conventions (``distributed/dtensor.py``). Slicing a
named dimension (``mesh["tp"]``) gives this rank's 1-D sub-mesh, as torch does: ranks of different
rows hold tensors on different sub-meshes, and each collective runs among a sub-mesh's ranks only.
"""
from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np
import torch

from ..core.errors import HoloflowError
from ..core.tensor import Tensor
from . import env, world
from .placement import placement
from .process_group import RankGroup

__all__ = ["DeviceMesh", "init_device_mesh"]

_LOCAL = threading.local()   # .stack: this thread's ``with mesh:`` blocks, innermost last (a thread
                             # per simulated rank)


def _stack() -> list:
    if not hasattr(_LOCAL, "stack"):
        _LOCAL.stack = []
    return _LOCAL.stack


class DeviceMesh(placement):
    """``DeviceMesh(device_type, mesh, *, mesh_dim_names=None)``: ``mesh`` is the N-D array of
    global ranks (a list, NumPy array or tensor), as torch's; ``mesh_dim_names`` names its
    dimensions (``mesh["tp"]``)."""

    __slots__ = ("mesh_dim_names", "_root")
    torch_conventions = True

    def __init__(self, device_type: str, mesh, *, mesh_dim_names: Sequence[str] | None = None,
                 _init_backend: bool = True) -> None:
        if isinstance(mesh, Tensor):
            mesh = mesh._data
        ranks = np.asarray(mesh.tolist() if isinstance(mesh, torch.Tensor) else mesh, dtype=np.int64)
        if ranks.ndim == 0:
            raise ValueError(f"holoflow.DeviceMesh: mesh must have at least one dimension, got {mesh!r}")
        super().__init__(device_type, ranks=ranks.tolist())
        if mesh_dim_names is not None:
            mesh_dim_names = tuple(mesh_dim_names)
            if len(mesh_dim_names) != ranks.ndim:
                raise RuntimeError(f"holoflow.DeviceMesh: mesh_dim_names {mesh_dim_names} must name each of the "
                                   f"mesh's {ranks.ndim} dimension(s) (shape {tuple(ranks.shape)})")
            if len(set(mesh_dim_names)) != len(mesh_dim_names):
                raise RuntimeError(f"holoflow.DeviceMesh: mesh_dim_names must be unique, got {mesh_dim_names}")
        self.mesh_dim_names = mesh_dim_names
        self._root: DeviceMesh | None = None   # the mesh this one was sliced from (torch's root mesh)

    @staticmethod
    def from_placement(place: placement) -> "DeviceMesh":
        """The mesh of a holoflow placement (unnamed dimensions)."""
        if isinstance(place, DeviceMesh):
            return place
        return DeviceMesh(place.type, place.ranks)

    # -- torch's DeviceMesh API ------------------------------------------------------------------

    @property
    def device_type(self) -> str:
        return self.type

    @property
    def mesh(self) -> Tensor:
        """The rank array, as torch's (an int tensor)."""
        return Tensor._make(torch.tensor(self._ranks, dtype=torch.int))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.hierarchy

    def size(self, mesh_dim: int | str | None = None) -> int:
        return len(self.flat_ranks) if mesh_dim is None else self.hierarchy[self._dim(mesh_dim)]

    def get_rank(self) -> int:
        """This process's global rank."""
        return world.rank()

    def get_coordinate(self) -> tuple[int, ...] | None:
        """This rank's index in the mesh, or None if the mesh doesn't hold it."""
        return self.coords(world.rank())

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's index along ``mesh_dim`` (may be omitted on a 1-D mesh)."""
        coords, dim = self._here(mesh_dim, "get_local_rank")
        return coords[dim]

    def get_group(self, mesh_dim: int | str | None = None) -> RankGroup:
        """The process group of this rank's ranks along ``mesh_dim`` (for ``torch.distributed``'s
        collectives: ``dist.all_reduce(t, group=mesh.get_group("tp"))``)."""
        _, dim = self._here(mesh_dim, "get_group")
        return RankGroup(sorted(self.axis_group(world.rank(), dim)))

    def _here(self, mesh_dim: int | str | None, op: str) -> tuple[tuple[int, ...], int]:
        """This rank's coordinates and ``mesh_dim`` as an index (None: the only one of a 1-D mesh)."""
        if mesh_dim is None:
            if self.ndim > 1:
                raise RuntimeError(f"holoflow.DeviceMesh.{op}: the mesh has {self.ndim} dimensions (shape "
                                   f"{self.hierarchy}); pass mesh_dim= (an index or one of "
                                   f"{self.mesh_dim_names or tuple(range(self.ndim))})")
            mesh_dim = 0
        coords = self.get_coordinate()
        if coords is None:
            raise RuntimeError(f"holoflow.DeviceMesh.{op}: rank {world.rank()} is not in {self!r}")
        return coords, self._dim(mesh_dim)

    def get_all_groups(self) -> list[RankGroup]:
        return [self.get_group(d) for d in range(self.ndim)]

    def __getitem__(self, names: str | Sequence[str]) -> "DeviceMesh":
        """The sub-mesh of the named dimensions that holds this rank (the other dimensions fixed at
        this rank's coordinates), as torch's ``mesh["tp"]`` / ``mesh["dp", "tp"]``."""
        wanted = (names,) if isinstance(names, str) else tuple(names)
        if self.mesh_dim_names is None:
            raise KeyError("holoflow.DeviceMesh: this mesh has no mesh_dim_names, so it cannot be sliced by name; "
                           "create it with init_device_mesh(..., mesh_dim_names=(...))")
        dims = []
        for n in wanted:
            if n not in self.mesh_dim_names:
                raise KeyError(f"holoflow.DeviceMesh: no dimension named {n!r}; the mesh's are {self.mesh_dim_names}")
            dims.append(self.mesh_dim_names.index(n))
        if dims == list(range(self.ndim)):
            return self
        c = self.get_coordinate()
        if c is None:
            raise RuntimeError(f"holoflow.DeviceMesh: rank {world.rank()} is not in {self!r}, so it has no "
                               f"sub-mesh {wanted}")
        index = tuple(slice(None) if a in dims else c[a] for a in range(self.ndim))
        sub = np.transpose(self._ranks[index], np.argsort(np.argsort(dims)))   # in the asked order
        out = DeviceMesh(self.type, sub, mesh_dim_names=wanted)
        out._root = self.root_mesh()
        return out

    def root_mesh(self) -> "DeviceMesh":
        """The mesh this one was sliced from by name (itself if it was not), as torch's
        ``_get_root_mesh``: FSDP composes a tensor-parallel layout with its own through it."""
        return self._root if self._root is not None else self

    def __enter__(self) -> "DeviceMesh":
        _stack().append(self)
        return self

    def __exit__(self, *exc) -> None:
        _stack().pop()

    def __repr__(self) -> str:
        if self.mesh_dim_names is None:
            dims = f"({', '.join(map(str, self.hierarchy))},)" if self.ndim == 1 else str(self.hierarchy)
        else:
            dims = "(" + ", ".join(f"{n}={s}" for n, s in zip(self.mesh_dim_names, self.hierarchy)) + ")"
        strides = tuple(math.prod(self.hierarchy[a + 1:]) for a in range(self.ndim))
        return f"DeviceMesh({dims}, '{self.type}', stride={strides})"

    def __reduce__(self):
        return (_rebuild, (self.type, self._ranks.tolist(), self.mesh_dim_names))

    def _dim(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"holoflow.DeviceMesh: no dimension named {mesh_dim!r}; the mesh's are "
                               f"{self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"holoflow.DeviceMesh: mesh_dim {mesh_dim} is out of range for a {self.ndim}-D mesh")
        return mesh_dim % self.ndim


def _rebuild(device_type: str, ranks: list, names) -> DeviceMesh:
    return DeviceMesh(device_type, ranks, mesh_dim_names=names)


def current_mesh() -> DeviceMesh | None:
    """The mesh of the innermost ``with mesh:`` block, if any."""
    stack = _stack()
    return stack[-1] if stack else None


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *,
                     mesh_dim_names: Sequence[str] | None = None, backend_override=None) -> DeviceMesh:
    """A mesh of every rank of the world laid out in ``mesh_shape`` (row-major), as torch's; the
    default process group is set up first if it is not yet."""
    if device_type not in ("cpu", "cuda"):
        raise RuntimeError(f"holoflow.init_device_mesh: device_type must be 'cpu' or 'cuda', got {device_type!r}")
    shape = tuple(int(s) for s in mesh_shape)
    env.ensure_initialized()
    ws = env.get_world_size()
    if math.prod(shape) != ws:
        raise RuntimeError(f"holoflow.init_device_mesh: mesh_shape {shape} holds {math.prod(shape)} ranks, but the "
                           f"world has {ws}; choose a shape whose product is {ws}")
    if device_type == "cuda" and torch.cuda.is_available():
        torch.cuda.set_device(env.get_local_rank() % torch.cuda.device_count())
    return DeviceMesh(device_type, np.arange(ws).reshape(shape), mesh_dim_names=mesh_dim_names)


def _check_mesh(mesh, op: str) -> DeviceMesh:
    """``mesh`` (or the current one) as a DeviceMesh, or a clear error."""
    mesh = mesh if mesh is not None else current_mesh()
    if mesh is None:
        raise HoloflowError(f"holoflow.{op}: no device_mesh given and none is current; pass "
                            f"device_mesh=init_device_mesh(...) or call it inside `with mesh:`")
    if not isinstance(mesh, placement):
        raise TypeError(f"holoflow.{op}: device_mesh must be a DeviceMesh, got {type(mesh).__name__}")
    return DeviceMesh.from_placement(mesh)
