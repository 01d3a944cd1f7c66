"""``holoflow.cuda``: torch.cuda's device queries and controls (``is_available``,
``device_count``, ``manual_seed_all``, ``synchronize``, ``max_memory_allocated``,
``reset_peak_memory_stats`` ...). holoflow's CUDA tensors are torch's, so these are torch.cuda's
own functions: real on a GPU, torch's answers on a CPU-only machine (``is_available() == False``,
``device_count() == 0``). ``holoflow.cuda.amp`` holds the CUDA ``autocast`` and ``GradScaler``.
"""
import torch.cuda

from .._forward import forward_module
from . import amp

__all__ = ["amp"]

forward_module(__name__, torch.cuda)
