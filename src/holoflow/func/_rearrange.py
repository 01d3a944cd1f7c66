"""``rearrange``: einops' reordering of axes (``torch.func.rearrange``), one reshape to the
left side's elementary axes, one permute, one reshape to the right side's groups.

A side of the pattern parses to a list of dims, each a list of axis names: ``a`` is ``["a"]``,
``(a b)`` is ``["a", "b"]``, ``1`` and ``()`` are ``[]`` (a dim of size 1), and ``...`` (the
tuple ``("...",)``) the axes no name covers, as many dims; ``(...)`` on the right merges them.
"""
from __future__ import annotations

import math
import re
from typing import Sequence

from ..core.tensor import Tensor
from ..ops import shape as _shape

_ELLIPSIS = "..."
_TOKEN = re.compile(r"\.\.\.|\(|\)|[^\s()]+")


def _error(message: str) -> ValueError:
    return ValueError(f"holoflow.func.rearrange: {message}")


def _parse_side(side: str) -> list:
    if "." in side.replace(_ELLIPSIS, ""):
        raise _error("a pattern may contain dots only as one ellipsis (...) per side")
    dims: list = []
    group: list[str] | None = None
    for tok in _TOKEN.findall(side):
        if tok == "(":
            if group is not None:
                raise _error(f"brackets are not balanced (nested) in {side.strip()!r}")
            group = []
        elif tok == ")":
            if group is None:
                raise _error(f"brackets are not balanced in {side.strip()!r}")
            dims.append(group)
            group = None
        else:
            if tok != _ELLIPSIS and tok != "1" and not tok.isidentifier():
                raise _error(f"{tok!r} is not an axis name; axes are identifiers, '1' (an unnamed axis of size 1, "
                             f"the only number allowed) or '...'")
            names = [] if tok == "1" else [tok]
            if group is None:
                dims.append((_ELLIPSIS,) if tok == _ELLIPSIS else names)
            else:
                group += names
    if group is not None:
        raise _error(f"brackets are not balanced in {side.strip()!r}")
    names = [n for d in dims for n in d]
    if names.count(_ELLIPSIS) > 1:
        raise _error("only one ellipsis (...) per side")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _error(f"the pattern names dimension {twice[0]!r} twice on one side")
    return dims


def _expand(dims: list, count: int) -> list[list[str]]:
    """The ellipsis as ``count`` axes: separate dims where it stands alone, merged into its group
    inside brackets."""
    ell = [f"...{i}" for i in range(count)]
    out: list[list[str]] = []
    for d in dims:
        if d == (_ELLIPSIS,):
            out += [[n] for n in ell]
        else:
            out.append([m for n in d for m in (ell if n == _ELLIPSIS else [n])])
    return out


def _sizes(left: list[list[str]], shape: tuple, lengths: dict) -> dict:
    """Each axis's size, from the tensor's shape and the given ``lengths``."""
    known = dict(lengths)
    for d, size in zip(left, shape):
        unknown = [n for n in d if n not in known]
        given = math.prod(known[n] for n in d if n in known)
        if len(unknown) > 1:
            raise _error(f"cannot infer the sizes of {unknown} at once (dim of size {size}); give all but one "
                         f"as keyword arguments")
        if unknown and (given == 0 or size % given):
            raise _error(f"dim of size {size} does not split evenly into {d} with known sizes {given}")
        if unknown:
            known[unknown[0]] = size // given
        elif given != size:
            raise _error(f"dim of size {size} does not match the sizes given for {d} (product {given})")
    return known


def rearrange(tensor: Tensor | Sequence[Tensor], pattern: str, **axes_lengths: int) -> Tensor:
    """``tensor`` (a sequence of tensors: stacked on a new first dim) reordered as ``pattern``
    says, einops' notation (``torch.func.rearrange``).

    >>> rearrange(flow.ones(32, 30, 40, 3), "b (h h1) (w w1) c -> b h w (c h1 w1)", h1=2, w1=2).shape
    torch.Size([32, 15, 20, 12])
    """
    if not isinstance(tensor, Tensor):
        tensor = _shape.stack(list(tensor))
    if pattern.count("->") != 1:
        raise _error(f"the pattern must contain a single '->' separator, got {pattern!r}")
    left, right = (_parse_side(s) for s in pattern.split("->"))
    lnames, rnames = ({n for d in side for n in d} for side in (left, right))
    if lnames != rnames:
        raise _error(f"identifiers must appear on both sides; only on one: {sorted(lnames ^ rnames)}")
    stray = sorted(set(axes_lengths) - lnames)
    if stray:
        raise _error(f"identifiers not found in the pattern: {stray}")
    if any(_ELLIPSIS in d and d != (_ELLIPSIS,) for d in left):
        raise _error("an ellipsis inside brackets is allowed on the right side only")
    named = len(left) - (_ELLIPSIS in lnames)
    if named > tensor.dim() or (_ELLIPSIS not in lnames and named != tensor.dim()):
        raise _error(f"the pattern's left side has {named} dims for a tensor of {tensor.dim()}")
    count = tensor.dim() - named
    left, right = _expand(left, count), _expand(right, count)
    known = _sizes(left, tuple(tensor.shape), axes_lengths)
    flat = [n for d in left for n in d]
    order = [flat.index(n) for d in right for n in d]
    out = tensor.reshape(tuple(known[n] for n in flat)).permute(order)
    return out.reshape(tuple(math.prod(known[n] for n in d) for d in right))
