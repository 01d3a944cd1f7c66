"""holoflow devices: ``device("cpu")``, ``device("cuda:0")``, ``device("cuda", 1)``."""
from __future__ import annotations

import torch


class device:
    """Where a tensor's storage lives; prints and compares like ``torch.device``."""

    __slots__ = ("type", "index", "torch")

    def __init__(self, type, index: int | None = None) -> None:  # noqa: A002 - torch's name
        if isinstance(type, device):
            type, index = type.type, type.index
        t = torch.device(type) if index is None else torch.device(type, index)
        self.type, self.index, self.torch = t.type, t.index, t

    def __repr__(self) -> str:
        return f"device(type='{self.type}')" if self.index is None else \
            f"device(type='{self.type}', index={self.index})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and self.torch == other.torch

    def __hash__(self) -> int:
        return hash(self.torch)

    def __reduce__(self):
        return (device, (str(self),))

    def __enter__(self) -> "device":
        """``with device("meta"):`` makes it the default device of the creation functions inside
        (torch's own device context: holoflow's creation functions call torch's factories)."""
        self.torch.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.torch.__exit__(*exc)


_CACHE: dict[torch.device, device] = {}


def from_torch(t: torch.device) -> device:
    d = _CACHE.get(t)
    if d is None:
        d = _CACHE[t] = device(t.type, t.index)
    return d


def to_torch(d) -> torch.device | None:
    """Accepts a holoflow device, a torch device, a string, an int (a CUDA index) or None."""
    if d is None or isinstance(d, torch.device):
        return d
    if isinstance(d, device):
        return d.torch
    if isinstance(d, int):
        return torch.device("cuda", d)
    try:
        return torch.device(d)
    except (RuntimeError, TypeError) as e:
        from .errors import ArgValueError   # torch: RuntimeError; a ValueError too, as before
        raise ArgValueError(f"holoflow: {d!r} is not a device; expected 'cpu', 'cuda' or 'cuda:N'") from e
