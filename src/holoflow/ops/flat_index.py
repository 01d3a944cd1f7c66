"""Flat indexing: ``take``/``put`` (``Tensor.put_``) read and write a tensor as if it were 1-D,
``argwhere`` and ``unravel_index`` (flat indices to coordinates).

``take`` and ``put`` have grad rules written as ops (each other's, or a backward op whose grad is
the forward), so double backward composes; ``unravel_index`` is not differentiable. SBP: the
indexed tensor stays whole (B, or P where the op is linear in it); the index splits the output.
"""
from __future__ import annotations

import torch

from ..core.dispatch import apply, apply_inplace
from ..core.registry import Meta, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .family import needs
from .indexing import nonzero
from .pointwise import _tensor
from .shape import reshape
from .sorting import _first_split_sbp

__all__ = ["take", "put", "argwhere", "unravel_index"]


# -- flat indexing: take, put ----------------------------------------------------------------------------

def _take_sbp(metas, attrs):
    """The input is read at flat positions, so it stays whole (B, or P: take is linear in it); the
    index splits the output alike."""
    return [((B, B), (B,)), ((P, B), (P,))] + [((B, S(a)), (S(a),)) for a in range(len(metas[1].shape))]


def _take_backward_sbp(metas, attrs):
    """``(dy, index) -> zeros(shape)`` with dy added at index: shards of both add partial sums."""
    return [((B, B), (B,)), ((P, B), (P,))] + [((S(a), S(a)), (P,)) for a in range(len(metas[1].shape))]


def _put_sbp(metas, attrs):
    """Linear in (input, source) together; a number source (the gradient's zeros) keeps P only if 0."""
    if isinstance(metas[2], Meta):
        return [((B, B, B), (B,)), ((P, B, P), (P,))]
    return [((B, B), (B,))] + ([((P, B), (P,))] if metas[2] == 0 else [])


def _put_source(x, index, source):
    if not isinstance(source, torch.Tensor):  # a number at every indexed position (put's own gradient)
        source = x.new_full(index.shape, source)
    return source


def _put_kernel(x, index, source, accumulate):
    return x.put(index, _put_source(x, index, source), accumulate)


def _put_inplace(x, index, source, accumulate):
    return x.put_(index, _put_source(x, index, source), accumulate)


def _put_grad(c, dy):
    """ATen's: the input's gradient is dy, with the written positions zeroed unless accumulating;
    the source's is dy taken at index."""
    index = c.inputs[1]
    g_in = (dy if c.accumulate else apply(PUT, dy, index, 0.0, accumulate=False)) if needs(c, 0) else None
    g_src = reshape(apply(TAKE, dy, index), c.shapes[2]) if needs(c, 2) else None
    return g_in, None, g_src


_INDEX_ONLY = dict(save="inputs", saved_inputs=(1,), family="indexing")
TAKE = defop("take", lambda x, index: torch.take(x, index), sbp=_take_sbp, **_INDEX_ONLY,
             grad=lambda c, dy: (apply(TAKE_BACKWARD, dy, c.inputs[1], shape=tuple(c.shapes[0])), None))
TAKE_BACKWARD = defop("take_backward", lambda dy, index, shape: dy.new_zeros(shape).put_(index, dy, accumulate=True),
                      sbp=_take_backward_sbp, **_INDEX_ONLY,
                      grad=lambda c, g: (apply(TAKE, g, c.inputs[1]), None))
PUT = defop("put", _put_kernel, grad=_put_grad, sbp=_put_sbp, inplace_kernel=_put_inplace, **_INDEX_ONLY)


def take(input: Tensor, index: Tensor) -> Tensor:
    """``input`` read as a 1-D tensor at ``index`` (int64; negative counts from the end), shaped like
    ``index``, as ``torch.take``."""
    return apply(TAKE, _tensor("take", input), _tensor("take", index, "index"))


def put(input: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """A copy of ``input`` with ``source``'s elements written (or, with ``accumulate``, added) at the
    flat positions ``index``, as ``torch.put``."""
    return apply(PUT, _tensor("put", input), _tensor("put", index, "index"), _tensor("put", source, "source"),
                 accumulate=bool(accumulate))


def _put_(self: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    return apply_inplace(PUT, self, _tensor("put_", index, "index"), _tensor("put_", source, "source"),
                         accumulate=bool(accumulate))


def argwhere(input: Tensor) -> Tensor:
    """The indices of the non-zero elements, one row each, as ``torch.argwhere``."""
    return nonzero(_tensor("argwhere", input))


UNRAVEL = defop("unravel_index", lambda i, shape: torch.stack(torch.unravel_index(i, shape)),
                sbp=_first_split_sbp(shift=1), differentiable=False)


def unravel_index(indices, shape) -> tuple:
    """The coordinates of flat ``indices`` in a tensor of ``shape``, one tensor per dim, as
    ``torch.unravel_index``."""
    if not isinstance(indices, Tensor):
        indices = Tensor._make(torch.tensor(indices))
    if indices.is_floating_point() or indices.is_complex() or indices._data.dtype is torch.bool:
        raise TypeError(f"holoflow.unravel_index: expected 'indices' to be integer dtype, but got {indices.dtype}")
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"holoflow.unravel_index: 'shape' cannot have negative values, but got {shape}")
    return tuple(apply(UNRAVEL, indices, shape=shape).unbind(0))


for _name in ("take", "put", "argwhere"):
    setattr(Tensor, _name, globals()[_name])

Tensor.put_ = _put_
