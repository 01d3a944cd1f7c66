"""``nn.parallel.DistributedDataParallel``: replicate a module on every rank, average gradients."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch

from ...core import grad_mode
from ...distributed import comm_api, env
from ...distributed.algorithms.join import Join, Joinable, JoinHook
from ...distributed.comm_check import call_site
from ...distributed.ddp import GradReducer, verify_same_model
from ..module import Module


def _refuse_unsupported(kwargs: dict) -> None:
    """torch's other arguments: ``batched_grad_copy`` (speed only) in any value, the rest at their
    defaults, else refused by name."""
    for name, value in kwargs.items():
        if name == "batched_grad_copy" or (name == "skip_all_reduce_unused_params" and not value):
            continue
        if name in ("mixed_precision", "device_mesh", "delay_all_reduce_named_params", "param_to_hook_all_reduce",
                    "bucket_cap_mb_list", "skip_all_reduce_unused_params"):
            if value is not None:
                raise NotImplementedError(f"holoflow.nn.parallel.DistributedDataParallel: {name}={value!r} is not "
                                          f"supported; leave it at its default (for mixed precision use "
                                          f"holoflow.autocast around the forward)")
            continue
        raise TypeError(f"holoflow.nn.parallel.DistributedDataParallel: unexpected keyword argument {name!r}")


class _DDPJoinHook(JoinHook):
    """What a rank out of inputs does for DDP while others train: take part in their buffer
    broadcast and gradient all-reduces (with zeros); at the end, every rank copies the model of
    the last rank to join (torch's)."""

    def __init__(self, ddp: "DistributedDataParallel", divide_by_initial_world_size: bool) -> None:
        self.ddp = ddp
        ddp.reducer.divide_by = None if divide_by_initial_world_size else 0

    def main_hook(self) -> None:
        ddp, join = self.ddp, self.ddp._join_config
        if ddp.require_forward_param_sync:   # (as the training ranks decide theirs: the last iteration's sync)
            ddp._sync_buffers(max(join.training))
        ddp.require_forward_param_sync = join.sync
        if join.sync:
            ddp.reducer.shadow_backward()

    def post_hook(self, is_last_joiner: bool) -> None:
        ddp = self.ddp
        ranks = ddp.process_group
        mine = torch.tensor([float(env.get_rank() if is_last_joiner else -1)], dtype=torch.float64)
        with call_site("DistributedDataParallel join: the final model"):
            comm_api.functions().all_reduce(mine, ranks, op="max")
            ddp.reducer.broadcast_from_first(list(ddp.module.parameters()) + list(ddp.module.buffers()),
                                             int(mine.item()))
        ddp.reducer.divide_by, ddp.reducer.joining = None, False


class DistributedDataParallel(Module, Joinable):
    """Data parallelism: each rank runs ``module`` on its own batch; gradients are averaged.

    At construction the parameters and buffers of the first rank are broadcast to every rank; a
    forward broadcasts the first rank's buffers again when the forward before it synchronised
    gradients (``broadcast_buffers``; torch's ``require_forward_param_sync``).
    During backward, gradients are packed into buckets of about ``bucket_cap_mb`` (in reverse
    parameter order) and each bucket is all-reduced asynchronously as soon as it is complete;
    the end of backward waits for them and divides by the world size. ``process_group`` is a
    sequence of global ranks (default: the world). ``device_ids`` is accepted for torch
    compatibility; the module's own device is used.

    >>> model = flow.nn.parallel.DistributedDataParallel(Net())
    >>> loss = model(x).sum(); loss.backward()     # p.grad is the mean over ranks
    >>> with model.no_sync(): model(x).sum().backward()   # accumulate locally
    """

    def __init__(self, module: Module, device_ids: Sequence[int] | None = None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool | None = None, init_sync: bool = True,
                 process_group: Sequence[int] | None = None, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False, **kwargs: Any) -> None:
        """torch's arguments. Parameters without a gradient in a backward are reduced as zeros
        whatever ``find_unused_parameters`` says (torch raises without it); ``output_device``,
        ``dim``, ``check_reduction``, ``gradient_as_bucket_view`` and ``static_graph`` change no
        value (one device per process; gradients are copied out of the buckets). ``init_sync=False``
        skips the first rank's broadcast of the parameters and buffers."""
        forward_sync = kwargs.pop("forward_sync_buffers", None)
        _refuse_unsupported(kwargs)
        super().__init__()
        self.module = module
        self.device_ids = device_ids
        self.output_device, self.dim = output_device, dim
        self.find_unused_parameters, self.static_graph = find_unused_parameters, static_graph
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.broadcast_buffers = True if broadcast_buffers is None else bool(broadcast_buffers)
        if forward_sync is not None:   # (torch's newer switch for the same forward-time broadcast)
            self.broadcast_buffers = bool(forward_sync)
        ranks = tuple(process_group) if process_group is not None else tuple(range(env.get_world_size()))
        self.process_group = ranks
        self._join_config = None   # (the Join block this model is in: model.join())
        named = [*module.named_parameters(), *((n, b) for n, b in module.named_buffers() if b is not None)]
        verify_same_model(named, ranks)
        self.reducer = GradReducer(list(module.parameters()), ranks, 25.0 if bucket_cap_mb is None else bucket_cap_mb)
        # torch's flag: a forward broadcasts the first rank's buffers when the forward before it
        # synchronised gradients (so an evaluation pass right after training runs on rank 0's
        # BatchNorm statistics, and the forward ending a no_sync() accumulation keeps each rank's)
        self.require_forward_param_sync = True
        if init_sync:
            self.reducer.broadcast_from_first(list(module.parameters()) + list(module.buffers()))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        reducer = self.reducer
        sync = reducer.enabled and grad_mode.STATE.enabled
        training = Join.notify_join_context(self, sync=sync)   # (None outside a join() block)
        reducer.joining = training is not None
        if training is not None and reducer.divide_by is not None:
            reducer.divide_by = len(training)
        if self.require_forward_param_sync:
            self._sync_buffers(None if training is None else max(training))
        self.require_forward_param_sync = sync
        return self.module(*args, **kwargs)

    def _sync_buffers(self, src: int | None) -> None:
        if self.broadcast_buffers:
            buffers = [b for b in self.module.buffers() if b is not None]
            if buffers:
                with call_site("DistributedDataParallel buffers"):   # (joined ranks: from the join)
                    self.reducer.broadcast_from_first(buffers, src)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skips the gradient all-reduce inside; the next synchronised backward includes these grads."""
        with self.reducer.no_sync():
            yield

    # -- uneven inputs: torch's join() -------------------------------------------------------
    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """A context in which ranks may run different numbers of iterations: a rank out of inputs
        shadows the others' collectives until all are done (gradients are averaged over the
        initial world size, or over the ranks still training), then every rank takes the model
        of the last rank to finish."""
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _DDPJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        first = next(iter(self.module.parameters()), None)
        return torch.device("cpu") if first is None else first._data.device

    @property
    def join_process_group(self) -> Sequence[int]:
        return self.process_group

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """torch's communication hook: ``hook(state, bucket)`` gets each bucket of flattened
        gradients (a ``GradBucket``, not averaged) and returns a ``torch.futures.Future`` of the
        averaged result, which becomes the gradients (``torch.distributed.algorithms.
        ddp_comm_hooks.default_hooks``: ``allreduce_hook``, ``fp16_compress_hook``, ...)."""
        self.reducer.register_comm_hook(state, hook)
