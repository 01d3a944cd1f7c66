"""scaled_dot_product_attention without a mask runs torch's fused flash forward/backward (the
forward keeps the logsumexp); masks keep the math backward. Values and grads against torch,
SBP of the fused ops through the op harness, and the double-backward error."""
import pytest
import torch
import torch.nn.functional as F
from harness import F32, F64, Case, parametrize, randn

import holoflow as flow
import holoflow.nn.functional as HF
from holoflow.core.interpret import Observe, pushed
from holoflow.core.errors import UnsupportedError


def _qkv(qs, ks, vs, transposed=False):
    def make(dt, g):
        xs = [randn(*s, gen=g, dtype=dt) for s in (qs, ks, vs)]
        if transposed:  # (B, L, H, E) storage seen as (B, H, L, E), as in the GPT example
            xs = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in xs]
        return tuple(xs), {}
    return make


SHAPES = {"3d": ((3, 4, 5), (3, 6, 5), (3, 6, 5)), "5d": ((2, 2, 1, 3, 4), (2, 2, 1, 5, 4), (2, 2, 1, 5, 4)),
          "4d": ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8))}
CASES = []
for name, shapes in SHAPES.items():
    for causal in (False, True):
        CASES.append(Case(f"sdpa-fused-{name}-causal{causal}",
                          lambda q, k, v, c=causal: HF.scaled_dot_product_attention(q, k, v, is_causal=c, scale=0.7),
                          lambda q, k, v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c, scale=0.7),
                          _qkv(*shapes), dtypes=(F32, F64), atol=1e-4))
CASES.append(Case("sdpa-fused-strided", lambda q, k, v: HF.scaled_dot_product_attention(q, k, v, is_causal=True),
                  lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                  _qkv(*SHAPES["4d"], transposed=True), dtypes=(F32,), atol=1e-4))
globals().update(parametrize(CASES))


def _backward_ops(mask: bool) -> list[str]:
    q, k, v = (flow.randn(2, 2, 3, 4, requires_grad=True) for _ in range(3))
    m = flow.randn(3, 3) if mask else None
    y = HF.scaled_dot_product_attention(q, k, v, m)
    seen: list[str] = []

    with pushed(Observe(lambda op, inputs, attrs: seen.append(op.name))):
        flow.autograd.grad([y], [q, k, v], [flow.ones_like(y)])
    return seen


def test_fused_backward_without_mask_math_backward_with_mask():
    assert "scaled_dot_product_attention_fused_backward" in _backward_ops(mask=False)
    assert "scaled_dot_product_attention_backward" in _backward_ops(mask=True)


def test_fused_double_backward_is_a_clear_error():
    q, k, v = (flow.randn(1, 2, 3, 4, requires_grad=True) for _ in range(3))
    y = HF.scaled_dot_product_attention(q, k, v, is_causal=True)
    (dq,) = flow.autograd.grad([y.sum()], [q], create_graph=True)
    with pytest.raises(UnsupportedError, match="scaled_dot_product_attention_fused_backward: double backward"):
        flow.autograd.grad([dq.sum()], [q])


def test_fused_empty_batch():
    q = flow.randn(0, 2, 3, 4, requires_grad=True)
    y = HF.scaled_dot_product_attention(q, q, q)
    (g,) = flow.autograd.grad([y.sum()], [q])
    assert tuple(y.shape) == (0, 2, 3, 4) and tuple(g.shape) == (0, 2, 3, 4)
    assert torch.equal(y.to_torch(), F.scaled_dot_product_attention(*[torch.zeros(0, 2, 3, 4)] * 3))
