"""Static graphs (docs/architecture.md, "Graph"): ``Graph`` (``holoflow.nn.Graph``), its ``GraphConfig``, and
``GraphModule`` for per-module settings (activation checkpointing, pipeline stage)."""
import sys as _sys

from .. import nn as _nn
from .compile_module import compile_forward
from .config import GraphConfig
from .graph import Graph, GraphModule
from .graph_compile import GraphBuildError
from .lower import GraphRunError

__all__ = ["Graph", "GraphBuildError", "GraphConfig", "GraphModule", "GraphRunError"]

# ``holoflow.nn.Graph`` is OneFlow's public name; graph sits above nn, so graph publishes it there
_nn.Graph, _nn.GraphModule, _nn.GraphConfig = Graph, GraphModule, GraphConfig
_nn.graph = _sys.modules[__name__]   # OneFlow's ``nn.graph.GraphModule``
# ``Module.compile()`` (torch's, in place) compiles with holoflow.compile, which lives up here
_nn.Module._compile_forward = staticmethod(compile_forward)
