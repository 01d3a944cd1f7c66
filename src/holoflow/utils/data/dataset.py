"""Datasets: ``Dataset``, ``IterableDataset``, ``TensorDataset``, ``Subset``, ``ConcatDataset``,
``random_split`` — the same classes and splitting as ``torch.utils.data``."""
from __future__ import annotations

import bisect
import itertools
import math
import warnings
from typing import Any, Iterator, Sequence

import torch

from ...core.tensor import Tensor

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "Subset", "ConcatDataset", "random_split"]


def torch_generator(generator) -> torch.Generator | None:
    """The ``torch.Generator`` behind a holoflow ``Generator`` (or a torch one, or None)."""
    return getattr(generator, "torch", generator)


class Dataset:
    """A map-style dataset: implement ``__getitem__`` (and ``__len__`` for samplers)."""

    def __getitem__(self, index) -> Any:
        raise NotImplementedError(f"holoflow.utils.data: {type(self).__name__} must implement __getitem__")

    def __add__(self, other: "Dataset") -> "ConcatDataset":
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream of samples: implement ``__iter__``. With workers, each worker iterates its own
    copy; use :func:`get_worker_info` to shard the stream."""

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"holoflow.utils.data: {type(self).__name__} must implement __iter__")

    def __add__(self, other):
        raise TypeError("holoflow.utils.data: IterableDatasets cannot be concatenated with +")


class TensorDataset(Dataset):
    """Samples are ``tuple(t[i] for t in tensors)``; all tensors share their first dimension."""

    def __init__(self, *tensors: Tensor) -> None:
        sizes = {t.shape[0] for t in tensors}
        if len(sizes) != 1:
            raise ValueError(f"holoflow.utils.data.TensorDataset: size mismatch between tensors, first "
                             f"dimensions {[t.shape[0] for t in tensors]}")
        self.tensors = tensors

    def __getitem__(self, index) -> tuple:
        return tuple(_row(t, index) for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


def _row(t, index):
    if isinstance(t, Tensor) and t.is_local and not t.requires_grad:
        return Tensor._make(t._data[index])   # no autograd to record: index the storage directly
    return t[index]


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: list[int]) -> list:
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__([self.indices[i] for i in indices])
        return [self.dataset[self.indices[i]] for i in indices]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """The concatenation of map-style datasets."""

    def __init__(self, datasets) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("holoflow.utils.data.ConcatDataset: datasets should not be empty")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("holoflow.utils.data.ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int):
        if idx < 0:
            if -idx > len(self):
                raise IndexError("holoflow.utils.data.ConcatDataset: index out of range")
            idx = len(self) + idx
        d = bisect.bisect_right(self.cumulative_sizes, idx)
        return self.datasets[d][idx - (self.cumulative_sizes[d - 1] if d > 0 else 0)]


def random_split(dataset: Dataset, lengths: Sequence[int | float], generator=None) -> list[Subset]:
    """Splits ``dataset`` into non-overlapping random subsets of the given lengths (or fractions
    summing to 1), with the same permutation as ``torch.utils.data.random_split``."""
    n = len(dataset)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        sizes = []
        for i, frac in enumerate(lengths):
            if not 0 <= frac <= 1:
                raise ValueError(f"holoflow.utils.data.random_split: fraction at index {i} is not in [0, 1]")
            sizes.append(math.floor(n * frac))
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        for i, s in enumerate(sizes):
            if s == 0:
                warnings.warn(f"holoflow.utils.data.random_split: length of split at index {i} is 0", stacklevel=2)
        lengths = sizes
    if sum(lengths) != n:
        raise ValueError(f"holoflow.utils.data.random_split: sum of lengths {sum(lengths)} does not equal "
                         f"the length of the dataset {n}")
    g = torch_generator(generator)
    perm = torch.randperm(sum(lengths), generator=g if g is not None else torch.default_generator).tolist()
    return [Subset(dataset, perm[end - k:end]) for end, k in zip(itertools.accumulate(lengths), lengths)]
