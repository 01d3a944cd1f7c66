"""``holoflow.accelerator``: torch.accelerator (``is_available``, ``current_accelerator``,
``device_count``, ``synchronize`` ...) for the device holoflow's kernels run on."""
import torch

from ._forward import forward_module

forward_module(__name__, torch.accelerator)
