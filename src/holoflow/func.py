"""``holoflow.func``: torch.func's function transforms on holoflow's tape autograd.

``functional_call`` runs a module with other tensors in place of its parameters and buffers.
``grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``jacrev``, ``jacfwd`` and ``hessian`` differentiate
a function by recording it on fresh inputs and running ``autograd.grad`` (with ``create_graph``
where an enclosing transform, or the caller, differentiates the result again: ``grad(grad(f))``,
``hessian`` and per-sample gradients compose). ``vmap`` maps a function over a batch dimension by
running it once per sample and stacking the results: torch.func's semantics for functions
without in-place writes to captured tensors (random draws per its ``randomness``: an error, each
sample its own, or one shared by all), at Python-loop speed rather than as batched kernels.
``jvp`` and ``jacfwd`` compute forward-mode results by reverse mode (the transpose of a vjp,
and one vjp per output element): the same values, at reverse mode's cost.

Arguments and results may be nested tuples, lists and dicts of tensors, as in torch.func.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .autograd import grad as _autograd_grad
from .core import generators, grad_mode
from .core.tensor import Tensor
from .graph.pytree import flatten, unflatten
from .nn.module import Module
from .nn.utils.stateless import swapped
from .ops import creation as C
from .ops import shape as _shape

__all__ = ["functional_call", "grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian",
           "vmap", "stack_module_state"]


# -- functional_call ------------------------------------------------------------------------------

def functional_call(module: Module, parameter_and_buffer_dicts: dict | Sequence[dict], args: Any = (),
                    kwargs: dict | None = None, *, tie_weights: bool = True, strict: bool = False) -> Any:
    """``module(*args, **kwargs)`` with its parameters and buffers replaced by the tensors of
    ``parameter_and_buffer_dicts`` (by qualified name; several dicts are merged, a key given
    twice is an error), as ``torch.func.functional_call``."""
    dicts = [parameter_and_buffer_dicts] if isinstance(parameter_and_buffer_dicts, dict) \
        else list(parameter_and_buffer_dicts)
    values: dict = {}
    for d in dicts:
        twice = sorted(set(values) & set(d))
        if twice:
            raise ValueError(f"holoflow.func.functional_call: {twice} appear in more than one dict")
        values.update(d)
    args = args if isinstance(args, tuple) else (args,)
    with swapped(module, values, tie_weights, strict):
        return module(*args, **(kwargs or {}))


# -- reverse mode ------------------------------------------------------------------------------

def _argnums(argnums, n: int, who: str) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums or any(not isinstance(a, int) or not -n <= a < n for a in nums):
        raise RuntimeError(f"holoflow.func.{who}: argnums {argnums!r} must be an int or a tuple of ints "
                           f"indexing the {n} positional argument(s)")
    return tuple(a % n for a in nums)


def _tensors(tree: Any, who: str) -> tuple[list, Any]:
    leaves, spec = flatten(tree)
    for x in leaves:
        if not isinstance(x, Tensor):
            raise RuntimeError(f"holoflow.func.{who}: expected tensors (or tuples, lists, dicts of them) "
                               f"to differentiate with respect to, got {type(x).__name__}")
    return leaves, spec


def _track(x: Tensor) -> Tensor:
    """A fresh input to differentiate with respect to: still differentiable with respect to what
    ``x`` came from when an enclosing transform (or the caller) records ``x``."""
    if x.requires_grad and grad_mode.STATE.enabled:
        return x.view_as(x)
    return x.detach().requires_grad_(True)


def _outer(xs: list) -> bool:
    """Whether the results must stay differentiable: an input was recorded from outside."""
    return grad_mode.STATE.enabled and any(x.requires_grad for x in xs)


def _grads(out: list, wrt: list, cot: list | None, keep: bool, retain: bool = False) -> list:
    """d(out)/d(wrt) contracted with ``cot``: zeros for inputs the outputs do not depend on."""
    live = [(o, c) for o, c in zip(out, cot or [None] * len(out)) if o.requires_grad]
    if not live:
        return [C.zeros_like(w) for w in wrt]
    got = _autograd_grad([o for o, _ in live], wrt, None if cot is None else [c for _, c in live],
                         retain_graph=keep or retain, create_graph=keep, allow_unused=True)
    return [C.zeros_like(w) if g is None else (g if keep else g.detach()) for g, w in zip(got, wrt)]


def _fresh_args(args: tuple, nums: tuple, who: str) -> tuple[list, list, bool]:
    """``args`` with the arguments ``nums`` replaced by fresh inputs to differentiate with respect
    to: ``(args, parts, keep)``, ``parts`` one ``(fresh leaves, structure)`` per argument, ``keep``
    whether an enclosing transform (or the caller) records them."""
    args, parts, originals = list(args), [], []
    for a in nums:
        leaves, spec = _tensors(args[a], who)
        originals += leaves
        fresh = [_track(x) for x in leaves]
        parts.append((fresh, spec))
        args[a] = unflatten(fresh, spec)
    return args, parts, _outer(originals)


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
        args, parts, keep = _fresh_args(args, _argnums(argnums, len(args), "grad"), "grad")
        with grad_mode.enable_grad():
            res = func(*args, **kwargs)
            value, aux = _split_aux(res, has_aux, "grad")
            if not isinstance(value, Tensor) or value.numel() != 1:
                what = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
                raise RuntimeError(f"holoflow.func.grad: the function must return a scalar tensor (one "
                                   f"element) to differentiate, got {what}; use jacrev or vjp for others")
            gs = _grads([value], [x for fresh, _ in parts for x in fresh], None, keep)
        out = _regroup(gs, parts)
        g = out[0] if isinstance(argnums, int) else tuple(out)
        value = value if keep else value.detach()
        return (g, (value, aux)) if has_aux else (g, value)
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
    args, fresh, keep = _fresh_args(primals, tuple(range(len(primals))), "vjp")
    with grad_mode.enable_grad():
        res = func(*args)
    out, aux = _split_aux(res, has_aux, "vjp")
    out_leaves, out_spec = _tensors(out, "vjp")
    wrt = [x for f, _ in fresh for x in f]

    def vjp_fn(cotangents: Any) -> tuple:
        cot, cspec = _tensors(cotangents, "vjp")
        if len(cot) != len(out_leaves) or any(tuple(c.shape) != tuple(o.shape) for c, o in zip(cot, out_leaves)):
            raise RuntimeError(f"holoflow.func.vjp: cotangents of shapes {[tuple(c.shape) for c in cot]} do "
                               f"not match the outputs' {[tuple(o.shape) for o in out_leaves]}")
        with grad_mode.enable_grad():
            gs = _grads(out_leaves, wrt, cot, keep, retain=True)
        return tuple(_regroup(gs, fresh))
    shown = out if keep else unflatten([o.detach() for o in out_leaves], out_spec)
    return (shown, vjp_fn, aux) if has_aux else (shown, vjp_fn)


def jvp(func: Callable, primals: tuple, tangents: tuple, *, has_aux: bool = False) -> tuple:
    """``(func(*primals), J @ tangents)`` (``torch.func.jvp``), by reverse mode: the vjp with a
    symbolic cotangent ``u`` is linear in ``u``; differentiating it against ``tangents`` gives J t."""
    if len(primals) != len(tangents):
        raise RuntimeError(f"holoflow.func.jvp: {len(primals)} primals but {len(tangents)} tangents")
    args, fresh, keep = _fresh_args(primals, tuple(range(len(primals))), "jvp")
    tl = [_tensors(t, "jvp")[0] for t in tangents]
    for (ps, _), ts in zip(fresh, tl):
        if len(ps) != len(ts) or any(tuple(p.shape) != tuple(t.shape) for p, t in zip(ps, ts)):
            raise RuntimeError("holoflow.func.jvp: tangents must have the primals' structure and shapes")
    with grad_mode.enable_grad():
        res = func(*args)
        out, aux = _split_aux(res, has_aux, "jvp")
        outs, ospec = _tensors(out, "jvp")
        wrt = [x for f, _ in fresh for x in f]
        us = [C.zeros_like(o).requires_grad_(True) for o in outs]
        live = [(o, u) for o, u in zip(outs, us) if o.requires_grad]
        if live:
            vj = _autograd_grad([o for o, _ in live], wrt, [u for _, u in live], create_graph=True,
                                allow_unused=True)
            pairs = [(g, t) for g, t in zip(vj, (t for ts in tl for t in ts)) if g is not None and g.requires_grad]
        else:
            pairs = []
        if pairs:
            jt = _autograd_grad([g for g, _ in pairs], us, [t for _, t in pairs], create_graph=keep,
                                allow_unused=True)
        else:
            jt = [None] * len(us)
    tans = [C.zeros_like(o) if j is None else (j if keep else j.detach()) for j, o in zip(jt, outs)]
    shown = out if keep else unflatten([o.detach() for o in outs], ospec)
    result = (shown, unflatten(tans, ospec))
    return (*result, aux) if has_aux else result


def jacrev(func: Callable, argnums: int | tuple = 0, *, has_aux: bool = False) -> Callable:
    """The Jacobian of ``func`` with respect to ``argnums`` (``torch.func.jacrev``): for each
    output, a tensor of shape ``output.shape + input.shape`` (nested as outputs, then inputs),
    one vjp per output element."""
    def wrapped(*args, **kwargs):
        args, parts, keep = _fresh_args(args, _argnums(argnums, len(args), "jacrev"), "jacrev")
        wrt = [x for f, _ in parts for x in f]
        with grad_mode.enable_grad():
            res = func(*args, **kwargs)
            out, aux = _split_aux(res, has_aux, "jacrev")
            outs, ospec = _tensors(out, "jacrev")
            per_out = []
            for o in outs:
                rows = [[] for _ in wrt]
                flat_o = o.reshape(-1)
                for k in range(flat_o.numel()):
                    cot = C.zeros_like(flat_o)
                    cot[k] = 1.0
                    gs = _grads([flat_o], wrt, [cot], keep, retain=True)
                    for i, g in enumerate(gs):
                        rows[i].append(g)
                jac = [(_shape.stack(r) if r else C.zeros((0,) + tuple(w.shape), dtype=w.dtype))
                       .reshape(tuple(o.shape) + tuple(w.shape)) for r, w in zip(rows, wrt)]
                per_in = _regroup(jac, parts)
                per_out.append(per_in[0] if isinstance(argnums, int) else tuple(per_in))
        result = unflatten(per_out, ospec)
        return (result, aux) if has_aux else result
    return wrapped


def jacfwd(func: Callable, argnums: int | tuple = 0, has_aux: bool = False, *, randomness: str = "error") -> Callable:
    """The Jacobian as ``torch.func.jacfwd`` gives it (computed here by reverse mode, see the
    module doc)."""
    return jacrev(func, argnums, has_aux=has_aux)


def hessian(func: Callable, argnums: int | tuple = 0) -> Callable:
    """The Hessian of a scalar function: the Jacobian of its gradient (``torch.func.hessian``)."""
    return jacrev(jacrev(func, argnums), argnums)


# -- vmap --------------------------------------------------------------------------------------

def _dims_like(in_dims: Any, args: tuple) -> list:
    """``in_dims`` broadcast to the flattened arguments (an int or None applies to a whole arg)."""
    if not isinstance(in_dims, (tuple, list)):
        in_dims = (in_dims,) * len(args)
    if len(in_dims) != len(args):
        raise ValueError(f"holoflow.func.vmap: in_dims {in_dims!r} has {len(in_dims)} entries for "
                         f"{len(args)} positional arguments")
    out = []
    for d, a in zip(in_dims, args):
        leaves, _ = flatten(a)
        if d is None or isinstance(d, int):
            out.append([d] * len(leaves))
        else:
            dl, _ = flatten(d)
            if len(dl) != len(leaves):
                raise ValueError(f"holoflow.func.vmap: in_dims entry {d!r} does not match its argument's structure")
            out.append(dl)
    return out


def _rng_devices() -> list[torch.device]:
    cuda = torch.cuda.device_count() if torch.cuda.is_available() and torch.cuda.is_initialized() else 0
    return [torch.device("cpu")] + [torch.device("cuda", i) for i in range(cuda)]


def _rng_state() -> list:
    """The default generators' states (a simulated rank's own on its thread): CPU, then CUDA's."""
    cpu, *cuda = [generators.get_state(d) for d in _rng_devices()]
    return [cpu, cuda] if cuda else [cpu]


def _set_rng_state(state: list) -> None:
    devices = _rng_devices()
    generators.set_state(state[0])
    for d, st in zip(devices[1:], state[1] if len(state) > 1 else ()):
        generators.set_state(st, d)


def _same_rng(a: list, b: list) -> bool:
    return torch.equal(a[0], b[0]) and (len(a) == 1 or all(torch.equal(x, y) for x, y in zip(a[1], b[1])))


def vmap(func: Callable, in_dims: Any = 0, out_dims: Any = 0, randomness: str = "error", *,
         chunk_size: int | None = None) -> Callable:
    """``func`` mapped over dimension ``in_dims`` of its arguments (None: not mapped), results
    stacked along ``out_dims`` (``torch.func.vmap``); see the module doc for how it runs.
    ``randomness``: ``"error"`` (a function that draws random numbers raises), ``"different"``
    (each sample its own draws) or ``"same"`` (every sample the same draws), as torch.func's."""
    if randomness not in ("error", "different", "same"):
        raise ValueError(f"holoflow.func.vmap: randomness must be 'error', 'different' or 'same', got {randomness!r}")

    def wrapped(*args):
        dims = _dims_like(in_dims, args)
        flat = [flatten(a) for a in args]
        sizes = set()
        for (leaves, _), ds in zip(flat, dims):
            for x, d in zip(leaves, ds):
                if d is not None:
                    if not isinstance(x, Tensor):
                        raise ValueError(f"holoflow.func.vmap: in_dims maps a {type(x).__name__}; only tensors "
                                         f"can be mapped (use None for it)")
                    if not -x.dim() <= d < x.dim():
                        raise ValueError(f"holoflow.func.vmap: in_dim {d} is out of range for a tensor of "
                                         f"shape {tuple(x.shape)}")
                    sizes.add(x.shape[d])
        if not sizes:
            raise ValueError("holoflow.func.vmap: no argument is mapped (every in_dim is None)")
        if len(sizes) > 1:
            raise ValueError(f"holoflow.func.vmap: mapped dimensions have different sizes {sorted(sizes)}")
        (n,) = sizes
        results = []
        start = _rng_state() if randomness != "different" else None
        for i in range(n):
            call = []
            for (leaves, spec), ds in zip(flat, dims):
                call.append(unflatten([x if d is None else x.select(d, i) for x, d in zip(leaves, ds)], spec))
            if randomness == "same" and i:
                _set_rng_state(start)
            results.append(func(*call))
            if randomness == "error" and i == 0 and not _same_rng(start, _rng_state()):
                raise RuntimeError("holoflow.func.vmap: the function draws random numbers; pass "
                                   "randomness='different' (each sample its own draws) or 'same' (one draw "
                                   "shared by every sample), as torch.func.vmap asks")
        leaves0, spec = flatten(results[0])
        ods = [out_dims] * len(leaves0) if isinstance(out_dims, int) else flatten(out_dims)[0]
        if len(ods) != len(leaves0):
            raise ValueError(f"holoflow.func.vmap: out_dims {out_dims!r} does not match the outputs' structure")
        per = [flatten(r)[0] for r in results]
        stacked = []
        for j, od in enumerate(ods):
            col = [p[j] for p in per]
            if not all(isinstance(c, Tensor) for c in col):
                raise ValueError("holoflow.func.vmap: the function must return tensors (or tuples, lists, dicts "
                                 "of them)")
            stacked.append(_shape.stack(col, dim=od % (col[0].dim() + 1)))
        return unflatten(stacked, spec)
    return wrapped


def stack_module_state(models: Sequence[Module]) -> tuple[dict, dict]:
    """Every model's parameters and buffers stacked along a new leading dimension (an ensemble for
    ``vmap(functional_call)``), as ``torch.func.stack_module_state``."""
    if not models:
        raise RuntimeError("holoflow.func.stack_module_state: expected at least one model")
    params = {k: _shape.stack([dict(m.named_parameters())[k].detach() for m in models]).requires_grad_(True)
              for k, _ in models[0].named_parameters()}
    buffers = {k: _shape.stack([dict(m.named_buffers())[k] for m in models]) for k, _ in models[0].named_buffers()}
    return params, buffers

