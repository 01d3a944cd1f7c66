"""Samplers: index orders and batches, drawing the same numbers as ``torch.utils.data``'s."""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import torch

from ...core.tensor import Tensor
from .dataset import drawing_generator, torch_generator

__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler",
           "WeightedRandomSampler", "BatchSampler"]


class Sampler:
    """Base class: ``__iter__`` yields dataset indices (or lists of them for batch samplers)."""

    def __init__(self, data_source=None) -> None:
        pass

    def __iter__(self) -> Iterator:
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random permutation (or ``num_samples`` draws with ``replacement``), as torch's."""

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None,
                 generator=None) -> None:
        self.data_source, self.replacement, self._num_samples = data_source, replacement, num_samples
        self.generator = generator
        if not isinstance(replacement, bool):
            raise TypeError(f"holoflow.utils.data.RandomSampler: replacement should be a bool, got {replacement}")
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(f"holoflow.utils.data.RandomSampler: num_samples should be a positive integer, "
                             f"got {self.num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        g = torch_generator(self.generator)
        if g is None:
            g = torch.Generator()
            g.manual_seed(int(torch.empty((), dtype=torch.int64).random_(generator=drawing_generator(None)).item()))
        if self.replacement:
            for _ in range(self.num_samples // 32):
                yield from torch.randint(high=n, size=(32,), dtype=torch.int64, generator=g).tolist()
            yield from torch.randint(high=n, size=(self.num_samples % 32,), dtype=torch.int64, generator=g).tolist()
        else:
            for _ in range(self.num_samples // n):
                yield from torch.randperm(n, generator=g).tolist()
            yield from torch.randperm(n, generator=g).tolist()[:self.num_samples % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order."""

    def __init__(self, indices: Sequence[int], generator=None) -> None:
        self.indices, self.generator = indices, generator

    def __iter__(self) -> Iterator[int]:
        for i in torch.randperm(len(self.indices), generator=drawing_generator(self.generator)).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """``num_samples`` indices drawn with probabilities proportional to ``weights``."""

    def __init__(self, weights, num_samples: int, replacement: bool = True, generator=None) -> None:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(f"holoflow.utils.data.WeightedRandomSampler: num_samples should be a positive "
                             f"integer, got {num_samples}")
        w = weights.to_torch() if isinstance(weights, Tensor) else torch.as_tensor(weights, dtype=torch.double)
        if w.dim() != 1:
            raise ValueError(f"holoflow.utils.data.WeightedRandomSampler: weights should be 1-d, got shape "
                             f"{tuple(w.shape)}")
        self.weights, self.num_samples, self.replacement, self.generator = w, num_samples, replacement, generator

    def __iter__(self) -> Iterator[int]:
        draw = torch.multinomial(self.weights, self.num_samples, self.replacement,
                                 generator=drawing_generator(self.generator))
        yield from draw.tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Groups the indices of ``sampler`` into lists of ``batch_size``."""

    def __init__(self, sampler: Sampler | Iterable[int], batch_size: int, drop_last: bool) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"holoflow.utils.data.BatchSampler: batch_size should be a positive integer, "
                             f"got {batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"holoflow.utils.data.BatchSampler: drop_last should be a bool, got {drop_last}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self) -> Iterator[list[int]]:
        it = iter(self.sampler)
        while True:
            batch = [i for _, i in zip(range(self.batch_size), it)]
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else (n + self.batch_size - 1) // self.batch_size
