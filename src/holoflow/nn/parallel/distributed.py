"""``nn.parallel.DistributedDataParallel``: replicate a module on every rank, average gradients."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from ...distributed import env
from ...distributed.ddp import GradReducer, verify_same_model
from ..module import Module


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

    def __init__(self, module: Module, device_ids: Sequence[int] | None = None, bucket_cap_mb: float = 25.0,
                 broadcast_buffers: bool = True, process_group: Sequence[int] | None = None) -> None:
        super().__init__()
        self.module = module
        self.device_ids = device_ids
        self.broadcast_buffers = broadcast_buffers
        ranks = tuple(process_group) if process_group is not None else tuple(range(env.get_world_size()))
        self.process_group = ranks
        named = [*module.named_parameters(), *((n, b) for n, b in module.named_buffers() if b is not None)]
        verify_same_model(named, ranks)
        self.reducer = GradReducer(list(module.parameters()), ranks, bucket_cap_mb)
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
