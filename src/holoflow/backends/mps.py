"""``holoflow.backends.mps``: torch.backends.mps itself (reads and writes go to torch's switches)."""
import torch.backends.mps

from .._forward import forward_module

forward_module(__name__, torch.backends.mps)
