"""SBP values for one mesh axis: ``split(axis)``, ``broadcast``, ``partial_sum``.

They are pure data (frozen, hashable), printed as OneFlow prints them. An op's signature is a
pair ``(input_sbps, output_sbps)`` of tuples with one value per tensor input / output.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ArgTypeError


@dataclass(frozen=True)
class SBP:
    """Base of the three SBP kinds."""


@dataclass(frozen=True)
class split(SBP):
    """The logical tensor is cut along ``axis``; the first ``n % p`` ranks hold one more row."""

    axis: int

    def __post_init__(self) -> None:
        if not isinstance(self.axis, int) or isinstance(self.axis, bool):
            raise ArgTypeError(f"holoflow.sbp.split: axis must be an int >= 0, got {self.axis!r} "
                               f"of type {type(self.axis).__name__}")
        if self.axis < 0:
            raise ValueError(f"holoflow.sbp.split: axis must be an int >= 0, got {self.axis!r}")

    def __repr__(self) -> str:
        return f"oneflow.sbp.split(dim={self.axis})".replace("oneflow", "holoflow")


@dataclass(frozen=True)
class _Broadcast(SBP):
    def __repr__(self) -> str:
        return "holoflow.sbp.broadcast"


@dataclass(frozen=True)
class _PartialSum(SBP):
    def __repr__(self) -> str:
        return "holoflow.sbp.partial_sum"


broadcast = _Broadcast()
partial_sum = _PartialSum()
S, B, P = split, broadcast, partial_sum


def short(s: SBP) -> str:
    """Compact form for tables and debug views: S(0), B, P."""
    return f"S({s.axis})" if isinstance(s, split) else ("B" if s == broadcast else "P")

