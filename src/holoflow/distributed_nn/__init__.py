"""``holoflow.distributed_nn``: torch's ``torch.distributed.nn`` (what mock_torch gives for it):
collectives that autograd differentiates, in :mod:`.functional`."""
from . import functional

__all__ = ["functional"]
