"""torch's ``torch.distributed.algorithms.join``: training on uneven inputs.

Inside ``with Join([model]):`` (or ``model.join()``) each rank runs its own number of iterations.
Every iteration of a rank still training starts with :meth:`Join.notify_join_context`, one small
all-reduce in which each rank says whether it is still training (and whether this iteration's
backward synchronizes gradients). A rank that ran out of inputs leaves the block's body and, in
``__exit__``, answers those all-reduces with "joined", and while some rank still trains runs each
joinable's ``main_hook`` (DDP's shadows the gradient all-reduces of that iteration with zeros;
ZeroRedundancyOptimizer's steps its own share on its last gradients and makes the step's
broadcasts; only the first joinable of the list notifies, as torch's); when every rank has
joined each joinable's ``post_hook`` runs (DDP's copies the model from the last rank to join to
every rank)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import torch

from .. import comm_api, env
from ..comm_check import call_site

__all__ = ["Join", "Joinable", "JoinHook"]

class JoinHook:
    """What a joinable does for the ranks that joined: ``main_hook`` once per iteration some
    other rank still runs, ``post_hook(is_last_joiner)`` once every rank has joined."""

    def main_hook(self) -> None:
        return None

    def post_hook(self, is_last_joiner: bool) -> None:
        return None


class Joinable(ABC):
    """A class whose collectives a joined rank can shadow (torch's: DDP)."""

    @abstractmethod
    def join_hook(self, **kwargs: Any) -> JoinHook:
        ...

    @property
    @abstractmethod
    def join_device(self) -> torch.device:
        ...

    @property
    @abstractmethod
    def join_process_group(self) -> Sequence[int] | None:
        ...


def _ranks(group: Sequence[int] | None) -> tuple:
    return tuple(range(env.get_world_size())) if group is None else tuple(group)


class Join:
    """torch's ``Join(joinables, enable=True, throw_on_early_termination=False, **kwargs)``: the
    ``kwargs`` go to each joinable's ``join_hook``."""

    def __init__(self, joinables: list, enable: bool = True, throw_on_early_termination: bool = False,
                 **kwargs: Any) -> None:
        if not joinables:
            raise ValueError("holoflow Join: the joinables list is empty; pass the DistributedDataParallel "
                             "model(s) whose collectives the ranks that run out of inputs shadow")
        for j in joinables:
            if not isinstance(j, Joinable):
                raise TypeError(f"holoflow Join: {type(j).__name__} is not Joinable (holoflow's "
                                f"DistributedDataParallel and ZeroRedundancyOptimizer are; a plain optimizer "
                                f"communicates nothing and needs no joining)")
        groups = {_ranks(j.join_process_group) for j in joinables}
        if len(groups) != 1:
            raise ValueError(f"holoflow Join: the joinables must share one process group, got {sorted(groups)}")
        self.joinables = list(joinables)
        self.enable = enable
        self.throw_on_early_termination = throw_on_early_termination
        self.ranks = groups.pop()
        self.hooks = [j.join_hook(**kwargs) for j in joinables]
        self.training: list = list(self.ranks)   # the ranks still training, as of the last exchange

    def __enter__(self) -> "Join":
        for j in self.joinables:
            j._join_config = self
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.enable and exc_type is None:
                self._shadow_until_all_joined()
        finally:
            for j in self.joinables:
                j._join_config = None

    def _shadow_until_all_joined(self) -> None:
        is_last_joiner = True
        while True:
            active, sync = self._exchange(active=False, sync=False)
            if not active:
                break
            self.sync = sync
            if self.throw_on_early_termination:
                raise RuntimeError("holoflow Join: rank %d exhausted its inputs; throwing across all ranks "
                                   "(throw_on_early_termination=True)" % env.get_rank())
            is_last_joiner = False
            for hook in self.hooks:
                hook.main_hook()
        for hook in self.hooks:
            hook.post_hook(is_last_joiner)

    def _exchange(self, active: bool, sync: bool) -> tuple[list, bool]:
        """One all-reduce: which ranks still train, and whether any of them synchronizes its
        gradients this iteration."""
        me = self.ranks.index(env.get_rank())
        flags = torch.zeros(2 * len(self.ranks), dtype=torch.float64)
        flags[2 * me], flags[2 * me + 1] = float(active), float(sync)
        with call_site("Join: the ranks still training"):   # (joined ranks ask from __exit__)
            comm_api.functions().all_reduce(flags, self.ranks)
        self.training = [r for i, r in enumerate(self.ranks) if flags[2 * i] > 0]
        return self.training, bool(flags[1::2].sum() > 0)

    @staticmethod
    def notify_join_context(joinable: Joinable, sync: bool = True) -> list | None:
        """Called by a joinable at the start of each iteration inside a ``Join`` block: the ranks
        still training (None outside a block). Raises on every rank, as torch's, once one rank
        has joined with ``throw_on_early_termination``."""
        join = getattr(joinable, "_join_config", None)
        if join is None or not join.enable:
            return None
        training, _ = join._exchange(active=True, sync=sync)
        if join.throw_on_early_termination and len(training) < len(join.ranks):
            raise RuntimeError(f"holoflow Join: detected at least one rank that exhausted its inputs (ranks "
                               f"{sorted(set(join.ranks) - set(training))}); throwing across all ranks "
                               f"(throw_on_early_termination=True)")
        return training

