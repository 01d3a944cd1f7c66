"""bucket_gathers: the all-gathers of one module unit's state, one collective (FSDP's units).

A ZeRO-3 parameter is read through an all-gather of its rows recorded just before each op that
reads it (graph/zero.py), and backward gathers it again (zero_regather). Gathering each
parameter alone costs one collective per parameter and use: a transformer block's handful of
weights, each a rank synchronisation. This pass groups a run of such gathers into one
``global_box_bucket`` node at the first one's place when they

- gather values no node makes (parameters, state: they exist from the start),
- belong to one module unit: the innermost module of their scope that is an item of a list or
  sequence (``blocks.3``), else their own module,
- are all forward or all backward, over the same placement and SBPs, of one dtype, with one
  all-gather of rows that split evenly over the ranks (each rank's rows of every member are
  packed side by side and unpacked after, global_graph._unpack_rows),
- and no node between the first and a member writes that member's memory or is an effect.

The memory plan then sees the unit's parameters whole from the bucket on, as they are; lowering
issues each all-gather one all-gather ahead (global_graph.issue_collectives), so a block's
parameters travel while the block before computes. ``config.gather_ahead = False`` turns both
off (every parameter gathered alone, where it stands: the same bits).
"""
from __future__ import annotations

from ...core.registry import REGISTRY
from ...core.sbp import B
from ...distributed.boxing import plan as box_plan
from ..global_graph import merge_boxes, unwritten
from ..ir import AliasGroups, IRGraph, Node
from . import register


def _row_gather(n: Node, made: set) -> bool:
    """One input no node makes, all-gathered along rows that split evenly, other mesh axes B."""
    op = REGISTRY.get(n.op)
    if op is None or not op.collective or len(n.inputs) != 1 or n.inputs[0] in made or "src" not in n.attrs:
        return False
    a = n.attrs
    steps = box_plan(a["src"], a["dst"], a["place"].hierarchy)
    if len(steps) != 1 or steps[0].kind != "all_gather" or steps[0].dim != 0:
        return False
    shape = n.inputs[0].shape
    return all(s == B for i, s in enumerate(a["dst"]) if i != steps[0].axis) and len(shape) > 0 \
        and shape[0] % a["place"].hierarchy[steps[0].axis] == 0


def unit(scope: str) -> str:
    """The module unit of a scope path (``model/model.blocks.3/model.blocks.3.mlp``): its innermost
    module that is an item of a list or sequence (``model.blocks.3``), else the scope itself."""
    for p in reversed(scope.split("/")):
        if p.rsplit(".", 1)[-1].isdigit():
            return p
    return scope


def _joins(first: Node, n: Node) -> bool:
    a, b = first.attrs, n.attrs
    return (bool(first.scope) and unit(first.scope) == unit(n.scope) and ("bw" in first.tags) == ("bw" in n.tags)
            and (a["place"], a["src"], a["dst"]) == (b["place"], b["src"], b["dst"])
            and first.inputs[0].dtype == n.inputs[0].dtype and first.inputs[0].device == n.inputs[0].device)


@register("bucket_gathers", enabled=lambda cfg: getattr(cfg, "global_graph", False)
          and getattr(cfg, "gather_ahead", True))
def bucket_gathers(g: IRGraph, config=None) -> IRGraph:
    made = {v for n in g.nodes for v in n.outputs}
    groups = AliasGroups(g.nodes)
    buckets: list[list[int]] = []
    for i, n in enumerate(g.nodes):
        if not _row_gather(n, made):
            continue
        last = buckets[-1] if buckets else None
        if last is not None and _joins(g.nodes[last[0]], n):
            between = g.nodes[last[0] + 1:i]
            if not any(x.effect for x in between) and unwritten(between, groups, {n.inputs[0]}):
                last.append(i)
                continue
        buckets.append([i])
    return merge_boxes(g, buckets, at_last=False)
