"""``holoflow.backends.cudnn``: torch.backends.cudnn itself (reads and writes go to torch's switches)."""
import torch.backends.cudnn

from .._forward import forward_module

forward_module(__name__, torch.backends.cudnn)
