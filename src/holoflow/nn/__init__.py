"""``holoflow.nn``: modules, parameters, containers, init and utilities, with torch's API.

Layers call :mod:`holoflow.nn.functional` (resolved when they run), so model code written for
``torch.nn`` ports by changing the import.
"""
import importlib as _importlib

from . import init, utils
from .containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from .hooks import RemovableHandle
from .module import Module
from .modules import *
from .modules.transformer import generate_square_subsequent_mask as _causal_mask
from .parameter import Buffer, Parameter
from ._state import _IncompatibleKeys

try:  # written alongside this package; the layers look it up when they run
    functional = _importlib.import_module(".functional", __name__)
except ModuleNotFoundError as _e:
    if _e.name != __name__ + ".functional":
        raise
from . import global_module as _global_module  # noqa: E402,F401 - attaches Module.to_global
