"""``vmap``: a function mapped over a batch dimension of its arguments by running it once per
sample and stacking the results (torch.func's semantics for functions without in-place writes to
captured tensors, at Python-loop speed rather than as batched kernels).

``in_dims`` and ``out_dims`` are torch's: an int or None for a whole argument (output), or a
tuple (for the arguments) or nested tuples, lists and dicts that are a prefix of their structure.
Keyword arguments reach every call unmapped. An output whose out_dim is None is returned as
the function gave it, which must then be the same for every sample (torch: not computed from a
mapped input; a value that depends on the samples but happens to be equal in all passes here).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from ..core.tensor import Tensor
from ..graph.pytree import flatten, unflatten
from ..ops import shape as _shape
from . import _rng
from ..core.grad_mode import STATE
from ._levels import inner, level


def check_chunk_size(chunk_size: Any, who: str) -> None:
    """None or a positive int, as torch.func asks (a ValueError for one under 1)."""
    if chunk_size is None:
        return
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool):
        raise TypeError(f"holoflow.func.{who}: chunk_size must be None or an int, got {type(chunk_size).__name__}")
    if chunk_size <= 0:
        raise ValueError(f"holoflow.func.{who}: chunk_size should be None or greater than 0 (got {chunk_size})")


def vmap(func: Callable, in_dims: int | tuple = 0, out_dims: Any = 0, randomness: str = "error", *,
         chunk_size: int | None = None) -> Callable:
    """``func`` mapped over dimension ``in_dims`` of its arguments (None: not mapped), results
    stacked along ``out_dims`` (None: returned unstacked), as ``torch.func.vmap``; see the module
    doc. ``randomness``: ``"error"`` (a function that draws random numbers raises),
    ``"different"`` (each sample its own draws) or ``"same"`` (every sample the same draws).
    ``chunk_size`` (None or positive) is torch's bound on how many samples run at once; holoflow
    runs one at a time, so the results do not depend on it.

    >>> vmap(lambda x, w: x @ w, in_dims=(0, None))(flow.ones(5, 3), flow.ones(3, 2)).shape
    torch.Size([5, 2])
    """
    _rng.check_randomness(randomness, "vmap")
    check_chunk_size(chunk_size, "vmap")

    @functools.wraps(func)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        leaves, spec = flatten(args)
        dims = _in_dims(in_dims, args, leaves, _name(func))
        n = _batch_size(leaves, dims)
        results = _run(func, leaves, spec, dims, n, kwargs, randomness)
        return _outputs(results, out_dims, n, _name(func))
    return wrapped


def _name(func: Callable) -> str:
    return getattr(func, "__name__", type(func).__name__)


def _broadcast(prefix: Any, tree: Any) -> list | None:
    """One entry of ``prefix`` per leaf of ``tree`` (an int or None stands for everything below
    it), or None where ``prefix`` is not a prefix of ``tree``'s structure (torch's
    ``_broadcast_to_and_flatten``)."""
    if not isinstance(prefix, (tuple, list, dict)):
        return [prefix] * len(flatten(tree)[0])
    if type(prefix) is not type(tree) or len(prefix) != len(tree):
        return None
    if isinstance(prefix, dict):
        if set(prefix) != set(tree):
            return None
        pairs = [(prefix[k], v) for k, v in tree.items()]
    else:
        pairs = list(zip(prefix, tree))
    out: list = []
    for p, t in pairs:
        sub = _broadcast(p, t)
        if sub is None:
            return None
        out += sub
    return out


def _in_dims(in_dims: Any, args: tuple, leaves: list, name: str) -> list:
    """``in_dims`` as one non-negative dim (or None) per leaf of ``args``, checked as torch does."""
    where = f"holoflow.func.vmap({name}, in_dims={in_dims!r})"
    if not isinstance(in_dims, (int, tuple)):
        raise ValueError(f"{where}: expected in_dims to be an int or a (possibly nested) tuple matching the "
                         f"structure of the inputs, got {type(in_dims).__name__}")
    if not args:
        raise ValueError(f"{where}: got no inputs; vmap maps over the positional arguments, so a function "
                         f"without them cannot be mapped")
    dims = _broadcast(in_dims, args)
    if dims is None:
        raise ValueError(f"{where}: in_dims is not compatible with the structure of the inputs (it must be a "
                         f"prefix of it: {len(args)} positional argument(s))")
    out = []
    for x, d in zip(leaves, dims):
        if d is not None and (not isinstance(d, int) or isinstance(d, bool)):
            raise ValueError(f"{where}: got in_dim={d!r} for an input; an in_dim is an integer dimension or None")
        if d is not None and not isinstance(x, Tensor):
            raise ValueError(f"{where}: got in_dim={d} for an input of type {type(x).__name__}; only tensors "
                             f"can be mapped, use None as its in_dim")
        if d is not None and not -x.dim() <= d < x.dim():
            raise ValueError(f"{where}: got in_dim={d} for a tensor of dimensionality {x.dim()}; expected "
                             f"{-x.dim()} <= in_dim < {x.dim()}")
        out.append(None if d is None else d % x.dim())
    return out


def _batch_size(leaves: list, dims: list) -> int:
    sizes = sorted({x.shape[d] for x, d in zip(leaves, dims) if d is not None})
    if not sizes:
        raise ValueError("holoflow.func.vmap: expected at least one tensor to map over (every in_dim is None)")
    if len(sizes) > 1:
        raise ValueError(f"holoflow.func.vmap: expected all mapped tensors to have the same size in the mapped "
                         f"dimension, got different sizes {sizes}")
    return sizes[0]


def _sample(x: Any, d: int | None, i: int) -> Any:
    """Sample ``i`` of a leaf; of an empty batch, zeros of a sample's shape (the function still
    runs once, so that the outputs' shapes are known, as torch's batched call does), summed from
    ``x`` where it requires grad: ``x`` then gets its (empty) gradient, as torch's."""
    if d is None:
        return x
    if x.shape[d] == 0:
        return x.sum(d) if x.requires_grad else x.new_zeros(tuple(x.shape[:d]) + tuple(x.shape[d + 1:]))
    return x.select(d, i)


def _run(func: Callable, leaves: list, spec: Any, dims: list, n: int, kwargs: dict, randomness: str) -> list:
    """``func`` on each sample (on one zero sample for an empty batch), with the random draws
    ``randomness`` asks for."""
    start = _rng.get_state() if randomness != "different" else None
    results = []
    depth = inner()
    for i in range(max(n, 1)):
        if randomness == "same" and i:
            _rng.set_state(start)
        flat = [_sample(x, d, i) for x, d in zip(leaves, dims)]
        for s, d in zip(flat, dims):
            if d is not None and isinstance(s, Tensor):
                s._wrapped_at = depth   # (a batched tensor: core/tensor._unwrapped_false)
        STATE.vmap_samples[depth] = {id(s.grad_fn) for s, d in zip(flat, dims)
                               if d is not None and isinstance(s, Tensor) and s.grad_fn is not None}
        try:
            with level(depth, "vmap"):
                results.append(func(*unflatten(flat, spec), **kwargs))
        finally:
            del STATE.vmap_samples[depth]
        if randomness == "error" and i == 0 and not _rng.same(start, _rng.get_state()):
            raise _rng.drew_error("vmap")
    return results


def _valid_out_dims(o: Any) -> bool:
    if o is None or (isinstance(o, int) and not isinstance(o, bool)):
        return True
    if isinstance(o, (tuple, list)):
        return all(_valid_out_dims(e) for e in o)
    return isinstance(o, dict) and all(_valid_out_dims(e) for e in o.values())


def _outputs(results: list, out_dims: Any, n: int, name: str) -> Any:
    """The per-sample results stacked along their out_dims (returned as given where None)."""
    where = f"holoflow.func.vmap({name}, out_dims={out_dims!r})"
    if not _valid_out_dims(out_dims):
        raise ValueError(f"{where}: out_dims must be an int, None or a (nested) tuple, list or dict of them, "
                         f"saying where in each output the mapped dimension goes")
    leaves0, spec = flatten(results[0])
    ods = _broadcast(out_dims, results[0])
    if ods is None:
        raise ValueError(f"{where}: out_dims is not compatible with the structure of the outputs (it must be a "
                         f"prefix of it)")
    per = []
    for r in results:
        leaves, s = flatten(r)
        if s != spec:
            raise RuntimeError(f"{where}: the function returned outputs of different structures for different "
                               f"samples")
        per.append(leaves)
    cols = [[p[j] for p in per] for j in range(len(leaves0))]
    return unflatten([_unmapped(c, where) if od is None else _stacked(c, od, n, where)
                      for c, od in zip(cols, ods)], spec)


def _stacked(col: list, od: int, n: int, where: str) -> Tensor:
    for c in col:
        if not isinstance(c, Tensor):
            raise ValueError(f"{where}: the function must return only tensors where out_dims is an int, got "
                             f"type {type(c).__name__}; set that output's out_dim to None to return it as is")
    out = _shape.stack(col, dim=od)
    return out if n else out.narrow(od, 0, 0)


def _unmapped(col: list, where: str) -> Any:
    """An out_dim None output: what every sample gave (a tensor that differs between samples is
    mapped, which torch refuses there)."""
    first = col[0]
    for c in col[1:]:
        if isinstance(first, Tensor):
            same = c is first or isinstance(c, Tensor) and c.shape == first.shape and c.dtype == first.dtype and \
                bool(first.equal(c))
        else:
            same = c is first or c == first
        if not same:
            raise ValueError(f"{where}: an output whose out_dim is None differs between samples (it is mapped); "
                             f"torch.func.vmap cannot return a batched output there: give it an int out_dim")
    return first
