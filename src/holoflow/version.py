"""``holoflow.version``: the versions of the torch build underneath (``cuda``, ``hip``,
``git_version``); ``holoflow.__version__`` is holoflow's own."""
import torch.version

from ._forward import forward_module

forward_module(__name__, torch.version)
