"""Differential fuzzing of autograd compositions: a small random differentiable program (the
body: pointwise ops, matmul, reductions, softmax, indexing, views, where, cat/stack, layer_norm,
in-place writes into intermediates, custom autograd Functions, checkpointing, hooks, grad-mode
regions, a Linear module) wrapped in a random stack of torch.func transforms (grad, vjp, jvp,
jacrev, jacfwd, hessian, vmap, functional_call) and driven from outside by torch.autograd (a
plain call, ``autograd.grad`` with ``create_graph`` then a second derivative, or ``backward``
with given gradients, once or twice). Run under torch and under holoflow: the results' values,
shapes and dtypes must agree, and which inputs got a gradient (None against zeros); an error
must be raised by both (the same class) or by neither. Each seed is one program:
``_describe(seed)`` prints it.

A longer hunt: ``HOLOFLOW_FUZZ_FIRST=10000 HOLOFLOW_FUZZ_SEEDS=3000``.
"""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

import holoflow as flow

# seeds that found a bug (fixed since), run in CI besides the first ones
FOUND = (0, 12, 33, 193, 239, 504, 508, 679, 752, 1231, 2675, 2971, 3128, 3504, 3942, 3943, 25241, 25747)
_FIRST = int(os.environ.get("HOLOFLOW_FUZZ_FIRST", 0))   # (a longer hunt: new seeds from here)
SEEDS = sorted(set(range(_FIRST, _FIRST + int(os.environ.get("HOLOFLOW_FUZZ_SEEDS", 60)))) | set(FOUND))
DTYPE = torch.float64


def _wave(lib, shape: tuple, k: float = 0.0):
    """A fixed tensor of ``shape``, the same in both libraries: the weights, cotangents and
    tangents the transforms and drivers use (made inside a vmapped function too: unbatched)."""
    n = int(np.prod(shape)) if shape else 1
    return (lib.arange(n, dtype=lib.float64) * 0.7 + k).cos().reshape(shape)


# -- the body: steps (name, operand indices into the pool, params) over the inputs x and y -------

def _inplace(lib, xs, p):
    t = xs[0] * 1.0   # (a fresh intermediate: writes into an input are the views fuzzer's business)
    view = t if p["view"] is None else t[p["view"]]
    if p["how"] == "mul_":
        view.mul_(p["c"])
    elif p["how"] == "add_":
        view.add_(xs[1] if len(xs) > 1 else p["c"])
    elif p["how"] == "sigmoid_":
        view.sigmoid_()
    else:
        view.copy_(xs[1] if len(xs) > 1 else view.sin())
    return t


def _hook(lib, xs, p):
    t = xs[0] * 1.0
    try:
        t.register_hook(lambda g: g * p["c"])
    except RuntimeError:   # (t doesn't require grad; inside vmap torch's batched tensors don't, and
        pass               # holoflow refuses as well: test_a_hook_inside_forward_mode_or_vmap_is_refused)
    return t


def _checkpoint(lib, xs, p):
    from holoflow.utils.checkpoint import checkpoint as flow_checkpoint
    from torch.utils.checkpoint import checkpoint as torch_checkpoint
    ck = torch_checkpoint if lib is torch else flow_checkpoint
    return ck(lambda a: a.sin() * a, xs[0], use_reentrant=p["reentrant"])


def _regions(lib, xs, p):
    if p["how"] == "no_grad":
        with lib.no_grad():
            return xs[0] * p["c"]
    if p["how"] == "enable_grad":   # (enable_grad inside no_grad records again)
        with lib.no_grad(), lib.enable_grad():
            return xs[0] * p["c"]
    if p["how"] == "inference":
        with lib.inference_mode():
            return xs[0] * p["c"]
    return xs[0].detach() * p["c"]


def _custom(lib, xs, p):
    fns = _functions(lib)
    if p["fn"] == "two":
        a, b = fns["two"].apply(xs[0])
        return a if b is None else a + b
    return fns[p["fn"]].apply(xs[0] * 1.0 if p["fn"] == "scale_" else xs[0])


def _linear(lib, xs, p):
    return p["module"](xs[0])   # (the run puts the module of its library in p: see _bind)


BODY = {
    # pointwise
    "sin": (1, lambda lib, xs, p: xs[0].sin()),
    "tanh": (1, lambda lib, xs, p: xs[0].tanh()),
    "exp": (1, lambda lib, xs, p: (xs[0] * 0.5).exp()),
    "square": (1, lambda lib, xs, p: xs[0] * xs[0]),
    "scale": (1, lambda lib, xs, p: xs[0] * p["c"]),
    "relu": (1, lambda lib, xs, p: lib.relu(xs[0])),
    "add": (2, lambda lib, xs, p: xs[0] + xs[1]),
    "mul": (2, lambda lib, xs, p: xs[0] * xs[1]),
    "where": (2, lambda lib, xs, p: lib.where(xs[0] > 0, xs[0], xs[1])),
    # products, reductions, normalisations
    "matmul": (2, lambda lib, xs, p: xs[0] @ xs[1]),
    "sum": (1, lambda lib, xs, p: xs[0].sum(p["dim"], keepdim=p["keep"])),
    "mean": (1, lambda lib, xs, p: xs[0].mean(p["dim"], keepdim=p["keep"])),
    "amax": (1, lambda lib, xs, p: xs[0].amax(p["dim"], keepdim=p["keep"])),
    "logsumexp": (1, lambda lib, xs, p: xs[0].logsumexp(p["dim"])),
    "softmax": (1, lambda lib, xs, p: xs[0].softmax(p["dim"])),
    "log_softmax": (1, lambda lib, xs, p: xs[0].log_softmax(p["dim"])),
    "layer_norm": (1, lambda lib, xs, p: lib.nn.functional.layer_norm(xs[0], xs[0].shape[-1:])),
    # views, indexing, joins
    "index": (1, lambda lib, xs, p: xs[0][p["idx"]]),
    "take": (1, lambda lib, xs, p: xs[0][lib.tensor(p["rows"])]),
    "select": (1, lambda lib, xs, p: xs[0].select(p["dim"], p["i"])),
    "reshape": (1, lambda lib, xs, p: xs[0].reshape(-1)),
    "transpose": (1, lambda lib, xs, p: xs[0].transpose(0, -1)),
    "unsqueeze": (1, lambda lib, xs, p: xs[0].unsqueeze(p["dim"])),
    "expand": (1, lambda lib, xs, p: xs[0].unsqueeze(0).expand(2, *xs[0].shape)),
    "cat": (2, lambda lib, xs, p: lib.cat([xs[0], xs[1]], p["dim"])),
    "stack": (2, lambda lib, xs, p: lib.stack([xs[0], xs[1]], p["dim"])),
    # autograd's own machinery inside the body
    "inplace": (1, _inplace),
    "inplace2": (2, _inplace),
    "hook": (1, _hook),
    "checkpoint": (1, _checkpoint),
    "region": (1, _regions),
    "custom": (1, _custom),
    "linear": (1, _linear),
    # random draws (vmap's randomness; both libraries draw from torch's generator, seeded alike)
    "noise": (1, lambda lib, xs, p: xs[0] + lib.rand(tuple(xs[0].shape), dtype=lib.float64)),
}


@functools.lru_cache(maxsize=None)
def _functions(lib) -> dict:
    """The custom autograd Functions of the body, one set per library."""
    F = lib.autograd.Function

    class Square(F):   # torch.func's style: setup_context, a jvp, vmap rule generated
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return x * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            ctx.save_for_forward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * g * x

        @staticmethod
        def jvp(ctx, t):
            (x,) = ctx.saved_tensors
            return 2 * x * t

    class Cube(F):   # the old style: forward takes ctx (torch.func refuses it)
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * g * x * x

    class Scale_(F):   # writes its input: mark_dirty
        @staticmethod
        def forward(ctx, x):
            x.mul_(2.0)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2.0

    class Once(F):   # a backward that can't be differentiated again
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        @lib.autograd.function.once_differentiable
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.cos()

    class Two(F):   # two outputs; backward sees None for the one unused (no materialized zeros)
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(x)
            return x.sin(), x.cos()

        @staticmethod
        def backward(ctx, ga, gb):
            (x,) = ctx.saved_tensors
            g = 0 * x if ga is None else ga * x.cos()
            return g if gb is None else g - gb * x.sin()

    return {"square": Square, "cube": Cube, "scale_": Scale_, "once": Once, "two": Two}


def _body_params(name: str, x: torch.Tensor, pool: list, rng: np.random.Generator):
    """Random params and second operand (pool index) for ``name`` on ``x``; None when none fit."""
    nd, shape = x.dim(), tuple(x.shape)
    p: dict = {"c": float(rng.choice([-1.5, -0.5, 0.5, 2.0]))}

    def other(ok):
        js = [j for j, y in enumerate(pool) if ok(tuple(y.shape))]
        return (p, int(rng.choice(js))) if js else None
    if name in ("add", "mul", "where"):
        return other(lambda s: _broadcasts(s, shape))
    if name == "inplace2":
        p.update(how=str(rng.choice(["add_", "copy_"])), view=None)
        return other(lambda s: _broadcasts(s, shape) and len(s) <= nd)
    if name == "matmul":
        return other(lambda s: nd >= 1 and len(s) >= 1 and nd + len(s) <= 4 and
                     s[-2 if len(s) > 1 else 0] == shape[-1])
    if name in ("cat", "stack"):
        if nd == 0 and name == "cat":
            return None
        p["dim"] = int(rng.integers(-nd - (name == "stack"), nd + (name == "stack")))
        return other(lambda s: s == shape)
    if name in ("sum", "mean", "amax", "logsumexp", "softmax", "log_softmax", "select", "unsqueeze"):
        if nd == 0 and name != "unsqueeze":
            return None
        p.update(dim=int(rng.integers(-nd - (name == "unsqueeze"), nd + (name == "unsqueeze"))),
                 keep=bool(rng.random() < 0.5))
        if name == "select":
            if shape[p["dim"]] == 0:
                return None
            p["i"] = int(rng.integers(0, shape[p["dim"]]))
        return p, None
    if name in ("index", "take"):
        if nd == 0 or shape[0] == 0:
            return None
        start = int(rng.integers(0, shape[0]))
        p["idx"] = slice(start, None, int(rng.integers(1, 3)))
        p["rows"] = [int(r) for r in rng.integers(0, shape[0], size=int(rng.integers(1, 4)))]
        return p, None
    if name == "inplace":
        p["how"] = str(rng.choice(["mul_", "add_", "sigmoid_", "copy_"]))
        p["view"] = None if nd == 0 or rng.random() < 0.5 else int(rng.integers(0, shape[0]) if shape[0] else 0)
        return (p, None) if p["view"] is None or shape[0] else None
    if name in ("layer_norm", "transpose") and nd == 0:
        return None
    if name == "linear":
        return (p, None) if nd >= 1 and shape[-1] == 3 else None
    if name == "hook":
        p["c"] = float(rng.choice([0.0, 2.0, -1.0]))
    if name == "checkpoint":
        p["reentrant"] = bool(rng.random() < 0.5)
    if name == "region":
        p["how"] = str(rng.choice(["no_grad", "enable_grad", "inference", "detach"]))
    if name == "custom":
        p["fn"] = str(rng.choice(["square", "square", "cube", "scale_", "once", "two"]))
    return p, None


def _broadcasts(s: tuple, shape: tuple) -> bool:
    try:
        return torch.broadcast_shapes(s, shape) == shape
    except RuntimeError:
        return False


# which body ops, by family: a program draws from a few families so that they meet
FAMILIES = {
    "math": ["sin", "tanh", "exp", "square", "scale", "relu", "add", "mul", "where", "matmul", "sum", "mean",
             "amax", "logsumexp", "softmax", "log_softmax", "layer_norm"],
    "shape": ["index", "take", "select", "reshape", "transpose", "unsqueeze", "expand", "cat", "stack"],
    "autograd": ["inplace", "inplace2", "hook", "checkpoint", "region", "custom"],
    "module": ["linear"],
}
FAMILY_WEIGHTS = {"math": 0.5, "shape": 0.25, "autograd": 0.2, "module": 0.05}


def _inputs(lib, packed: bool) -> list:
    """The body's arguments at sample level: x (2, 3) and y (3,), as ``((x, y),)`` when packed."""
    x = _wave(lib, (2, 3), 0.3) * 1.5
    y = _wave(lib, (3,), 1.1)
    return [(x, y)] if packed else [x, y]


def _module(lib):
    lib.manual_seed(0)
    m = lib.nn.Linear(3, 3).double()
    with lib.no_grad():
        m.weight.copy_(_wave(lib, (3, 3), 0.2))
        m.bias.copy_(_wave(lib, (3,), 2.0))
    return m


def _generate_body(rng: np.random.Generator, steps: int) -> list:
    """A body, chosen by running it on torch at sample shapes; its last tensor is its result,
    or its last two (a tuple) when the program says so."""
    pool = list(_flatten(_inputs(torch, False)))
    fams = [f for f in FAMILIES if rng.random() < FAMILY_WEIGHTS[f] * 2] or ["math"]
    names = [n for f in fams for n in FAMILIES[f]]
    body = []
    module = _module(torch)
    for _ in range(steps):
        for _try in range(20):
            name = names[int(rng.integers(0, len(names)))]
            i = len(pool) - 1 if rng.random() < 0.6 else int(rng.integers(0, len(pool)))
            got = _body_params(name, pool[i], pool, rng)
            if got is not None:
                break
        else:
            continue
        p, j = got
        operands = (i,) if BODY[name][0] == 1 or j is None else (i, j)
        try:
            out = BODY[name][1](torch, [pool[k] for k in operands], {**p, "module": module})
        except Exception:
            continue   # (not a valid step on its own: another)
        body.append((name, operands, p))
        pool.append(out)
    return body


def _run_body(lib, body: list, args: list, module, two_outputs: bool):
    pool = list(_flatten(args))
    for name, operands, p in body:
        pool.append(BODY[name][1](lib, [pool[k] for k in operands], {**p, "module": module}))
    return (pool[-2], pool[-1]) if two_outputs and len(pool) > 1 else pool[-1]


# -- the transforms: each maps a function of some arguments to a function of the same arguments
# (vmap: batched ones); the stack is built from the body outwards ------------------------------

def _flatten(tree) -> list:
    """The leaves of a tree of tuples, lists and dicts (a torch.Size is a leaf: a shape)."""
    if isinstance(tree, (tuple, list)) and not isinstance(tree, torch.Size):
        return [leaf for t in tree for leaf in _flatten(t)]
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in _flatten(tree[k])]
    return [tree]


def _scalar(lib, out):
    """One number from a function's outputs (every leaf weighted): what grad and hessian need."""
    leaves = [t for t in _flatten(out) if isinstance(t, (torch.Tensor, flow.Tensor))]
    return sum((t * _wave(lib, tuple(t.shape), 0.5 + k)).sum() for k, t in enumerate(leaves))


def _like(lib, tree, k: float):
    """A tree of fixed tensors shaped as ``tree``'s leaves (cotangents, tangents)."""
    if isinstance(tree, (tuple, list)):
        return type(tree)(_like(lib, t, k + 1.3 * i) for i, t in enumerate(tree))
    if isinstance(tree, dict):
        return {key: _like(lib, tree[key], k + i) for i, key in enumerate(sorted(tree))}
    return _wave(lib, tuple(tree.shape), k).to(tree.dtype)


def _transform(lib, fn, spec: tuple):
    """``fn`` under one transform ``(name, params)``, in library ``lib``'s torch.func."""
    func = lib.func
    name, p = spec
    if name == "grad":
        def scalar(*a):
            out = fn(*a)
            return (_scalar(lib, out), out) if p["has_aux"] else _scalar(lib, out)
        return func.grad(scalar, argnums=p["argnums"], has_aux=p["has_aux"])
    if name == "hessian":
        return func.hessian(lambda *a: _scalar(lib, fn(*a)), argnums=p["argnums"])
    if name in ("jacrev", "jacfwd"):
        return getattr(func, name)(fn, argnums=p["argnums"])
    if name == "vjp":
        def pulled(*a):
            out, vjp_fn = func.vjp(fn, *a)
            return out, vjp_fn(_like(lib, out, 0.9))
        return pulled
    if name == "jvp":
        return lambda *a: func.jvp(fn, tuple(a), _like(lib, tuple(a), 0.4))
    if name == "vmap":
        return func.vmap(fn, in_dims=p["in_dims"], out_dims=p["out_dims"], chunk_size=p["chunk_size"],
                         randomness=p["randomness"])
    if name == "functional_call":   # (innermost only: fn takes the module's parameters first)
        return lambda params, *a: func.functional_call(p["module"], params, tuple(a))
    raise AssertionError(name)


def _batched(tree, dims, size: int):
    """The shapes of ``tree`` (a tree of shape tuples) with a dim of ``size`` inserted as ``dims``
    (a prefix of the tree) says."""
    if isinstance(tree, torch.Size):
        if dims is None:
            return tree
        d = dims % (len(tree) + 1)
        return torch.Size(tree[:d] + (size,) + tree[d:])
    if isinstance(dims, (tuple, list, dict)):
        keys = sorted(tree) if isinstance(tree, dict) else range(len(tree))
        parts = {k: _batched(tree[k], dims[k], size) for k in keys}
        return parts if isinstance(tree, dict) else type(tree)(parts[k] for k in keys)
    if isinstance(tree, (tuple, list, dict)):
        keys = sorted(tree) if isinstance(tree, dict) else range(len(tree))
        parts = {k: _batched(tree[k], dims, size) for k in keys}
        return parts if isinstance(tree, dict) else type(tree)(parts[k] for k in keys)
    raise AssertionError(tree)


def _draw_in_dims(tree, rng: np.random.Generator, top: bool = True):
    """in_dims for arguments shaped ``tree``: per leaf an int or None, or one for a whole subtree."""
    subtree = not isinstance(tree, torch.Size)
    if subtree and (top or rng.random() < 0.5):
        keys = sorted(tree) if isinstance(tree, dict) else range(len(tree))
        parts = {k: _draw_in_dims(tree[k], rng, False) for k in keys}
        return parts if isinstance(tree, dict) else type(tree)(parts[k] for k in keys)
    nd = min(len(s) for s in _flatten(tree))
    return None if rng.random() < 0.25 else int(rng.integers(-nd - 1, nd + 1))


def _shapes(tree):
    if isinstance(tree, (tuple, list)):
        return type(tree)(_shapes(t) for t in tree)
    if isinstance(tree, dict):
        return {k: _shapes(v) for k, v in tree.items()}
    return torch.Size(tree.shape)


def _make_args(lib, shapes):
    """Arguments of the given shapes (a tree), fixed values in both libraries."""
    counter = iter(range(100))

    def make(tree):
        if isinstance(tree, torch.Size):
            return _wave(lib, tuple(tree), 0.37 * next(counter)) * 1.2
        if isinstance(tree, (tuple, list)):
            return type(tree)(make(t) for t in tree)
        if isinstance(tree, dict):
            return {k: make(tree[k]) for k in sorted(tree)}
        raise AssertionError(tree)
    return make(shapes)


# -- the program: body, transforms, driver ----------------------------------------------------

TRANSFORMS = ["grad", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "vmap", "vmap"]
DRIVERS = ["call", "call", "grad2", "backward"]


def _generate(seed: int) -> dict:
    """The program of ``seed`` (a dict of data: body, transforms inner to outer, driver)."""
    rng = np.random.default_rng(seed)
    prog = {"body": _generate_body(rng, int(rng.integers(1, 6))), "two": bool(rng.random() < 0.25),
            "packed": bool(rng.random() < 0.2), "fc": False, "transforms": []}
    prog["fc"] = any(n == "linear" for n, _, _ in prog["body"]) and rng.random() < 0.6
    shapes = _shapes(_inputs(torch, prog["packed"]))
    if prog["fc"]:
        shapes = [{"weight": torch.Size((3, 3)), "bias": torch.Size((3,))}] + list(shapes)
    for _ in range(int(rng.choice([0, 1, 1, 2, 2, 3]))):
        name = str(rng.choice(TRANSFORMS))
        if name == "hessian" and any(n in ("hessian", "jacrev", "jacfwd") for n, _ in prog["transforms"]):
            name = "grad"   # (keeps the outputs small)
        n_args = len(shapes)
        argnums = int(rng.integers(0, n_args)) if rng.random() < 0.6 else \
            tuple(int(a) for a in rng.permutation(n_args)[:int(rng.integers(1, n_args + 1))])
        p = {"argnums": argnums, "has_aux": bool(rng.random() < 0.3)}
        if name == "vmap":
            size = int(rng.choice([0, 1, 2, 3, 3]))
            in_dims = _draw_in_dims(list(shapes), rng)
            in_dims = tuple(in_dims)
            if all(d is None for d in _flatten(in_dims)):
                in_dims = 0
            out = _out_structure(prog, shapes)
            batched = _batched(list(shapes), list(in_dims) if isinstance(in_dims, tuple) else in_dims, size)
            mapped = iter(_mapped_outputs(prog, batched, in_dims) or [])
            p = {"in_dims": in_dims, "size": size,
                 "out_dims": 0 if rng.random() < 0.5 else _draw_out_dims(out, rng, mapped),
                 # (torch 2.13 fails an assertion of its own chunking an empty batch)
                 "chunk_size": None if rng.random() < 0.6 or size == 0 else int(rng.integers(1, 3)),
                 "randomness": str(rng.choice(["error", "different", "same"]))}
            shapes = batched
        prog["transforms"].append((name, p))
        if _out_structure(prog, shapes) is None:   # (torch refuses this stack: keep it, it is compared)
            break
    prog["shapes"] = shapes
    prog["driver"] = str(rng.choice(DRIVERS))
    prog["wants"] = [bool(rng.random() < 0.7) for _ in _flatten(shapes)]
    prog["twice"] = bool(rng.random() < 0.3)
    prog["retain"] = bool(rng.random() < 0.5)
    prog["materialize"] = bool(rng.random() < 0.3)
    # (drawn apart, so that the programs of the seeds above stay as they were)
    more = np.random.default_rng([seed, 1])
    if more.random() < 0.15:   # a random draw at the end of the body
        prog["body"] = prog["body"] + [("noise", (len(prog["body"]) + 1,), {})]
    prog["grad_outputs"] = bool(more.random() < 0.5)
    return prog


def _out_structure(prog: dict, shapes):
    """The output shapes of the program so far on torch, or None where torch raises."""
    try:
        return _shapes(_function(torch, prog)(*_make_args(torch, shapes)))
    except Exception:
        return None


def _draw_out_dims(out, rng: np.random.Generator, mapped):
    """out_dims for outputs shaped ``out``: per leaf an int, 0 where ``mapped`` (an iterator of
    flags per leaf) says the output does not depend on the mapped inputs: torch 2.13 mishandles
    another out_dim there (the batch dim put first, a garbage shape, an error, or a segfault for
    an empty batch)."""
    if out is None:
        return 0
    if isinstance(out, torch.Size):
        d = int(rng.integers(-len(out) - 1, len(out) + 1))
        return d if next(mapped, True) else 0
    if isinstance(out, (tuple, list)):
        return type(out)(_draw_out_dims(o, rng, mapped) for o in out)
    if isinstance(out, dict):
        return {k: _draw_out_dims(out[k], rng, mapped) for k in sorted(out)}
    return 0


def _mapped_outputs(prog: dict, shapes, in_dims) -> list | None:
    """Per output leaf of the program so far, whether it depends on the inputs a vmap with
    ``in_dims`` of arguments shaped ``shapes`` maps (None where torch raises)."""
    from torch._C._functorch import maybe_current_level, maybe_get_level
    flags: list = []
    fn = _function(torch, prog)

    def probe(*a):
        out = fn(*a)
        level = maybe_current_level()
        flags[:] = [maybe_get_level(t) == level for t in _flatten(out)]
        return out
    try:
        torch.func.vmap(probe, in_dims=in_dims)(*_make_args(torch, shapes))
    except Exception:
        return None
    return flags


def _function(lib, prog: dict):
    """The program's transformed function in ``lib``."""
    module = _module(lib)

    def body(*args):
        flat = _flatten(list(args))
        return _run_body(lib, prog["body"], flat, module, prog["two"])
    fn = body
    transforms = prog["transforms"]
    if prog["fc"]:
        fn = _transform(lib, body, ("functional_call", {"module": _FcModule.make(lib, prog, module)}))
    for spec in transforms:
        fn = _transform(lib, fn, spec)
    return fn


class _FcModule:
    """The module functional_call runs: the body, its Linear steps on the module's own parameters."""

    @staticmethod
    def make(lib, prog: dict, linear):
        class Body(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight, self.bias = linear.weight, linear.bias

            def forward(self, *args):
                def lin(t):
                    return lib.nn.functional.linear(t, self.weight, self.bias)
                return _run_body(lib, prog["body"], _flatten(list(args)), lin, prog["two"])
        return Body()


def _describe(seed: int) -> str:
    prog = _generate(seed)
    lines = [f"  {n}{ops} {p}" for n, ops, p in prog["body"]]
    lines += [f"  -> {n} {p}" for n, p in prog["transforms"]]
    lines.append(f"  driver {prog['driver']} grad_outputs={prog.get('grad_outputs')} wants={prog['wants']} twice={prog['twice']} "
                 f"retain={prog['retain']} materialize={prog['materialize']} fc={prog['fc']} "
                 f"packed={prog['packed']} two={prog['two']}")
    return "\n".join(lines)


# -- the drivers: how the transformed function is run from outside ---------------------------

def _leaves_of(lib, prog: dict) -> tuple[list, list]:
    """The program's arguments and the flat leaves of them that require grad (per ``wants``;
    none for the plain call)."""
    args = _make_args(lib, prog["shapes"])
    leaves = _flatten(args)
    if prog["driver"] == "call":
        return args, []
    wanted = [t.requires_grad_(True) for t, w in zip(leaves, prog["wants"]) if w]
    return args, wanted


def _weighted(lib, tensors: list):
    """``_scalar`` of the tensors that require grad (each weighted by its place among all), or
    None where none does."""
    live = [t * _wave(lib, tuple(t.shape), 0.8 + k) for k, t in enumerate(tensors)
            if t is not None and t.requires_grad]
    return sum(t.sum() for t in live) if live else None


def _drive(lib, prog: dict) -> dict:
    """The run's observable results: values (and the grads of the leaves), or the error."""
    fn = _function(lib, prog)
    args, wanted = _leaves_of(lib, prog)
    try:
        lib.manual_seed(0)
        out = fn(*args)
        result = {"out": out}
        if prog["driver"] == "grad2" and wanted:
            s = _weighted(lib, _flatten(out))
            if s is None:
                return result
            kw = {"allow_unused": True, "materialize_grads": prog["materialize"]}
            if prog.get("grad_outputs"):   # (the outputs that require grad, with given gradients)
                live = [(t, _wave(lib, tuple(t.shape), 1.7 + k)) for k, t in enumerate(_flatten(out)) if t.requires_grad]
                g = lib.autograd.grad([t for t, _ in live], wanted, [w for _, w in live], create_graph=True, **kw)
            else:
                g = lib.autograd.grad(s, wanted, create_graph=True, **kw)
            result["grad"] = g
            s2 = _weighted(lib, list(g))
            if s2 is not None:
                result["grad2"] = lib.autograd.grad(s2, wanted, allow_unused=True)
        elif prog["driver"] == "backward" and wanted:
            outs = _flatten(out)
            grads = [_wave(lib, tuple(t.shape), 0.8 + k) for k, t in enumerate(outs)]
            live = [k for k, t in enumerate(outs) if t.requires_grad]
            if live:
                lib.autograd.backward([outs[k] for k in live], grad_tensors=[grads[k] for k in live],
                                      retain_graph=prog["retain"])
                if prog["twice"]:   # (again: refused unless the graph was retained, else accumulated)
                    lib.autograd.backward([outs[k] for k in live], grad_tensors=[grads[k] for k in live])
            result["leaf_grads"] = [t.grad for t in wanted]
        return result
    except Exception as e:
        return {"error": e}


def _numpy(tree):
    if isinstance(tree, (tuple, list)):
        return [type(tree).__name__, [_numpy(t) for t in tree]]
    if isinstance(tree, dict):
        return ["dict", {k: _numpy(v) for k, v in tree.items()}]
    if tree is None:
        return None
    t = tree if isinstance(tree, torch.Tensor) else tree.to_torch() if isinstance(tree, flow.Tensor) else tree
    if isinstance(t, torch.Tensor):
        # (torch.func's zero tensors hold no data: jacfwd(hessian(f)) gives some strides past their storage)
        value = np.zeros(tuple(t.shape)) if t._is_zerotensor() else t.detach().numpy(force=True).copy()
        return (str(t.dtype).replace("torch.", ""), tuple(t.shape), value)
    return t


def _compare(got, want, where: str, loose: bool, path: str = "") -> None:
    """``got`` (holoflow's results, as ``_numpy`` gives them) against torch's ``want``; ``loose``:
    a gradient that is None on one side may be zeros on the other (under a transform, whether a
    result stays connected to its inputs where it does not depend on them is torch's detail)."""
    if isinstance(want, list) and len(want) == 2 and isinstance(want[0], str):
        assert isinstance(got, list) and got[0] == want[0] and len(got[1]) == len(want[1]), \
            f"{path}: structure {got if not isinstance(got, list) else got[0]} vs torch {want[0]}. {where}"
        items = want[1].items() if want[0] == "dict" else enumerate(want[1])
        for k, w in items:
            _compare(got[1][k], w, where, loose, f"{path}[{k}]")
        return
    if want is None or got is None:
        if loose and (got is None or not got[2].any()) and (want is None or not want[2].any()):
            return
        assert got is None and want is None, f"{path}: {'None' if got is None else 'a tensor'} vs torch " \
                                             f"{'None' if want is None else 'a tensor'}. {where}"
        return
    if isinstance(want, tuple) and len(want) == 3 and isinstance(want[2], np.ndarray):
        assert got[:2] == want[:2], f"{path}: dtype/shape {got[:2]} vs torch {want[:2]}. {where}"
        np.testing.assert_allclose(got[2], want[2], rtol=1e-9, atol=1e-10, err_msg=f"{path}. {where}")
        return
    assert got == want, f"{path}: {got!r} vs torch {want!r}. {where}"


# torch's refusals of programs holoflow runs right, by message: where torch.func's batching or
# wrapping falls short (holoflow's vmap runs the samples one by one and its transforms record
# plain tensors, so it has no unbatched tensor a batched value can't be written into, no wrapped
# zeros to refuse a write into, nothing to escape). Programs whose result these refusals decide
# are compared up to there (holoflow's errors are compared whenever torch's are not these).
TORCH_ONLY = (
    "vmap: inplace arithmetic(self, *extra_args) is not possible",   # (a batched value into an unbatched one)
    "ZeroTensors are immutable",                 # (a write into jvp's zero tangent, wrapped)
    "escaped from inside a function being vmapped",   # (checkpoint under vmap)
    "index 0 out of range for tensor of size [0]",    # (jacrev/jacfwd/hessian under an empty vmap)
    "cannot reshape tensor of 0 elements into shape [0, ",   # (reshape(-1) under an empty vmap, [0, 2, -1]
    # under two: seed 6355)
    "Cannot set version_counter for inference tensor",   # (an inference_mode result under vmap and jvp)
    "Batching rule not implemented for aten::_unpack_dual",   # (one under jvp under vmap: seed 9354)
    "more than one element of the written-to tensor refers to a single memory location",   # (an in-place
    # write under an empty vmap, into torch's expanded stand-in for the batch: seed 6823)
    "A different number of tensors was saved during the original forward and recomputation",   # (checkpoint
    # under jacfwd, whose forward mode saves other tensors when recomputing)
)

# torch's refusals under vmap that read as an eager error (a batched value written into an
# unbatched tensor: its batched add_ broadcasts the batch into the target, seeds 9086, 10969), where
# holoflow, running the samples one by one, raises nothing; an error holoflow raises is compared
VMAP_TORCH_ONLY = ("doesn't match the broadcast shape [",)

# derivative orders, to skip what torch computes wrong
ORDER = {"grad": 1, "vjp": 1, "jvp": 1, "jacrev": 1, "jacfwd": 1, "hessian": 2, "vmap": 0}
DRIVER_ORDER = {"call": 0, "backward": 1, "grad2": 2}


def _torch_wrong(prog: dict) -> bool:
    """Whether torch 2.13's answer is known wrong: a custom Function's jvp staticmethod in a third
    derivative (hessian(jvp(f))) disagrees with the same function written with plain ops; its
    layer_norm derivatives past the first
    disagree with finite differences in reverse over forward mode (``vjp(jacfwd(layer_norm))``,
    hessian's jacfwd(jacrev)), and from the third on in reverse mode alone (holoflow's agree with
    torch's there, so that one is left to the op tests)."""
    order = sum(ORDER[n] for n, _ in prog["transforms"]) + DRIVER_ORDER[prog["driver"]]
    forward = any(n in ("jvp", "jacfwd", "hessian") for n, _ in prog["transforms"])
    if any(name == "custom" and p["fn"] == "square" for name, _, p in prog["body"]) and forward and order >= 3:
        return True   # (its jvp staticmethod differentiated twice more: torch's disagrees with x * x's, seed 1325)
    if not any(name == "layer_norm" for name, _, _ in prog["body"]):
        return False
    return order >= 3 or order >= 2 and forward


def _check(seed: int) -> None:
    prog = _generate(seed)
    if _torch_wrong(prog):
        return
    want, got = _drive(torch, prog), _drive(flow, prog)
    where = f"seed {seed}, program:\n{_describe(seed)}"
    t_err, f_err = want.get("error"), got.get("error")
    if t_err is not None:
        if any(m in str(t_err) for m in TORCH_ONLY):
            return
        if f_err is None and any(n == "vmap" for n, _ in prog["transforms"]) and \
                any(m in str(t_err) for m in VMAP_TORCH_ONLY):
            return
        if f_err is None and prog["transforms"] and "backward through the graph a second time" in str(t_err) and \
                not any(g is not None for g in got.get("leaf_grads", [None])):
            # a result torch left connected to the inputs (zero gradients), holoflow not, which the
            # second backward alone tells apart: compared as below, to torch's single backward (seed 10103)
            _compare(_numpy(got), _numpy(_drive(torch, {**prog, "twice": False})), where, loose=True)
            return
        assert f_err is not None, f"torch raised {type(t_err).__name__}: {t_err}; holoflow did not. {where}"
        assert isinstance(f_err, type(t_err)) or isinstance(t_err, type(f_err)), \
            f"torch raised {type(t_err).__name__}: {t_err}; holoflow {type(f_err).__name__}: {f_err}. {where}"
        return
    assert f_err is None, f"holoflow raised {type(f_err).__name__}: {f_err}; torch did not. {where}"
    if set(got) != set(want):   # (a result torch left connected to the inputs, holoflow not: as loose)
        assert prog["transforms"], f"results {sorted(got)} vs torch {sorted(want)}. {where}"
        got, want = {"out": got["out"]}, {"out": want["out"]}
    _compare(_numpy(got), _numpy(want), where, loose=bool(prog["transforms"]))


# found and left (strict xfails, so a fix shows; seeds 20000-26499 hunted): seed -> why
KNOWN: dict[int, str] = {
    24781: "a second backward (retain_graph=False) through jvp's primal output and tangent: holoflow's tangent "
           "is a reverse pass over the primal's record, whose LinearBackward the first backward freed; torch's "
           "forward-mode tangent shares no freed buffer (loud: holoflow raises, torch computes)",
    24846: "vmap(vmap(f, chunk_size=1)) with randomness='different': torch runs the inner chunks as its Python "
           "loop, each drawing for the whole outer batch, so its random stream goes chunk-major; holoflow's "
           "per-sample loops draw outer-sample-major (other random values, as valid; torch's order not followed)",
}


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=KNOWN[s]))
                                  if s in KNOWN else s for s in sorted(set(SEEDS) | set(KNOWN))])
def test_random_composition_agrees_with_torch(seed):
    _check(seed)


# -- the findings, minimized (each failed before its fix) ------------------------------------

def _hooked(lib, c: float):
    """``f(y) = sin(y * 1)`` with a hook scaling the gradient of ``y * 1`` by ``c``."""
    def f(y):
        t = y * 1.0
        t.register_hook(lambda g: g * c)
        return t.sin()
    return f


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_a_hook_inside_forward_mode_or_vmap_is_refused(lib):
    # jvp and jacfwd are forward mode, and torch.func's tensors don't require grad there or inside
    # vmap: a hook on an intermediate is refused (holoflow, computing forward mode by reverse mode,
    # ran it: twice the tangent, silently, seed 12 of the first generator; inside vmap it fired
    # in backward passes from outside)
    y, t = _wave(lib, (3,), 0.3), _wave(lib, (3,), 1.0)
    for run in (lambda: lib.func.jvp(_hooked(lib, 2.0), (y,), (t,)), lambda: lib.func.jacfwd(_hooked(lib, 2.0))(y),
                lambda: lib.func.vmap(_hooked(lib, 2.0))(_wave(lib, (2, 3)).requires_grad_(True))):
        with pytest.raises(RuntimeError, match="hook"):
            run()
    # (a grad transform inside them has its own: it runs there)
    _, tangent = lib.func.jvp(lib.func.grad(lambda y: _hooked(lib, 2.0)(y).sum()), (y,), (t,))
    torch.testing.assert_close(_numpy(tangent)[2], (-2 * y.sin() * t).numpy())


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_a_hook_inside_vmap_on_an_unbatched_tensor_fires_outside(lib):
    # (only a batched tensor refuses it: holoflow refused every hook inside vmap for a while,
    # seed 5186)
    x, y = _wave(lib, (3, 2)), _wave(lib, (3,), 0.5).requires_grad_(True)
    lib.func.vmap(lambda x, y: _hooked(lib, 0.0)(y) * x.sum(), in_dims=(0, None))(x, y).sum().backward()
    torch.testing.assert_close(_numpy(y.grad)[2], np.zeros(3))


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_a_hook_inside_a_transform_is_its_own(lib):
    # a hook registered inside vjp's function scales vjp's gradient, not that of a backward pass
    # through the output from outside (holoflow's ran it there too: seed 193 of the first generator)
    y = _wave(lib, (3,), 0.3).requires_grad_(True)
    out, vjp_fn = lib.func.vjp(_hooked(lib, -1.0), y)
    (inside,) = vjp_fn(lib.ones(3, dtype=lib.float64))
    (outside,) = lib.autograd.grad(out.sum(), y)
    torch.testing.assert_close(_numpy(inside)[2], -y.detach().cos().numpy())
    torch.testing.assert_close(_numpy(outside)[2], y.detach().cos().numpy())


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_an_empty_vmap_gives_its_inputs_a_gradient(lib):
    # (holoflow ran the function on zeros made apart from the input: the input got None; seed 149)
    x = lib.zeros(0, 3, dtype=lib.float64, requires_grad=True)
    lib.func.vmap(lambda s: s.sin() * 2)(x).sum().backward()
    assert x.grad is not None and tuple(x.grad.shape) == (0, 3)


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_backward_through_grad_aux(lib):
    # aux of grad's function, returned as it is: torch's is cut from the inputs grad differentiates,
    # holoflow's reaches back to them through the function's graph, which grad had freed; a
    # backward through it raised "backward through the graph a second time" (seed 239)
    x = _wave(lib, (3,), 0.2).requires_grad_(True)
    y = _wave(lib, (3,), 0.4)
    def f(x, y):
        t = y.tanh()
        return t.sum(), t
    g, aux = lib.func.grad(f, argnums=1, has_aux=True)(x, y)
    if aux.requires_grad:   # (holoflow's: its gradient goes nowhere the caller sees)
        aux.sum().backward()
    assert x.grad is None
    torch.testing.assert_close(_numpy(g)[2], (1 / y.cosh() ** 2).numpy())


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_a_function_without_setup_context_is_refused_by_transforms(lib):
    # torch.func asks custom Functions for setup_context (holoflow ran them; seed 0)
    cube = _functions(lib)["cube"]
    x = _wave(lib, (3,))
    for transform in (lib.func.grad, lib.func.vmap):
        with pytest.raises(RuntimeError, match="setup_context"):
            transform(lambda x: cube.apply(x).sum())(x)
    with pytest.raises(RuntimeError, match="setup_context"):
        lib.func.grad(lambda x: _checkpoint(lib, [x], {"reentrant": True}).sum())(x)
    # (without reentry, checkpoint runs under vmap)
    got = lib.func.vmap(lambda x: _checkpoint(lib, [x], {"reentrant": False}))(x.reshape(3, 1))
    torch.testing.assert_close(_numpy(got)[2], (x.sin() * x).reshape(3, 1).numpy())


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_hessian_refuses_random_draws(lib):
    # torch's hessian is jacfwd(jacrev(f)), and jacfwd refuses random draws (holoflow's was
    # jacrev(jacrev(f)): it drew; seed 33)
    x = _wave(lib, (3,))
    with pytest.raises(RuntimeError, match="random"):
        lib.func.hessian(lambda x: (x * x * lib.rand(3, dtype=lib.float64)).sum())(x)


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_a_result_requires_grad_only_through_what_outside_records(lib):
    # the Jacobian in x, which nothing outside records, is a constant outside; holoflow's stayed
    # connected to its own fresh copy of x, so a second backward over both results (the graph
    # freed by the first) raised (seed 504)
    x, y = _wave(lib, (3,), 0.1), _wave(lib, (3,), 0.6).requires_grad_(True)
    jx, jy = lib.func.jacrev(lambda x, y: x.sin() + y * y, argnums=(0, 1))(x, y)
    assert not jx.requires_grad and jy.requires_grad
    out, vjp_fn = lib.func.vjp(lambda x: x.sin(), x)
    assert not out.requires_grad and not vjp_fn(lib.ones(3, dtype=lib.float64))[0].requires_grad


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_a_transform_stays_differentiable_in_what_its_function_closes_over(lib):
    # jacrev in x, which nothing outside records, of a function closing over w, which the grad
    # around it records: holoflow decided from x alone that nothing outside differentiates the
    # Jacobian, detached it, and the gradient in w was zeros (silent; seed 1231, there through
    # functional_call's parameters)
    x, w = _wave(lib, (3,), 0.1), _wave(lib, (3,), 0.6)
    g = lib.func.grad(lambda w: (lib.func.jacrev(lambda x: (x * w).sin())(x) * _wave(lib, (3, 3))).sum())(w)
    want = torch.func.grad(lambda w: (torch.func.jacrev(lambda x: (x * w).sin())(_wave(torch, (3,), 0.1)) *
                                      _wave(torch, (3, 3))).sum())(_wave(torch, (3,), 0.6))
    torch.testing.assert_close(torch.from_numpy(_numpy(g)[2]), want)


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_a_reentrant_checkpoint_refuses_autograd_grad(lib):
    # (torch's refuses a backward for some tensors only; holoflow's computed it: seed 1977)
    x = _wave(lib, (3,)).requires_grad_(True)
    with pytest.raises(RuntimeError, match="use_reentrant"):
        lib.autograd.grad(_checkpoint(lib, [x], {"reentrant": True}).sum(), x)
    with pytest.raises(RuntimeError, match="use_reentrant"):
        _checkpoint(lib, [x], {"reentrant": True}).sum().backward(inputs=[x])
    _checkpoint(lib, [x], {"reentrant": True}).sum().backward()
    assert x.grad is not None


def test_checkpoint_is_differentiable_twice_and_in_forward_mode():
    # checkpoint(use_reentrant=False) was a custom Function whose backward recomputed the function
    # and backpropagated through it without create_graph, into every leaf the recomputation
    # reached: no second derivative, zeros in forward mode (silent), and autograd.grad of the
    # inputs alone accumulated .grad into the parameters the function closes over (seeds 1100,
    # 1106, 1427). It is saved-tensor hooks around the first run now, as torch's.
    from holoflow.utils.checkpoint import checkpoint
    x = flow.tensor([0.5, 1.0, 2.0], dtype=flow.float64, requires_grad=True)
    w = flow.tensor([1.5, -1.0, 0.5], dtype=flow.float64, requires_grad=True)
    (g,) = flow.autograd.grad(checkpoint(lambda a: (a * w).sin() * a, x, use_reentrant=False).sum(), x,
                              create_graph=True)
    assert w.grad is None and g.requires_grad
    _, t = flow.func.jvp(lambda a: checkpoint(lambda b: b.sin() * b, a, use_reentrant=False), (x.detach(),),
                         (flow.ones(3, dtype=flow.float64),))
    assert bool((t != 0).all())


def test_no_grad_does_not_stop_forward_mode():
    # torch's no_grad disables reverse mode only: a jvp's tangents flow through it (holoflow's
    # jvp, a reverse computation, gave zeros there: silent; seeds 3504, 3942)
    def f(lib):
        def g(x):
            with lib.no_grad():
                return x.sin()
        return g
    want = torch.func.jvp(f(torch), (_wave(torch, (3,)),), (_wave(torch, (3,), 1.0),))[1]
    got = flow.func.jvp(f(flow), (_wave(flow, (3,)),), (_wave(flow, (3,), 1.0),))[1]
    torch.testing.assert_close(torch.from_numpy(_numpy(got)[2]), want)


def test_an_inference_tensor_is_not_saved_for_backward():
    # torch refuses (seed 4217, there under hessian); holoflow computed the gradient
    x, y = _wave(flow, (3,)), _wave(flow, (3,), 1.0).requires_grad_(True)
    with flow.inference_mode():
        a = x * 2
    with pytest.raises(RuntimeError, match="[Ii]nference"):
        (a * y).sum().backward()
