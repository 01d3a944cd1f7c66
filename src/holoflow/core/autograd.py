"""The autograd engine: a dependency-counting backward pass over the nodes dispatch records
(core/node.py: ``GradNode``).

The engine knows no op: a node holds its op, and the op's ``grad`` rule (written in holoflow
ops) maps output gradients to input gradients. Running those rules with grad enabled
(``create_graph=True``) records a new graph, which is how double backward works.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Sequence

import torch

from . import anomaly, grad_mode
from .anomaly import ANOMALY
from .errors import HoloflowError
from .native import FAST
from .node import (_FREED, _TASK, AccumulateGrad, AccumulatePostHook, GradientEdge, GradNode, GraphTask,
                   PackedNode, _run_node_hooks)
from .views import dense_layout

__all__ = ["GradNode", "PackedNode", "AccumulateGrad", "GraphTask", "queue_callback", "current_graph_task",
           "EdgeRoot", "as_roots", "split_backward",
           "will_execute", "accumulate_grad", "seed_grads", "run_backward"]

_ACC_LOCK = threading.Lock()
_TASK_IDS = itertools.count()
_LEVELS = grad_mode.STATE   # (.level, this thread's: -1, no tensor hook, node hook or retain_grad runs)


def queue_callback(fn: Callable[[], None]) -> None:
    """Runs ``fn`` at the end of the backward pass in progress (DDP waits for its buckets here)."""
    task = _TASK.get()
    if task is None:
        raise RuntimeError("holoflow.autograd: queue_callback() called outside a backward pass")
    task.callbacks.append(fn)


def current_graph_task() -> GraphTask | None:
    """The backward pass running on this thread, or None."""
    return _TASK.get()


def will_execute(grad_fn, out_idx: int = 0, leaf=None) -> bool:
    """Whether the backward pass in progress computes the gradient at ``(grad_fn, out_idx)`` (or
    of ``leaf``) and runs its hooks: torch's ``_will_engine_execute_node``."""
    task = _TASK.get()
    if task is None:
        raise RuntimeError("holoflow.autograd: will_execute() called outside a backward pass")
    if grad_fn is not None:
        if task.runs is None:
            return grad_fn in task.deps
        return grad_fn in task.runs or (grad_fn, out_idx) in task.cap_keys
    if task.runs is not None:
        return id(leaf) in task.cap_keys
    return id(leaf) in task.leaf_deps


def accumulate_grad(t, g, inplace: bool = False) -> None:
    """``t.grad += g`` atomically: concurrent backward passes on a shared leaf lose nothing.
    ``inplace`` (a backward without ``create_graph``): as torch's AccumulateGrad, an existing
    ``.grad`` is added to in place (whoever holds it sees the sum), when it can be."""
    with _ACC_LOCK:   # (the engine's gradients have the leaf's shape: no assignment check)
        old = t._grad
        if old is None:
            t._grad = g
        elif inplace and _addable_in_place(old, g):
            old._data.add_(g._data)
        else:
            t._grad = old + g


def _grad_strides(leaf: torch.Tensor) -> tuple:
    """The strides of a (non-contiguous) leaf's ``.grad``, as torch's layout contract: the leaf's
    own when it is dense and non-overlapping (channels_last parameters get channels_last
    gradients), else contiguous ones."""
    if dense_layout(leaf.shape, leaf.stride()):
        return leaf.stride()
    out, acc = [], 1
    for n in reversed(leaf.shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def run_post_accumulate_hooks(t, g) -> None:
    """The hooks run once ``g`` was accumulated into leaf ``t``'s ``.grad``:
    ``register_post_accumulate_grad_hook``'s with the leaf, ``AccumulateGrad.register_hook``'s
    with ``((), (g,))``, as torch's."""
    post = t.__dict__.get("_post_acc_hooks")
    if post:
        for h in post:
            h(t) if type(h) is not AccumulatePostHook else h.fn((), (g,))


def _added_in_place(t, g) -> bool:
    """Whether ``g`` was added into ``t``'s existing local ``.grad`` in place (then the caller
    need not own a copy of ``g``)."""
    old = t._grad
    if old is None or g._data.is_meta or not _addable_in_place(old, g) or \
            g._data.untyped_storage().data_ptr() == old._data.untyped_storage().data_ptr():
        return False   # (a gradient sharing the .grad's memory is copied first, as before)
    with _ACC_LOCK:
        if t._grad is not old:   # (a concurrent backward replaced it meanwhile)
            return False
        old._data.add_(g._data)
    return True


def _addable_in_place(old, g) -> bool:
    d, e = old._data, g._data
    return (old._global is None and g._global is None and not old._rg and not g._rg
            and d.dtype == e.dtype and d.shape == e.shape and d.device == e.device
            and not d.is_meta and d.layout == torch.strided and e.layout == torch.strided
            and "_v" not in old.__dict__ and torch._debug_has_internal_overlap(d) == 0)


def seed_grads(outputs: list, grads: list) -> list:
    """Checks ``grads`` against ``outputs`` (None: ones for a scalar output) and turns a global
    output's gradient into the local value backward starts from."""
    if len(grads) != len(outputs):
        raise RuntimeError(f"holoflow.autograd: got {len(grads)} gradients for {len(outputs)} outputs")
    from .tensor import Tensor
    seeded = []
    for i, (t, g) in enumerate(zip(outputs, grads)):
        if type(t) is EdgeRoot:   # (a GradientEdge: the gradient given is where backward starts)
            if not isinstance(g, Tensor):
                raise RuntimeError(f"holoflow.autograd: output {i} is a GradientEdge (of "
                                   f"{t.grad_fn.name()}); pass its gradient in grad_outputs / grad_tensors")
            seeded.append(g)
            continue
        if not t.requires_grad:
            raise RuntimeError(f"holoflow.autograd: element {i} of tensors does not require grad and "
                               f"does not have a grad_fn; call .requires_grad_() on the inputs you "
                               f"differentiate with respect to")
        if g is None:
            if t.numel() != 1:
                raise RuntimeError(f"holoflow.autograd: grad can be implicitly created only for "
                                   f"scalar outputs; this output has shape {tuple(t.shape)}. Pass "
                                   f"gradient= a tensor of that shape (e.g. ones_like(output))")
            d = t._data
            if t._global is not None:
                g = None
            elif d.device.type == "meta":   # a traced value: the ones are a recorded op
                g = t.detach().new_ones(tuple(t.shape))
            else:
                g = Tensor._make(torch.ones(d.shape, dtype=d.dtype, device=d.device))
        elif not isinstance(g, Tensor):
            g = Tensor._make(torch.as_tensor(g, dtype=t._data.dtype, device=t._data.device))
        elif tuple(g.shape) != tuple(t.shape):
            raise RuntimeError(f"holoflow.autograd: gradient has shape {tuple(g.shape)} but the output "
                               f"has shape {tuple(t.shape)}; they must match")
        if t._global is not None:
            g = t._global.seed_grad(t, g)
        seeded.append(g)
    return seeded


_TENSOR: list = []


def _tensor_type() -> type:
    """``core.tensor.Tensor`` (which imports this module), looked up once."""
    if not _TENSOR:
        from .tensor import Tensor
        _TENSOR.append(Tensor)
    return _TENSOR[0]


# -- the backward pass ------------------------------------------------------------------------
#
# The ready queue is torch's (CPU, one queue): a std::priority_queue of nodes by creation number
# (``GradNode.seq``), the largest first; a leaf whose gradients all came (torch's AccumulateGrad,
# sequence number UINT64_MAX) before any node. Entries of equal key (ready leaves) leave in the
# order std::priority_queue's push_heap/pop_heap give them, which heapq's steps are; core/_fast.c
# has the same two functions. An entry is a node or a ``(leaf, gradient)`` pair.

_LAST = 1 << 63   # (a leaf's key: above any node's creation number)


def _key(e) -> int:
    return _LAST if type(e) is tuple else e.seq


def _heap_push(heap: list, e) -> None:
    key, pos = _key(e), len(heap)
    heap.append(e)
    while pos:
        parent = (pos - 1) >> 1
        if not _key(heap[parent]) < key:
            break
        heap[pos] = heap[parent]
        pos = parent
    heap[pos] = e


def _heap_pop(heap: list):
    last = heap.pop()
    n = len(heap)
    if not n:
        return last
    top, key, pos, child = heap[0], _key(last), 0, 1
    while child < n:   # the hole goes down the larger children to the bottom ...
        if child + 1 < n and not _key(heap[child + 1]) < _key(heap[child]):
            child += 1
        heap[pos] = heap[child]
        pos, child = child, 2 * child + 1
    while pos:         # ... and the last entry comes up from there
        parent = (pos - 1) >> 1
        if not _key(heap[parent]) < key:
            break
        heap[pos] = heap[parent]
        pos = parent
    heap[pos] = last
    return top


def _accumulate(old, new):
    return new if old is None else old + new


def _dependencies(roots: Sequence[GradNode]) -> tuple[dict[GradNode, int], dict[int, int]]:
    """The number of edges into each node reachable from ``roots``, and into each leaf (by id):
    a leaf, like torch's AccumulateGrad node, takes its gradients summed, once."""
    deps: dict[GradNode, int] = {n: 0 for n in roots}
    leaves: dict[int, int] = {}
    stack = list(deps)
    while stack:
        node = stack.pop()
        for e in node.edges:
            if type(e) is tuple:
                child = e[0]
                if child in deps:
                    deps[child] += 1
                else:
                    deps[child] = 1
                    stack.append(child)
            elif e is not None:
                k = id(e)
                leaves[k] = leaves.get(k, 0) + 1
    return deps, leaves


class EdgeRoot:
    """Output ``_out_idx`` of the grad node ``grad_fn`` as a root of :func:`run_backward` (what
    it reads of a root tensor): a backward resumed from a node's incoming gradients, or, as a
    captured input, the gradient flowing into it (torch's ``GradientEdge``)."""

    __slots__ = ("grad_fn", "_out_idx")
    _view = _global = None
    requires_grad = True

    def __init__(self, node: GradNode, index: int) -> None:
        self.grad_fn, self._out_idx = node, index

    def retain_grad(self) -> None:
        """Nothing to keep: an edge has no ``.grad``. As torch's ``backward(inputs=[edge])`` of a
        node's output, the node runs (its hooks fire) and nothing accumulates."""


def as_roots(xs: Any) -> list:
    """Tensors (or one) as the engine reads them; a ``GradientEdge`` stands for the tensor whose
    gradient flows through it: a leaf's (its AccumulateGrad) is the leaf, another node's output an
    :class:`EdgeRoot`."""
    if not isinstance(xs, (list, tuple)) or isinstance(xs, GradientEdge):
        xs = [xs]
    return [(e.node.variable if isinstance(e.node, AccumulateGrad) else EdgeRoot(e.node, e.output_nr))
            if isinstance(e, GradientEdge) else e for e in xs]


def split_backward(tensors: Sequence, inputs: Sequence, weights: Sequence) -> tuple[set, list]:
    """How a backward from ``tensors`` splits into an input part (``autograd.grad`` of
    ``inputs``) and a weight part (zero-bubble pipelines): ``region``, the nodes the input part
    runs (those on a path to an input), and ``frontier``, the nodes of the region and the roots
    outside it with an edge towards a weight that leaves the region. The weight part is the
    backward from the frontier's incoming gradients with its edges into the region cut: no node
    outside the region has an edge into it (it would be on a path to an input), so nothing of the
    input part runs twice."""
    roots = [t.grad_fn for t in tensors if t.grad_fn is not None]
    deps, _ = _dependencies(roots)
    region = _needed(deps, {((t.grad_fn, t._out_idx) if t.grad_fn is not None else id(t)): i
                            for i, t in enumerate(inputs)})
    wanted = {id(w) for w in weights}
    toward = _needed(deps, dict.fromkeys(wanted, 0))

    def leaves_region(e) -> bool:
        if type(e) is tuple:
            return e[0] not in region and e[0] in toward
        return e is not None and id(e) in wanted
    frontier = [n for n in deps if (n in region or n in roots) and any(map(leaves_region, n.edges))]
    return region, frontier


def _zeros_for(meta, like):
    """The gradient of an output nothing read: zeros of its meta. In a trace (``like``, another
    gradient of the node, is a lazy tensor) they are a recorded op, as the seed's ones are."""
    from .tensor import Tensor
    import torch
    shape, dtype, dev = meta
    if like is not None and like._data.device.type == "meta":
        z = like.detach().new_zeros(tuple(shape), dtype=dtype)
        # a traced global gradient: the zeros every rank makes, as a broadcast value
        return z if like._global is None else like._global.seed_grad(like, z)
    return Tensor._make(torch.zeros(shape, dtype=dtype, device=dev))


def _call_grad(node: GradNode, grads: list) -> tuple:
    if node.out_metas is not None and not all(g is not None for g in grads):
        reads = node.op.grad_reads
        like = next((g for g in grads if g is not None), None)
        grads = [g if g is not None or (reads is not None and i not in reads) else _zeros_for(m, like)
                 for i, (g, m) in enumerate(zip(grads, node.out_metas))]
    return _as_grads(node, node.op.grad(node, *grads))


def _as_grads(node: GradNode, result) -> tuple:
    """A grad rule's result as one gradient per input (a lone gradient: a 1-tuple)."""
    if not isinstance(result, tuple):
        result = (result,)
    if len(result) != len(node.edges):
        raise HoloflowError(f"grad rule of {node.op.name!r} returned {len(result)} gradients for "
                            f"{len(node.edges)} inputs")
    return result


def _capture_only(node: GradNode, gs: list, cap_keys: dict, captured: dict) -> None:
    """A captured tensor's gradient, with its hooks and ``retain_grad`` run, at a node that
    itself need not run."""
    if node.hooks and _LEVELS.level >= 0:
        gs = [_apply_hooks(node.hooks.get(i, ()), g) for i, g in enumerate(gs)]
    if node.retains and _LEVELS.level >= 0:
        for i, keep in node.retains.items():
            if gs[i] is not None:
                keep(gs[i])
    for i, g in enumerate(gs):
        key = (node, i)
        if key in cap_keys and g is not None:
            captured[key] = _accumulate(captured.get(key), g)


def _apply_hooks(hooks, g):
    level = _LEVELS.level
    for h in hooks:
        if getattr(h, "transform_level", 0) != level:   # (registered inside a holoflow.func transform: its own)
            continue
        r = h(g)
        if r is not None:
            _check_hook_result(h, g, r)
            g = r
    return g


def _check_hook_result(hook, g, r) -> None:
    """torch's checks on what a tensor hook returned: a tensor like the gradient it was given."""
    name = getattr(hook, "__name__", type(hook).__name__)
    if g is None:
        raise RuntimeError(f"holoflow: hook {name!r} can't replace a None gradient with a non-None value")
    if not isinstance(r, _tensor_type()):
        raise TypeError(f"holoflow: expected a Tensor, but hook {name!r} returned {type(r).__name__!r}")
    d, e = g._data, r._data
    if d.dtype != e.dtype:
        raise RuntimeError(f"holoflow: hook {name!r} has changed the type of value (was {d.dtype} got "
                           f"{e.dtype})")
    if tuple(r.shape) != tuple(g.shape):
        raise RuntimeError(f"holoflow: hook {name!r} has changed the size of value (was {tuple(g.shape)} "
                           f"got {tuple(r.shape)})")
    if d.device != e.device:
        raise RuntimeError(f"holoflow: hook {name!r} has changed the device of value (was {d.device} got "
                           f"{e.device})")


def run_backward(tensors: Sequence, grads: Sequence, retain_graph: bool, create_graph: bool,
                 capture: Sequence | None = None, accumulate: bool = True) -> list | None:
    """Backpropagates ``grads`` from ``tensors``; accumulates into leaves' ``.grad`` and/or
    returns the gradients of the ``capture`` tensors (``autograd.grad``: ``accumulate=False``).
    ``capture`` with ``accumulate`` is ``backward(inputs=capture)``: only what leads to them
    runs, and only their gradients accumulate (a non-leaf's through its ``retain_grad``, which
    the caller sets, as torch's); nothing is returned."""
    from .tensor import Tensor
    stale = [t for t in (*tensors, *(capture or ())) if t._view is not None]
    if stale:   # a view whose base was written in place since: its history re-derived first
        from .dispatch import refresh
        for t in stale:
            refresh(t)
    captured: dict = {}
    keys = {}   # what the backward is for: autograd.grad's inputs, or backward(inputs=)'s
    for i, t in enumerate(capture or ()):
        keys[(t.grad_fn, t._out_idx) if t.grad_fn is not None else id(t)] = i
    cap_keys = keys if not accumulate else {}
    buffers: dict[GradNode, list] = {}
    # storages already handed out as a leaf's .grad, or given by the caller: another leaf's copies
    handed: dict[int, torch.Tensor] = {g._data.data_ptr(): g._data for g in grads
                                       if isinstance(g, Tensor) and g._data.numel() and not g._data.is_meta}

    def to_leaf(t, g):
        if keys and id(t) not in keys:   # a lone root that leads nowhere wanted: as torch's, its
            if t._hooks:                 # hooks run and nothing accumulates
                _apply_hooks(t._hooks, g)
            return
        if g is None:   # no gradient came (a rule gave None): as torch's AccumulateGrad, its hooks
            if t._hooks:   # see None and nothing accumulates
                _apply_hooks(t._hooks, None)
            if accumulate and t._rg:
                run_post_accumulate_hooks(t, None)
            return
        if t.grad_fn is not None:   # detach_()ed since this use, then written with a value that
            raise RuntimeError(     # requires grad: no longer a leaf (torch's AccumulateGrad check)
                "holoflow: leaf variable has been moved into the graph interior: a tensor this backward "
                "reaches as a leaf was detach_()ed since and written in place with a value that requires "
                "grad, so it has a history now; backward before the write, or write a clone")
        if t._hooks:
            g = _apply_hooks(t._hooks, g)
        if cap_keys:
            key = id(t)
            if key in cap_keys:
                captured[key] = _accumulate(captured.get(key), g)
        if not accumulate or not t._rg:   # (torch's AccumulateGrad skips a leaf that stopped
            return                        # requiring grad since: detach_(), requires_grad_(False))
        want = t.__dict__.get("_grad_dtype")   # Tensor.grad_dtype set to a dtype: gradients cast to it
        if want is not None and g._data.dtype != want:
            g = g.to(want)
        # (an existing local .grad takes g in place, as torch's AccumulateGrad: nothing to copy)
        if create_graph or t._global is not None or not _added_in_place(t, g):
            if not create_graph:  # own a dense buffer: in-place updates of .grad must be safe
                d = g._data
                if d.is_meta:  # a traced value (a trace is SSA: no aliasing)
                    g = g.detach()
                else:
                    # a view, a gradient another leaf (or the caller) already holds, one not laid out
                    # as torch's AccumulateGrad lays it out (the leaf's strides if it is dense, e.g.
                    # channels_last; else contiguous): copy
                    ptr = d.data_ptr()
                    strides = None if t._data.is_contiguous() else _grad_strides(t._data)
                    if strides is None:
                        if d._base is not None or ptr in handed or not d.is_contiguous():
                            d = d.clone(memory_format=torch.contiguous_format)
                            ptr = d.data_ptr()
                    elif d._base is not None or ptr in handed or d.stride() != strides:
                        d = torch.empty_strided(d.shape, strides, dtype=d.dtype, device=d.device).copy_(d)
                        ptr = d.data_ptr()
                    handed[ptr] = d  # held, so an address is never reused within this pass
                    g, glob = Tensor._make(d), g._global
                    g._global = glob
            if t._global is not None:  # a local gradient of SBP dual(t.sbp): box it for .grad
                g = t._global.box_grad(t, g)
            accumulate_grad(t, g, not create_graph)
        run_post_accumulate_hooks(t, g)

    roots, seeds = [], []   # seeds: each root's node or leaf (torch's GraphRoot's edges, in order)
    leaf_sums: dict[int, Any] = {}   # gradients of leaves still waiting for more
    for t, g in zip(tensors, grads):
        node = t.grad_fn
        if node is None:   # a leaf given as a root: summed with what reaches it
            leaf_sums[id(t)] = _accumulate(leaf_sums.get(id(t)), g)
            seeds.append(t)
            continue
        buf = buffers.get(node)
        if buf is None:
            buf = buffers[node] = [None] * node.n_outputs
            roots.append(node)
        buf[t._out_idx] = _accumulate(buf[t._out_idx], g)
        seeds.append(node)

    deps, leaf_deps = _dependencies(roots)
    runs = queued = None   # (None: every node runs)
    if keys:   # only the nodes on a path to what is wanted run (and, for backward(inputs=), its nodes)
        runs = _needed(deps, keys)
        wanted = {k[0] for k in keys if type(k) is tuple and k[0] in deps}
        if accumulate:
            runs |= wanted
        queued = runs | wanted   # (a captured node's hooks run, though it need not)
    if len(seeds) == 1:   # a lone root is queued as it is, even if it leads nowhere wanted
        s = seeds[0]
        ready = [s if isinstance(s, GradNode) else (s, leaf_sums.pop(id(s)))]
    else:
        ready = []
        last = {id(s): i for i, s in enumerate(seeds)}
        for i, s in enumerate(seeds):   # queued at its last seed, if nothing inside the graph feeds it
            if last[id(s)] != i:
                continue
            if isinstance(s, GradNode):
                if not deps[s] and (queued is None or s in queued):
                    _heap_push(ready, s)
            elif id(s) not in leaf_deps and (not keys or id(s) in keys):
                _heap_push(ready, (s, leaf_sums.pop(id(s))))
    task = GraphTask()
    task.id, task.callbacks, task.deps, task.leaf_deps = next(_TASK_IDS), [], deps, leaf_deps
    task.runs, task.cap_keys, task.accumulate = runs, keys, accumulate
    token = _TASK.set(task)
    try:
        _drain(ready, buffers, deps, leaf_deps, leaf_sums, keys, cap_keys, captured, retain_graph,
               create_graph, to_leaf, runs, queued)
        pending = task.callbacks
        while pending:
            pending.pop(0)()
    finally:
        _TASK.reset(token)
    if capture is None or accumulate:
        return None
    by_index = {v: k for k, v in cap_keys.items()}
    return [captured.get(by_index[i]) for i in range(len(capture))]


def _needed(deps: dict, cap_keys: dict) -> set:
    """The nodes whose grad rule must run to reach the captured tensors (``autograd.grad``): as
    torch's engine, the others neither run (their hooks included) nor free what they saved."""
    parents: dict = {}
    runs: set = set()
    stack = [k[0] for k in cap_keys if type(k) is tuple and k[0] in deps]
    for node in deps:
        for e in node.edges:
            if type(e) is tuple:
                parents.setdefault(e[0], []).append(node)
            elif e is not None and id(e) in cap_keys and node not in runs:
                runs.add(node)
                stack.append(node)
    while stack:
        for p in parents.get(stack.pop(), ()):
            if p not in runs:
                runs.add(p)
                stack.append(p)
    return runs


def _needed_edges(edges: tuple, queued: set, keys: dict) -> tuple:
    """``edges`` with those that lead to no wanted tensor (``autograd.grad``'s, ``backward``'s
    ``inputs``) replaced by None, so a grad rule asks for (``needs``) only the gradients wanted:
    ``zeta(x, q)`` with ``x`` requiring grad gives ``q``'s gradient alone, as torch's engine does
    (an edge into a node that runs or is captured is computed, whichever output it is)."""
    return tuple([e if e is not None and (id(e) in keys if type(e) is not tuple else e[0] in queued)
                  else None for e in edges])


def _run_node(node: GradNode, gs: list, retain_graph: bool, checks: bool, queued, keys: dict, cap_keys: dict,
              captured: dict) -> tuple:
    """Runs one node of a backward pass: captures (the gradients as they came, as torch's), its
    tensors' hooks, retained gradients, node pre-hooks, the grad rule, node post-hooks; returns
    one gradient per edge."""
    if cap_keys:
        for i, g in enumerate(gs):
            key = (node, i)
            if key in cap_keys and g is not None:
                captured[key] = _accumulate(captured.get(key), g)
    hooks = node.hooks if _LEVELS.level >= 0 else None
    if hooks:
        # (as torch's, an output the node got no gradient for calls its hooks with None)
        gs = [_apply_hooks(hooks.get(i, ()), g) for i, g in enumerate(gs)]
    if node.retains and _LEVELS.level >= 0:  # after every other tensor hook, as torch does
        for i, keep in node.retains.items():
            if gs[i] is not None:
                keep(gs[i])
    if hooks and "pre" in hooks:   # Node.register_prehook: after the tensors' hooks
        gs = _run_node_hooks(hooks["pre"], len(gs), gs)
    op, edges = node.op, node.edges
    if queued is not None:   # rules compute only what reaches the wanted tensors (torch's
        node.edges = _needed_edges(edges, queued, keys)   # should_compute_output)
    if checks:
        prev = anomaly.running(node)
    try:
        if node.out_metas is None:   # one output: the rule gets its gradient, no list work
            g = gs[0]
            if g is None:
                in_grads = (None,) * len(edges)
            else:
                in_grads = op.grad(node, g)
                if type(in_grads) is not tuple:
                    in_grads = _as_grads(node, in_grads)
                elif len(in_grads) != len(edges):
                    _as_grads(node, in_grads)
                if not retain_graph and op.save:
                    node._saved, node._outs, node._versions = _FREED, None, None
        elif any(g is not None for g in gs):
            in_grads = _call_grad(node, gs)
            if not retain_graph and op.save:
                node.release()
        else:
            in_grads = (None,) * len(edges)
        if hooks and "post" in hooks:   # Node.register_hook
            in_grads = _run_node_hooks(hooks["post"], len(edges), in_grads, tuple(gs))
        if checks:
            anomaly.check_nan(node, in_grads)
    except BaseException:
        if checks:
            anomaly.warn_error(node)
        raise
    finally:
        node.edges = edges
        if checks:
            anomaly.restore(prev)
        if retain_graph and node.__class__ is PackedNode:
            node._versions = None   # (its unpacked tensors: freed once the rule ran, as torch's)
    return in_grads


def _drain(ready, buffers, deps, leaf_deps, leaf_sums, keys, cap_keys, captured, retain_graph, create_graph,
           to_leaf, runs=None, queued=None) -> None:
    """Runs the ready nodes (a heap: ``_heap_pop``) until none is left. With ``runs`` (a backward
    for some tensors only) a node or leaf joins the queue only if torch's would: it runs, is
    captured, or is a wanted leaf."""
    checks = ANOMALY.enabled   # (anomaly mode: read once a pass)
    with grad_mode.set_grad_enabled(create_graph):
        if FAST is not None and runs is None and not cap_keys and not checks:
            # the loop in C: a node with hooks, retained gradients or packed saved tensors, or
            # whose rule reads zeros for an output gradient that never came, runs here
            # (_run_node); every other node's rule is called from C
            FAST.drain(ready, buffers, deps, leaf_deps, leaf_sums, to_leaf, retain_graph, _FREED, _as_grads,
                       lambda node, gs: _run_node(node, gs, retain_graph, False, None, keys, cap_keys, captured))
            return
        while ready:
            node = _heap_pop(ready)
            if type(node) is tuple:   # a leaf whose gradients all came
                to_leaf(*node)
                continue
            gs = buffers.pop(node)
            if runs is not None and node not in runs:   # captured, or a lone root: its hooks alone
                _capture_only(node, gs, cap_keys, captured)
                continue
            edges = node.edges
            in_grads = _run_node(node, gs, retain_graph, checks, queued, keys, cap_keys, captured)
            for e, g in zip(edges, in_grads):
                if e is None:
                    continue
                if type(e) is tuple:
                    child, idx = e
                    if queued is not None and child not in queued:   # (torch's skips it)
                        deps[child] -= 1
                        continue
                    if g is not None:
                        buf = buffers.get(child)
                        if buf is None:
                            buf = buffers[child] = [None] * child.n_outputs
                        old = buf[idx]
                        buf[idx] = g if old is None else old + g
                    elif child not in buffers:
                        buffers[child] = [None] * child.n_outputs
                    left = deps[child] - 1
                    deps[child] = left
                    if not left:
                        _heap_push(ready, child)
                else:   # a leaf: its gradients summed, queued once the last one arrived
                    k = id(e)
                    left = leaf_deps[k] - 1
                    leaf_deps[k] = left
                    if left or k in leaf_sums:
                        if g is not None:
                            old = leaf_sums.get(k)
                            leaf_sums[k] = g if old is None else old + g
                        if not left:
                            g = leaf_sums.pop(k, None)
                            if not keys or k in keys:
                                _heap_push(ready, (e, g))
                    elif not keys or k in keys:
                        _heap_push(ready, (e, g))
            # drop this node's gradients now (torch frees a node's buffers once it ran): held
            # until the next node's kernels they raise the step's peak memory
            gs = in_grads = g = old = None
