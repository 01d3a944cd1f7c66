"""Ops whose backward is torch's own: a forward op on a torch function and a backward op that
runs that function's vector-Jacobian product with ``torch.autograd.grad``.

For ops whose gradient formula is long and delicate (SVD, QR, eigh, grid_sample, CTC, embedding
bags, cdist), reusing ATen's derivative gives torch's gradients exactly, including its choices
at degenerate points (zero distances, repeated singular values, empty bags). The backward op is
a primitive like ``convolution_backward``: it has its own SBP rule and no double backward. On
meta tensors (graph tracing) the backward's outputs are the differentiable inputs' shapes.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..core.dispatch import apply
from ..core.errors import UnsupportedError
from ..core.registry import Op, defop
from ..core.tensor import Tensor
from .family import needs


def _is_diff(x) -> bool:
    return isinstance(x, torch.Tensor) and (x.dtype.is_floating_point or x.dtype.is_complex)


def _bwd_kernel(fn: Callable) -> Callable:
    def kernel(*args, n_in: int, diff: tuple, **attrs):
        ins, dys = args[:n_in], args[n_in:]
        if any(isinstance(x, torch.Tensor) and x.device.type == "meta" for x in args):
            return tuple(torch.empty_like(ins[i]) for i in diff)
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(i in diff) if isinstance(x, torch.Tensor) else x
                      for i, x in enumerate(ins)]
            out = fn(*leaves, **attrs)
            outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
            # (an output no gradient reached stays undefined, as in torch's engine: svd's U and V
            # or eigh's vectors then drop out of the formula, whose 1 / (s_i^2 - s_j^2) would turn
            # zeros into NaN at repeated values)
            pairs = [(o, dy) for o, dy in zip(outs, dys)
                     if isinstance(o, torch.Tensor) and o.requires_grad and dy is not None]
            wrt = [leaves[i] for i in diff]
            grads = torch.autograd.grad([o for o, _ in pairs], wrt, [dy for _, dy in pairs],
                                        allow_unused=True) if pairs else [None] * len(wrt)
        return tuple(g if g is not None else torch.zeros_like(w) for g, w in zip(grads, wrt))
    return kernel


def defop_vjp(name: str, fn: Callable, *, sbp: Callable, bwd_sbp: Callable, family: str = "other",
              outputs: tuple | None = None, shape: Callable | None = None, complex_grads: bool = True,
              inplace_kernel: Callable | None = None) -> Op:
    """Declares ``name`` (kernel ``fn(*inputs, **attrs)``) and ``name_backward``.

    ``bwd_sbp(metas, attrs)`` sees ``(*inputs, *dys)`` and ``attrs`` with ``n_in`` and ``diff``
    (the positions of the floating inputs — and complex ones unless ``complex_grads=False`` — one
    gradient output each, in order). Complex inputs take torch's own (conjugate) gradients by
    default: without them a complex input that requires grad (``linalg.det``/``inv``/``solve`` of a
    complex matrix) would silently get none."""
    def no_double(ctx, *dys):
        raise UnsupportedError(f"holoflow.{name}: double backward is not implemented")

    bwd = defop(f"{name}_backward", _bwd_kernel(fn), sbp=bwd_sbp, grad=no_double, family=family)

    def grad(c, *dys):
        ins = c.inputs
        diff = tuple(i for i, x in enumerate(ins) if isinstance(x, Tensor) and (
            x.is_floating_point() or complex_grads and x.is_complex()))
        want = tuple(i for i in diff if needs(c, i))
        if not want:
            return (None,) * len(ins)
        gs = apply(bwd, *ins, *dys, n_in=len(ins), diff=want, **c.attrs)
        res: list = [None] * len(ins)
        for i, g in zip(want, gs):
            res[i] = g
        return tuple(res)

    return defop(name, fn, grad=grad, save="inputs", sbp=sbp, family=family, outputs=outputs, shape=shape,
                 grad_reads=(),   # (outputs without a gradient reach the backward as None)
                 inplace_kernel=inplace_kernel)


__all__: list[str] = []
