"""Activation checkpointing: forward values computed inside a checkpointed module are not kept
for the backward; the backward recomputes them from the module's inputs.

A module is checkpointed by its path (``config.checkpointed_scopes``), set with
:func:`set_activation_checkpointing` or, OneFlow's attribute form, by flagging the module
(``graph.model.layer.activation_checkpointing = True``, collected by :func:`flagged_paths`).

The rewrite: walking the nodes in order, every backward node (tag ``bw``) that reads a value
produced by a forward node of a checkpointed module reads a recomputed copy instead. The copy is
made just before that first backward use, by re-emitting the producing node and, transitively,
the producers of its inputs that belong to the same checkpointed module — non-random nodes only:
a random node's outputs (a dropout mask) stay saved, so the recomputation draws nothing. The
module's boundary inputs and its outputs (values read outside it, as torch.utils.checkpoint
keeps a segment's outputs) are read as they are. Copies get new Values and the tags ``bw`` and
``recompute`` (so CSE does not merge them back); memory_plan then frees the forward originals
after their last forward use.
"""
from __future__ import annotations

from typing import Any

from ...core.errors import HoloflowError
from ...core.registry import REGISTRY
from ..ir import IRGraph, Node, Value
from . import register
from .stages import is_move

RECOMPUTE = "recompute"


def set_activation_checkpointing(graph: Any, module_or_path: Any, on: bool = True) -> str:
    """Turns checkpointing of one module of ``graph`` on or off; returns the module's path.

    ``module_or_path`` is the module object or its path as ``graph`` names it (``"model.blocks.0"``).

    >>> set_activation_checkpointing(g, g.model.blocks[0])   # -> "model.blocks.0"
    """
    paths = _module_paths(graph)
    if isinstance(module_or_path, str):
        path = module_or_path
        if path not in paths.values():
            raise HoloflowError(f"holoflow.nn.Graph: no module at path {path!r} to checkpoint; the graph's "
                                f"modules are {sorted(paths.values())[:8]}...")
    else:
        path = paths.get(id(module_or_path))
        if path is None:
            raise HoloflowError(f"holoflow.nn.Graph: {type(module_or_path).__name__} is not a module of "
                                f"this graph; assign its root module to the graph (self.model = model) first")
    scopes = set(getattr(graph.config, "checkpointed_scopes", None) or ())
    (scopes.add if on else scopes.discard)(path)
    graph.config.checkpointed_scopes = scopes
    return path


def flagged_paths(graph: Any) -> set[str]:
    """Paths of the graph's modules flagged with ``module.activation_checkpointing = True``."""
    out = set()
    for name, root in getattr(graph, "_modules", {}).items():
        for path, m in root.named_modules(prefix=name):
            if getattr(m, "activation_checkpointing", False) is True:
                out.add(path)
    return out


def _module_paths(graph: Any) -> dict[int, str]:
    paths: dict[int, str] = {}
    for name, root in getattr(graph, "_modules", {}).items():
        for path, m in root.named_modules(prefix=name):
            paths.setdefault(id(m), path)
    return paths


def region_of(n: Node, scopes: set) -> str | None:
    """The outermost checkpointed module a forward node was traced in, if any."""
    if "bw" in n.tags or n.effect:
        return None
    return next((s for s in n.scope.split("/") if s in scopes), None) if n.scope else None


def _recomputable(n: Node | None, region: str | None, scopes: set) -> bool:
    """Whether ``n`` is recomputed for ``region``'s backward: a non-random node of that module,
    not a move between pipeline stages (a staged module's inputs moved onto its placement by
    ``set_stage`` are its boundary inputs, as a move made before the call; recomputing one
    would send forward data during the backward, a cycle between stages)."""
    op = REGISTRY.get(n.op) if n is not None else None
    return op is not None and not op.random and n.kernel is None and not is_move(n) and \
        region_of(n, scopes) == region


def _region_outputs(g: IRGraph, scopes: set, producer: dict) -> set:
    """Values made inside a checkpointed module and read by forward code outside it (or returned)."""
    out = {o for o in g.outputs if isinstance(o, Value)}
    for n in g.nodes:
        if "bw" in n.tags or n.effect:
            continue
        here = region_of(n, scopes)
        out.update(v for v in n.value_inputs() if v in producer and region_of(producer[v], scopes) not in (None, here))
    return out


@register("checkpointing", enabled=lambda cfg: bool(getattr(cfg, "checkpointed_scopes", None)))
def checkpointing(g: IRGraph, config=None) -> IRGraph:
    """Recomputes checkpointed forward values for the backward; see the module docstring."""
    scopes = set(getattr(config, "checkpointed_scopes", None) or ())
    producer = g.producers()
    copies: dict[Value, Value] = {v: v for v in _region_outputs(g, scopes, producer)}
    nodes: list[Node] = []

    def recompute(v: Value, region: str) -> Value:
        if v in copies:
            return copies[v]
        p = producer.get(v)
        if not _recomputable(p, region, scopes):
            return v  # a boundary input, a saved random draw, or state
        ins = tuple(recompute(x, region) if isinstance(x, Value) else x for x in p.inputs)
        outs = tuple(Value(o.shape, o.dtype, o.device) for o in p.outputs)
        nodes.append(p.with_(inputs=ins, outputs=outs, tags=p.tags | {"bw", RECOMPUTE}))
        copies.update(zip(p.outputs, outs))
        return copies[v]

    changed = False
    for n in g.nodes:
        if "bw" in n.tags and RECOMPUTE not in n.tags:
            ins = []
            for x in n.inputs:
                region = region_of(producer[x], scopes) if isinstance(x, Value) and x in producer else None
                ins.append(recompute(x, region) if region is not None else x)
            if any(a is not b for a, b in zip(ins, n.inputs)):
                n = n.with_(inputs=tuple(ins))
                changed = True
        nodes.append(n)
    return g.with_(nodes=tuple(nodes)) if changed else g
