"""torch.func's differentiating transforms on holoflow's tape autograd: ``grad``,
``grad_and_value``, ``vjp``, ``jvp``, ``linearize``, ``jacrev``, ``jacfwd`` and ``hessian`` record
the function on fresh inputs and run ``autograd.grad`` (with ``create_graph`` where an enclosing
transform, or the caller, differentiates the result again: ``grad(grad(f))``, ``hessian`` and
per-sample gradients compose); ``functional_call`` runs a module on other parameters.

Forward mode is computed by reverse mode: the vjp with a symbolic cotangent ``u`` is linear in
``u``, and differentiating it against the tangents gives J t (``jvp``, ``linearize``, and
``jacfwd``, one J e_k per input element). The same values, at reverse mode's cost. As torch's
forward mode, it runs through ``no_grad`` regions (grad_mode's regions: reverse passes outside
take them, and the tangent terms computed from them, as constants) and reads what an op saw
though the function writes it in place later (``_levels.forward_saves``).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

from ..autograd import grad as _autograd_grad
from ..autograd.graph import disable_saved_tensors_hooks
from ..core import grad_mode
from ..core.tensor import Tensor, reaches_outside
from ..graph.pytree import flatten, unflatten
from ..nn.module import Module
from ..nn.utils.stateless import swapped
from ..ops import creation as C
from ..ops import shape as _shape
from . import _rng
from ._levels import forward_saves, in_region, inner, level, mark_stale
from ._vmap import check_chunk_size


# -- functional_call ------------------------------------------------------------------------------

def functional_call(module: Module, parameter_and_buffer_dicts: dict | Sequence[dict], args: Any = None,
                    kwargs: dict | None = None, *, tie_weights: bool = True, strict: bool = False) -> Any:
    """``module(*args, **kwargs)`` with its parameters and buffers replaced by the tensors of
    ``parameter_and_buffer_dicts`` (by qualified name; several dicts are merged, a key given
    twice is an error), as ``torch.func.functional_call``: ``args`` None is no arguments, and
    one that is not a tuple is the only one."""
    dicts = [parameter_and_buffer_dicts] if isinstance(parameter_and_buffer_dicts, dict) \
        else parameter_and_buffer_dicts
    if not isinstance(dicts, (list, tuple)) or not all(isinstance(d, dict) for d in dicts):
        raise ValueError(f"holoflow.func.functional_call: expected parameter_and_buffer_dicts to be a dict or a "
                         f"list/tuple of dicts, got {type(parameter_and_buffer_dicts).__name__}")
    values: dict = {}
    for d in dicts:
        twice = sorted(set(values) & set(d))
        if twice:
            raise ValueError(f"holoflow.func.functional_call: {twice} appear in more than one dict")
        values.update(d)
    args = () if args is None else args if isinstance(args, tuple) else (args,)
    with swapped(module, values, tie_weights, strict):
        return module(*args, **(kwargs or {}))


# -- reverse mode ------------------------------------------------------------------------------

_NO_SAVED_HOOKS = ("holoflow.func.{grad, vjp, jacrev, hessian} do not support saved tensor hooks (saved_tensors_hooks, "
                   "save_on_cpu, utils.checkpoint(use_reentrant=False)) around or inside the function they "
                   "differentiate, as torch.func's; call the transform outside the hooks' context, or take "
                   "jvp/jacfwd/vmap, which allow them")


def _no_saved_hooks():
    """Saved-tensor hooks refused while a reverse transform runs its function (torch.func's
    grad, vjp and jacrev refuse them, hooks already pushed included: their tensors are wrapped
    per level, which a hook's packed value would escape)."""
    return disable_saved_tensors_hooks(_NO_SAVED_HOOKS)


def _argnums(argnums: Any, n: int, who: str) -> tuple[int, ...]:
    """``argnums`` as non-negative positions: an int or a non-empty tuple of distinct ints, each
    indexing the ``n`` positional arguments (torch raises a RuntimeError otherwise)."""
    nums = (argnums,) if isinstance(argnums, int) else argnums
    legal = f"argnums must be an int or a non-empty tuple of distinct ints indexing the {n} positional argument(s)"
    if not isinstance(nums, tuple) or not nums or any(not isinstance(a, int) or not -n <= a < n for a in nums):
        raise RuntimeError(f"holoflow.func.{who}: {legal}, got {argnums!r}")
    if len({a % n for a in nums}) != len(nums):
        raise RuntimeError(f"holoflow.func.{who}: {legal}; {argnums!r} repeats one")
    return tuple(a % n for a in nums)


def _tensors(tree: Any, who: str, what: str = "outputs", error: type = RuntimeError) -> tuple[list, Any]:
    """The leaves of ``tree``, which must all be tensors (torch: a ValueError for an input, a
    RuntimeError for an output), and its structure."""
    leaves, spec = flatten(tree)
    for x in leaves:
        if not isinstance(x, Tensor):
            raise error(f"holoflow.func.{who}: expected the {what} to be tensors (or tuples, lists, dicts of "
                        f"them), got {type(x).__name__}")
    return leaves, spec


def _track(x: Tensor, depth: int) -> Tensor:
    """A fresh input to differentiate with respect to: still differentiable with respect to what
    ``x`` came from when an enclosing transform (or the caller) records ``x``; else a leaf of the
    transform at level ``depth``, which no transform outside it records (``_reaches_outside``)."""
    if x.requires_grad and grad_mode.STATE.enabled:
        fresh = x.view_as(x)
    else:
        fresh = x.detach().requires_grad_(True)
        fresh._func_level = depth
    fresh._wrapped_at = depth   # (what the function is handed: core/tensor._unwrapped_false)
    return fresh


def _grads(out: list, wrt: list, cot: list | None, keep: bool, retain: bool = False) -> list:
    """d(out)/d(wrt) contracted with ``cot``: zeros for inputs the outputs do not depend on. A
    reverse pass at a transform's level (not forward mode's, at level -1) treats what a no_grad
    region recorded for forward mode alone as constants (``_regions_cut``)."""
    live = [(o, c) for o, c in zip(out, cot or [None] * len(out)) if o.requires_grad]
    if not live:
        return [C.zeros_like(w) for w in wrt]
    with _regions_cut([o for o, _ in live]) if grad_mode.STATE.level >= 0 else contextlib.nullcontext():
        got = _autograd_grad([o for o, _ in live], wrt, None if cot is None else [c for _, c in live],
                             retain_graph=keep or retain, create_graph=keep, allow_unused=True)
    return [C.zeros_like(w) if g is None else (g if keep else g.detach()) for g, w in zip(got, wrt)]


def _region_nodes(outs: list) -> list:
    """The grad nodes reachable from ``outs`` that a no_grad region recorded for forward mode."""
    if not grad_mode.STATE.regions:
        return []
    seen, stack, found = set(), [o.grad_fn for o in outs], []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack += [e[0] for e in node.edges if type(e) is tuple]
        if in_region(node):
            found.append(node)
    return found


@contextlib.contextmanager
def _regions_cut(outs: list) -> Iterator[None]:
    """Inside, the region nodes reachable from ``outs`` have no edges: a reverse pass sees their
    results as constants (torch's no_grad stops reverse mode; a forward-mode transform around
    sees through them once their edges are back)."""
    nodes = _region_nodes(outs)
    edges = [n.edges for n in nodes]
    for n in nodes:
        n.edges = (None,) * len(n.edges)
    try:
        yield
    finally:
        for n, e in zip(nodes, edges):
            n.edges = e


def _fresh_args(args: tuple, nums: tuple, who: str) -> tuple[list, list, bool]:
    """``args`` with the arguments ``nums`` replaced by fresh inputs to differentiate with respect
    to: ``(args, parts, outer)``, ``parts`` one ``(fresh leaves, structure)`` per argument,
    ``outer`` whether grad mode is on outside (see ``_keep``)."""
    args, parts, originals = list(args), [], []
    for a in nums:
        leaves, spec = _tensors(args[a], who, "inputs to differentiate with respect to", ValueError)
        originals += leaves
        fresh = [_track(x, inner()) for x in leaves]
        parts.append((fresh, spec))
        args[a] = unflatten(fresh, spec)
    return args, parts, grad_mode.STATE.enabled


def _reaches_outside(t: Tensor, depth: int, around_regions: bool = False) -> bool:
    """Whether ``t``'s history reaches a leaf recorded outside the transform at level ``depth``:
    any but the fresh inputs of that transform and of those inside it; with ``around_regions``,
    not through a no_grad region only forward mode sees (``_seal_regions``)."""
    return reaches_outside(t, depth, in_region if around_regions else None)


def _keep(outer: bool, outs: list, depth: int, forward: bool = False) -> bool:
    """Whether the results must stay differentiable (``create_graph``): grad mode is on outside
    and an output reaches a tensor recorded there, an argument or one the function closes over
    (``grad(lambda w: jacrev(lambda x: x * w)(x0).sum())(w)``); ``depth``: the transform's level."""
    # (the outermost forward-mode transform's no_grad regions are constants to all outside it)
    around = forward and len(grad_mode.STATE.forward_levels) == 1
    return outer and any(isinstance(o, Tensor) and o.requires_grad and _reaches_outside(o, depth, around)
                         for o in outs)


def _cut(tree: Any, depth: int) -> Any:
    """``tree`` with every tensor differentiable only with respect to the fresh inputs of the
    transform at level ``depth`` (and of those inside it) detached: as torch.func's results, which
    require grad outside only through what outside records."""
    leaves, spec = flatten(tree)
    return unflatten([x.detach() if isinstance(x, Tensor) and x.requires_grad and
                      (x.__dict__.get("_func_level", 0) >= depth or not _reaches_outside(x, depth)) else x
                      for x in leaves], spec)


def _regroup(values: list, parts: list) -> list:
    """One value per fresh leaf, back into each argument's structure."""
    out, i = [], 0
    for fresh, spec in parts:
        out.append(unflatten(values[i:i + len(fresh)], spec))
        i += len(fresh)
    return out


def grad_and_value(func: Callable, argnums: int | tuple = 0, has_aux: bool = False) -> Callable:
    """``(gradient, value)`` of a function returning a one-element tensor, with respect to the
    arguments ``argnums`` (the gradient mirrors their structure); with ``has_aux`` the function
    returns ``(value, aux)`` and the result is ``(gradient, (value, aux))``."""
    def wrapped(*args, **kwargs):
        depth = inner()
        args, parts, keep = _fresh_args(args, _argnums(argnums, len(args), "grad"), "grad")
        with _no_saved_hooks(), grad_mode.enable_grad(), level(depth):
            res = func(*args, **kwargs)
            value, aux = _split_aux(res, has_aux, "grad")
            if not isinstance(value, Tensor) or value.numel() != 1:
                what = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
                raise RuntimeError(f"holoflow.func.grad: the function must return a scalar tensor (one "
                                   f"element) to differentiate, got {what}; use jacrev or vjp for others")
            keep = _keep(keep, [value], depth)
            # (aux, returned as it is, may reach back through the function's graph: kept for it)
            gs = _grads([value], [x for fresh, _ in parts for x in fresh], None, keep, retain=has_aux)
        out = _regroup(gs, parts)
        g = out[0] if isinstance(argnums, int) else tuple(out)
        value = value if keep else value.detach()
        return _cut((g, (value, aux)) if has_aux else (g, value), depth)
    return wrapped


def _split_aux(res: Any, has_aux: bool, who: str) -> tuple[Any, Any]:
    if not has_aux:
        return res, None
    if not isinstance(res, tuple) or len(res) != 2:
        raise RuntimeError(f"holoflow.func.{who}: with has_aux=True the function must return a "
                           f"(output, aux) tuple")
    return res


def grad(func: Callable, argnums: int | tuple = 0, has_aux: bool = False) -> Callable:
    """The gradient of a function returning a one-element tensor (``torch.func.grad``)."""
    gv = grad_and_value(func, argnums, has_aux)

    def wrapped(*args, **kwargs):
        g, (value_aux) = gv(*args, **kwargs)
        return (g, value_aux[1]) if has_aux else g
    return wrapped


def vjp(func: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """``(func(*primals), vjp_fn)``: ``vjp_fn(cotangents)`` gives one gradient per primal
    (structured as the primals), as ``torch.func.vjp``; it may be called more than once."""
    depth = inner()
    args, fresh, keep = _fresh_args(primals, tuple(range(len(primals))), "vjp")
    with _no_saved_hooks(), grad_mode.enable_grad(), level(depth):
        res = func(*args)
    out, aux = _split_aux(res, has_aux, "vjp")
    out_leaves, out_spec = _tensors(out, "vjp")
    keep = _keep(keep, out_leaves, depth)
    wrt = [x for f, _ in fresh for x in f]

    def vjp_fn(cotangents: Any) -> tuple:
        cot, cspec = _tensors(cotangents, "vjp", "cotangents")
        if len(cot) != len(out_leaves) or any(tuple(c.shape) != tuple(o.shape) for c, o in zip(cot, out_leaves)):
            raise RuntimeError(f"holoflow.func.vjp: cotangents of shapes {[tuple(c.shape) for c in cot]} do "
                               f"not match the outputs' {[tuple(o.shape) for o in out_leaves]}")
        with grad_mode.enable_grad(), level(depth):
            gs = _grads(out_leaves, wrt, cot, keep, retain=True)
        return _cut(tuple(_regroup(gs, fresh)), depth)
    shown = out if keep else unflatten([o.detach() for o in out_leaves], out_spec)
    shown, aux = _cut((shown, aux), depth)
    return (shown, vjp_fn, aux) if has_aux else (shown, vjp_fn)


def _linear_map(outs: list, wrt: list) -> Callable[[list, bool, bool], list]:
    """``apply(tangents, keep, retain)``: J @ tangents at the recorded point, one tensor per
    output (zeros where an output does not depend on the inputs). Records, under grad mode, the
    vjp with a symbolic cotangent ``u``: linear in ``u``, so its gradient against the tangents is
    J t. ``retain`` keeps that record for further calls (``linearize``'s jvp_fn). Hooks the
    function registered do not run: forward mode runs no backward."""
    us = [C.zeros_like(o).requires_grad_(True) for o in outs]
    live = [(o, u) for o, u in zip(outs, us) if o.requires_grad]
    vj = [None] * len(wrt)
    if live and wrt:
        with level(-1), _regions_kept([o for o, _ in live]):
            vj = _autograd_grad([o for o, _ in live], wrt, [u for _, u in live], create_graph=True,
                                allow_unused=True)

    def apply(tangents: list, keep: bool, retain: bool) -> list:
        pairs = [(g, t) for g, t in zip(vj, tangents) if g is not None and g.requires_grad]
        jt = [None] * len(us)
        if pairs:
            with level(-1), _regions_kept([g for g, _ in pairs]):
                jt = _autograd_grad([g for g, _ in pairs], us, [t for _, t in pairs], retain_graph=retain or keep,
                                create_graph=keep, allow_unused=True)
        return [C.zeros_like(o) if j is None else (j if keep else j.detach()) for j, o in zip(jt, outs)]
    apply.record = [g for g in vj if g is not None]   # (what a later pass reads: linearize seals it)
    return apply


class _InRegion:
    """A no_grad region node's rule as forward mode's reverse passes run it: what it records
    (the tangent's terms from inside the region) is of the region too, a constant to reverse
    passes as the region is (torch computes those terms under no_grad)."""

    __slots__ = ("op",)

    def __init__(self, op: Any) -> None:
        self.op = op

    def __getattr__(self, name: str) -> Any:
        return getattr(self.op, name)

    def grad(self, node: Any, *grads: Any) -> Any:
        with grad_mode.forward_region():
            return self.op.grad(node, *grads)


@contextlib.contextmanager
def _regions_kept(outs: list) -> Iterator[None]:
    """Inside (a forward-mode transform's reverse pass), the rules of the region nodes reachable
    from ``outs`` record into a region (``_InRegion``)."""
    nodes = [n for n in _region_nodes(outs) if type(n.op) is not _InRegion]
    for n in nodes:
        n.op = _InRegion(n.op)
    try:
        yield
    finally:
        for n in nodes:
            n.op = n.op.op


def _seal_regions(outs: list, keep: bool) -> list:
    """After the outermost forward-mode transform's last reverse pass: the nodes recorded in its
    function's no_grad regions (which torch's forward mode runs through, its reverse mode not)
    lose their edges, so no reverse pass outside sees through them (``grad(jvp(f))``), as torch's.
    Only results that stay differentiable outside (``keep``) can reach them, or the saved copies
    of tensors written since, which are then marked stale (``mark_stale``: ``linearize``'s later
    passes read its record, stale copies included, only then). The nodes cut, with their edges
    (``linearize`` gives them back for each later pass of its jvp_fn)."""
    if len(grad_mode.STATE.forward_levels) != 1:
        return []
    if keep:
        mark_stale()
    cut = [(node, node.edges) for node in _region_nodes(outs)] if keep else []
    for node, edges in cut:
        node.edges = (None,) * len(edges)
    return cut


def _check_tangents(tangents: Any, primals: tuple, wrt: list, who: str) -> list:
    """The tangents' leaves, which must match the primals' structure, shapes and dtypes."""
    leaves, spec = flatten(tangents)
    if spec != flatten(primals)[1]:
        raise RuntimeError(f"holoflow.func.{who}: expected the tangents to have the primals' structure "
                           f"({len(primals)} argument(s) of {len(wrt)} tensor(s) in all), got {len(leaves)} leaves")
    for i, (t, p) in enumerate(zip(leaves, wrt)):
        if not isinstance(t, Tensor):
            raise RuntimeError(f"holoflow.func.{who}: tangent {i} is a {type(t).__name__}, not a tensor")
        if tuple(t.shape) != tuple(p.shape) or t.dtype != p.dtype:
            raise RuntimeError(f"holoflow.func.{who}: tangent {i} of shape {tuple(t.shape)} and dtype {t.dtype} "
                               f"does not match its primal's shape {tuple(p.shape)} and dtype {p.dtype}")
    return leaves


def _recorded(tangents: list, outer: bool) -> bool:
    """Whether the tangents are recorded outside (grad mode on there, ``outer``): J t is then
    differentiable with respect to them (``grad(lambda t: jvp(f, (x,), (t,))[1].sum())``)."""
    return outer and any(t.requires_grad for t in tangents)


def jvp(func: Callable, primals: tuple, tangents: tuple, *, strict: bool = False, has_aux: bool = False) -> tuple:
    """``(func(*primals), J @ tangents)`` (``torch.func.jvp``), computed by reverse mode (see the
    module doc). ``strict``: an output that does not depend on the primals is an error rather
    than a zero tangent."""
    for name, value in (("primals", primals), ("tangents", tangents)):
        if not isinstance(value, tuple):
            raise RuntimeError(f"holoflow.func.jvp: expected {name} to be a tuple (func(*primals) is called), "
                               f"got {type(value).__name__}")
    depth = inner()
    args, fresh, keep = _fresh_args(primals, tuple(range(len(primals))), "jvp")
    wrt = [x for f, _ in fresh for x in f]
    tl = _check_tangents(tangents, primals, wrt, "jvp")
    with grad_mode.enable_grad(), level(depth, "forward"):
        with forward_saves():
            res = func(*args)
        out, aux = _split_aux(res, has_aux, "jvp")
        outs, ospec = _tensors(out, "jvp")
        keep = _keep(keep, outs, depth, forward=True) or _recorded(tl, keep)
        if strict and not all(o.requires_grad for o in outs):
            raise RuntimeError("holoflow.func.jvp(strict=True): an output of the function does not depend on "
                               "the primals; strict=False gives it a zero tangent")
        tans = _linear_map(outs, wrt)(tl, keep, retain=False)
        _seal_regions(outs + tans, keep)
    shown = out if keep else unflatten([o.detach() for o in outs], ospec)
    result = _cut((shown, unflatten(tans, ospec), aux), depth)
    return result if has_aux else result[:2]


def linearize(func: Callable, *primals: Any) -> tuple[Any, Callable]:
    """``(func(*primals), jvp_fn)`` as ``torch.func.linearize``: ``jvp_fn(*tangents)`` is the
    Jacobian-vector product at ``primals``, from one recording of ``func`` kept for every call
    (computed by reverse mode, see the module doc).

    >>> out, jvp_fn = linearize(flow.sin, x)
    >>> jvp_fn(t)            # == flow.cos(x) * t
    """
    depth = inner()
    args, fresh, keep = _fresh_args(primals, tuple(range(len(primals))), "linearize")
    wrt = [x for f, _ in fresh for x in f]
    with grad_mode.enable_grad(), level(depth, "linearize"):
        with forward_saves():
            out = func(*args)
        outs, ospec = _tensors(out, "linearize")
        keep = _keep(keep, outs, depth, forward=True)
        apply = _linear_map(outs, wrt)
        # (each later call runs as a forward-mode transform again, with these regions: see _replay)
        regions = list(grad_mode.STATE.regions)
        cut = _seal_regions(outs + apply.record, keep)

    def jvp_fn(*tangents: Any) -> Any:
        tl = _check_tangents(tangents, primals, wrt, "linearize")
        now = keep or _recorded(tl, grad_mode.STATE.enabled)
        with grad_mode.enable_grad(), _replay(regions, cut):
            tans = apply(tl, now, retain=True)
            _seal_regions(outs + apply.record + tans, now)
        return unflatten(tans, ospec)
    shown = out if keep else unflatten([o.detach() for o in outs], ospec)
    return shown, jvp_fn


@contextlib.contextmanager
def _replay(regions: list, cut: list) -> Iterator[None]:
    """A later pass of ``linearize``'s record, as a forward-mode transform: the no_grad regions
    its function recorded are forward mode's again (their nodes' edges given back), and cut once
    more when it is done (``_seal_regions``, which also cuts those the pass recorded)."""
    with level(inner(), "linearize"):
        grad_mode.STATE.regions.extend(regions)
        for node, edges in cut:
            node.edges = edges
        try:
            yield
        except BaseException:   # (no seal follows: the regions are cut again here)
            for node, edges in cut:
                node.edges = (None,) * len(edges)
            raise


def _rows(outs: list, wrt: list, keep: bool) -> list:
    """jacrev's Jacobians, one per output (a list per input, ``output.shape + input.shape``):
    one vjp per output element."""
    per_out = []
    for o in outs:
        rows: list = [[] for _ in wrt]
        flat_o = o.reshape(-1)
        for k in range(flat_o.numel()):
            cot = C.zeros_like(flat_o)
            cot[k] = 1.0
            for i, g in enumerate(_grads([flat_o], wrt, [cot], keep, retain=True)):
                rows[i].append(g)
        per_out.append([(_shape.stack(r) if r else C.zeros((0,) + tuple(w.shape), dtype=w.dtype))
                        .reshape(tuple(o.shape) + tuple(w.shape)) for r, w in zip(rows, wrt)])
    return per_out


def _columns(outs: list, wrt: list, keep: bool) -> list:
    """jacfwd's Jacobians, laid out as ``_rows``': one Jacobian-vector product per input element,
    from one recording of the vjp (``_linear_map``), as torch's forward mode computes them (a no_grad
    region's terms come out as its tangents do)."""
    apply = _linear_map(outs, wrt)
    cols: list = []   # per input: per element, one tangent per output
    for i, w in enumerate(wrt):
        cols.append([])
        for k in range(w.numel()):
            basis = C.zeros_like(w).reshape(-1)
            basis[k] = 1.0
            tangents = [basis.reshape(tuple(w.shape)) if j == i else C.zeros_like(v) for j, v in enumerate(wrt)]
            cols[i].append(apply(tangents, keep, retain=True))
    return [[(_shape.stack([c[n] for c in cols[i]], -1) if cols[i] else C.zeros(tuple(o.shape) + (0,), dtype=o.dtype))
             .reshape(tuple(o.shape) + tuple(w.shape)) for i, w in enumerate(wrt)] for n, o in enumerate(outs)]


def _jacobian(func: Callable, argnums: int | tuple, has_aux: bool, who: str) -> Callable:
    """For each output, a tensor of shape ``output.shape + input.shape`` (nested as outputs, then
    inputs): jacrev's by rows (``_rows``), jacfwd's by columns (``_columns``: forward mode, whose
    reverse passes run no hooks)."""
    forward = who == "jacfwd"

    def wrapped(*args, **kwargs):
        depth = inner()
        args, parts, keep = _fresh_args(args, _argnums(argnums, len(args), who), who)
        wrt = [x for f, _ in parts for x in f]
        with grad_mode.enable_grad(), level(depth, "forward" if forward else "reverse"):
            with forward_saves() if forward else _no_saved_hooks():
                res = func(*args, **kwargs)
            out, aux = _split_aux(res, has_aux, who)
            outs, ospec = _tensors(out, who)
            keep = _keep(keep, outs, depth, forward=forward)
            jacs = (_columns if forward else _rows)(outs, wrt, keep)
            if forward:
                _seal_regions(outs + [j for js in jacs for j in js], keep)
        per_out = [(lambda per_in: per_in[0] if isinstance(argnums, int) else tuple(per_in))(_regroup(js, parts))
                   for js in jacs]
        result, aux = _cut((unflatten(per_out, ospec), aux), depth)
        return (result, aux) if has_aux else result
    return wrapped


def jacrev(func: Callable, argnums: int | tuple = 0, *, has_aux: bool = False, chunk_size: int | None = None,
           _preallocate_and_copy: bool = False) -> Callable:
    """The Jacobian of ``func`` with respect to ``argnums`` (``torch.func.jacrev``): for each
    output, a tensor of shape ``output.shape + input.shape`` (nested as outputs, then inputs).
    ``chunk_size`` (None or positive) is torch's bound on how many vjps run at once, and
    ``_preallocate_and_copy`` its way of assembling them; holoflow runs one vjp per output
    element, so neither changes the result."""
    check_chunk_size(chunk_size, "jacrev")
    return _jacobian(func, argnums, has_aux, "jacrev")


def jacfwd(func: Callable, argnums: int | tuple = 0, has_aux: bool = False, *,
           randomness: str = "error") -> Callable:
    """The Jacobian as ``torch.func.jacfwd`` gives it, computed here by reverse mode from one run
    of ``func``. ``randomness`` as torch's: with ``"error"`` a function that draws random numbers
    raises; ``"same"`` and ``"different"`` both take every column from that one run's draws
    (torch's ``"different"`` draws anew per column)."""
    _rng.check_randomness(randomness, "jacfwd")

    def checked(*args, **kwargs):
        start = _rng.get_state() if randomness == "error" else None
        res = func(*args, **kwargs)
        if start is not None and not _rng.same(start, _rng.get_state()):
            raise _rng.drew_error("jacfwd")
        return res
    return _jacobian(checked, argnums, has_aux, "jacfwd")


def hessian(func: Callable, argnums: int | tuple = 0) -> Callable:
    """The Hessian of a scalar function: the Jacobian of its gradient (``torch.func.hessian``),
    ``jacfwd(jacrev(func))`` as torch's: a function drawing random numbers is refused."""
    return jacfwd(jacrev(func, argnums), argnums)
