"""``holoflow.nn.parallel``: data parallelism over processes."""
from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
