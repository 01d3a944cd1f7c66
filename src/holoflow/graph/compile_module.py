"""``holoflow.compile(module_or_fn)``: what ``torch.compile`` promises (the same numbers, less time)
for eager holoflow code, on nn.Graph's tracer and lowering (docs/architecture.md,
"holoflow.compile").

A call is traced once per input signature (shapes, dtypes, devices and ``requires_grad`` of the
inputs, grad mode, the modules' train/eval flags, the autocast region, and the identity of every
tensor the call can reach): the forward into the graph IR and, when a gradient is needed, its
backward too, recorded from holoflow's own grad rules (custom autograd Functions included) on lazy
gradients of the outputs (AOT autograd's joint graph). The IR is cut in two: the forward nodes,
which also return what the backward reads (the *saved* values), and the backward nodes
(``bw``-tagged), whose feeds are the saved values and the outputs' gradients. Each half is
lowered as a graph's plan is (one program of direct kernel calls; with ``backend="inductor"``
each task through Inductor, as ``config.enable_compile()``), and a call runs the forward
program inside one autograd Function whose backward runs the backward program: the inputs and
the parameters get their gradients through holoflow's engine as from any op (hooks, DDP's
buckets and gradient accumulation see them as in eager).

What is not traced runs eagerly, as torch's graph breaks fall back to Python: a trace that fails
(data-dependent shapes or control flow, ``.item()``), module hooks inside the call (a hook's
Python side effects would run once, at trace time), a call that changes module attributes or
reads tensors it can reach only through containers, global tensors (``nn.Graph`` compiles
those), inputs written in place, outputs that are inputs or state themselves, signatures beyond
the cache limit, and calls inside an ``nn.Graph`` trace, under a functional transform or under
saved-tensor hooks. Each such signature warns once with the reason (``fullgraph=True`` raises)
and then runs eagerly without trying again.

Differences from eager, by design: the backward of a compiled call cannot itself be
differentiated (``create_graph=True`` raises, as torch.compile's does), and a saved tensor
changed in place between forward and backward raises as torch's version check does.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import torch

from ..autograd.function import Function
from ..amp.autocast import Autocast
from ..core import grad_mode, interpret, saved
from ..core.dispatch import cut_history
from ..core.tensor import Tensor
from ..core.forward_ad import any_level
from ..nn.module import Module
from ..nn import module as _module
from .cache_key import _cache_key, _state_walk
from . import passes
from .config import GraphConfig
from .ir import IRGraph, Value, check
from .lower import GraphRunError, Lowered, failing_line, lower
from .pytree import flatten, unflatten
from .trace import Tracer

BACKENDS = ("inductor", "eager", "aot_eager")


class _Eager:
    """A signature that runs eagerly, and why."""

    def __init__(self, why: str) -> None:
        self.why = why


class _Plan:
    """One traced signature: the forward program (user outputs, then saved values) and, when a
    gradient is needed, the backward program (saved values and output gradients in, one gradient
    per differentiable input out), each run by its driver on the caller's thread."""

    def __init__(self, fwd: Lowered, bwd: Lowered | None, n_out: int, out_spec: Any, diff: list,
                 saved: list, grad_outs: list) -> None:
        self.fwd, self.bwd = fwd, bwd
        self.n_out, self.out_spec = n_out, out_spec
        # leaves the call makes (``ones(3, requires_grad=True)``): the forward's outputs n_user..n_out,
        # each call a fresh leaf of that meta; user output i that is one of them is made[k]
        self.n_user, self.made_metas, self.made_outs = n_out, [], {}
        self.diff = diff            # the tensors gradients flow to: (kind, index or tensor)
        self.saved = saved          # per saved value: ("feed", i) | ("state", tensor) | ("fwd", j)
        self.grad_outs = grad_outs  # indices of the outputs whose gradients backward takes
        # user outputs that required grad in the trace when no gradient reaches anything the call
        # differentiates (no backward program): as eager's, they require grad, their history
        # leading nowhere (a view of an input written and detach_()ed since)
        self.nowhere: list = []
        self.seed_metas = [] if bwd is None else [(v.shape, v.dtype, v.device) for v in bwd.graph.feeds[len(saved):]]


def _run(lowered: Lowered, feeds: list, what: str) -> tuple:
    """The program's outputs on ``feeds`` (torch tensors); a failing kernel is named with its op
    and the user's source line, as a graph's run-time error is."""
    try:
        return lowered.entry(*feeds)
    except Exception as e:
        k = failing_line(lowered.program, e)
        if k is None:
            raise
        n = lowered.program.lines[k]
        scope = f" in module {n.scope!r}" if n.scope else ""
        raise GraphRunError(f"holoflow.compile: op {n.op!r}{scope} failed in the compiled {what}: "
                            f"{type(e).__name__}: {e}\n  source: {n.source}") from e


class _Run(Function):
    """The forward program as one op; its backward runs the backward program."""

    @staticmethod
    def forward(ctx, plan: _Plan, leaves: list, made: list, *diff_tensors):
        outs = _run(plan.fwd, [x._data for x in leaves if isinstance(x, Tensor)], "forward")
        for leaf, d in zip(made, outs[plan.n_user:plan.n_out]):   # (the values the call made them with)
            leaf._data = d
        user = [Tensor._make(o) if isinstance(o, torch.Tensor) else o for o in outs[:plan.n_user]]
        if plan.bwd is not None:
            rest = outs[plan.n_out:]
            ctx.values = [leaves[ref]._data if kind == "feed" else ref._data if kind == "state" else rest[ref]
                          for kind, ref in plan.saved]
            ctx.versions = [v._version for v in ctx.values]   # (a view shares its base's counter)
            ctx.plan = plan
            # outputs the trace saw without history (a piece of an input that needs no grad) have
            # none here either, as eager's (Function.apply gives integer outputs none itself)
            outside = set(plan.grad_outs)
            ctx.mark_non_differentiable(*[u for i, u in enumerate(user) if i not in outside and isinstance(u, Tensor)])
        return tuple(user)

    @staticmethod
    def backward(ctx, *grads):
        if grad_mode.is_grad_enabled():
            raise RuntimeError("holoflow.compile: the backward of a compiled call cannot be differentiated "
                               "(backward(create_graph=True) / autograd.grad(create_graph=True) through it); "
                               "call the module uncompiled for higher-order gradients")
        plan = ctx.plan
        for v, version in zip(ctx.values, ctx.versions):
            if v._version != version:
                raise RuntimeError(f"holoflow.compile: one of the variables needed for gradient computation has "
                                   f"been modified by an inplace operation: a tensor of shape {tuple(v.shape)} "
                                   f"saved by the compiled forward is at version {v._version}; expected version "
                                   f"{version} instead (a parameter, an input or an output changed in place "
                                   f"between the forward and this backward)")
        seeds = [grads[i]._data if grads[i] is not None else torch.zeros(shape, dtype=dtype, device=device)
                 for i, (shape, dtype, device) in zip(plan.grad_outs, plan.seed_metas)]
        got = _run(plan.bwd, ctx.values + seeds, "backward")
        return (None, None, None) + tuple(Tensor._make(g) for g in got)


CACHE_SIZE_LIMIT = 8   # traced signatures per compiled callable (torch's dynamo cache_size_limit)


class _Compiler:
    """The plans of one compiled callable, one per input signature."""

    def __init__(self, fn: Callable, backend: str, fullgraph: bool) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"holoflow.compile: backend must be one of {BACKENDS}, got {backend!r}")
        self.fn, self.backend, self.fullgraph = fn, backend, fullgraph
        self.plans: dict = {}
        self.limit_warned = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.fn
        if _untraceable_context():
            return fn(*args, **kwargs)
        leaves, spec = flatten((args, kwargs))
        roots, tensors = _reachable(fn, leaves)
        need = grad_mode.is_grad_enabled()
        # what a plan was traced for: the inputs (requires_grad too), grad mode, the modules' flags,
        # the autocast region, and which tensor objects the call can reach (a parameter, buffer or
        # tensor attribute assigned anew is another object: the plan would read the old one)
        key = _cache_key(leaves, spec, (need, tuple(isinstance(x, Tensor) and x.requires_grad for x in leaves),
                                        _state_walk(roots, ())[0], _region(), tuple(map(id, tensors))))
        plan = self.plans.get(key)
        if plan is None and len(self.plans) >= CACHE_SIZE_LIMIT:   # (new signatures are not kept)
            if self.fullgraph or not self.limit_warned:
                self.limit_warned = True
                self._eager(_Eager(f"{CACHE_SIZE_LIMIT} signatures were traced already (holoflow.compile's "
                                   f"cache size limit, as torch's): inputs of ever new shapes, or parameters "
                                   f"replaced by new objects on every call (a fully_shard'd module), would "
                                   f"compile anew each call; new signatures run eagerly"))
            return fn(*args, **kwargs)
        if plan is None:
            plan = self.plans[key] = self._trace(leaves, spec, need, roots, tensors)
            if isinstance(plan, _Eager):
                if self.fullgraph:
                    del self.plans[key]
                self._eager(plan)
        if isinstance(plan, _Eager):
            return fn(*args, **kwargs)
        # as torch.compile's, a leaf the call makes is a fresh one each call: its gradient flows
        # (an output that is one is the leaf itself)
        made = [Tensor._make(torch.empty(shape, dtype=dtype, device="meta")).requires_grad_()
                for shape, dtype in plan.made_metas]
        diff = [leaves[ref] if kind == "feed" else made[ref] if kind == "made" else ref for kind, ref in plan.diff]
        outs = list(_Run.apply(plan, leaves, made, *diff))
        for i, k in plan.made_outs.items():
            outs[i] = made[k]
        for i in plan.nowhere:
            cut_history(outs[i])
        return unflatten(outs, plan.out_spec)

    def _eager(self, plan: _Eager) -> None:
        """Says why a signature runs eagerly: a warning, or with ``fullgraph=True`` an error."""
        if self.fullgraph:
            raise RuntimeError(f"holoflow.compile(fullgraph=True): {_name(self.fn)} cannot be traced whole: "
                               f"{plan.why}")
        warnings.warn(f"holoflow.compile: {_name(self.fn)} runs eagerly for this input signature: {plan.why}",
                      stacklevel=4)

    # -- tracing ---------------------------------------------------------------------------------
    def _trace(self, leaves: list, spec: Any, need_grad: bool, roots: list, tensors: list) -> _Plan | _Eager:
        """The plan of one signature; the trace may change no Python state it can reach: the
        ``.grad`` of real tensors and the attributes of the modules (``self.mask = ...``, a
        counter) are restored after it, and a call that changed any runs eagerly (its change
        would happen once, while tracing, and its lazy values would outlive the trace)."""
        grads = [(t, t._grad) for t in tensors]
        modules = _module_states(roots)
        plan: _Plan | _Eager | None = None
        try:
            plan = self._trace_once(leaves, spec, need_grad, roots, {id(t) for t in tensors})
        except Exception as e:   # (splitting or lowering failed: run eagerly rather than fail the user)
            plan = _Eager(f"compiling it failed: {type(e).__name__}: {e}")
        finally:
            leaked = [t for t, g in grads if t._grad is not g]
            for t, g in grads:
                t._grad = g
            changed = _restore_modules(modules)
        if changed:
            return _Eager(f"it changes module attribute(s) {changed} when called (Python state a compiled "
                          f"call would change only once, while tracing)")
        if leaked and not isinstance(plan, _Eager):
            return _Eager(f"tracing it wrote the .grad of {len(leaked)} tensor(s) (the first of shape "
                          f"{tuple(leaked[0].shape)}) outside the gradients it returns")
        return plan

    def _trace_once(self, leaves: list, spec: Any, need_grad: bool, roots: list, reachable: set) -> _Plan | _Eager:
        fn = self.fn
        why = _unsupported(fn, leaves, roots)
        if why is not None:
            return _Eager(why)
        tracer = Tracer()
        tracer.device_type = next((x._data.device.type for x in leaves if isinstance(x, Tensor)), "cpu")
        try:
            with tracer:
                lazy = [tracer.feed(x, f"input{i}") if isinstance(x, Tensor) else x for i, x in enumerate(leaves)]
                for x, t in zip(leaves, lazy):
                    if isinstance(x, Tensor) and x.requires_grad:
                        t.requires_grad_()
                args, kwargs = unflatten(lazy, spec)
                out = fn(*args, **kwargs)
                out_leaves, out_spec = flatten(out)
                why = _bad_outputs(tracer, out_leaves, lazy)
                if why is not None:
                    return _Eager(why)
                made = _made_leaves(out_leaves, lazy, tracer)
                written = tracer.written_inputs(lazy)
                if written:
                    return _Eager(f"it writes its input(s) {written} in place")
                hidden = [x for _, x in tracer.state.values() if id(x) not in reachable]
                if hidden:
                    return _Eager(f"it reads {len(hidden)} tensor(s) (the first of shape {tuple(hidden[0].shape)}) "
                                  f"that are neither parameters, buffers nor tensor attributes of its modules, "
                                  f"nor tensors its function's closure or globals name: a new object there "
                                  f"would go unseen")
                grads, diff, grad_outs, diff_outs = [], [], [], []
                if need_grad:
                    wrt = [(("feed", i), t) for i, t in enumerate(lazy) if isinstance(t, Tensor) and t.requires_grad]
                    wrt += [(("state", x), x) for _, x in tracer.state.values()
                            if x.requires_grad and x.grad_fn is None]
                    if any(x.requires_grad and x.grad_fn is not None for _, x in tracer.state.values()):
                        return _Eager("it reads a tensor with autograd history from outside the call "
                                      "(pass it as an argument)")
                    wrt += [(("made", k), t) for k, t in enumerate(made)]
                    diff_outs = [(i, o) for i, o in enumerate(out_leaves) if isinstance(o, Tensor) and o.requires_grad
                                 and not any(o is t for t in made)]
                    if wrt and diff_outs:
                        dev = torch.device(tracer.device_type)
                        seeds = [tracer.feed(Tensor._make(torch.empty(tuple(o.shape), dtype=o._data.dtype)),
                                             f"grad{i}", dev if dev.type != "cpu" else None) for i, o in diff_outs]
                        got = _traced_grads(tracer, [o for _, o in diff_outs], [t for _, t in wrt], seeds,
                                            {id(t) for (kind, _), t in wrt if kind == "state"})
                        diff = [ref for (ref, _), g in zip(wrt, got) if g is not None]
                        grads = [g for g in got if g is not None]
                        grad_outs = [i for i, _ in diff_outs]
                ir = tracer.graph(tuple(out_leaves) + tuple(made) + tuple(grads), out_spec)
        except Exception as e:   # (a graph break: the call runs eagerly)
            # (the tracer is nn.Graph's: its words for build() hold for this traced call)
            msg = str(e).removeprefix("holoflow.nn.Graph: ").replace("inside build()", "in a traced call")
            return _Eager(f"tracing failed: {type(e).__name__}: {msg}")
        plan = self._split(ir, leaves, len(out_leaves) + len(made), out_spec, diff, grad_outs)
        if isinstance(plan, _Plan):
            plan.n_user = len(out_leaves)
            plan.made_metas = [(tuple(t.shape), t._data.dtype) for t in made]
            plan.made_outs = {i: k for i, o in enumerate(out_leaves) for k, t in enumerate(made) if o is t}
            if plan.bwd is None:
                plan.nowhere = [i for i, _ in diff_outs]
        return plan

    def _split(self, ir: IRGraph, leaves: list, n_out: int, out_spec: Any, diff: list,
               grad_outs: list) -> _Plan | _Eager:
        inductor = self.backend == "inductor"
        ir = _joint_passes(ir)
        n_in = len([x for x in leaves if isinstance(x, Tensor)])
        input_feeds, seed_feeds = ir.feeds[:n_in], ir.feeds[n_in:]
        fwd_nodes = [n for n in ir.nodes if "bw" not in n.tags]
        bwd_nodes = [n for n in ir.nodes if "bw" in n.tags]
        user_outs, grad_vals = ir.outputs[:n_out], ir.outputs[n_out:]
        if not diff:   # nothing to differentiate: the forward alone
            fwd = IRGraph(input_feeds, ir.state, tuple(fwd_nodes), user_outs, ir.updates, out_spec)
            return _Plan(_compiled(fwd, inductor), None, n_out, out_spec, [], [], [])
        fwd_defined = {v for n in fwd_nodes for v in n.outputs}
        bwd_defined = {v for n in bwd_nodes for v in n.outputs}
        if any(v in bwd_defined for n in fwd_nodes for v in n.value_inputs()):
            return _Eager("its forward reads a value its backward computes")
        state_of = {v: t for v, t in ir.state}
        feed_index = {v: i for i, v in enumerate(input_feeds)}
        leaf_index = [i for i, x in enumerate(leaves) if isinstance(x, Tensor)]
        needed = list(dict.fromkeys([v for n in bwd_nodes for v in n.value_inputs()] +
                                    [v for v in grad_vals if isinstance(v, Value)]))
        saved_vals, saved, fwd_extra = [], [], []
        seeds = set(seed_feeds)
        for v in needed:
            if v in seeds or v in bwd_defined:
                continue
            saved_vals.append(v)
            if v in feed_index:
                saved.append(("feed", leaf_index[feed_index[v]]))
            elif v in state_of:
                if any(t is state_of[v] for t, _ in ir.updates):
                    return _Eager(f"its forward writes a tensor of shape {tuple(v.shape)} in place that its "
                                  f"backward reads")
                saved.append(("state", state_of[v]))
            elif v in fwd_defined:
                saved.append(("fwd", len(fwd_extra)))
                fwd_extra.append(v)
            else:
                return _Eager(f"its backward reads {v!r}, which the forward does not define")
        fwd = IRGraph(input_feeds, ir.state, tuple(fwd_nodes), tuple(user_outs) + tuple(fwd_extra), ir.updates,
                      out_spec)
        # the backward's feeds: fresh values standing for the saved ones, then the output gradients
        fresh = {v: Value(v.shape, v.dtype, v.device, f"saved{k}") for k, v in enumerate(saved_vals)}
        bwd = IRGraph(tuple(fresh[v] for v in saved_vals) + tuple(seed_feeds), (),
                      tuple(n.with_(inputs=tuple(fresh.get(x, x) if isinstance(x, Value) else x for x in n.inputs))
                            for n in bwd_nodes),
                      tuple(fresh.get(v, v) if isinstance(v, Value) else v for v in grad_vals))
        # saved values go only to the backward: in Inductor's layouts (channels-last activations
        # cross as they are), unless the user gets them too
        keep = frozenset(fwd_extra) - {v for v in user_outs if isinstance(v, Value)}
        return _Plan(_compiled(fwd, inductor, keep), _compiled(bwd, inductor), n_out, out_spec, diff, saved,
                     grad_outs)


def _made_leaves(outs: list, lazy: list, tracer: Tracer) -> list:
    """The leaves requiring grad the call makes itself (``ones(3, requires_grad=True)``,
    ``zeros(3).requires_grad_()``) that its outputs are or were computed from: differentiated as
    its inputs are, and at run time a fresh leaf each call, as torch.compile's."""
    known = {id(t) for t in lazy if isinstance(t, Tensor)} | {id(x) for _, x in tracer.state.values()}
    found: dict = {}
    seen: set = set()
    stack = []
    for o in outs:
        if isinstance(o, Tensor) and o.requires_grad:
            if o.grad_fn is not None:
                stack.append(o.grad_fn)
            elif id(o) not in known and "_v" in o.__dict__:
                found.setdefault(id(o), o)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for e in node.edges:
            if type(e) is tuple:
                stack.append(e[0])
            elif e is not None and id(e) not in known and "_v" in e.__dict__:
                found.setdefault(id(e), e)
    return list(found.values())


def _traced_grads(tracer: Tracer, outs: list, wrt: list, seeds: list, leaves: set) -> list:
    """The gradients of ``outs`` w.r.t. ``wrt``, recorded as backward (``bw``) nodes. Tensor
    hooks of ``wrt`` do not run here: at run time the engine runs them on the real gradients.
    A backward that accumulates into leaves itself (an activation checkpoint's recomputation
    runs ``backward()`` inside) leaves lazy values in the ``.grad`` of the ``leaves`` (ids of
    parameters), cleared for the trace and restored after: those are added to their gradients."""
    from ..autograd import grad as autograd_grad
    hooks = [(t, t._hooks) for t in wrt]
    held = [(t, t._grad) for t in wrt if id(t) in leaves]
    tracer.in_backward += 1
    try:
        for t, _ in hooks:
            t._hooks = None
        for t, _ in held:
            t._grad = None
        got = list(autograd_grad(outs, wrt, seeds, retain_graph=True, allow_unused=True))
        for k, t in enumerate(wrt):
            acc = t._grad if id(t) in leaves else None
            if acc is not None:
                got[k] = acc if got[k] is None else got[k] + acc
        return got
    finally:
        tracer.in_backward -= 1
        for t, h in hooks:
            t._hooks = h
        for t, g in held:
            t._grad = g


def _reachable(fn: Any, leaves: list) -> tuple[list, list]:
    """The modules a call of ``fn`` can reach (``fn`` itself, modules passed as arguments, e.g.
    a compiled method's ``self``, or modules its closure and globals name) and, in a fixed order,
    the tensors it can reach through them: parameters, buffers and tensor attributes of those
    modules, and tensors the closure and globals name."""
    roots = [x for x in leaves if isinstance(x, Module)]
    tensors: list = []
    if isinstance(fn, Module):
        roots.append(fn)
    else:
        code = getattr(fn, "__code__", None)
        cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
        names = getattr(fn, "__globals__", {})
        found = cells + [names[n] for n in (code.co_names if code is not None else ()) if n in names]
        self_ = getattr(fn, "__self__", None)
        if self_ is not None:
            found.append(self_)
        for x in found:
            if isinstance(x, Module):
                roots.append(x)
            elif isinstance(x, Tensor):
                tensors.append(x)
    seen: set = set()
    stack = roots[::-1]
    while stack:   # (a plain walk: this runs on every call)
        m = stack.pop()
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        tensors += [p for p in m._parameters.values() if p is not None]
        tensors += [b for b in m._buffers.values() if b is not None]
        tensors += [v for v in m.__dict__.values() if isinstance(v, Tensor)]
        stack.extend(reversed(m._modules.values()))
    return roots, tensors


def _module_states(roots: list) -> list:
    """Each module under ``roots`` with a shallow copy of its attributes and of its parameter,
    buffer and submodule tables (and the lengths of its list and dict attributes)."""
    out, seen, stack = [], set(), roots[::-1]
    while stack:
        m = stack.pop()
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        attrs = dict(m.__dict__)
        tables = {k: dict(v) for k, v in attrs.items() if k in ("_parameters", "_buffers", "_modules")}
        sizes = {k: len(v) for k, v in attrs.items() if type(v) in (list, dict) and k not in tables}
        out.append((m, attrs, tables, sizes))
        stack.extend(reversed(m._modules.values()))
    return out


def _restore_modules(states: list) -> list:
    """Puts back what changed since :func:`_module_states`; returns the changed names."""
    changed = []
    for m, attrs, tables, sizes in states:
        now = m.__dict__
        names = [k for k in attrs.keys() | now.keys()
                 if k not in tables and now.get(k, _MISSING) is not attrs.get(k, _MISSING)]
        names += [k for k, n in tables.items() if now.get(k) is not attrs[k] or not _same_table(now[k], n)]
        names += [k for k, n in sizes.items() if k in now and len(now[k]) != n]
        if names:
            changed += [f"{type(m).__name__}.{k}" for k in sorted(set(names))]
            for k in [k for k in now if k not in attrs]:
                del now[k]
            now.update(attrs)
            for k, table in tables.items():
                now[k].clear()
                now[k].update(table)
    return changed


_MISSING = object()


def _same_table(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(a[k] is b[k] for k in a)


def _filled(cell) -> bool:
    try:
        return cell.cell_contents is not _filled   # (reading an empty cell raises)
    except ValueError:
        return False


def _joint_passes(g: IRGraph) -> IRGraph:
    """nn.Graph's passes on the joint graph (CSE, DCE, pointwise recomputation in the backward),
    but memory planning, which runs on each half: a backward node reusing a saved value's buffer
    in place would spoil a second backward (``retain_graph``)."""
    cfg = GraphConfig().for_passes(set())
    passes.load_all()
    for p in passes.PIPELINE:
        if p.name != "memory_plan" and p.enabled(cfg):
            g = check(p.fn(g, cfg), where=p.name)
    return g


def _compiled(g: IRGraph, inductor: bool, keep_layouts: frozenset = frozenset()) -> Lowered:
    """One half, memory-planned (feeds are never reused in place) and lowered."""
    from .passes.memory_plan import memory_plan
    return lower(check(memory_plan(g, GraphConfig()), where="memory_plan"), compile_tasks=inductor,
                 keep_layouts=keep_layouts)


def _name(fn: Any) -> str:
    return type(fn).__name__ if isinstance(fn, Module) else getattr(fn, "__name__", repr(fn))


def _region() -> tuple:
    """The autocast regions around the call (part of the signature: they change what runs)."""
    return tuple((type(it).__name__, repr(getattr(it, "modes", None)), getattr(it, "shadowed", None))
                 for it in interpret.stack() if it.parent is not None)


def _untraceable_context() -> str | None:
    """Why calls here run eagerly whatever the inputs: inside a trace (nn.Graph's build traces
    the call itself), under an interpreter other than autocast (functional transforms), or with
    saved-tensor hooks active (they pack what eager's nodes save; the compiled forward's saved
    values would bypass them), or in a forward-AD level (torch's tangents ride on eager kernels:
    autograd/forward_ad.py)."""
    if any_level():
        return "a forward-AD level is active"
    for it in interpret.stack():
        if it.parent is not None and not isinstance(it, Autocast):
            return f"called under {type(it).__name__}"
    if saved._LIVE[0] and saved.current() is not None:
        return "saved-tensor hooks are active"
    return None


def _unsupported(fn: Any, leaves: list, roots: list) -> str | None:
    if any(isinstance(x, Tensor) and x._global is not None for x in leaves):
        return "its inputs are global tensors (compile a graph of global tensors with nn.Graph)"
    if _module._global_forward_pre_hooks or _module._global_forward_hooks or _module._global_backward_hooks \
            or _module._global_backward_pre_hooks:
        return "global module hooks are registered (their side effects would run only while tracing)"
    owner = getattr(fn, "__self__", None)   # a compiled method: its own module's hooks run outside it
    for root in roots:
        for m in root.modules():
            if m is not owner and (m._forward_pre_hooks or m._forward_hooks or m._backward_hooks
                                   or m.__dict__.get("_backward_pre_hooks")):
                return f"module {type(m).__name__} has forward or backward hooks (their side effects would run " \
                       f"only while tracing)"
            if any(p is not None and p._global is not None for p in m._parameters.values()):
                return "its parameters are global tensors (compile a graph of global tensors with nn.Graph)"
    return None


def _bad_outputs(tracer: Tracer, outs: list, lazy: list) -> str | None:
    state = {v for v, _ in tracer.state.values()}
    feeds = set(tracer.feeds)
    for o in outs:
        if isinstance(o, Tensor):
            if o._global is not None:
                return "it returns a global tensor"
            v = tracer.value_of(o)
            if v in state or v in feeds:
                return "it returns one of its inputs or a parameter as it is"
        elif o is not None and not isinstance(o, (int, float, bool, str)):
            return f"it returns a {type(o).__name__}"
    return None


class OptimizedModule(Module):
    """``holoflow.compile(module)`` (torch's ``OptimizedModule``): a module whose forward runs the
    compiled plans of ``_orig_mod`` (registered as its submodule, so its state dict keys carry the
    ``_orig_mod.`` prefix as torch's); other attributes are the original's. Hooks registered on
    this wrapper run eagerly around the compiled call."""

    def __init__(self, mod: Module, backend: str = "inductor", fullgraph: bool = False) -> None:
        super().__init__()
        self._orig_mod = mod
        self.__dict__["_compiler"] = _Compiler(mod, backend, fullgraph)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["_compiler"](*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_modules"]["_orig_mod"], name)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"


class CompiledFunction:
    """``holoflow.compile(fn)`` for a function: calls run its compiled plans."""

    def __init__(self, fn: Callable, backend: str = "inductor", fullgraph: bool = False) -> None:
        self._compiler = _Compiler(fn, backend, fullgraph)
        self._orig_mod = fn
        for name in ("__name__", "__qualname__", "__doc__", "__module__", "__wrapped__"):
            if hasattr(fn, name):
                setattr(self, name, getattr(fn, name))
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiler(*args, **kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:   # (a compiled method binds as a function)
        return self if obj is None else functools.partial(self.__call__, obj)

    def __repr__(self) -> str:
        return f"CompiledFunction({self._orig_mod!r})"


def compile_callable(fn: Callable, backend: str = "inductor", fullgraph: bool = False) -> Any:
    """An :class:`OptimizedModule` for a module, a :class:`CompiledFunction` for a function."""
    if isinstance(fn, Module):
        return OptimizedModule(fn, backend, fullgraph)
    return CompiledFunction(fn, backend, fullgraph)


def compile(model: Callable | None = None, *, fullgraph: bool = False, dynamic: bool | None = None,  # noqa: A001
            backend: Any = "inductor", mode: str | None = None, options: dict | None = None,
            disable: bool = False) -> Any:
    """``torch.compile``'s signature (``holoflow.compile``): ``backend="inductor"`` (torch's
    default) runs each program's tasks through Inductor, any other backend the programs' kernel
    calls as they are; ``dynamic``, ``mode`` and ``options`` are accepted (a new shape traces
    anew, up to :data:`CACHE_SIZE_LIMIT` signatures); ``disable=True`` returns ``model``. Bare, as
    ``@compile`` and as ``@compile(...)``."""
    if model is None:
        return lambda fn: compile(fn, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                                  options=options, disable=disable)
    if not callable(model):
        raise TypeError(f"holoflow.compile: expected a module or a function, got {type(model).__name__}")
    if disable:
        return model
    return compile_callable(model, "inductor" if backend == "inductor" else "eager", fullgraph)


def compile_forward(module: Module, **kwargs: Any) -> None:
    """``module.compile(**kwargs)`` (torch's ``nn.Module.compile``, in place): the module's
    forward becomes its compiled form; its own hooks keep running eagerly around it."""
    held = module.__dict__.get("forward")
    plain = held._orig_mod if isinstance(held, CompiledFunction) else type(module).forward.__get__(module)
    compiled = compile(plain, **kwargs)
    if compiled is plain:   # (disable=True)
        module.__dict__.pop("forward", None)
    else:
        module.__dict__["forward"] = compiled
