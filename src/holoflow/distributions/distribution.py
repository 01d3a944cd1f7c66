"""``holoflow.distributions.distribution``: torch's module name for the ``Distribution`` base
(defined in base.py)."""
from .base import Distribution

__all__ = ["Distribution"]
