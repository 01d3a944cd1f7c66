"""torch's ``ZeroRedundancyOptimizer`` (ZeRO stage 1 for eager data parallelism): every rank
keeps the optimizer state of its own partition of the parameters only, steps that partition and
broadcasts the updated values to the other ranks.

The partition is torch's: group by group, parameters from the largest down, each to the rank
holding the fewest elements so far over all groups (the lowest such rank). ``state_dict()`` after
``consolidate_state_dict(to)`` is, on rank ``to``, the state dict the unsharded optimizer would
have (torch's format, every parameter's index); ``load_state_dict`` takes such a dict on every
rank and keeps each rank's own part.

It is ``Joinable``, as torch's: inside ``Join([ddp_model, zero_opt])`` a rank out of inputs answers
each step of the ranks still training with a step of its own partition (on the gradients it last
had, as torch's hook does) and that step's broadcasts, so every rank's broadcasts pair up."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch

from ..core.tensor import Tensor
from ..distributed import comm_api, env
from ..distributed.algorithms.join import Join, Joinable, JoinHook
from ..distributed.comm_check import call_site
from ..distributed.ddp import broadcast_tensors
from ..optim.optimizer import Optimizer

__all__ = ["ZeroRedundancyOptimizer"]


def _plain(v: Any) -> Any:
    """A state value as something pickling sends between ranks (torch tensors for holoflow's)."""
    return v._data.detach().clone() if isinstance(v, Tensor) else v


class _ZeROJoinHook(JoinHook):
    """What a joined rank does for ZeRO while others train: steps its partition and broadcasts it
    (torch's ``_ZeROJoinHook``), the broadcasts a training rank's ``step`` makes."""

    def __init__(self, zero: "ZeroRedundancyOptimizer") -> None:
        self.zero = zero

    def main_hook(self) -> None:
        self.zero._local_step()
        self.zero._sync_params()


class ZeroRedundancyOptimizer(Optimizer, Joinable):
    """``ZeroRedundancyOptimizer(params, optimizer_class, process_group=None, **defaults)``:
    ``optimizer_class(partition, **defaults)`` steps this rank's partition."""

    def __init__(self, params: Iterable, optimizer_class: type, process_group: Sequence[int] | None = None,
                 parameters_as_bucket_view: bool = False, overlap_with_ddp: bool = False,
                 **defaults: Any) -> None:
        if overlap_with_ddp:
            raise NotImplementedError("holoflow ZeroRedundancyOptimizer: overlap_with_ddp=True (steps run from "
                                      "DDP's communication hook) is not supported; step after backward")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise TypeError(f"holoflow ZeroRedundancyOptimizer: optimizer_class must be an optimizer class "
                            f"(torch.optim.AdamW, ...), got {optimizer_class!r}")
        super().__init__(params, defaults)
        self.ranks = tuple(range(env.get_world_size())) if process_group is None else tuple(process_group)
        self.rank = self.ranks.index(env.get_rank())
        self.optimizer_class = optimizer_class
        self.parameters_as_bucket_view = parameters_as_bucket_view
        self._partition = self._partition_parameters()
        self._all_state_dicts: list | None = None
        self._join_config: Join | None = None   # (the Join block this optimizer is in)
        mine = [{**self._hyper(g), "params": part[self.rank]} for g, part in zip(self.param_groups, self._partition)]
        self.optim = optimizer_class(mine, **defaults)

    @staticmethod
    def _hyper(group: dict) -> dict:
        return {k: v for k, v in group.items() if k != "params"}

    def _partition_parameters(self) -> list:
        """Per group, per rank, the parameters it owns (torch's greedy partition)."""
        out = []
        sizes = [0] * len(self.ranks)   # (counted across the groups, as torch's)
        for g in self.param_groups:
            per_rank: list = [[] for _ in self.ranks]
            for p in sorted(g["params"], key=lambda t: t.numel(), reverse=True):
                r = sizes.index(min(sizes))
                per_rank[r].append(p)
                sizes[r] += p.numel()
            out.append(per_rank)
        return out

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        if getattr(self, "optim", None) is not None:   # (after construction: repartition, as torch)
            self._partition = self._partition_parameters()
            part = self._partition[-1][self.rank]
            self.optim.add_param_group({**self._hyper(self.param_groups[-1]), "params": part})

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Steps this rank's partition (with the groups' current hyper-parameters: a scheduler
        sets them here), then every rank broadcasts its updated parameters. Inside a ``Join``
        block whose first joinable is this optimizer, first tells the block this rank still
        trains (torch's: only the first joinable does; DDP's forward, when it comes first)."""
        join = self._join_config
        if join is not None and join.joinables[0] is self:
            Join.notify_join_context(self)
        loss = self._local_step(closure, **kwargs)
        self._sync_params()
        return loss

    def _local_step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        for g, local in zip(self.param_groups, self.optim.param_groups):
            local.update(self._hyper(g))
        loss = self.optim.step(closure, **kwargs) if closure is not None or kwargs else self.optim.step()
        for g, local in zip(self.param_groups, self.optim.param_groups):
            g.update(self._hyper(local))
        return loss

    # -- uneven inputs: torch's Joinable ------------------------------------------------------
    def join_hook(self, **_kwargs: Any) -> JoinHook:
        """The hook a rank out of inputs runs while others step (torch's takes no keyword)."""
        return _ZeROJoinHook(self)

    @property
    def join_device(self) -> torch.device:
        first = next((p for g in self.param_groups for p in g["params"]), None)
        return torch.device("cpu") if first is None else first._data.device

    @property
    def join_process_group(self) -> Sequence[int]:
        return self.ranks

    def _sync_params(self) -> None:
        """Each rank's parameters from their owner (its buckets broadcast)."""
        if len(self.ranks) == 1:
            return
        with call_site("ZeroRedundancyOptimizer step: the partitions' broadcasts"):   # (joined ranks: from Join)
            for r, src in enumerate(self.ranks):
                broadcast_tensors([p for part in self._partition for p in part[r]], src, self.ranks)

    # -- state dicts ------------------------------------------------------------------------
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gathers every rank's partition state on global rank ``to`` (every rank must call it);
        then ``state_dict()`` there is the whole optimizer's."""
        local = self.optim.state_dict()
        local = {"state": {i: {k: _plain(v) for k, v in s.items()} for i, s in local["state"].items()},
                 "param_groups": local["param_groups"]}
        every = comm_api.functions().all_gather_object(local, self.ranks)
        self._all_state_dicts = every if env.get_rank() == to else None

    def state_dict(self) -> dict:
        """The whole optimizer's state dict (torch's format), on the rank it was consolidated on."""
        if self._all_state_dicts is None:
            raise RuntimeError(f"holoflow ZeroRedundancyOptimizer: the optimizer state has not been consolidated "
                               f"on rank {env.get_rank()}; call consolidate_state_dict(to={env.get_rank()}) on "
                               f"every rank first")
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        state: dict = {}
        for r, local in enumerate(self._all_state_dicts):
            for local_group, part in zip(local["param_groups"], self._partition):
                for local_i, p in zip(local_group["params"], part[r]):
                    if local_i in local["state"]:
                        state[index[id(p)]] = {k: Tensor._make(v) if isinstance(v, torch.Tensor) else v
                                               for k, v in local["state"][local_i].items()}
        groups = [{**self._hyper(g), "params": [index[id(p)] for p in g["params"]]} for g in self.param_groups]
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads a whole optimizer's state dict (every rank keeps its partition's part)."""
        order = [p for g in self.param_groups for p in g["params"]]
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise ValueError(f"holoflow ZeroRedundancyOptimizer: the state dict has "
                             f"{len(state_dict['param_groups'])} parameter groups, this optimizer "
                             f"{len(self.param_groups)}")
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})
        local_index = {id(p): i for i, p in enumerate(p for g in self.optim.param_groups for p in g["params"])}
        local_state = {local_index[id(order[i])]: s for i, s in state_dict["state"].items()
                       if id(order[i]) in local_index}
        local_groups = [{**self._hyper(g), "params": [local_index[id(p)] for p in lg["params"]]}
                        for g, lg in zip(self.param_groups, self.optim.param_groups)]
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
