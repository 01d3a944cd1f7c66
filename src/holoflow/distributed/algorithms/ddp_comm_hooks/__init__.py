"""torch's ``torch.distributed.algorithms.ddp_comm_hooks``: ``default_hooks`` (all-reduce, fp16 /
bf16 compression) for ``DistributedDataParallel.register_comm_hook``."""
from . import default_hooks

__all__ = ["default_hooks"]
