"""Views and in-place writes, with torch's autograd semantics.

An op declared ``view=True`` (reshape, permute, slicing, split, ...) returns tensors that share
storage with its input when the kernel could alias it. Such an output remembers its *base* (the
tensor that owns the storage, never itself a view) and the chain of view ops that leads from the
base to it, so the view can be re-derived.

An in-place op on a view changes the base too. Autograd follows torch: the base's history is
*rebased* onto a ``view_scatter`` node (torch's CopySlices) whose gradient sends the view's
region to the in-place op and the rest to the base's old history; other views of the base see
that their base changed and re-derive their history (torch regenerates a view's grad_fn from its
base the same way). Inside a graph trace the same write is recorded as a functional update of the
base (a ``view_scatter`` node), and stale views are re-derived as nodes. See
docs/architecture.md, "Views and in-place ops".
"""
from __future__ import annotations

from typing import Callable

import torch

from . import grad_mode, interpret
from .registry import Op, defop
from .sbp import B, P


class ViewInfo:
    """How a view tensor derives from its base: ``chain`` of ``(op, attrs, out_index)``
    (``out_index`` None for single-output ops). ``nograd``: the view (or one it was taken from)
    was made with grad mode off; as in torch, an in-place write to it that autograd would
    record, or use of it after its base was written in place with grad mode on, is an error.
    ``version``: for a view among several outputs of one op (``unbind``, ``split``, ``chunk``)
    or taken from one, its storage's version when it was made (None for the others): such a view
    may not be used by autograd once anything wrote the storage since (``check_multi_output``).
    ``at``: the storage's version when the view's history was derived (made or re-derived), as
    torch's view keeps its grad_fn until its version counter moves (``dispatch.refresh``)."""

    __slots__ = ("base", "chain", "stamp", "nograd", "version", "at")

    def __init__(self, base, chain: tuple, stamp, nograd: bool, version: int | None, at: int) -> None:
        self.base, self.chain, self.stamp, self.nograd, self.version = base, chain, stamp, nograd, version
        self.at = at


class CopyOf:
    """A view op's result that could not alias its source (a global tensor whose view needed
    boxing: ``x[:, 1]`` of a tensor split along dim 1): ``chain`` leads from ``source`` to it (the
    op's logical attrs). Writes to it go back into ``source`` (core/dispatch.py ``assign``); when
    ``source``'s storage changed since ``version`` it is re-derived before it is read
    (``dispatch.fresh_copy``), so it behaves as the view torch would return. ``detached``: one
    of ``detach()`` (it shares the values, not the view's autograd: no piece of a multi-output op
    for autograd then, as torch's detached view). ``held``: the source's version whose values the
    storage holds, one cell shared by a copy and its ``detach()``es (one storage): a copy
    re-derived once is not written again by another (a second write would bump the version the
    first one's readers saved, where torch's views write nothing)."""

    __slots__ = ("source", "chain", "version", "detached", "held")

    def __init__(self, source, chain: tuple, version: int, detached: bool = False,
                 held: list | None = None) -> None:
        self.source, self.chain, self.version, self.detached = source, chain, version, detached
        self.held = [version] if held is None else held

    @property
    def multi(self) -> bool:
        """Whether it stands for a piece of a multi-output view op (``split``, ``chunk``, ...) for
        autograd (a detached one does not)."""
        return not self.detached and any(idx is not None for _, _, idx in self.chain)


def detached_from(t):
    """The tensor ``t`` was detached from inside a graph trace (``x.detach()``, ``x.data``), or
    None. Eager's detach shares ``x``'s storage without its history: in-place writes through either
    reach the other. A trace has no storage to share, so ``Tensor.detach`` links the two and the
    tracer (graph/trace.py) reads ``t``'s value as its source's and sends writes of ``t`` on to the
    source, without autograd. A real (state) tensor's link holds while the two still share storage."""
    src = t.__dict__.get("_detached_from")
    if src is None or "_v" in t.__dict__:
        return src
    d, s = t._data, src._data
    return src if d.device == s.device and d.untyped_storage().data_ptr() == s.untyped_storage().data_ptr() \
        else None


def dense_layout(shape, strides) -> bool:
    """Whether a layout covers its elements once each with no gaps (a permutation of a
    contiguous layout, as torch's "non-overlapping and dense")."""
    expect = 1
    for st, n in sorted((st, n) for st, n in zip(strides, shape) if n != 1):
        if st != expect:
            return False
        expect *= n
    return True


def aliases(out: torch.Tensor, data: torch.Tensor) -> bool:
    """Whether a kernel output shares ``data``'s storage (a view, or ``data`` itself)."""
    b = out._base
    return out is data or (b is not None and (b is data or b is data._base))


def stamp_of(base) -> tuple:
    """What a view's derivation depends on: its base's autograd history and (while tracing)
    its current symbolic value; when this changes, the view is re-derived."""
    return base.grad_fn, base._out_idx, interpret.token_of(base)


def make_view(out, x, op: Op, attrs: dict, idx: int) -> None:
    """Marks ``out`` (output ``idx`` of view op ``op`` on ``x``; None if the op has one output)
    as a view of ``x``'s base."""
    vi = x._view
    nograd = not grad_mode.STATE.enabled
    multi = idx is not None or (vi is not None and vi.version is not None)
    at = out._data._version
    version = at if multi else None
    if vi is None:
        out._view = ViewInfo(x, ((op, attrs, idx),), stamp_of(x), nograd, version, at)
    else:
        out._view = ViewInfo(vi.base, vi.chain + ((op, attrs, idx),), vi.stamp, nograd or vi.nograd, version, at)
    if multi or nograd or (vi is not None and vi.nograd):
        token = interpret.token_of(out._view.base)
        if token is not None:   # (a trace: its writes bind the base a new value, storages stay)
            out.__dict__["_made_at"] = token


def written_since_made(v) -> bool:
    """Whether ``v``'s storage was written since the view was made (torch compares version
    counters): in eager its storage's version; in a trace, whose writes bind the base a new value
    (``_made_at``: the base's value when the view was made), the base's value."""
    vi = v._view
    made = v.__dict__.get("_made_at")
    if made is not None:
        return interpret.token_of(vi.base) is not made
    if interpret._CURRENT.get() is not None:
        return False   # (made outside the trace: its storage's version says nothing there)
    return v._data._version != (vi.version if vi.version is not None else vi.at)


def check_multi_output(x) -> None:
    """torch's refusal to let autograd use a view among several outputs of one op (or taken from
    one) after its storage was written in place since it was made: its history can't be
    re-derived as a single view's. (Asked where autograd records, or the history is read: in any
    grad mode then, as torch's getter.)"""
    vi = x._view
    if (x._grad_fn is not None or vi.base._rg) and written_since_made(x):
        op, _, idx = next((op, a, i) for op, a, i in reversed(vi.chain) if i is not None)
        raise RuntimeError(
            f"holoflow: output {idx} of {op.name} is a view and its base or another view of its base "
            f"has been modified in place since; such views (outputs of an op returning several views: "
            f"unbind, split, chunk) can't be used by autograd after that, as in torch: take the pieces "
            f"after the write, or .clone() them before it")


def replay(chain: tuple, x, run: Callable):
    """Applies the view ops of ``chain`` to ``x`` with ``run(op, x, attrs)``; ``idx`` picks one
    output of a multi-output view op (None for single-output ops)."""
    for op, attrs, idx in chain:
        x = run(op, x, attrs)
        if idx is not None:
            x = x[idx]
    return x


def _kernel_run(op: Op, x: torch.Tensor, attrs: dict):
    return op.kernel(x, **attrs)


def _view_scatter_kernel(base: torch.Tensor, src, chain: tuple) -> torch.Tensor:
    out = base.clone()
    region = replay(chain, out, _kernel_run)
    if region.untyped_storage().data_ptr() != out.untyped_storage().data_ptr():
        # the clone keeps ``base``'s strides (a gradient arriving transposed), where a reshape of
        # the chain copies instead of viewing: on a contiguous clone every reshape views
        out = base.clone(memory_format=torch.contiguous_format)
        region = replay(chain, out, _kernel_run)
        if region.untyped_storage().data_ptr() != out.untyped_storage().data_ptr():
            raise RuntimeError(f"holoflow.view_scatter: the view chain {[op.name for op, _, _ in chain]} does "
                               f"not view a tensor of shape {tuple(base.shape)}; its write would be lost")
    if isinstance(src, torch.Tensor):
        region.copy_(src)
    else:
        region.fill_(src)
    return out


def _view_scatter_grad(ctx, dy):
    from .dispatch import apply
    g_base = apply(VIEW_SCATTER, dy, 0.0, chain=ctx.chain) if ctx.needs_grad[0] else None
    g_src = None
    if ctx.needs_grad[1]:
        g_src = replay(ctx.chain, dy, lambda op, x, attrs: apply(op, x, **attrs))
    return g_base, g_src


def _view_scatter_sbp(metas, attrs):
    if isinstance(metas[1], (int, float)):
        return [((B,), (B,)), ((P,), (P,))] if metas[1] == 0 else [((B,), (B,))]
    return [((B, B), (B,)), ((P, P), (P,))]


VIEW_SCATTER = defop("view_scatter", _view_scatter_kernel, grad=_view_scatter_grad, sbp=_view_scatter_sbp,
                     family="view")


def may_overlap(d: torch.Tensor) -> bool:
    """Whether a layout may hold an element at more than one index (``unfold`` windows that
    overlap), by torch's test: its dims sorted by stride don't each step past the ones before.
    An expanded one (stride 0) is not asked here (its writes have their own rules); an empty one
    holds nothing."""
    if 0 in d.shape:
        return False
    extent = 0
    for st, n in sorted((st, n) for st, n in zip(d.stride(), d.shape) if n != 1):
        if st <= extent:
            return True
        extent = st * (n - 1) + extent
    return False


def _view_read_kernel(base: torch.Tensor, chain: tuple) -> torch.Tensor:
    return replay(chain, base, _kernel_run).clone()


def _view_read_grad(ctx, dy):
    from .dispatch import apply
    zeros = dy.detach().new_zeros(ctx.shapes[0], dtype=ctx.dtypes[0])   # (traced: a recorded op)
    return (apply(VIEW_SCATTER, zeros, dy, chain=ctx.chain),)


# the values of view ``chain`` of a base, whose gradient is written back into the base's region
# (torch's CopySlices hands the in-place op's gradient of the view's old value to the base so:
# where the view holds an element more than once, it arrives once, not summed over its places).
# Local only (dispatch.apply_inplace; a trace's too)
VIEW_READ = defop("view_read", _view_read_kernel, grad=_view_read_grad, family="view")


def _written_values_kernel(base: torch.Tensor, *operands: torch.Tensor, chain: tuple, kernel: Callable,
                           args: tuple, kwargs: dict, slots: tuple, dtype: torch.dtype) -> torch.Tensor:
    memory = base.clone(memory_format=torch.contiguous_format)
    region = replay(chain, memory, _kernel_run)
    args, kwargs = list(args), dict(kwargs)
    for slot, t in zip(slots, operands):
        if isinstance(slot, int):
            args[slot] = t
        else:
            kwargs[slot] = t
    kernel(region, *args, **kwargs)
    return region.to(dtype, memory_format=torch.contiguous_format, copy=True)


# The values in-place ``kernel`` leaves in view ``chain`` of a base holding elements at more than
# one index (unfold's overlapping windows), which torch's kernel writes element after element;
# run on a copy of the base, returned in ``dtype``. A trace's dispatch.written_by_kernel: the
# write's result computed out of place takes these values (Interpreter.overwrite); local only
WRITTEN_VALUES = defop("written_values", _written_values_kernel, differentiable=False, opaque=True)
