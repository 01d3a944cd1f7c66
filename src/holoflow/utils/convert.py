"""``holoflow.utils.convert``: checkpoints moving between holoflow and PyTorch.

``holoflow.save`` writes safetensors with a holoflow manifest, which ``torch.load`` cannot read;
:func:`to_torch_file` writes the same tree as a ``torch.save`` file (holoflow tensors become
torch tensors sharing nothing with the model), readable by ``torch.load(path, weights_only=True)``.
:func:`from_torch_file` reads a ``torch.save`` file of tensors/dicts/lists/numbers without running
code (``weights_only=True``) and returns holoflow tensors; :func:`convert_file` converts a file
either way by its format.

>>> flow.utils.convert.to_torch_file({"model": model.state_dict(), "step": 3}, "ckpt.pt")
>>> sd = flow.utils.convert.from_torch_file("resnet18.pth")   # then model.load_state_dict(sd)
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import torch

from ..core.tensor import Tensor
from ..serialization import load, save

__all__ = ["to_torch", "from_torch", "to_torch_file", "from_torch_file", "convert_file"]


def _map(obj: Any, fn, want: type, where: str) -> Any:
    if isinstance(obj, want):
        return fn(obj)
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_map(v, fn, want, f"{where}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for k, v in obj.items():
            out[k] = _map(v, fn, want, f"{where}[{k!r}]")
        if hasattr(obj, "_metadata"):   # a state dict's per-module versions, as torch keeps them
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Size)):
        return obj
    if isinstance(obj, (Tensor, torch.Tensor)):
        return obj   # a tensor of the other kind: already what the target holds
    raise TypeError(f"holoflow.utils.convert: can't convert {type(obj).__name__} at {where}; checkpoints "
                    f"hold tensors, dicts, lists, tuples and plain values (save module.state_dict())")


def to_torch(obj: Any) -> Any:
    """The tree ``obj`` with every holoflow tensor replaced by a detached torch copy."""
    return _map(obj, lambda t: t.to_torch().detach().clone(), Tensor, "obj")


def from_torch(obj: Any) -> Any:
    """The tree ``obj`` with every torch tensor replaced by a holoflow tensor (same values)."""
    def wrap(t: torch.Tensor) -> Tensor:
        out = Tensor._make(t.detach())
        return out.requires_grad_() if t.requires_grad else out
    return _map(obj, wrap, torch.Tensor, "obj")


def to_torch_file(obj: Any, path: str | os.PathLike) -> None:
    """Writes ``obj`` (a tree of holoflow tensors and plain values) as a ``torch.save`` file."""
    torch.save(to_torch(obj), os.fspath(path))


def from_torch_file(path: str | os.PathLike, map_location: Any = None) -> Any:
    """Reads a ``torch.save`` file (weights only: no code runs) as holoflow tensors."""
    return from_torch(torch.load(os.fspath(path), map_location=map_location, weights_only=True))


def convert_file(src: str | os.PathLike, dst: str | os.PathLike, to: str) -> None:
    """Converts a checkpoint file: ``to="torch"`` (holoflow -> torch.save file) or
    ``to="holoflow"`` (torch.save file -> holoflow.save file)."""
    if to == "torch":
        to_torch_file(load(src), dst)
    elif to == "holoflow":
        save(from_torch_file(src), dst)
    else:
        raise ValueError(f"holoflow.utils.convert.convert_file: to must be 'torch' or 'holoflow', got {to!r}")
