"""``holoflow.futures``: torch's ``torch.futures`` (``Future``, ``collect_all``, ``wait_all``)."""
from .distributed.futures import Future, collect_all, wait_all

__all__ = ["Future", "collect_all", "wait_all"]
