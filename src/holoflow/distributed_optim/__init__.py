"""``holoflow.distributed_optim``: torch's ``torch.distributed.optim`` (what mock_torch gives for
it): :class:`ZeroRedundancyOptimizer`, the optimizer state sharded over data-parallel ranks."""
from .zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
