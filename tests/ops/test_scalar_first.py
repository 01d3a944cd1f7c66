"""Function forms with a Python number first (``flow.sub(2.7, x)``) compute in the dtype torch
does, with the number's full precision (the number was wrapped as a float32 0-d tensor: 2.7 in a
float64 result was float32's 2.7). Complex ``abs`` backward and ``xlogy``'s scalar/NaN forms
match torch."""
import pytest
import torch

import holoflow as flow

DTYPES = [torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.complex128]
SCALARS = [2.7, 3, 1e-9 + 1.0, 0.1 + 0.2j]


def _x(dtype):
    t = torch.tensor([1.25, -0.5, 3.0]).to(dtype) if dtype.is_floating_point or dtype.is_complex \
        else torch.tensor([1, -2, 3], dtype=dtype)
    return t, flow.from_torch(t.clone())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("s", SCALARS, ids=repr)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow"])
def test_scalar_first_matches_torch(name, s, dtype):
    t, x = _x(dtype)
    # torch's own scalar-first form: the reflected operator (pow takes a number first itself);
    # torch's ``2.7 / x`` is reciprocal(x) * 2.7, so div is checked against a true division by
    # the number as a 0-d tensor of the result dtype
    try:
        if name == "div":
            want = torch.div(torch.tensor(s, dtype=torch.result_type(s, t)), t)
        else:
            want = torch.pow(s, t) if name == "pow" else getattr(torch.Tensor, f"__r{name}__")(t, s)
    except (RuntimeError, NotImplementedError):  # e.g. complex-half kernels torch lacks: both refuse
        with pytest.raises((RuntimeError, NotImplementedError)):
            getattr(flow, name)(s, x)
        return
    got = getattr(flow, name)(s, x).to_torch()
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", ["maximum", "minimum", "atan2"])
def test_tensor_only_ops_take_the_scalar_second_at_full_precision(name):
    t, x = _x(torch.float64)
    want = getattr(torch, name)(t, torch.tensor(2.7, dtype=torch.float64))
    torch.testing.assert_close(getattr(flow, name)(x, 2.7).to_torch(), want, rtol=0, atol=0)


TENSOR_INPUT = ["eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum", "atan2", "fmod", "logical_and",
                "logical_or", "logical_xor", "greater", "less_equal", "not_equal", "arctan2"]


@pytest.mark.parametrize("name", TENSOR_INPUT + ["mul", "pow", "remainder", "bitwise_and", "add", "sub"])
@pytest.mark.parametrize("s", [2, 2.5, True], ids=repr)
def test_a_number_first_is_refused_where_torch_refuses_it(name, s):
    t, x = _x(torch.int64)
    try:
        want = getattr(torch, name)(s, t)
    except TypeError:
        assert name in TENSOR_INPUT
        with pytest.raises(TypeError, match=r"holoflow\.\w+\(\): argument 'input' .* must be Tensor, not "
                                            + type(s).__name__):
            getattr(flow, name)(s, x)
        return
    except (RuntimeError, NotImplementedError) as e:   # no kernel for the promoted dtype: the same class
        with pytest.raises(type(e)):
            getattr(flow, name)(s, x)
        return
    assert name not in TENSOR_INPUT
    torch.testing.assert_close(getattr(flow, name)(s, x).to_torch(), want, rtol=0, atol=0)


def test_sub_scalar_first_float64_is_exact():
    x = flow.tensor([1.0], dtype=flow.float64)
    assert flow.sub(2.7, x).item() == 2.7 - 1.0
    assert flow.sub(2.7, x).item() == (2.7 - x).item()


def test_complex_abs_backward_matches_torch():
    z = torch.tensor([1 + 2j, -3 + 0.5j, 0j, -2j], dtype=torch.complex128, requires_grad=True)
    w = torch.tensor([0.5, -1.0, 2.0, 3.0], dtype=torch.float64)
    (torch.abs(z) * w).sum().backward()
    x = flow.from_torch(z.detach().clone()).requires_grad_()
    (flow.abs(x) * flow.from_torch(w)).sum().backward()
    torch.testing.assert_close(x.grad.to_torch(), z.grad, rtol=1e-12, atol=1e-12)
    # real inputs keep sign(x)
    r = torch.tensor([-1.5, 0.0, 2.0], dtype=torch.float64, requires_grad=True)
    torch.abs(r).sum().backward()
    y = flow.from_torch(r.detach().clone()).requires_grad_()
    flow.abs(y).sum().backward()
    torch.testing.assert_close(y.grad.to_torch(), r.grad)


def test_complex_abs_second_order_matches_torch():
    z = torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex128, requires_grad=True)
    c = torch.tensor([0.5 - 1j, 2 + 0.25j], dtype=torch.complex128)
    g, = torch.autograd.grad(torch.abs(z).sum(), z, create_graph=True)
    torch.abs(g + c).sum().backward()
    x = flow.from_torch(z.detach().clone()).requires_grad_()
    gx, = flow.autograd.grad(flow.abs(x).sum(), x, create_graph=True)
    flow.abs(gx + flow.from_torch(c)).sum().backward()
    torch.testing.assert_close(x.grad.to_torch(), z.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("a, b", [("X", "Y"), (2.7, "Y"), (0.0, "Y"), ("X", 2.7), ("X", 0.0)])
def test_xlogy_forms_and_nan_match_torch(a, b):
    X = torch.tensor([0.0, 1.5, 0.0, 2.0, 0.0], dtype=torch.float64)
    Y = torch.tensor([float("nan"), 2.0, 3.0, 0.0, float("inf")], dtype=torch.float64)
    ta, tb = (X if a == "X" else a), (Y if b == "Y" else b)
    fa = flow.from_torch(X) if a == "X" else a
    fb = flow.from_torch(Y) if b == "Y" else b
    want = torch.xlogy(ta, tb)
    got = flow.xlogy(fa, fb).to_torch()
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
