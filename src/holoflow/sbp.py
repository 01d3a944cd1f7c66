"""``holoflow.sbp``: ``split(axis)``, ``broadcast``, ``partial_sum`` (see core/sbp.py)."""
from .core.sbp import SBP, B, P, S, broadcast, partial_sum, short, split

__all__ = ["SBP", "split", "broadcast", "partial_sum", "S", "B", "P", "short"]
