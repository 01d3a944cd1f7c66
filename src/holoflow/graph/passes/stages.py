"""Pipeline partition of a traced global graph (graph/pipeline.py; docs/architecture.md,
"Pipeline stages and schedules"): which stage each node runs on, which phase (forward ``F``,
backward ``B``, once-per-step update ``U``), and rank r's share of the graph.

- ``U``: effect nodes (optimizer updates), nodes traced after ``loss.backward()`` that read its
  results (gradient clipping), and backward collectives whose results only ``U`` reads (the
  data-parallel gradient all-reduce runs once per step on the summed gradients, as OneFlow does).
- ``B``: backward nodes and what reads them; ``F``: the rest.

Not a registered pass: the pipeline lowering calls these functions on the logical graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import HoloflowError, UnsupportedError
from ...core.registry import REGISTRY
from ..ir import AliasGroups, IRGraph, Node, Value
from ..optimizer import _group_update

STAGE = "stage"   # the family of a move between stages' placements (graph/pipeline.py's stage_move)


def is_move(n: Node) -> bool:
    """A move between placements (a stage boundary): asked of the op's declared family."""
    op = REGISTRY.get(n.op) if n.kernel is None else None
    return op is not None and op.family == STAGE


def tag_update_nodes(g: IRGraph, mark: int) -> IRGraph:
    """Tags ``upd`` the nodes traced after backward (index >= ``mark``) that read backward's values."""
    bw: set = set()
    nodes = []
    for i, n in enumerate(g.nodes):
        dep = any(v in bw for v in n.value_inputs())
        if "bw" in n.tags or dep:
            bw.update(n.outputs)
        if i >= mark and "bw" not in n.tags and (dep or n.effect):
            n = n.with_(tags=n.tags | {"upd"})
        nodes.append(n)
    return g.with_(nodes=tuple(nodes))


def _collective(n: Node) -> bool:
    op = REGISTRY.get(n.op) if n.kernel is None else None
    return op is not None and op.collective


def phases(g: IRGraph) -> dict[int, str]:
    """``id(node) -> 'F' | 'B' | 'U'`` (see the module docstring)."""
    prod = g.producers()
    ph: dict[int, str] = {}
    for n in g.nodes:
        srcs = {ph[id(prod[v])] for v in n.value_inputs() if v in prod}
        if n.effect or "upd" in n.tags or "U" in srcs:
            ph[id(n)] = "U"
        elif "bw" in n.tags or "recompute" in n.tags or "B" in srcs:   # recomputed in backward (checkpointing)
            ph[id(n)] = "B"
        else:
            ph[id(n)] = "F"
    users = g.users()
    outs = {o for o in g.outputs if isinstance(o, Value)} | {v for _, v in g.updates}
    changed = True
    while changed:
        changed = False
        for n in reversed(g.nodes):
            if ph[id(n)] == "B" and not is_move(n) and _collective(n) and n.outputs and all(
                    v not in outs and users.get(v) and all(ph[id(u)] == "U" for u in users[v]) for v in n.outputs):
                ph[id(n)] = "U"
                changed = True
    return ph


def value_placements(g: IRGraph) -> dict:
    """Every global value's placement, including values a pass made without one (AMP casts and
    the nodes it re-made): a node's values share the placement of the first value that has one."""
    out = {v: v.placement for v in (*g.feeds, *(v for v, _ in g.state)) if v.placement is not None}
    for n in g.nodes:
        if is_move(n):
            out[n.outputs[0]] = n.attrs["dst"]
            continue
        p = next((v.placement for v in n.outputs if v.placement is not None), None) or \
            next((out[v] for v in n.value_inputs() if v in out), None)
        if p is not None:
            for v in n.outputs:
                out.setdefault(v, v.placement or p)
    return out


def node_placement(n: Node, places: dict | None = None):
    places = places if places is not None else {}
    for v in (*n.outputs, *n.value_inputs()):
        p = v.placement or places.get(v)
        if p is not None:
            return p
    return None


def implicit_placements(g: IRGraph) -> list:
    """Stages when no module has one: each placement the graph computes on, ordered so that
    forward moves go to later stages (ties: order of first use)."""
    seen: list = []
    places = value_placements(g)
    for n in g.nodes:   # a move's destination is a stage even when nothing computes there
        for p in ((n.attrs["src"], n.attrs["dst"]) if is_move(n) else (node_placement(n, places),)):
            if p is not None and p not in seen and not n.effect:
                seen.append(p)
    for v in (*g.feeds, *(v for v, _ in g.state)):
        if v.placement is not None and v.placement not in seen:
            seen.append(v.placement)
    ph = phases(g)
    before = {p: set() for p in seen}
    for n in g.nodes:
        if is_move(n) and ph[id(n)] == "F" and n.attrs["dst"] in before:
            before[n.attrs["dst"]].add(n.attrs["src"])
    order: list = []
    while len(order) < len(seen):
        ready = [p for p in seen if p not in order and before[p] <= set(order)]
        order.append(ready[0] if ready else next(p for p in seen if p not in order))   # a cycle: reported later
    for i, a in enumerate(order):   # stages are disjoint rank sets: a permutation is no pipeline
        for b in order[:i]:
            shared = set(a.flat_ranks) & set(b.flat_ranks)
            if shared:
                raise UnsupportedError(f"holoflow.nn.Graph: build() moves tensors between {b} and {a}, which "
                                       f"share ranks {sorted(shared)}; inside a graph a move between "
                                       f"placements is a pipeline stage boundary (disjoint ranks). Do this "
                                       f"move outside the graph (eager), or keep one placement")
    return order


def check_stages(g: IRGraph, placements: list, ph: dict) -> None:
    """Every global node sits on a stage's placement; forward moves go to later stages and
    backward moves to earlier ones (anything else is a cycle between stages)."""
    index = {p: i for i, p in enumerate(placements)}
    places = value_placements(g)
    for n in g.nodes:
        if is_move(n):
            s, d = index.get(n.attrs["src"]), index.get(n.attrs["dst"])
            if s is None or d is None:
                bad = n.attrs["src"] if s is None else n.attrs["dst"]
                raise HoloflowError(f"holoflow.nn.Graph: a tensor moves to {bad} at {n.source or '?'}, which is no "
                                    f"stage's placement (stages: {', '.join(map(str, placements))})")
            if ph[id(n)] == "U":   # once per step (a clip's norms and factor): any direction
                continue
            fwd = ph[id(n)] == "F"
            if (fwd and d <= s) or (not fwd and d >= s):
                raise HoloflowError(
                    f"holoflow.nn.Graph: impossible stage assignment: at {n.source or '?'} a "
                    f"{'forward' if fwd else 'backward'} "
                    f"value moves from stage {s} ({n.attrs['src']}) to stage {d} ({n.attrs['dst']}); "
                    f"forward data must flow to later stages (a cycle between stages cannot be pipelined)")
            continue
        p = node_placement(n, places)
        if p is not None and p not in index and not n.effect:
            raise HoloflowError(f"holoflow.nn.Graph: op {n.op!r} at {n.source or '?'} runs on {p}, which is no "
                                f"stage's placement (stages: {', '.join(map(str, placements))})")


def _effect_share(n: Node, mine, places: dict, sync: Any = None) -> Node | None:
    """An optimizer effect over parameters of several stages, restricted to this stage's: the
    optimizer's own update on those parameters (None if it has none); a grad scaler's update
    (under ZeRO or not) becomes this stage's share of it, every stage's inf checks summed by
    ``sync`` (graph/optimizer.py's ``_zero_scaler_update``)."""
    vals = n.value_inputs()
    here = [i for i, v in enumerate(n.inputs)
            if isinstance(v, Value) and (v.placement or places.get(v)) in (None, mine)]
    k = n.kernel
    share = getattr(k, "share", None)
    if share is not None:   # every stage runs its share, to step or skip with the others
        if sync is None:
            raise UnsupportedError("holoflow.nn.Graph: a GradScaler with pipeline stages needs the pipeline runner")
        return n.with_(inputs=tuple(n.inputs[i] for i in here), kernel=share(here, sync))
    if len(here) == len(n.inputs) or not vals:
        return n
    restrict = getattr(k, "restrict", None)
    if restrict is not None:   # step hooks: every stage runs them, seeing its parameters' gradients
        return n.with_(inputs=tuple(n.inputs[i] for i in here), kernel=restrict(here))
    if not here:
        return None
    if getattr(k, "params", None) is None or len(k.params) != len(n.inputs):
        raise HoloflowError(f"holoflow.nn.Graph: the update {n.op!r} reads gradients of several pipeline stages "
                            f"and cannot be split by stage")
    part = _group_update(k.opt, k.group_index, [k.params[i] for i in here], getattr(k, "book", None))
    return n.with_(inputs=tuple(n.inputs[i] for i in here), kernel=part)


@dataclass
class RankGraph:
    """Rank r's share: its nodes by phase, what it receives and sends per channel, its feeds."""

    graph: IRGraph                 # feeds = (my feeds, received values); outputs = see `exports`
    phase: dict                    # id(node) -> phase, for graph.nodes
    feeds: list                    # indices into the logical graph's feeds that this rank reads
    recv: dict = field(default_factory=dict)   # (phase, src stage, dst stage) -> [values received]
    send: dict = field(default_factory=dict)   # (phase, src stage, dst stage) -> [values sent]
    outputs: list = field(default_factory=list)   # indices of logical outputs produced here


U_TAG = 30000   # channel tags of once-per-step moves (forward / backward channels use 1xxxx / 2xxxx)


def rank_graph(g: IRGraph, placements: list, ph: dict, rank: int, p2p: Any = None,
               sync: Any = None) -> RankGraph | None:
    """The logical graph restricted to ``rank``'s stage (None if the rank is on no stage): its
    nodes, local values its nodes need, moves turned into send/recv channels.

    Moves after backward (``U``: a clip's norms gathered on one stage, its factor sent back) stay
    nodes of the update program, in traced order on every rank: ``p2p.send(peer, tag)`` and
    ``p2p.recv(value, peer, tag)`` make their kernels. ``sync(x)`` sums a float over every
    stage's ranks (a grad scaler's inf check split by stage)."""
    mine = next((p for p in placements if rank in p.flat_ranks), None)
    if mine is None:
        return None
    index = {p: i for i, p in enumerate(placements)}
    places = value_placements(g)
    ph = dict(ph)
    keep: list[Node] = []
    state_values = {v for v, _ in g.state}
    recv: dict = {}
    send: dict = {}
    n_u = 0
    for n in g.nodes:
        if is_move(n) and ph[id(n)] == "U":
            src, dst, tag = n.attrs["src"], n.attrs["dst"], U_TAG + n_u
            n_u += 1
            if mine not in (src, dst):
                continue
            if p2p is None:
                raise UnsupportedError(f"holoflow.nn.Graph: at {n.source or '?'} a value computed after "
                                       f"loss.backward() moves between pipeline stages; this runner cannot send it")
            if src == mine:
                peer = dst.flat_ranks[src.flat_ranks.index(rank)]
                x = n.inputs[0]
                tok = Value(x.shape, x.dtype, x.device)   # the sent value itself (nothing reads it)
                new = Node("stage_send", (x,), {"peer": peer, "tag": tag}, (tok,), n.source, n.scope,
                           kernel=p2p.send(peer, tag), tags=n.tags)
            else:
                peer = src.flat_ranks[dst.flat_ranks.index(rank)]
                new = Node("stage_recv", (), {"peer": peer, "tag": tag}, n.outputs, n.source, n.scope,
                           kernel=p2p.recv(n.outputs[0], peer, tag), tags=n.tags)
            ph[id(new)] = "U"
            keep.append(new)
            continue
        if is_move(n):
            key = (ph[id(n)], index[n.attrs["src"]], index[n.attrs["dst"]])
            if n.attrs["src"] == mine:
                x = n.inputs[0]
                if x in state_values:   # a parameter read by another stage (tied weights): a
                    # per-micro-batch copy of it that this stage's task makes and sends
                    sent = Value(x.shape, x.dtype, x.device, placement=x.placement, sbp=x.sbp)
                    copy = Node("stage_state_copy", (x,), {}, (sent,), n.source, n.scope, kernel=_copy_state,
                                tags=n.tags)
                    ph[id(copy)] = ph[id(n)]
                    keep.append(copy)
                    x = sent
                send.setdefault(key, []).append(x)
            elif n.attrs["dst"] == mine:
                recv.setdefault(key, []).append(n.outputs[0])
            continue
        if n.effect:
            n = _effect_share(n, mine, places, sync)
            if n is not None:
                ph[id(n)] = "U"
                keep.append(n)
            continue
        p = node_placement(n, places)
        if p == mine or p is None:
            keep.append(n)
    # local nodes (no placement) only where this rank's nodes need them
    need = {v for vs in send.values() for v in vs}
    def where(v: Value):
        return v.placement or places.get(v)
    need |= {o for o in g.outputs if isinstance(o, Value) and where(o) in (None, mine)}
    need |= {v for _, v in g.updates if where(v) == mine}
    out: list[Node] = []
    for n in reversed(keep):
        if node_placement(n, places) is None and not n.effect and not any(v in need for v in n.outputs):
            continue
        need.update(n.value_inputs())
        out.append(n)
    out.reverse()
    feeds = [i for i, f in enumerate(g.feeds) if f.placement == mine or (f.placement is None and f in need)]
    received = [v for vs in recv.values() for v in vs]
    state = tuple((v, t) for v, t in g.state if v.placement in (None, mine))
    outputs = [i for i, o in enumerate(g.outputs) if isinstance(o, Value) and where(o) in (None, mine)]
    sub = g.with_(feeds=tuple(g.feeds[i] for i in feeds) + tuple(received), state=state, nodes=tuple(out),
                  outputs=tuple(g.outputs[i] for i in outputs),
                  updates=tuple((t, v) for t, v in g.updates if where(v) == mine), frees=None)
    return RankGraph(sub, {id(n): ph[id(n)] for n in out}, feeds, recv, send, outputs)


def _copy_state(x):
    """The kernel of a copy of a state value that a move sends to another stage."""
    return x.clone()


def _mask_split(n: Node) -> bool:
    """A backward computing an input gradient and weight gradients at once under an output mask
    (its op declares ``mask_split``): split in two nodes so the weight part can wait."""
    op = REGISTRY.get(n.op) if n.kernel is None else None
    return op is not None and op.mask_split and len(n.outputs) == 3


def _split_mask(n: Node, first: bool) -> Node:
    """``n`` (a norm backward) computing only its input gradient (``first``) or only its weight
    gradients; the outputs it no longer computes become fresh values nothing reads."""
    mask = list(n.attrs["output_mask"])
    keep = [0] if first else [1, 2]
    new_mask = [bool(mk) and i in keep for i, mk in enumerate(mask)]
    outs = tuple(v if i in keep else Value(v.shape, v.dtype, v.device, placement=v.placement, sbp=v.sbp)
                 for i, v in enumerate(n.outputs))
    return n.with_(attrs={**n.attrs, "output_mask": new_mask}, outputs=outs)


def split_weight_grads(nodes: list, keep: set) -> tuple[list, list]:
    """Backward nodes split for zero-bubble schedules: those that ``keep`` values (gradients sent
    to the previous stage, outputs) depend on, and the rest — weight gradients, read only by the
    once-per-step update — which may run later. A norm backward needed for its input gradient is
    split too: its weight and bias gradients go with the rest."""
    need = set(keep)
    first: dict[int, Node] = {}
    later_part: dict[int, Node] = {}
    for n in reversed(nodes):
        if not any(v in need for v in n.outputs):
            continue
        if _mask_split(n) and n.outputs[0] in need \
                and not any(v in need for v in n.outputs[1:]) and any(n.attrs["output_mask"][1:]):
            later_part[id(n)] = _split_mask(n, first=False)
            n0 = _split_mask(n, first=True)
            first[id(n)] = n0
            need.update(n0.value_inputs())
            continue
        need.update(n.value_inputs())
        first[id(n)] = n
    b = [first[id(n)] for n in nodes if id(n) in first]
    w = [later_part.get(id(n), n) for n in nodes if id(n) not in first or id(n) in later_part]
    return _undo_inplace(b, w), w


def _undo_inplace(first: list, later: list) -> list:
    """The ``first`` nodes, those writing in place into a buffer that ``later`` nodes still read
    made out of place again (the memory plan chose in-place ops for the traced order, in which
    the weight gradients read that buffer before the input gradients overwrote it)."""
    groups = AliasGroups((*first, *later))
    read = {groups.find(v) for n in later for v in n.value_inputs()}
    out = []
    for n in first:
        if "inplace" in n.tags and n.inputs and groups.find(n.inputs[0]) in read:
            n = n.with_(kernel=None, tags=n.tags - {"inplace"})
        out.append(n)
    return out


def undo_clobbering(first: list, later: list) -> list:
    """The ``first`` nodes, each in-place write into a buffer whose earlier value a ``later`` node
    still reads made out of place again. The memory plan chose in-place ops for the order of the
    passed graph, in which the schedule pass may have moved a backward node reading ``x`` ahead
    of the forward node that last reads ``x`` (and so may overwrite it); a runtime that runs
    every ``first`` node (a micro-batch's forward) before any ``later`` one (its backward) would
    hand that backward node the overwritten buffer. Reading the in-place result itself, or a
    value made after the write, is left alone."""
    groups = AliasGroups((*first, *later))
    reads: dict = {}
    for n in later:
        for v in n.value_inputs():
            reads.setdefault(groups.find(v), set()).add(v)
    made_after: set = set()
    out = []
    for n in reversed(first):
        made_after.update(n.outputs)
        if "inplace" in n.tags and n.inputs and isinstance(n.inputs[0], Value) and \
                any(v not in made_after for v in reads.get(groups.find(n.inputs[0]), ())):
            n = n.with_(kernel=None, tags=n.tags - {"inplace"})
        out.append(n)
    return out[::-1]


def split_weight_grads_within(nodes: list, keep: set, budget: int, state: set) -> tuple[list, list]:
    """`split_weight_grads`, with the deferred part reading at most ``budget`` bytes (per
    micro-batch) of values it does not make itself (``state`` is not per micro-batch). The weight
    gradients to defer are chosen greedily, most estimated work (`work`) per byte they add to what
    the deferred part holds first (one that reads only what is already held adds none); the others
    run with the input gradients. So a zero-bubble stage holds at most ``budget`` bytes per
    waiting micro-batch and defers as much of its work as fits."""
    first, later = split_weight_grads(nodes, keep)
    if _held(later, state) <= budget:
        return first, later
    sinks = _sinks(later)
    cones = {id(s): _cone(s, later) for s in sinks}
    cost = {id(n): work(n) for n in later}
    chosen: set = set()   # ids of the sinks kept deferred

    def deferred(extra: int) -> list:   # what stays deferred if only the chosen sinks and ``extra`` are
        moved = set().union(*(cones[id(s)] for s in sinks if id(s) not in chosen and id(s) != extra))
        return [n for n in later if id(n) not in moved]
    held_now, work_now = 0, 0.0
    while True:
        best = None
        for s in sinks:
            if id(s) in chosen:
                continue
            d = deferred(id(s))
            h = _held(d, state)
            if h > budget:
                continue
            w = sum(cost[id(n)] for n in d)
            score = (w - work_now) / max(h - held_now, 1)
            if best is None or score > best[0]:
                best = (score, id(s), h, w)
        if best is None:
            break
        _, sid, held_now, work_now = best
        chosen.add(sid)
    moved = {v for s in sinks if id(s) not in chosen for v in s.outputs}
    return split_weight_grads(nodes, set(keep) | moved)


def work(n: Node) -> float:
    """A node's estimated work, for choosing what to defer: multiply-adds for an op of the
    ``einsum`` family (``out`` times the contracted size, sqrt(|a| |b| / |out|) for operands a, b),
    else the elements it reads and writes."""
    op = REGISTRY.get(n.op) if n.kernel is None else None
    ins = n.value_inputs()
    out = sum(_numel(v) for v in n.outputs)
    if op is not None and op.family == "einsum" and len(ins) >= 2 and out:
        return out * math.sqrt(_numel(ins[0]) * _numel(ins[1]) / out)
    return float(sum(_numel(v) for v in ins) + out)


def _numel(v: Value) -> int:
    return math.prod(v.shape)


def _held(nodes: list, state: set) -> int:
    """Bytes of the values ``nodes`` read and do not make (state excluded: it is not per micro-batch)."""
    made = {v for n in nodes for v in n.outputs}
    read = {v for n in nodes for v in n.value_inputs() if v not in made and v not in state}
    return sum(v.nbytes for v in read)


def _sinks(nodes: list) -> list:
    """The nodes of ``nodes`` whose outputs no other node of them reads."""
    read = {v for n in nodes for v in n.value_inputs()}
    return [n for n in nodes if not any(v in read for v in n.outputs)]


def _cone(sink: Node, nodes: list) -> set:
    """Ids of ``sink`` and the nodes of ``nodes`` it depends on."""
    made = {v: n for n in nodes for v in n.outputs}
    cone, todo = {id(sink)}, [sink]
    while todo:
        for v in todo.pop().value_inputs():
            n = made.get(v)
            if n is not None and id(n) not in cone:
                cone.add(id(n))
                todo.append(n)
    return cone
