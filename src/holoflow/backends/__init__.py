"""``holoflow.backends``: torch's backend switches (``cudnn.benchmark``, ``cudnn.deterministic``,
``cuda.matmul.allow_tf32``, ``mps.is_available()`` ...), read and written on torch's own modules,
since holoflow's kernels are torch's."""
import torch.backends

from .._forward import forward_module
from . import cuda, cudnn, mps

__all__ = ["cuda", "cudnn", "mps"]

forward_module(__name__, torch.backends)
