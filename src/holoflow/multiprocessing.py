"""``holoflow.multiprocessing``: torch.multiprocessing itself (``spawn``, ``Process``, ``Queue``,
``set_start_method``, sharing strategies ...). holoflow tensors hold torch tensors, which torch's
pickling reductions move between processes through shared memory, so scripts that start workers
with ``torch.multiprocessing`` run unchanged under ``mock_torch``."""
import torch.multiprocessing

from ._forward import forward_module

forward_module(__name__, torch.multiprocessing)
