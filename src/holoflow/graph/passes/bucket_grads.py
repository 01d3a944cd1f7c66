"""bucket_grads: the gradient all-reduces of a global graph, grouped into buckets (DDP's).

Backward's boxing nodes that only all-reduce (``P -> B`` on a mesh axis), or that reduce-scatter
whole rows (``P -> S(0)`` of a gradient whose rows split evenly: ZeRO 2 and 3), are grouped, in
the order backward produces them, into buckets of at most ``config.allreduce_bucket_mb`` MB (same
placement and SBPs; the first bucket at most 1 MiB, as DDP's, so that reducing the last layers'
gradients starts early and overlaps the rest of backward; the last one at most 1 MiB too, since
nothing is left to overlap it once backward ends); each bucket is one
``global_box_bucket`` node: one collective over the concatenated gradients. Lowering issues it
where it stands and waits for it just before the update reads it (global_graph.issue_collectives),
so a bucket is reduced as soon as its gradients exist while backward goes on. A bucket closes
early when a
member's result is needed before the next gradient is ready, so the order stays topological.

The small first and last buckets buy overlap, which needs a core for the communicator: Gloo
reduces on the CPU, on its own threads. When the ranks on this host already keep every core
computing (CPU placement, cores <= local ranks x intra-op threads: :func:`spare_core`), a
collective issued during backward only takes CPU from it, and each extra collective adds its
own fixed cost; the buckets are then simply ``allreduce_bucket_mb`` each (bench/dp_overlap.py
measured one 3.3 MB bucket a little faster than three on 2 ranks of a 2-core host). Ranks of one
host reduce through shared memory (distributed/shm_comm.py), where that one bucket costs well
under a millisecond; the split into buckets is the same whichever transport runs it. Every rank
must bucket alike: ranks that decide differently trace different programs, which
``global_graph.check_same_program`` reports before anything runs.
"""
from __future__ import annotations

import os

import torch

from ...core.registry import REGISTRY
from ...distributed.boxing import plan as box_plan
from ...core.sbp import B
from ..global_graph import merge_boxes
from ..ir import IRGraph, Node
from . import register

FIRST_BUCKET_BYTES = 2 ** 20   # DDP's first bucket


def spare_core(place) -> bool:
    """Whether a collective issued during backward has a core to run on beside it: always off the
    CPU; on the CPU, when this host has more cores than its ranks' intra-op threads (local ranks
    from ``LOCAL_WORLD_SIZE``, set by the launcher; simulated ranks in one process are not
    counted). ``HOLOFLOW_DP_OVERLAP=1``/``0`` decides instead."""
    forced = os.environ.get("HOLOFLOW_DP_OVERLAP")
    if forced in ("0", "1"):
        return forced == "1"
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if getattr(place, "type", "cpu") != "cpu" or local is None:
        return True
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores > int(local) * torch.get_num_threads()


def _all_reduce_only(n: Node) -> bool:
    a = n.attrs
    steps = [s for s in box_plan(a["src"], a["dst"], a["place"].hierarchy) if s.kind != "reshard"]
    return bool(steps) and all(s.kind == "all_reduce" for s in steps)


def _even_row_scatter(n: Node) -> bool:
    """One reduce-scatter to rows, every other mesh axis broadcast, rows a multiple of the ranks:
    a bucket packs each rank's block of every member side by side (global_graph._pack_rows)."""
    a = n.attrs
    steps = box_plan(a["src"], a["dst"], a["place"].hierarchy)
    if len(steps) != 1 or steps[0].kind != "reduce_scatter" or steps[0].dim != 0:
        return False
    others = [s for i, s in enumerate(a["dst"]) if i != steps[0].axis]
    shape = n.inputs[0].shape
    return all(s == B for s in others) and len(shape) > 0 and shape[0] % a["place"].hierarchy[steps[0].axis] == 0


def _candidate(n: Node) -> bool:
    """A backward collective boxing one value (a gradient) by all-reduces only, or by one
    reduce-scatter of even rows."""
    op = REGISTRY.get(n.op)
    return (op is not None and op.collective and len(n.inputs) == 1 and "bw" in n.tags
            and (_all_reduce_only(n) or _even_row_scatter(n)))


def _split_tail(g: IRGraph, members: list[int], tail: int) -> list[list[int]]:
    """The last bucket of a key as ``[rest, last]``: the last gradients, up to ``tail`` bytes,
    in a bucket of their own (reduced after backward ends, exposed), the rest reduced before."""
    k, size = len(members), 0
    while k > 0 and size + g.nodes[members[k - 1]].outputs[0].nbytes <= tail:
        k -= 1
        size += g.nodes[members[k]].outputs[0].nbytes
    return [m for m in (members[:k], members[k:]) if m] if 0 < k < len(members) else [members]


@register("bucket_grads", enabled=lambda cfg: getattr(cfg, "global_graph", False)
          and getattr(cfg, "allreduce_bucket_mb", 0) > 0)
def bucket_grads(g: IRGraph, config) -> IRGraph:
    limit = config.allreduce_bucket_mb * 2 ** 20
    place = next((n.attrs["place"] for n in g.nodes if _candidate(n)), None)
    first = min(limit, FIRST_BUCKET_BYTES) if place is None or spare_core(place) else limit
    first_use: dict = {}
    for i, n in enumerate(g.nodes):
        for v in n.value_inputs():
            first_use.setdefault(v, i)
    buckets: list[tuple] = []   # (key, member indices)
    open_: dict = {}   # (placement, src, dst) -> (member indices, bytes, earliest use of a member's result)
    for i, n in enumerate(g.nodes):
        if not _candidate(n):
            continue
        key = (n.attrs["place"], n.attrs["src"], n.attrs["dst"])
        out = n.outputs[0]
        cur = open_.get(key)
        cap = limit if any(k == key for k, _ in buckets) else first
        if cur is not None and (cur[1] + out.nbytes > cap or cur[2] < i):
            buckets.append((key, cur[0]))
            cur = None
        if cur is None:
            cur = ([], 0, len(g.nodes))
        open_[key] = (cur[0] + [i], cur[1] + out.nbytes, min(cur[2], first_use.get(out, len(g.nodes))))
    for k, b in open_.items():   # the last bucket overlaps nothing: at most `first` bytes too
        buckets += [(k, m) for m in _split_tail(g, b[0], first)]
    return merge_boxes(g, [members for _, members in buckets], at_last=True)
