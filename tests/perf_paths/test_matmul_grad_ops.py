"""matmul's backward without broadcasting runs one matmul per operand (matmul_grad_a/_b), not
an einsum; those ops are closed under differentiation. Values, double backward and SBP of the
batched cases against torch through the op harness."""
import torch
from harness import F32, F64, Case, parametrize, randn
from ops.test_linalg import grad_of

import holoflow as flow
from holoflow.core.interpret import Observe, pushed


def ins(*shapes):
    return lambda dt, g: (tuple(randn(*s, gen=g, dtype=dt) for s in shapes), {})


SECOND = {
    "bmm": (lambda lib, a, b: lib.matmul(a * a, b), [(2, 3, 4), (2, 4, 5), (2, 3, 5)]),
    "4d": (lambda lib, a, b: lib.matmul(a, b * b), [(2, 3, 2, 4), (2, 3, 4, 3), (2, 3, 2, 3)]),
    "2d-both": (lambda lib, a, b: lib.matmul(a * b.sum(), b), [(3, 3), (3, 3), (3, 3)]),
}
CASES = [Case("matmul-4d-same-batch", flow.matmul, torch.matmul, ins((2, 3, 2, 4), (2, 3, 4, 5)),
              dtypes=(F32, F64))]
CASES += [Case(f"grad-of-matmul-{name}", grad_of(flow, f), grad_of(torch, f), ins(*shapes))
          for name, (f, shapes) in SECOND.items()]
globals().update(parametrize(CASES))


def _backward_ops(sa: tuple, sb: tuple) -> list[str]:
    a = flow.randn(*sa, requires_grad=True)
    b = flow.randn(*sb, requires_grad=True)
    y = flow.matmul(a, b)
    seen: list[str] = []

    with pushed(Observe(lambda op, inputs, attrs: seen.append(op.name))):
        flow.autograd.grad([y], [a, b], [flow.ones_like(y)])
    return seen


def test_unbroadcast_matmul_backward_is_two_matmuls():
    for sa, sb in [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 2, 3, 4), (2, 2, 4, 5))]:
        ops = _backward_ops(sa, sb)
        assert "matmul_grad_a" in ops and "matmul_grad_b" in ops and "einsum" not in ops, (sa, sb, ops)


def test_broadcast_matmul_backward_keeps_einsum():
    assert "einsum" in _backward_ops((2, 3, 4), (4, 5))
