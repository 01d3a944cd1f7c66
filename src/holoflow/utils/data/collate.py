"""``default_collate`` / ``default_convert``: samples -> a batch of holoflow tensors.

Collation runs in two halves so worker processes never build holoflow tensors: ``collate_torch``
(in the worker) stacks samples into torch tensors inside the same structure; ``to_holoflow`` (in
the main process) wraps every torch tensor as a holoflow Tensor without copying.
"""
from __future__ import annotations

import collections.abc as abc
from typing import Any

import numpy as np
import torch

from ...core.tensor import Tensor

__all__ = ["default_collate", "default_convert", "collate_torch", "to_holoflow"]

_NP_STR = ("U", "S", "O")


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _rebuild(like, items):
    if _is_namedtuple(like):
        return type(like)(*items)
    if isinstance(like, tuple):
        return list(items)           # torch returns lists for tuples too
    try:
        return type(like)(items)
    except TypeError:
        return list(items)


def collate_torch(batch: list) -> Any:
    """Stacks a list of samples into torch tensors, keeping dicts, namedtuples and sequences."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        return torch.stack([x._local_full().detach() for x in batch])
    if isinstance(elem, torch.Tensor):
        return torch.stack([x.detach() for x in batch])
    if isinstance(elem, np.ndarray):
        if elem.dtype.kind in _NP_STR:
            raise TypeError(f"holoflow.utils.data.default_collate: numpy arrays of dtype {elem.dtype} "
                            f"can't become tensors")
        return torch.stack([torch.as_tensor(x) for x in batch])
    if isinstance(elem, np.generic) and elem.dtype.kind not in _NP_STR:
        return torch.as_tensor(np.array(batch))
    if isinstance(elem, bool):
        return torch.tensor(batch)
    if isinstance(elem, float):
        return torch.tensor(batch, dtype=torch.float64)
    if isinstance(elem, int):
        return torch.tensor(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, abc.Mapping):
        out = {k: collate_torch([d[k] for d in batch]) for k in elem}
        try:
            return type(elem)(out)
        except TypeError:
            return out
    if _is_namedtuple(elem):
        return type(elem)(*(collate_torch(list(s)) for s in zip(*batch)))
    if isinstance(elem, abc.Sequence):
        if any(len(x) != len(elem) for x in batch):
            raise RuntimeError("holoflow.utils.data.default_collate: each element in list of batch should "
                               "be of equal size")
        return _rebuild(elem, [collate_torch(list(s)) for s in zip(*batch)])
    raise TypeError(f"holoflow.utils.data.default_collate: batch must contain tensors, numpy arrays, numbers, "
                    f"dicts or lists; found {type(elem).__name__}")


def to_holoflow(data: Any) -> Any:
    """Wraps every torch tensor in ``data`` (nested dicts, lists, tuples) as a holoflow Tensor."""
    if isinstance(data, torch.Tensor):
        return Tensor._make(data)
    if isinstance(data, (str, bytes, Tensor)) or data is None:
        return data
    if isinstance(data, abc.Mapping):
        out = {k: to_holoflow(v) for k, v in data.items()}
        try:
            return type(data)(out)
        except TypeError:
            return out
    if _is_namedtuple(data):
        return type(data)(*(to_holoflow(v) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(to_holoflow(v) for v in data)
    return data


def default_collate(batch: list) -> Any:
    """Collates a list of samples into a batch: tensors/arrays are stacked along a new first
    dimension, numbers become 1-d tensors, dicts/namedtuples/sequences are collated per field.

    >>> default_collate([(np.ones(2), 1), (np.zeros(2), 0)])   # [tensor of shape (2, 2), tensor([1, 0])]
    """
    return to_holoflow(collate_torch(batch))


def _convert_torch(data: Any) -> Any:
    if isinstance(data, np.ndarray) and data.dtype.kind not in _NP_STR:
        return torch.as_tensor(data)
    if isinstance(data, np.generic) and data.dtype.kind not in _NP_STR:
        return torch.as_tensor(data)
    if isinstance(data, abc.Mapping):
        out = {k: _convert_torch(v) for k, v in data.items()}
        try:
            return type(data)(out)
        except TypeError:
            return out
    if _is_namedtuple(data):
        return type(data)(*(_convert_torch(v) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_convert_torch(v) for v in data)
    return data


def default_convert(data: Any) -> Any:
    """Converts numpy arrays (also inside dicts/sequences) to tensors; used with ``batch_size=None``."""
    return to_holoflow(_convert_torch(data))


# the worker/main split used by DataLoader workers
default_collate.in_worker, default_collate.in_main = collate_torch, to_holoflow  # type: ignore[attr-defined]
default_convert.in_worker, default_convert.in_main = _convert_torch, to_holoflow  # type: ignore[attr-defined]
