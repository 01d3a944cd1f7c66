"""Gradient accumulation (``config.set_gradient_accumulation_steps(m)``), OneFlow's semantics:
each batch runs as ``m`` micro-batches, one forward and backward each, and the optimizer updates
once with the sum of their gradients.

``nn.Graph`` traces ``build`` on one micro-batch (inputs of ``batch / m`` rows, graph/pipeline.py
``micro_protos``) with ``loss.backward()`` scaled by ``1 / m`` (graph/graph_compile.py ``_backward_rule``),
exactly what eager code does with ``(loss / m).backward()`` per micro-batch. This pass turns that
micro-batch graph into the step:

- every input is split along dim 0 into ``m`` pieces; nodes that depend on an input, on a random
  draw or on state the step writes back (BatchNorm's running statistics) are *varying* and run
  once per micro-batch on their own piece, in micro-batch order where the data flow allows (so
  one micro-batch's activations die before the next starts, and random draws come in eager's
  order); nodes that depend on none of these (reads of the parameters) run once;
- state written back is chained: micro-batch ``k`` reads what micro-batch ``k - 1`` wrote (a
  BatchNorm's running statistics take ``m`` momentum updates, as in eager), the last one is
  written back;
- effect nodes (the optimizer's update) read gradients: each is the sum of the micro-batches'
  values, added in micro-batch order (eager's accumulation into ``.grad``) — ``m`` times the
  value when it does not depend on the data;
- outputs come back per micro-batch, packed as OneFlow packs them: a scalar (the loss) becomes
  shape ``(m,)``, one value per micro-batch; other outputs are concatenated along dim 0.
"""
from __future__ import annotations

import heapq

from ...core.errors import HoloflowError
from ...core.registry import REGISTRY
from ..ir import IRGraph, Node, Value
from . import register


def piece_sizes(length: int, n: int) -> tuple:
    """Sizes of ``n`` pieces of ``length`` (the first ``length % n`` one longer, as SBP splits)."""
    return tuple(length // n + (1 if k < length % n else 0) for k in range(n))


class _Replicator:
    """Copies of the micro-batch graph's nodes: ``local[v][k]`` is value ``v`` in micro-batch
    ``k`` (the same Value in every micro-batch when ``v`` does not vary)."""

    def __init__(self, m: int) -> None:
        self.m = m
        self.local: dict[Value, list] = {}
        self.varies: set[Value] = set()
        self.nodes: list[tuple] = []          # (node, micro-batch index or None when shared)
        self.totals: dict[Value, Value] = {}  # gradient -> its micro-batches' sum (once per gradient)

    def emit(self, node: Node, k: int | None = None) -> None:
        self.nodes.append((node, k))

    def node(self, n: Node) -> None:
        op = REGISTRY.get(n.op) if n.kernel is None else None
        if not (op is not None and op.random) and not any(v in self.varies for v in n.value_inputs()):
            self.emit(n)
            for o in n.outputs:
                self.local[o] = [o] * self.m
            return
        outs_k = []
        for k in range(self.m):
            ins = tuple(self.local[x][k] if isinstance(x, Value) else x for x in n.inputs)
            outs = tuple(Value(o.shape, o.dtype, o.device, f"{o.name}_mb{k}" if o.name else "") for o in n.outputs)
            self.emit(n.with_(inputs=ins, outputs=outs), k)
            outs_k.append(outs)
        for j, o in enumerate(n.outputs):
            self.local[o] = [outs[j] for outs in outs_k]
            self.varies.add(o)

    def total(self, v: Value, at: Node) -> Value:
        """The micro-batches' values of gradient ``v`` summed in micro-batch order. A gradient
        that does not depend on the data (a bias's under a sum loss) is computed once but still
        counts once per micro-batch."""
        done = self.totals.get(v)
        if done is not None:   # read by several effects (an update and its step hooks): summed once
            return done
        acc = self.local[v][0]
        for p in self.local[v][1:]:
            nxt = Value(v.shape, v.dtype, v.device)
            self.emit(Node("add", (acc, p), {"alpha": 1}, (nxt,), at.source, at.scope, tags=at.tags))
            acc = nxt
        self.totals[v] = acc
        return acc

    def pack(self, v: Value, at: Node) -> Value:
        """OneFlow's pack of an output: scalars stacked into ``(m,)``, others concatenated on dim 0."""
        parts = self.local[v]
        if not v.shape:
            rows = []
            for p in parts:
                r = Value((1,), v.dtype, v.device)
                self.emit(Node("reshape", (p,), {"shape": (1,)}, (r,), at.source, at.scope, tags=at.tags))
                rows.append(r)
            parts, shape = rows, (self.m,)
        else:
            shape = (v.shape[0] * self.m,) + tuple(v.shape[1:])
        out = Value(shape, v.dtype, v.device)
        self.emit(Node("cat", tuple(parts), {"dim": 0}, (out,), at.source, at.scope, tags=at.tags))
        return out


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
    """The step of ``config.grad_acc_steps`` micro-batches from the graph traced on one; see the
    module docstring."""
    m = config.grad_acc_steps
    if any(v.placement is not None for v in (*g.feeds, *(v for v, _ in g.state))):
        raise HoloflowError("holoflow.nn.Graph: the grad_acc pass handles local graphs; global graphs run "
                            "their micro-batches as runtime iterations (graph/pipeline.py)")
    r = _Replicator(m)
    users, producer = g.users(), g.producers()
    feeds = []
    for f in g.feeds:
        if not f.shape:
            raise HoloflowError(f"holoflow.nn.Graph: gradient accumulation splits every input along dim 0, but "
                                f"input {f!r} is a scalar")
        whole = Value((f.shape[0] * m,) + tuple(f.shape[1:]), f.dtype, f.device, f.name)
        pieces = tuple(Value(f.shape, f.dtype, f.device, f"{f.name}_mb{k}") for k in range(m))
        # (an input nothing reads still gets a line: the check after the pass wants one on every node)
        source = users[f][0].source if f in users else next((n.source for n in g.nodes if n.source), "")
        r.emit(Node("split", (whole,), {"sizes": (f.shape[0],) * m, "dim": 0}, pieces, source))
        r.local[f], feeds = list(pieces), feeds + [whole]
        r.varies.add(f)
    written = {id(t): v for t, v in g.updates}
    state_of = {id(t): v for v, t in g.state}
    for v, t in g.state:
        r.local[v] = [v] * m
        if id(t) in written:
            r.varies.add(v)          # read per micro-batch: chained below, as nodes are copied
    chained = {state_of[id(t)]: nv for t, nv in g.updates if id(t) in state_of}
    effects = []
    for node in g.nodes:
        if node.effect:
            effects.append(node)
            continue
        r.node(node)
        for s, nv in chained.items():       # micro-batch k reads what k - 1 wrote, once it exists
            if nv in r.local and r.local[s][1:] != r.local[nv][:-1]:
                r.local[s] = [s] + r.local[nv][:-1]
                _retarget(r, s)
    state = {v for v, _ in g.state}
    tail = [e.with_(inputs=tuple(r.total(x, e) if isinstance(x, Value) and x not in state else x
                                 for x in e.inputs)) for e in effects]
    line = next((n.source for n in g.nodes if n.source), "")
    outputs = tuple(r.pack(o, _end(o, producer, line)) if isinstance(o, Value) else o for o in g.outputs)
    updates = tuple((t, r.local[v][-1]) for t, v in g.updates)
    return g.with_(feeds=tuple(feeds), nodes=tuple(_schedule(r.nodes) + tail), outputs=outputs, updates=updates)


def _retarget(r: _Replicator, s: Value) -> None:
    """Rewrites the already copied readers of state ``s`` in micro-batches ``k > 0`` to read the
    value micro-batch ``k - 1`` wrote."""
    for i, (nd, k) in enumerate(r.nodes):
        if k and s in nd.inputs:
            r.nodes[i] = (nd.with_(inputs=tuple(r.local[s][k] if x is s else x for x in nd.inputs)), k)


def _end(v: Value, producer: dict, line: str = "") -> Node:
    """Where a graph output is packed: at the line that made it (``line`` for an input or state
    returned as it is: the check after the pass wants a line on every node)."""
    p = producer.get(v)
    return Node("output", (), {}, (), p.source if p is not None else line)
