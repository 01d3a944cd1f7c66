"""linear's eager backward is one ``linear_backward`` op (dx, dw and the bias gradient, switched
by an output mask) where a trace or a double backward keeps linear_grad_input /
linear_grad_weight / sum_to_size. Values and SBP of the fused op against torch through the op
harness; which ops each path dispatches, observed."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from harness import F32, F64, Case, parametrize, randn
from ops.test_linalg import grad_of

import holoflow as flow
from holoflow.core.dispatch import apply
from holoflow.core.errors import UnsupportedError
from holoflow.core.interpret import Observe, pushed
from holoflow.ops.linalg import LINEAR_BACKWARD


def ins(*shapes):
    return lambda dt, g: (tuple(randn(*s, gen=g, dtype=dt) for s in shapes), {})


CASES = [Case("linear-3d-bias", flow.nn.functional.linear, torch.nn.functional.linear,
              ins((2, 3, 4), (5, 4), (5,)), dtypes=(F32, F64)),
         Case("linear-2d-nobias", flow.nn.functional.linear, torch.nn.functional.linear,
              ins((3, 4), (5, 4)), dtypes=(F32, F64)),
         Case("grad-of-linear", grad_of(flow, lambda lib, x, w, b: lib.nn.functional.linear(x * x, w, b)),
              grad_of(torch, lambda lib, x, w, b: lib.nn.functional.linear(x * x, w, b)),
              ins((2, 4), (3, 4), (3,), (2, 3)))]
globals().update(parametrize(CASES))


def _run(sx, bias, frozen=(), create_graph=False):
    """(holoflow grads, torch grads, ops holoflow's backward dispatched) of ``linear``."""
    gen = torch.Generator().manual_seed(0)
    tx = torch.randn(*sx, generator=gen, dtype=torch.float64)
    tw = torch.randn(5, sx[-1], generator=gen, dtype=torch.float64)
    tb = torch.randn(5, generator=gen, dtype=torch.float64) if bias else None
    tensors = [t for t in (tx, tw, tb) if t is not None]
    want = [i for i in range(len(tensors)) if i not in frozen]
    for i in want:
        tensors[i].requires_grad_()
    fl = [flow.tensor(t.detach().numpy(), requires_grad=t.requires_grad) for t in tensors]
    ty = torch.nn.functional.linear(*tensors) if bias else torch.nn.functional.linear(*tensors, None)
    fy = flow.nn.functional.linear(*fl) if bias else flow.nn.functional.linear(*fl, None)
    dy = torch.randn(ty.shape, generator=gen, dtype=torch.float64)
    tg = torch.autograd.grad([ty], [tensors[i] for i in want], [dy])
    seen: list[str] = []
    with pushed(Observe(lambda op, inputs, attrs: seen.append(op.name))):
        fg = flow.autograd.grad([fy], [fl[i] for i in want], [flow.tensor(dy.numpy())], create_graph=create_graph)
    return fg, tg, seen


@pytest.mark.parametrize("sx,bias,frozen", [((3, 4), True, ()), ((2, 3, 4), True, ()), ((4,), True, ()),
                                            ((2, 3, 4), False, ()), ((0, 4), True, ()),
                                            ((3, 4), True, (1,)), ((3, 4), True, (0, 2))])
def test_eager_backward_is_one_op(sx, bias, frozen):
    fg, tg, seen = _run(sx, bias, frozen)
    assert seen == ["linear_backward"], seen
    for f, t in zip(fg, tg):
        np.testing.assert_allclose(f.numpy(), t.numpy(), rtol=1e-12, atol=1e-12)


def test_create_graph_keeps_the_differentiable_ops():
    fg, tg, seen = _run((3, 4), True, create_graph=True)
    assert "linear_backward" not in seen and {"linear_grad_input", "linear_grad_weight"} <= set(seen), seen
    for f, t in zip(fg, tg):
        np.testing.assert_allclose(f.detach().numpy(), t.numpy(), rtol=1e-12, atol=1e-12)


def test_fused_op_refuses_differentiation():
    dy, x, w = (flow.randn(*s, requires_grad=True) for s in ((3, 5), (3, 4), (5, 4)))
    dx, dw, db = apply(LINEAR_BACKWARD, dy, x, w, output_mask=(True, True, True))
    with pytest.raises(UnsupportedError, match="linear_backward: not differentiable"):
        dx.sum().backward()
