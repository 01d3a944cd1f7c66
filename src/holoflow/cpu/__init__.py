"""``holoflow.cpu``: torch.cpu's device queries (``is_available``, ``device_count``,
``synchronize``, ``current_device``, ``Stream``, ``stream``, ``current_stream`` ...).

holoflow's CPU tensors are torch's, so these are torch.cpu's own functions and classes (there is
one CPU device and one trivial stream, as in torch). ``holoflow.cpu.amp`` holds the CPU
``autocast`` and ``GradScaler`` on holoflow's mixed precision.
"""
import torch.cpu

from .._forward import forward_module
from . import amp

__all__ = ["amp"]

forward_module(__name__, torch.cpu)
