"""torch's DTensor placements (``Shard(dim)``, ``Replicate()``, ``Partial()``) and their SBP:
``Shard(d)`` is ``split(d)``, ``Replicate()`` is ``broadcast``, ``Partial("sum")`` is
``partial_sum``. One placement per mesh dimension, as one SBP per mesh axis."""
from __future__ import annotations

from typing import Sequence

from ..core.errors import UnsupportedError
from ..core.sbp import SBP, B, P, S

__all__ = ["Placement", "Shard", "Replicate", "Partial"]


class Placement:
    """How a DTensor is laid out along one mesh dimension."""

    __slots__ = ()

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False


class Shard(Placement):
    """Split along tensor dimension ``dim`` (``holoflow.sbp.split(dim)``)."""

    __slots__ = ("dim",)

    def __init__(self, dim: int) -> None:
        if not isinstance(dim, int):
            raise TypeError(f"holoflow Shard: dim must be an int, got {type(dim).__name__}")
        self.dim = dim

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def __eq__(self, other) -> bool:
        return type(other) is Shard and other.dim == self.dim

    def __hash__(self) -> int:
        return hash(("Shard", self.dim))

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"

    def __str__(self) -> str:
        return f"S({self.dim})"


class Replicate(Placement):
    """The whole tensor on every rank of the dimension (``holoflow.sbp.broadcast``)."""

    __slots__ = ()

    def is_replicate(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return type(other) is Replicate

    def __hash__(self) -> int:
        return hash("Replicate")

    def __repr__(self) -> str:
        return "Replicate()"

    def __str__(self) -> str:
        return "R"


class Partial(Placement):
    """Pending reduction: the tensor is the sum of the ranks' pieces (``holoflow.sbp.partial_sum``;
    only ``reduce_op="sum"`` has an SBP)."""

    __slots__ = ("reduce_op",)

    def __init__(self, reduce_op: str = "sum") -> None:
        self.reduce_op = reduce_op

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return reduce_op is None or reduce_op == self.reduce_op

    def __eq__(self, other) -> bool:
        return type(other) is Partial and other.reduce_op == self.reduce_op

    def __hash__(self) -> int:
        return hash(("Partial", self.reduce_op))

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op})"

    def __str__(self) -> str:
        return f"P({self.reduce_op})"


def as_sbp(p, ndim: int, op: str) -> SBP:
    """One placement (or an SBP, passed through) as the SBP of a tensor of ``ndim`` dimensions."""
    if isinstance(p, SBP):
        return p
    if isinstance(p, Shard):
        d = p.dim + ndim if p.dim < 0 else p.dim
        if not 0 <= d < max(ndim, 1) or ndim == 0:
            raise IndexError(f"holoflow.{op}: Shard(dim={p.dim}) is out of range for a tensor of {ndim} "
                             f"dimension(s); legal dims are {-ndim}..{ndim - 1}" if ndim else
                             f"holoflow.{op}: a 0-dim tensor cannot be sharded; use Replicate() or Partial()")
        return S(d)
    if isinstance(p, Replicate):
        return B
    if isinstance(p, Partial):
        if p.reduce_op != "sum":
            raise UnsupportedError(f"holoflow.{op}: Partial({p.reduce_op!r}) has no SBP in holoflow; only "
                                   f"Partial('sum') (partial_sum) is supported")
        return P
    raise TypeError(f"holoflow.{op}: expected a Placement (Shard(d), Replicate() or Partial()), got {p!r}")


def as_nd_sbp(placements: Sequence, mesh_ndim: int, ndim: int, op: str) -> tuple:
    """A placement per mesh dimension as an nd-SBP tuple."""
    ps = tuple(placements)
    if len(ps) != mesh_ndim:
        raise ValueError(f"holoflow.{op}: the mesh has {mesh_ndim} dimension(s), so placements needs "
                         f"{mesh_ndim} value(s); got {len(ps)}: {ps}")
    return tuple(as_sbp(p, ndim, op) for p in ps)


def as_placement(s: SBP) -> Placement:
    """The torch placement of one SBP."""
    if isinstance(s, S):
        return Shard(s.axis)
    return Replicate() if s == B else Partial()
