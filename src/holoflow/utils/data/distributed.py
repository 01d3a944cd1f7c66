"""``DistributedSampler``: each rank's share of the indices, split exactly as torch's."""
from __future__ import annotations

import math
from typing import Iterator

import torch

from ...distributed import env
from .sampler import Sampler

__all__ = ["DistributedSampler"]


def _world() -> tuple[int, int]:
    return env.get_world_size(), env.get_rank()


class DistributedSampler(Sampler):
    """Rank ``rank`` of ``num_replicas`` gets every ``num_replicas``-th index of a (seeded,
    per-epoch) permutation, padded to equal length (or truncated with ``drop_last``).
    Call :meth:`set_epoch` each epoch so shuffles differ. Defaults come from ``holoflow.env``."""

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        world, me = _world() if num_replicas is None or rank is None else (num_replicas, rank)
        num_replicas = world if num_replicas is None else num_replicas
        rank = me if rank is None else rank
        if not 0 <= rank < num_replicas:
            raise ValueError(f"holoflow.utils.data.DistributedSampler: invalid rank {rank}, rank should be "
                             f"in the interval [0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.epoch, self.drop_last, self.shuffle, self.seed = 0, drop_last, shuffle, seed
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(n, generator=g).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            pad = self.total_size - len(indices)
            indices += indices[:pad] if pad <= len(indices) else (indices * math.ceil(pad / len(indices)))[:pad]
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch that seeds the shuffle (``seed + epoch``)."""
        self.epoch = epoch
