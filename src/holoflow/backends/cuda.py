"""``holoflow.backends.cuda``: torch.backends.cuda itself (reads and writes go to torch's switches)."""
import torch.backends.cuda

from .._forward import forward_module

forward_module(__name__, torch.backends.cuda)
