"""``holoflow.cuda``: torch.cuda's device queries and controls (``is_available``,
``device_count``, ``manual_seed_all``, ``synchronize``, ``max_memory_allocated``,
``reset_peak_memory_stats`` ...). holoflow's CUDA tensors are torch's, so these are torch.cuda's
own functions: real on a GPU, torch's answers on a CPU-only machine (``is_available() == False``,
``device_count() == 0``). ``holoflow.cuda.amp`` holds the CUDA ``autocast`` and ``GradScaler``.
The seeding and random-state functions (``holoflow.cuda.random``) are holoflow's: on a simulated
rank's thread they act on the rank's own CUDA generators, elsewhere they are torch.cuda's.
"""
import torch.cuda

from .._forward import forward_module, override
from . import amp, random

__all__ = ["amp", "random"]

forward_module(__name__, torch.cuda)
override(__name__, {name: getattr(random, name) for name in random.__all__})
