"""``holoflow.mps``: torch.mps itself (``is_available``, ``device_count``, ``synchronize``,
``manual_seed`` ...): holoflow's kernels are torch's, so device queries and controls are torch's own
(on a machine without the device: torch's answers, ``is_available() == False``)."""
import torch.mps

from ._forward import forward_module

forward_module(__name__, torch.mps)
