"""``holoflow.nn.parallel``: data parallelism over processes."""
from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]

from ..modules.compat import DataParallel  # noqa: E402

__all__ += ["DataParallel"]
