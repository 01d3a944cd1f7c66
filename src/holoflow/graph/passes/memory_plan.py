"""Memory planning: free every value right after its last use (the caching allocator then
reuses the block), and report the planned peak bytes of activations.

The plan is a dict ``id(node) -> values to free after it``, stored on the graph as
``graph.frees`` for lowering; ``peak_bytes(graph)`` simulates live bytes node by node.
"""
from __future__ import annotations

from ..ir import Graph, Value
from . import register


def last_uses(g: Graph) -> dict:
    """``id(node) -> [values whose last reader is that node]`` (outputs and state never freed)."""
    keep = {o for o in g.outputs if isinstance(o, Value)} | {v for _, v in g.updates} | \
        {v for v, _ in g.state} | set(g.feeds)
    last: dict = {}
    for n in g.nodes:
        for v in n.value_inputs():
            last[v] = n
        for v in n.outputs:  # a value nobody reads dies where it is born
            last.setdefault(v, n)
    frees: dict = {}
    for v, n in last.items():
        if v not in keep:
            frees.setdefault(id(n), []).append(v)
    return frees


def peak_bytes(g: Graph, frees: dict | None = None) -> int:
    """Peak bytes of live intermediate values when freed at last use (``frees``) or never."""
    live = peak = 0
    for n in g.nodes:
        live += sum(v.nbytes for v in n.outputs)
        peak = max(peak, live)
        if frees is not None:
            live -= sum(v.nbytes for v in frees.get(id(n), ()))
    return peak


@register("memory_plan")
def memory_plan(g: Graph, config=None) -> Graph:
    return g.with_(frees=last_uses(g))
