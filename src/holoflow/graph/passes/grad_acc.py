"""Gradient accumulation (``config.set_gradient_accumulation_steps(n)``): each batch runs as ``n``
micro-batches and the optimizer updates once with the full batch's gradient.

The micro-batches are ranks of a 1-D "time" mesh, and the rewrite is the one a data-parallel
graph would get, reusing every op's SBP rule (docs/architecture.md): each feed is split along dim 0
(``S(0)``), state is broadcast (``B``); every node is replicated ``n`` times on the local pieces,
with the signature whose input SBPs match (the op's ``local_attrs`` mapping shape attrs such as
a reshape's target or a mean's count to the piece); outputs take the signature's SBPs. A value
whose SBP doesn't fit the next op is boxed: ``S(d)`` is concatenated, ``P`` summed, ``B`` split.

So the traced mean loss becomes ``P`` — each micro-batch holds its partial sum divided by the
full count — its backward gives partial gradients, and the effect nodes read their sum: exactly
the full-batch gradient, which is what eager's ``(loss_i / n).backward()`` per micro-batch of a
mean loss accumulates. Graph outputs come back whole: scalars of partial values summed (the
full-batch mean), batch-shaped (``S(0)``) outputs concatenated. Random ops run once per micro-
batch on their own piece (fresh draws). Nodes, effects aside, are then ordered micro-batch by
micro-batch where the data flow allows, so one micro-batch's activations die before the next's.
"""
from __future__ import annotations

import heapq

import torch

from ...core.errors import HoloflowError, UnsupportedError
from ...core.registry import REGISTRY, Meta, infer_metas
from ...core.sbp import B, P, S, split
from ..ir import IRGraph, Node, Value
from . import register


def piece_sizes(length: int, n: int) -> tuple:
    """Sizes of ``n`` pieces of ``length`` (the first ``length % n`` one longer, as SBP splits)."""
    return tuple(length // n + (1 if k < length % n else 0) for k in range(n))


class _Rewriter:
    def __init__(self, n: int) -> None:
        self.n = n
        self.sbp: dict[Value, object] = {}
        self.local: dict[Value, list] = {}   # logical value -> its n local values
        self.whole: dict[Value, Value] = {}  # logical value -> its boxed-to-B value
        self.nodes: list[tuple] = []         # (node, micro-batch index or None)

    def emit(self, node: Node, k: int | None = None) -> Node:
        self.nodes.append((node, k))
        return node

    # -- boxing ----------------------------------------------------------------------------------
    def to_b(self, v: Value, at: Node) -> Value:
        s = self.sbp[v]
        if s == B:
            return self.local[v][0]
        if v not in self.whole:
            parts = self.local[v]
            out = Value(v.shape, v.dtype, v.device)
            if isinstance(s, split):
                self.emit(Node("cat", tuple(parts), {"dim": s.axis}, (out,), at.source, at.scope, tags=at.tags))
            else:
                acc = parts[0]
                for i, p in enumerate(parts[1:], 1):
                    nxt = out if i == len(parts) - 1 else Value(v.shape, v.dtype, v.device)
                    self.emit(Node("add", (acc, p), {"alpha": 1}, (nxt,), at.source, at.scope, tags=at.tags))
                    acc = nxt
            self.whole[v] = out
        return self.whole[v]

    def box(self, v: Value, want, at: Node) -> list:
        """The n local values of ``v`` under SBP ``want``."""
        if self.sbp[v] == want:
            return self.local[v]
        full = self.to_b(v, at)
        if want == B:
            return [full] * self.n
        assert isinstance(want, split)
        sizes = piece_sizes(v.shape[want.axis], self.n)
        outs = tuple(Value(tuple(s if d == want.axis else x for d, x in enumerate(v.shape)), v.dtype, v.device)
                     for s in sizes)
        self.emit(Node("split", (full,), {"sizes": sizes, "dim": want.axis}, outs, at.source, at.scope,
                       tags=at.tags))
        return list(outs)

    def define(self, v: Value, s, parts: list) -> None:
        self.sbp[v], self.local[v] = s, parts

    # -- nodes -------------------------------------------------------------------------------------
    def node(self, n: Node) -> None:
        vals = n.value_inputs()
        cur = [self.sbp[v] for v in vals]
        if all(s == B for s in cur):  # nothing depends on the batch: run once
            ins = tuple(self.local[x][0] if isinstance(x, Value) else x for x in n.inputs)
            self.emit(n.with_(inputs=ins))
            for o in n.outputs:
                self.define(o, B, [o] * self.n)
            return
        op = REGISTRY[n.op]
        metas = [Meta(x.shape, x.dtype, x.device) if isinstance(x, Value) else x for x in n.inputs]
        sig = _choose(op, metas, n.attrs, cur, len(n.outputs))
        parts = {v: self.box(v, s, n) for v, s in zip(vals, sig[0])}
        outs_k = []
        for k in range(self.n):
            ins = tuple(parts[x][k] if isinstance(x, Value) else x for x in n.inputs)
            local_metas = [Meta(x.shape, x.dtype, x.device) if isinstance(x, Value) else x for x in ins]
            attrs = op.local_attrs(n.attrs, metas, local_metas, tuple(sig[0])) if op.local_attrs else n.attrs
            shapes = infer_metas(op, tuple(torch.empty(x.shape, dtype=x.dtype, device="meta")
                                           if isinstance(x, Value) else x for x in ins), attrs)
            outs = tuple(Value(tuple(m.shape), m.dtype, o.device) for o, m in zip(n.outputs, shapes))
            self.emit(n.with_(inputs=ins, attrs=dict(attrs), outputs=outs), k)
            outs_k.append(outs)
        for j, o in enumerate(n.outputs):
            self.define(o, sig[1][j], [outs[j] for outs in outs_k])


def _choose(op, metas: list, attrs: dict, cur: list, n_out: int) -> tuple:
    """The declared signature needing the fewest boxings (never into P), on a tie the one that
    keeps more inputs split (work stays per micro-batch); all-B if none fits."""
    best, best_moves = ((B,) * len(cur), (B,) * n_out), None
    for ins, outs in (op.sbp(metas, attrs) if op.sbp is not None else []):
        if len(ins) != len(cur) or any(w == P and c != P for w, c in zip(ins, cur)):
            continue
        moves = (sum(w != c for w, c in zip(ins, cur)), sum(w == B for w in ins))
        if best_moves is None or moves < best_moves:
            best, best_moves = (tuple(ins), tuple(outs)), moves
    return best


def _schedule(items: list) -> list:
    """A topological order preferring shared nodes first, then lower micro-batch, then the
    original order — so micro-batch k runs as far as it can before k+1 starts."""
    made = {v: i for i, (nd, _) in enumerate(items) for v in nd.outputs}
    deps = [{made[v] for v in nd.value_inputs() if v in made} for nd, _ in items]
    users: dict[int, list] = {}
    for i, ds in enumerate(deps):
        for d in ds:
            users.setdefault(d, []).append(i)
    left = [len(ds) for ds in deps]
    key = [(0 if k is None else 1, k or 0, i) for i, (_, k) in enumerate(items)]
    ready = [key[i] for i in range(len(items)) if not left[i]]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)[2]
        order.append(items[i][0])
        for u in users.get(i, ()):
            left[u] -= 1
            if not left[u]:
                heapq.heappush(ready, key[u])
    return order


@register("grad_acc", enabled=lambda cfg: getattr(cfg, "grad_acc_steps", 1) > 1)
def grad_acc(g: IRGraph, config) -> IRGraph:
    """Splits the batch into ``config.grad_acc_steps`` micro-batches; see the module docstring."""
    n = config.grad_acc_steps
    if any(v.placement is not None for v in (*g.feeds, *(v for v, _ in g.state))):
        raise UnsupportedError(
            "holoflow.nn.Graph: gradient accumulation (set_gradient_accumulation_steps) in a graph of "
            "global tensors is not supported yet; accumulate eagerly, or train the global graph with "
            "the whole batch per step")
    r = _Rewriter(n)
    users, producer = g.users(), g.producers()
    for f in g.feeds:
        if not f.shape or f.shape[0] % n:
            raise HoloflowError(
                f"holoflow.nn.Graph: gradient accumulation splits every input along dim 0 into {n} "
                f"micro-batches, but input {f!r} has shape {tuple(f.shape)}; pass a batch whose size is a "
                f"multiple of {n} (or set_gradient_accumulation_steps to a divisor of it)")
        r.define(f, S(0), _split_feed(r, f, users[f][0].source if f in users else ""))
        r.whole[f] = f  # the whole of a feed is the feed
    for v, _t in g.state:
        r.define(v, B, [v] * n)
    effects = []
    for node in g.nodes:
        if node.effect:
            effects.append(node)
        else:
            r.node(node)
    tail = [e.with_(inputs=tuple(r.to_b(x, e) if isinstance(x, Value) else x for x in e.inputs)) for e in effects]
    outputs = tuple(r.to_b(o, _end(o, producer)) if isinstance(o, Value) else o for o in g.outputs)
    updates = tuple((t, r.to_b(v, _end(v, producer))) for t, v in g.updates)
    return g.with_(nodes=tuple(_schedule(r.nodes) + tail), outputs=outputs, updates=updates)


def _split_feed(r: _Rewriter, f: Value, source: str) -> list:
    """Splits a feed into micro-batches (the node gets the line of the feed's first reader)."""
    sizes = piece_sizes(f.shape[0], r.n)
    outs = tuple(Value((s,) + tuple(f.shape[1:]), f.dtype, f.device, f"{f.name}_mb{k}") for k, s in enumerate(sizes))
    r.emit(Node("split", (f,), {"sizes": sizes, "dim": 0}, outs, source))
    return list(outs)


def _end(v: Value, producer: dict) -> Node:
    """Where a graph output or state update is boxed back whole: at the line that made it."""
    p = producer.get(v)
    return Node("output", (), {}, (), p.source if p is not None else "")
