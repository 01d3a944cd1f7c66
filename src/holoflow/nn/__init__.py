"""``holoflow.nn``: modules, parameters, containers, init and utilities, with torch's API.

Layers call :mod:`holoflow.nn.functional` (resolved when they run), so model code written for
``torch.nn`` ports by changing the import.
"""
from . import init, utils
from .containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from .hooks import RemovableHandle
from .module import Module
from .modules import *
from .modules.transformer import generate_square_subsequent_mask as _causal_mask
from .parameter import Buffer, Parameter
from ._state import _IncompatibleKeys

from . import functional, parallel
from . import global_module as _global_module  # noqa: E402,F401 - attaches Module.to_global


def __getattr__(name: str):
    """``nn.Graph`` lives in holoflow.graph (which imports nn): resolved on first use."""
    if name in ("Graph", "GraphModule", "GraphConfig"):
        from .. import graph
        return getattr(graph, name)
    raise AttributeError(f"holoflow.nn has no attribute {name!r}")
