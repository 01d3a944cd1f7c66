"""torch's default DDP communication hooks: ``hook(process_group, bucket)`` returns a future of
the bucket's averaged gradients. ``process_group`` is the state given to ``register_comm_hook``
(None: the world)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ....core import dtype as _dtype
from ....core.tensor import Tensor
from ... import process_group as dist
from ...ddp import GradBucket
from ...futures import Future

__all__ = ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "fp16_compress_wrapper",
           "bf16_compress_wrapper"]


def _allreduce_fut(process_group: Sequence[int] | None, tensor: Tensor) -> Future:
    """``tensor`` divided by the group's size, all-reduced: a future of it."""
    tensor.div_(dist.get_world_size(process_group))
    return dist.all_reduce(tensor, group=process_group, async_op=True).get_future().then(lambda f: f.value()[0])


def allreduce_hook(process_group: Sequence[int] | None, bucket: GradBucket) -> Future:
    """What DDP does without a hook: the average over the ranks."""
    return _allreduce_fut(process_group, bucket.buffer())


def _compress_hook(dtype, process_group: Sequence[int] | None, bucket: GradBucket) -> Future:
    buffer = bucket.buffer()
    compressed = buffer.to(dtype).div_(dist.get_world_size(process_group))

    def decompress(fut: Future) -> Tensor:
        buffer.copy_(fut.value()[0])
        return buffer
    return dist.all_reduce(compressed, group=process_group, async_op=True).get_future().then(decompress)


def fp16_compress_hook(process_group: Sequence[int] | None, bucket: GradBucket) -> Future:
    """The average reduced in float16 (half the bytes), back in the gradients' dtype."""
    return _compress_hook(_dtype.float16, process_group, bucket)


def bf16_compress_hook(process_group: Sequence[int] | None, bucket: GradBucket) -> Future:
    """The average reduced in bfloat16, back in the gradients' dtype."""
    return _compress_hook(_dtype.bfloat16, process_group, bucket)


def _compress_wrapper(dtype, hook: Callable[[Any, GradBucket], Future]) -> Callable[[Any, GradBucket], Future]:
    def wrapped(state: Any, bucket: GradBucket) -> Future:
        buffer = bucket.buffer()   # (the inner hook reduces a compressed copy of it)
        inner = GradBucket(bucket.index(), buffer._data.to(_dtype.to_torch(dtype)), bucket.parameters(),
                           bucket.is_last())
        fut = hook(state, inner)

        def decompress(f: Future) -> Tensor:
            got = f.value()
            got = got[0] if isinstance(got, (list, tuple)) else got
            buffer.copy_(got)
            return buffer
        return fut.then(decompress)
    return wrapped


def fp16_compress_wrapper(hook: Callable[[Any, GradBucket], Future]) -> Callable[[Any, GradBucket], Future]:
    """``hook`` run on the bucket cast to float16, its result cast back."""
    return _compress_wrapper(_dtype.float16, hook)


def bf16_compress_wrapper(hook: Callable[[Any, GradBucket], Future]) -> Callable[[Any, GradBucket], Future]:
    """``hook`` run on the bucket cast to bfloat16, its result cast back."""
    return _compress_wrapper(_dtype.bfloat16, hook)
