"""Memory planning: free every value right after its last use (the caching allocator then
reuses the block), run elementwise ops in place where the buffer of their first input is dead,
and report the planned peak bytes of activations.

The plan is a dict ``id(node) -> values to free after it``, stored on the graph as
``graph.frees`` for lowering; ``peak_bytes(graph)`` simulates live buffers node by node.

In-place reuse: ``out = f(x, ...)`` becomes ``x.f_(...)`` (the op's ``inplace_kernel``; the node
is tagged ``inplace``) when

- the op is declared ``elementwise`` and ``fresh`` with an in-place kernel, the node has one
  output of ``x``'s shape, dtype and device, and the in-place kernel gives the same result on a
  small probe (signatures differ for some ops: ``atan2_`` rejects a Python scalar);
- ``x`` is not a feed, state, graph output or state update, and was produced by an op declared
  ``fresh`` (a new dense buffer: a view, an expand or ``x.to(same dtype)`` may share memory);
- every value that may share ``x``'s memory (its *alias group*: values joined through any op
  not declared ``fresh`` — reshape, transpose, getitem, expand, ...) is dead after this node, and
  no other input of the node is in that group (``x.add_(x.t())`` would read elements it has
  already written);
- producer and consumer run in the same task (lowering's task split), so no other task holds
  the buffer.

Scheduling (first, on the functional IR): inside each task, a node that frees more bytes than
it allocates (``linear_grad_weight`` reading the last use of an activation) runs as soon as
its inputs are ready, ahead of nodes that would allocate while that activation is still live.
Random nodes keep their relative order (the RNG stream), effect nodes stay in their task, global
graphs are left in traced order (ranks with uneven shards would order collectives differently),
and the new order is kept only when it lowers the planned peak.
"""
from __future__ import annotations

import torch

from ...core.registry import REGISTRY
from ..ir import AliasGroups, IRGraph, Node, Value, may_alias, split_tasks
from . import register


def execution_order(g: IRGraph) -> list[Node]:
    """Nodes in the order lowering runs them: effect nodes (optimizer updates) last."""
    return [n for n in g.nodes if not n.effect] + [n for n in g.nodes if n.effect]


def _keep(g: IRGraph) -> set:
    return {o for o in g.outputs if isinstance(o, Value)} | {v for _, v in g.updates} | \
        {v for v, _ in g.state} | set(g.feeds)


def last_uses(g: IRGraph) -> dict:
    """``id(node) -> [values whose last reader is that node]`` (outputs and state never freed)."""
    keep = _keep(g)
    last: dict = {}
    for n in execution_order(g):
        for v in n.value_inputs():
            last[v] = n
        for v in n.outputs:  # a value nobody reads dies where it is born
            last.setdefault(v, n)
    frees: dict = {}
    for v, n in last.items():
        if v not in keep:
            frees.setdefault(id(n), []).append(v)
    return frees


def peak_bytes(g: IRGraph, frees: dict | None = None) -> int:
    """Peak bytes of live intermediate buffers when freed at last use (``frees``) or never.

    A node tagged ``inplace`` writes into its first input's buffer and a broadcast is a view of
    it, so their outputs add nothing; a buffer is released when the last value living in it is
    freed.
    """
    buf: dict = {}       # value -> buffer id
    refs: dict = {}      # buffer id -> number of live values in it
    size: dict = {}      # buffer id -> bytes
    live = peak = 0
    for n in g.nodes:
        for i, v in enumerate(n.outputs):
            if i == 0 and _shares_first_input(n):
                b = buf.get(n.inputs[0], n.inputs[0])  # a feed's or state's memory: not counted
                size.setdefault(b, 0)
            else:
                b = v
                size[b] = v.nbytes
                live += v.nbytes
            buf[v] = b
            refs[b] = refs.get(b, 0) + 1
        peak = max(peak, live)
        for v in (frees or {}).get(id(n), ()):
            b = buf.get(v)
            if b is None:
                continue
            refs[b] -= 1
            if refs[b] == 0:
                live -= size[b]
    return peak


def _shares_first_input(n: Node) -> bool:
    """In-place nodes and broadcasts (``expand``, ``unreduce``: stride-0 views) add no memory."""
    if not n.inputs or not isinstance(n.inputs[0], Value):
        return False
    op = REGISTRY.get(n.op)
    return "inplace" in n.tags or (op is not None and n.kernel is None and op.family == "broadcast")


def _small(v: Value, gen: torch.Generator) -> torch.Tensor:
    """A small tensor broadcasting like ``v``, drawn from a private generator (the global RNG
    belongs to the program: drawing from it here would change its random numbers)."""
    shape = tuple(min(d, 2) for d in v.shape)
    if v.dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if v.dtype.is_floating_point or v.dtype.is_complex:
        return (torch.rand(shape, generator=gen) + 0.5).to(v.dtype)
    return torch.randint(1, 4, shape, generator=gen).to(v.dtype)


_PROBED: dict = {}


def inplace_agrees(n: Node) -> bool:
    """Runs the op and its in-place kernel on small tensors shaped like ``n``'s inputs; cached
    per op, attrs and input kinds."""
    from .cse import const_key
    kinds = tuple((len(x.shape), tuple(d == 1 for d in x.shape), x.dtype) if isinstance(x, Value)
                  else const_key(x) for x in n.inputs)
    key = (n.op, const_key(n.attrs), kinds)
    if key not in _PROBED:
        op = REGISTRY[n.op]
        try:
            gen = torch.Generator().manual_seed(0)
            args = [_small(x, gen) if isinstance(x, Value) else x for x in n.inputs]
            want = op.kernel(*args, **n.attrs)
            x0 = args[0].clone()
            got = op.inplace_kernel(x0, *args[1:], **n.attrs)
            _PROBED[key] = got is not None and got.dtype == want.dtype and \
                torch.equal(x0, want) and torch.equal(got, want)
        except Exception:  # a signature the in-place kernel does not take: keep out-of-place
            _PROBED[key] = False
    return _PROBED[key]


def _task_of(g: IRGraph, for_compile: bool = False) -> dict:
    return {id(n): i for i, t in enumerate(split_tasks(g, for_compile)) for n in t.nodes}


def _orders(n: Node) -> list[Node]:
    """``n``, and ``n`` with its inputs swapped when the op declares that exact (so the second
    input's buffer can be reused too)."""
    op = REGISTRY.get(n.op)
    if op is not None and len(n.inputs) == 2 and op.swaps(n.attrs) and \
            isinstance(n.inputs[1], Value) and n.inputs[1] is not n.inputs[0]:
        return [n, n.with_(inputs=(n.inputs[1], n.inputs[0]))]
    return [n]


def _candidate(n: Node, keep: set) -> bool:
    op = REGISTRY.get(n.op)
    if op is None or n.effect or n.kernel is not None or op.random or op.inplace_kernel is None:
        return False
    if not (op.elementwise and op.fresh) or len(n.outputs) != 1:
        return False
    x, out = n.inputs[0] if n.inputs else None, n.outputs[0]
    return isinstance(x, Value) and x not in keep and x.shape == out.shape and \
        x.dtype == out.dtype and x.device == out.device


def _reusable(n: Node, i: int, where, keep, producer, task, groups, members, last) -> bool:
    """Whether ``n`` (at position ``i`` of task ``where``) may write into its first input."""
    if not _candidate(n, keep):
        return False
    x = n.inputs[0]
    p = producer.get(x)
    if p is None or may_alias(p) or task.get(id(p)) != where:
        return False
    if any(m in keep or last[m] > i for m in members[groups.find(x)]):
        return False
    if any(y is not x and groups.find(y) is groups.find(x) for y in n.value_inputs()):
        return False
    return inplace_agrees(n)


def plan_inplace(g: IRGraph, for_compile: bool = False) -> IRGraph:
    """Rewrites the nodes that can run in place (see the module docstring)."""
    keep, order = _keep(g), execution_order(g)
    pos = {id(n): i for i, n in enumerate(order)}
    last: dict = {}
    for n in order:
        for v in n.value_inputs():
            last[v] = pos[id(n)]
        for v in n.outputs:
            last.setdefault(v, pos[id(n)])
    groups = AliasGroups(order)
    members: dict = {}
    producer = {v: n for n in order for v in n.outputs}
    for v in last:
        members.setdefault(groups.find(v), []).append(v)
    task = _task_of(g, for_compile)
    new: dict = {}
    for n in order:
        for m in _orders(n):
            if _reusable(m, pos[id(n)], task.get(id(n)), keep, producer, task, groups, members, last):
                new[id(n)] = m.with_(kernel=REGISTRY[n.op].inplace_kernel, tags=n.tags | {"inplace"})
                break
    if not new:
        return g
    return g.with_(nodes=tuple(new.get(id(n), n) for n in g.nodes))


def _net_bytes(n: Node, left: dict, keep: set, inside: set) -> int:
    """Bytes ``n`` allocates minus the bytes of inputs it reads for the last time."""
    alloc = 0 if _shares_first_input(n) else sum(v.nbytes for v in n.outputs)
    freed = sum(x.nbytes for x in set(n.value_inputs()) if left[x] == 1 and x in inside and x not in keep)
    return alloc - freed


def _schedule_task(nodes: list[Node], keep: set, left: dict, window: int) -> list[Node]:
    inside = {v for n in nodes for v in n.outputs}
    done: set = set()
    pending = list(nodes)
    randoms = [id(n) for n in nodes if (op := REGISTRY.get(n.op)) is not None and op.random]
    readers: dict = {}
    for n in nodes:
        for x in set(n.value_inputs()):
            readers.setdefault(x, []).append(n)
    out: list[Node] = []

    def blocked(n: Node, given: tuple = ()) -> bool:
        return any(x in inside and x not in done and x not in given for x in n.value_inputs()) or \
            (bool(randoms) and id(n) in randoms and id(n) != randoms[0])

    def net(n: Node) -> int:
        """n's bytes, or with a consumer that it alone unblocks and that frees more (a pair)."""
        own = _net_bytes(n, left, keep, inside)
        pairs = [own + _net_bytes(c, left, keep, inside) for v in n.outputs for c in readers.get(v, ())
                 if c is not n and not blocked(c, n.outputs)]
        return min([own, *pairs])

    while pending:
        pick, best = None, 0
        for i, n in enumerate(pending[:window]):
            if blocked(n):
                continue
            b = net(n)
            if pick is None or b < best:   # the ready node (or pair) adding the fewest bytes
                pick, best = i, b
        n = pending.pop(pick)
        if randoms and id(n) == randoms[0]:
            randoms.pop(0)
        for x in set(n.value_inputs()):
            left[x] -= 1
        done.update(n.outputs)
        out.append(n)
    return out


def _collective(n: Node) -> bool:
    op = REGISTRY.get(n.op)
    return op is not None and op.collective


def schedule(g: IRGraph, window: int = 64, for_compile: bool = False) -> IRGraph:
    """Runs memory-freeing nodes early inside each task (see the module docstring)."""
    if any("inplace" in n.tags or n.sbp is not None or _collective(n) for n in g.nodes) or \
            any(v.placement is not None for v in g.feeds):
        return g   # global graphs: every rank must run its collectives in one order, whatever its shard sizes
    keep = _keep(g)
    left: dict = {}
    for n in g.nodes:
        for x in set(n.value_inputs()):
            left[x] = left.get(x, 0) + 1
    mine = {id(n) for n in g.nodes}   # split_tasks adds the state updates' assign nodes
    nodes = [m for t in split_tasks(g, for_compile) for m in
             _schedule_task([n for n in t.nodes if id(n) in mine], keep, left, window)]
    if all(a is b for a, b in zip(nodes, execution_order(g))):
        return g
    return g.with_(nodes=tuple(nodes))


@register("memory_plan")
def memory_plan(g: IRGraph, config=None) -> IRGraph:
    """Scheduling for memory (kept when it lowers the planned peak), in-place reuse (unless
    ``config.inplace_reuse`` is False), then free at last use."""
    for_compile = bool(getattr(config, "compile_tasks", False))   # lowering's task split

    def plan(x: IRGraph) -> IRGraph:
        x = plan_inplace(x, for_compile) if getattr(config, "inplace_reuse", True) else x
        return x.with_(frees=last_uses(x))
    base = plan(g)
    s = schedule(g, for_compile=for_compile)
    if s is g:
        return base
    s = plan(s)
    return s if peak_bytes(s, s.frees) < peak_bytes(base, base.frees) else base
