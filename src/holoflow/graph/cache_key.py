"""The key a compiled plan is cached under (docs/architecture.md, "Graph"): the inputs' signature
(shapes, dtypes, devices, placements and SBPs; constants by value) and the state's flags, with the
state's layout checked beside it. Shared by ``nn.Graph`` (graph.py) and ``holoflow.compile``
(compile_module.py).
"""
from __future__ import annotations

from ..core.tensor import Tensor


def _state_walk(roots, optimizers) -> tuple[tuple, tuple]:
    """``(flags, layout)`` of the state under ``roots``, each module once, in a fixed order; read
    on every call, so one plain walk rather than ``modules()``' generators (a 12-layer GPT has
    ~115 modules).

    ``flags``: every module's ``training`` flag, its parameters' ``requires_grad`` and its state's
    dtypes: a parameter frozen or unfrozen between calls changes what backward computes and the
    optimizer updates, and a model cast between calls (``model.double()``) what every kernel
    reads, as in eager (part of the plan's cache key).

    ``layout``: the placement and SBP of every parameter and buffer and of the optimizers'
    parameters (None: local). A plan reads the state as it was laid out when it was compiled;
    ``module.to_global(...)`` between calls re-lays it out, so the plan is compiled again, as
    eager's next call would run on the new layout. (Not part of the cache key: ZeRO stage 3 and
    the auto-parallel plan re-lay parameters out while compiling, which is the layout the plan
    then keeps.)"""
    flags, layout, seen, stack = [], [], set(), list(roots)[::-1]
    while stack:
        m = stack.pop()
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        flags.append(m.training)
        for p in m._parameters.values():
            if p is None:
                flags.append(None)
                layout.append(None)
                continue
            flags.append((p._rg, p._data.dtype))   # (a parameter is a leaf: _rg is requires_grad)
            g = p._global
            layout.append(None if g is None else (g.placement, g.sbp))
        for b in m._buffers.values():
            if b is None:
                flags.append(None)
                layout.append(None)
                continue
            flags.append(b._data.dtype)
            g = b._global
            layout.append(None if g is None else (g.placement, g.sbp))
        subs = m._modules
        if subs:
            stack.extend(reversed(subs.values()))
    for opt, _ in optimizers:
        for group in opt.param_groups:
            layout.extend((p._global.placement, p._global.sbp) if p._global is not None else None
                          for p in group["params"])
    return tuple(flags), tuple(layout)


def _cache_key(leaves: list, spec, flags: tuple = ()) -> tuple:
    parts = []
    for x in leaves:
        if isinstance(x, Tensor):
            g = x._global   # a global input of another placement or SBP compiles another plan
            parts.append(("T", tuple(x.shape), x._data.dtype, x._data.device) +
                         ((g.placement, g.sbp) if g is not None else ()))
        else:
            try:
                hash(x)
                parts.append(("C", x))
            except TypeError:
                parts.append(("C", repr(x)))
    return (spec, tuple(parts), flags)
