"""``holoflow.nn``: modules, parameters, containers, init and utilities, with torch's API.

Layers call :mod:`holoflow.nn.functional` (resolved when they run), so model code written for
``torch.nn`` ports by changing the import. ``nn.Graph`` (with ``GraphModule`` and ``GraphConfig``)
is defined in :mod:`holoflow.graph`, a layer above nn, which publishes those names here when it is
imported (the ``holoflow`` facade imports it): nn never imports graph.
"""
from . import init, utils
from .containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from .hooks import RemovableHandle
from .module import Module
from .modules import *
from .modules.transformer import generate_square_subsequent_mask as _causal_mask
from .modules import module as _module_hooks  # noqa: F401 - torch.nn.modules.module's global hooks
from .parameter import Buffer, Parameter
from ._state import _IncompatibleKeys

from . import attention, functional, parallel
from . import global_module as _global_module  # noqa: E402,F401 - attaches Module.to_global


def __getattr__(name: str):
    raise AttributeError(f"holoflow.nn has no attribute {name!r}")
