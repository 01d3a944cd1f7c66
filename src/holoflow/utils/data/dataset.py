"""Datasets: ``Dataset``, ``IterableDataset``, ``TensorDataset``, ``StackDataset``, ``Subset``,
``ConcatDataset``, ``ChainDataset``, ``random_split`` — the same classes and splitting as
``torch.utils.data``."""
from __future__ import annotations

import bisect
import itertools
import math
import warnings
from typing import Any, Iterable, Iterator, Sequence

import torch

from ...core import generators
from ...core.tensor import Tensor

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "StackDataset", "Subset", "ConcatDataset", "ChainDataset",
           "random_split"]


def torch_generator(generator) -> torch.Generator | None:
    """The ``torch.Generator`` behind a holoflow ``Generator`` (or a torch one, or None)."""
    return getattr(generator, "torch", generator)


def drawing_generator(generator) -> torch.Generator | None:
    """What a CPU draw takes: the caller's generator, else None for torch's default, or on a
    simulated rank's thread the rank's own (core/generators.py)."""
    return generators.for_kernel(generator, "cpu")


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

    def __add__(self, other: Dataset) -> "ChainDataset":
        return ChainDataset([self, other])


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


class StackDataset(Dataset):
    """Datasets of one length side by side: sample ``i`` is ``tuple(d[i] for d in args)``, or
    ``{k: d[i] for k, d in kwargs.items()}`` (one of the two forms)."""

    def __init__(self, *args: Dataset, **kwargs: Dataset) -> None:
        if args and kwargs:
            raise ValueError("holoflow.utils.data.StackDataset: Supported either ``tuple``- (via ``args``) or "
                             "``dict``- (via ``kwargs``) like input/output, but both types are given.")
        if not args and not kwargs:
            raise ValueError("holoflow.utils.data.StackDataset: At least one dataset should be passed")
        parts = args or tuple(kwargs.values())
        self._length = len(parts[0])
        if any(self._length != len(d) for d in parts):
            raise ValueError(f"holoflow.utils.data.StackDataset: Size mismatch between datasets (lengths "
                             f"{[len(d) for d in parts]}); they must all have one length")
        self.datasets: tuple | dict = args if args else kwargs

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __getitems__(self, indices: list) -> list:
        """A batch of samples, each part read with its dataset's own ``__getitems__`` if it has one."""
        named = isinstance(self.datasets, dict)
        parts = self.datasets.items() if named else enumerate(self.datasets)
        columns = {k: _items(d, indices) for k, d in parts}
        if named:
            return [{k: col[i] for k, col in columns.items()} for i in range(len(indices))]
        return [tuple(col[i] for col in columns.values()) for i in range(len(indices))]

    def __len__(self) -> int:
        return self._length


def _items(dataset: Dataset, indices: list) -> list:
    getitems = getattr(dataset, "__getitems__", None)
    if not callable(getitems):
        return [dataset[i] for i in indices]
    items = getitems(indices)
    if len(items) != len(indices):
        raise ValueError(f"holoflow.utils.data.StackDataset: Nested dataset's output size mismatch. Expected "
                         f"{len(indices)}, got {len(items)}")
    return items


class ConcatDataset(Dataset):
    """The concatenation of map-style datasets."""

    @staticmethod
    def cumsum(sequence: Sequence) -> list[int]:
        """The running total of the datasets' lengths (torch's helper)."""
        return list(itertools.accumulate(len(d) for d in sequence))

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise AssertionError("holoflow.utils.data.ConcatDataset: datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise AssertionError("holoflow.utils.data.ConcatDataset does not support IterableDataset; chain "
                                     "them with ChainDataset")
        self.cumulative_sizes = self.cumsum(self.datasets)

    @property
    def cummulative_sizes(self) -> list[int]:
        warnings.warn("`cummulative_sizes` attribute is renamed to `cumulative_sizes`", FutureWarning, stacklevel=2)
        return self.cumulative_sizes

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int):
        if idx < 0:
            if -idx > len(self):
                raise ValueError(f"holoflow.utils.data.ConcatDataset: absolute value of index should not exceed "
                                 f"dataset length ({idx} for length {len(self)})")
            idx = len(self) + idx
        d = bisect.bisect_right(self.cumulative_sizes, idx)
        return self.datasets[d][idx - (self.cumulative_sizes[d - 1] if d > 0 else 0)]


class ChainDataset(IterableDataset):
    """Iterable datasets one after another, chained as they are iterated (nothing is read ahead)."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = datasets

    def __iter__(self) -> Iterator:
        for d in self.datasets:
            _check_iterable(d)
            yield from d

    def __len__(self) -> int:
        total = 0
        for d in self.datasets:
            _check_iterable(d)
            total += len(d)
        return total


def _check_iterable(d: Dataset) -> None:
    if not isinstance(d, IterableDataset):
        raise AssertionError(f"holoflow.utils.data.ChainDataset only supports IterableDataset, got "
                             f"{type(d).__name__}; use ConcatDataset for map-style datasets")


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
    perm = torch.randperm(sum(lengths), generator=drawing_generator(generator)).tolist()
    return [Subset(dataset, perm[end - k:end]) for end, k in zip(itertools.accumulate(lengths), lengths)]
