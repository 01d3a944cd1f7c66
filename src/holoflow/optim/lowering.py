"""How an optimizer's update rule runs: the rule is written once (``Optimizer._update``) against
a small vocabulary of list operations, modelled on ``torch._foreach_*``; a lowering executes it.

- :data:`FOREACH`: the list elements are the parameters' torch storages and every operation is
  one ``torch._foreach_*`` call (local tensors in eager mode, and the graph's update effect);
- :data:`OPS`: the elements are holoflow tensors and every operation is holoflow ops applied
  element by element, so the same rule runs on global tensors;
- a fused torch kernel for the whole rule (``torch._fused_adam_``) is a third lowering, which an
  optimizer declares as ``fused_update`` (graph/passes/fuse_update.py selects it).

Scalars may be one number or a list with one number per element (``addcdiv_``'s step sizes,
``add_``'s alphas). In-place operations end in ``_``; the others return new lists. Operations
torch has no ``_foreach_*`` for (``masked_fill_``, the comparisons) loop over the elements in
the foreach lowering too: the same torch calls torch's own single-tensor optimizers make.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..core.dispatch import apply_inplace
from ..core.tensor import Tensor
from ..ops import elementwise as E


class _PerElement:
    """The operations torch has no ``_foreach_*`` for: one call per element, the same method
    on torch storages and holoflow tensors."""

    @staticmethod
    def gt(xs: list, s: float) -> list:
        return [x.gt(s) for x in xs]

    @staticmethod
    def lt(xs: list, s: float) -> list:
        return [x.lt(s) for x in xs]

    @staticmethod
    def eq(xs: list, s: float) -> list:
        return [x.eq(s) for x in xs]

    @staticmethod
    def masked_fill_(xs: list, masks: list, value: float) -> None:
        for x, m in zip(xs, masks):
            x.masked_fill_(m, value)


class Foreach(_PerElement):
    """Lists of torch storages, one ``torch._foreach_*`` call per operation."""

    @staticmethod
    def of(tensors: Sequence[Tensor]) -> list:
        return [t._data for t in tensors]

    @staticmethod
    def tensor(x) -> Tensor:
        """A holoflow tensor for an element (to keep it as optimizer state)."""
        return Tensor._make(x)

    neg = staticmethod(torch._foreach_neg)
    sqrt = staticmethod(torch._foreach_sqrt)
    sqrt_ = staticmethod(torch._foreach_sqrt_)
    mul_ = staticmethod(torch._foreach_mul_)
    div_ = staticmethod(torch._foreach_div_)
    lerp_ = staticmethod(torch._foreach_lerp_)
    maximum_ = staticmethod(torch._foreach_maximum_)

    @staticmethod
    def add(xs: list, ys, alpha: float = 1) -> list:
        return torch._foreach_add(xs, ys, alpha=alpha)

    @staticmethod
    def add_(xs: list, ys, alpha=1) -> None:
        if isinstance(ys, (int, float)):
            torch._foreach_add_(xs, ys)
        elif isinstance(alpha, (list, tuple)):   # one alpha per element: torch has no foreach form
            for x, y, a in zip(xs, ys, alpha):
                x.add_(y, alpha=a)
        else:
            torch._foreach_add_(xs, ys, alpha=alpha)

    @staticmethod
    def sub(xs: list, ys: list) -> list:
        return torch._foreach_sub(xs, ys)

    @staticmethod
    def mul(xs: list, ys: list) -> list:
        return torch._foreach_mul(xs, ys)

    sign = staticmethod(torch._foreach_sign)
    sign_ = staticmethod(torch._foreach_sign_)

    @staticmethod
    def clamp_(xs: list, lo: float, hi: float) -> None:
        torch._foreach_clamp_min_(xs, lo)
        torch._foreach_clamp_max_(xs, hi)

    @staticmethod
    def copy_(xs: list, ys: list) -> None:
        torch._foreach_copy_(xs, ys)

    @staticmethod
    def addcmul(xs: list, ys: list, zs: list, value: float = 1) -> list:
        return torch._foreach_addcmul(xs, ys, zs, value=value)

    @staticmethod
    def addcmul_(xs: list, ys: list, zs: list, value: float = 1) -> None:
        torch._foreach_addcmul_(xs, ys, zs, value)

    @staticmethod
    def addcdiv_(xs: list, ys: list, zs: list, value=1) -> None:
        torch._foreach_addcdiv_(xs, ys, zs, value)

    @staticmethod
    def clone(xs: list) -> list:
        return [x.detach().clone() for x in xs]


def _per(value, n: int) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


class Ops(_PerElement):
    """Lists of holoflow tensors, holoflow ops per element (global tensors, traces)."""

    @staticmethod
    def of(tensors: Sequence[Tensor]) -> list:
        return list(tensors)

    @staticmethod
    def tensor(x: Tensor) -> Tensor:
        return x

    @staticmethod
    def neg(xs: list) -> list:
        return [-x for x in xs]

    @staticmethod
    def sqrt(xs: list) -> list:
        return [x.sqrt() for x in xs]

    @staticmethod
    def sqrt_(xs: list) -> None:
        for x in xs:
            x.sqrt_()

    @staticmethod
    def mul_(xs: list, s) -> None:
        for x, v in zip(xs, _per(s, len(xs))):
            x.mul_(v)

    @staticmethod
    def div_(xs: list, s) -> None:
        for x, v in zip(xs, _per(s, len(xs))):
            x.div_(v)

    @staticmethod
    def lerp_(xs: list, ys: list, w: float) -> None:
        for x, y in zip(xs, ys):
            x.lerp_(y, w)

    @staticmethod
    def maximum_(xs: list, ys: list) -> None:
        for x, y in zip(xs, ys):
            apply_inplace(E.MAXIMUM, x, y)

    @staticmethod
    def add(xs: list, ys: list, alpha: float = 1) -> list:
        return [x.add(y, alpha=alpha) for x, y in zip(xs, ys)]

    @staticmethod
    def add_(xs: list, ys, alpha=1) -> None:
        if isinstance(ys, (int, float)):
            for x in xs:
                x.add_(ys)
            return
        for x, y, a in zip(xs, ys, _per(alpha, len(xs))):
            x.add_(y, alpha=a)

    @staticmethod
    def sub(xs: list, ys: list) -> list:
        return [x - y for x, y in zip(xs, ys)]

    @staticmethod
    def mul(xs: list, ys: list) -> list:
        return [x * y for x, y in zip(xs, ys)]

    @staticmethod
    def sign(xs: list) -> list:
        return [x.sign() for x in xs]

    @staticmethod
    def sign_(xs: list) -> None:
        for x in xs:
            x.sign_()

    @staticmethod
    def clamp_(xs: list, lo: float, hi: float) -> None:
        for x in xs:
            x.clamp_(lo, hi)

    @staticmethod
    def copy_(xs: list, ys: list) -> None:
        for x, y in zip(xs, ys):
            x.copy_(y)

    @staticmethod
    def addcmul(xs: list, ys: list, zs: list, value: float = 1) -> list:
        return [x.addcmul(y, z, value=value) for x, y, z in zip(xs, ys, zs)]

    @staticmethod
    def addcmul_(xs: list, ys: list, zs: list, value: float = 1) -> None:
        for x, y, z in zip(xs, ys, zs):
            x.addcmul_(y, z, value=value)

    @staticmethod
    def addcdiv_(xs: list, ys: list, zs: list, value=1) -> None:
        for x, y, z, v in zip(xs, ys, zs, _per(value, len(xs))):
            x.addcdiv_(y, z, value=v)

    @staticmethod
    def clone(xs: list) -> list:
        return [x.detach().clone() for x in xs]


FOREACH, OPS = Foreach(), Ops()
