"""``placement``: which devices hold a global tensor, as a 1-D or N-D mesh of ranks."""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgValueError, HoloflowError
from . import env


class placement:
    """``placement("cpu", ranks=[0, 1])`` (1-D) or ``ranks=[[0, 1], [2, 3]]`` (a 2x2 mesh).

    Frozen and hashable; ``ranks`` is the rank array, ``hierarchy`` its shape.
    """

    __slots__ = ("type", "_ranks", "hierarchy", "_flat", "_coords", "_hash")
    # global tensors on it follow OneFlow's conventions (to_local's gradient: dual(sbp); an uneven
    # split gives the first n % p ranks one more); torch's DeviceMesh (device_mesh.py) sets it:
    # torch's DTensor conventions (an uneven split is torch.chunk's). Part of equality: the same
    # ranks under the two conventions hold different shards of an uneven split
    torch_conventions = False

    def __init__(self, type: str = "cpu", ranks=None) -> None:  # noqa: A002 - OneFlow's name
        if type not in ("cpu", "cuda"):
            # torch's class for a bad device type (torch.device('tpu')): RuntimeError
            raise ArgValueError(f"holoflow.placement: type must be 'cpu' or 'cuda', got {type!r}")
        if ranks is None:
            raise ValueError("holoflow.placement: ranks= is required, e.g. ranks=[0, 1]")
        arr = _rank_array(ranks)
        self.type = type
        self._ranks = arr
        self.hierarchy = tuple(arr.shape)
        self._flat = tuple(int(r) for r in arr.reshape(-1))
        self._coords = {r: tuple(int(i) for i in idx) for idx, r in np.ndenumerate(arr)}
        self._hash = hash((type, self.hierarchy, self._flat, self.torch_conventions))

    @staticmethod
    def all(type: str = "cpu") -> "placement":  # noqa: A002
        """Every rank of the world, as a 1-D mesh."""
        return placement(type, list(range(env.get_world_size())))

    @property
    def ranks(self) -> np.ndarray:
        return self._ranks.copy()

    @property
    def flat_ranks(self) -> tuple[int, ...]:
        return self._flat

    @property
    def ndim(self) -> int:
        return len(self.hierarchy)

    @property
    def size(self) -> int:
        return len(self._flat)

    def coords(self, rank: int) -> tuple[int, ...] | None:
        """This rank's index in the mesh, or None if the placement doesn't hold it."""
        return self._coords.get(rank)

    def axis_group(self, rank: int, axis: int) -> tuple[int, ...]:
        """The ranks that differ from ``rank`` only along mesh ``axis`` (a collective's group)."""
        c = self._coords[rank]
        index = tuple(slice(None) if a == axis else c[a] for a in range(self.ndim))
        return tuple(int(r) for r in self._ranks[index].reshape(-1))

    def device_for(self, rank: int):
        import torch
        if self.type == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", rank % max(torch.cuda.device_count(), 1))

    def __eq__(self, other) -> bool:
        return isinstance(other, placement) and self.type == other.type and \
            self.hierarchy == other.hierarchy and self._flat == other._flat and \
            self.torch_conventions == other.torch_conventions

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        ranks = self._ranks.tolist()
        return f'oneflow.placement(type="{self.type}", ranks={ranks})'.replace("oneflow", "holoflow")

    def __reduce__(self):
        return (placement, (self.type, self._ranks.tolist()))


def _rank_array(ranks) -> np.ndarray:
    if isinstance(ranks, range):
        ranks = list(ranks)
    try:
        arr = np.array(ranks)
    except ValueError as e:  # ragged nested lists
        raise HoloflowError(f"holoflow.placement: ranks {ranks!r} is not a rectangular mesh; "
                            f"every row must have the same length") from e
    if arr.dtype == object or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise HoloflowError(f"holoflow.placement: ranks must be a non-empty (nested) list of ints, "
                            f"got {ranks!r}")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if len(set(arr.reshape(-1).tolist())) != arr.size or arr.min() < 0:
        raise HoloflowError(f"holoflow.placement: ranks must be distinct non-negative ints, got {ranks!r}")
    return arr
