"""``holoflow.dtensor.experimental``: torch's ``torch.distributed.tensor.experimental`` names
holoflow has (``implicit_replication``)."""
from __future__ import annotations

from ..distributed.dtensor import implicit_replication

__all__ = ["implicit_replication"]
