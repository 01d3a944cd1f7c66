"""``scalar OP tensor`` rounds as torch's reflected operators (bf16/f16 under a GELU-style
``0.044715 * x``, float64 keeping the scalar's double precision), with torch's gradients."""
import pytest
import torch

import holoflow as flow

OPS = {"mul": lambda s, x: s * x, "truediv": lambda s, x: s / x, "sub": lambda s, x: s - x,
       "add": lambda s, x: s + x, "pow": lambda s, x: s ** x, "mod": lambda s, x: s % x,
       "floordiv": lambda s, x: s // x}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("scalar", [0.044715, 2.7, 3])
@pytest.mark.parametrize("name", sorted(OPS))
def test_reflected_scalar_rounds_as_torch(name, scalar, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(1000, generator=g) * 3 + 3).to(dtype)
    x[x == 0] = 1
    want = OPS[name](scalar, x)
    got = OPS[name](scalar, flow.from_torch(x.clone())).to_torch()
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reflected_scalar_gradients_match_torch(dtype):
    x = (torch.rand(6, dtype=dtype) + 0.5).requires_grad_()
    fx = flow.from_torch(x.detach().clone()).requires_grad_()
    f = lambda t: (2.7 / t + 2.7 ** t - 1.5 * t + (3 - t) * (0.5 + t)).sum()  # noqa: E731
    f(x).backward()
    f(fx).backward()
    torch.testing.assert_close(fx.grad.to_torch(), x.grad, rtol=1e-6, atol=1e-7)
