"""Static graphs (DESIGN §7): ``Graph`` (``holoflow.nn.Graph``), its ``GraphConfig``, and
``GraphModule`` for per-module settings (activation checkpointing, pipeline stage)."""
from .config import GraphConfig
from .graph import Graph, GraphBuildError, GraphModule
from .lower import GraphRunError

__all__ = ["Graph", "GraphBuildError", "GraphConfig", "GraphModule", "GraphRunError"]
