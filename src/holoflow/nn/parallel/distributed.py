"""``nn.parallel.DistributedDataParallel``: replicate a module on every rank, average gradients."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

from ...distributed import env
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


class DistributedDataParallel(Module):
    """Data parallelism: each rank runs ``module`` on its own batch; gradients are averaged.

    At construction the parameters and buffers of the first rank are broadcast to every rank.
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
        named = [*module.named_parameters(), *((n, b) for n, b in module.named_buffers() if b is not None)]
        verify_same_model(named, ranks)
        self.reducer = GradReducer(list(module.parameters()), ranks, 25.0 if bucket_cap_mb is None else bucket_cap_mb)
        if init_sync:
            self.reducer.broadcast_from_first(list(module.parameters()) + list(module.buffers()))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and self.reducer.enabled:
            buffers = [b for b in self.module.buffers() if b is not None]
            if buffers:
                self.reducer.broadcast_from_first(buffers)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skips the gradient all-reduce inside; the next synchronised backward includes these grads."""
        with self.reducer.no_sync():
            yield

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """torch's communication hook: ``hook(state, bucket)`` gets each bucket of flattened
        gradients (a ``GradBucket``, not averaged) and returns a ``torch.futures.Future`` of the
        averaged result, which becomes the gradients (``torch.distributed.algorithms.
        ddp_comm_hooks.default_hooks``: ``allreduce_hook``, ``fp16_compress_hook``, ...)."""
        self.reducer.register_comm_hook(state, hook)
