"""Elementwise ops vs torch: broadcasting, type promotion, scalars, in-place, empty tensors."""
import pytest
import torch

import holoflow as flow
from harness import BF16, F32, F64, Case, parametrize, positive, randn

UNARY_ANY = ["neg", "abs", "exp", "expm1", "sin", "cos", "tanh", "sigmoid", "erf", "atan",
             "sinh", "cosh", "square", "frac", "exp2"]
UNARY_POS = ["log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal"]
UNARY_UNIT = ["asin", "acos", "erfinv", "tan"]
UNARY_NOGRAD = ["sign", "floor", "ceil", "trunc", "round"]
BINARY_ANY = ["add", "sub", "mul", "maximum", "minimum", "atan2"]
BINARY_POS = ["div", "pow", "fmod", "remainder"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]

CASES = []
for name in UNARY_ANY + UNARY_POS + UNARY_UNIT:
    dom = positive if name in UNARY_POS else (lambda *s, gen, dtype: randn(*s, gen=gen, dtype=dtype) * 0.4) \
        if name in UNARY_UNIT else randn
    for shape in [(3, 4), (0, 3), ()]:
        CASES.append(Case(f"{name}{list(shape)}", getattr(flow, name), getattr(torch, name),
                          lambda dt, g, s=shape, d=dom: ((d(*s, gen=g, dtype=dt),), {}),
                          dtypes=(F32, F64, BF16)))
for name in UNARY_NOGRAD:
    CASES.append(Case(name, getattr(flow, name), getattr(torch, name),
                      lambda dt, g: ((randn(5, 3, gen=g, dtype=dt) * 3,), {}), gradcheck=False))
for name in BINARY_ANY + BINARY_POS:
    dom = positive if name in BINARY_POS else randn
    for sa, sb in [((3, 4), (3, 4)), ((2, 1, 4), (3, 1)), ((4,), ()), ((0, 2), (2,))]:
        CASES.append(Case(f"{name}{list(sa)}{list(sb)}", getattr(flow, name), getattr(torch, name),
                          lambda dt, g, sa=sa, sb=sb, d=dom: ((d(*sa, gen=g, dtype=dt), d(*sb, gen=g, dtype=dt)), {}),
                          dtypes=(F32, F64, BF16) if name != "atan2" else (F32, F64)))
    CASES.append(Case(f"{name}-scalar", lambda a, n=name: getattr(flow, n)(a, 1.5),
                      lambda a, n=name: getattr(torch, n)(a, torch.tensor(1.5, dtype=a.dtype)),
                      lambda dt, g, d=dom: ((d(3, 4, gen=g, dtype=dt),), {})))
for name in COMPARE:
    CASES.append(Case(name, getattr(flow, name), getattr(torch, name),
                      lambda dt, g: ((randn(3, 4, gen=g, dtype=dt).round(), randn(4, gen=g, dtype=dt).round()), {}),
                      grad=False))
CASES += [
    Case("add-alpha", lambda a, b: flow.add(a, b, alpha=2.5), lambda a, b: torch.add(a, b, alpha=2.5),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), randn(4, gen=g, dtype=dt)), {})),
    Case("sub-alpha", lambda a, b: flow.sub(a, b, alpha=-2), lambda a, b: torch.sub(a, b, alpha=-2),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), randn(3, 1, gen=g, dtype=dt)), {})),
    Case("rsub-scalar", lambda a: 2 - a, lambda a: 2 - a, lambda dt, g: ((randn(3, gen=g, dtype=dt),), {})),
    Case("rsub-fn-alpha", lambda a, b: flow.rsub(a, b, alpha=1.5), lambda a, b: torch.rsub(a, b, alpha=1.5),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), randn(4, gen=g, dtype=dt)), {})),
    Case("rdiv-scalar", lambda a: 2 / a, lambda a: 2 / a, lambda dt, g: ((positive(3, gen=g, dtype=dt),), {})),
    Case("rpow-scalar", lambda a: 2 ** a, lambda a: 2 ** a, lambda dt, g: ((randn(3, gen=g, dtype=dt),), {})),
    Case("floordiv", lambda a, b: a // b, lambda a, b: a // b,
         lambda dt, g: ((randn(6, gen=g, dtype=dt) * 5, positive(6, gen=g, dtype=dt)), {}), grad=False),
    Case("div-trunc", lambda a, b: flow.div(a, b, rounding_mode="trunc"),
         lambda a, b: torch.div(a, b, rounding_mode="trunc"),
         lambda dt, g: ((randn(6, gen=g, dtype=dt) * 5, positive(6, gen=g, dtype=dt)), {}), grad=False),
    Case("promote-int-float", lambda a, b: a * b, lambda a, b: a * b,
         lambda dt, g: ((torch.arange(6).reshape(2, 3), randn(3, gen=g, dtype=dt)), {})),
    Case("promote-f32-f64", lambda a, b: a + b, lambda a, b: a + b,
         lambda dt, g: ((randn(2, 3, gen=g, dtype=F32), randn(3, gen=g, dtype=F64)), {}), dtypes=(F64,), gradcheck=False),
    Case("int-ops", lambda a, b: (a + b, a * b, a // b, a % b, a & b, a | b, a ^ b, ~a),
         lambda a, b: (a + b, a * b, a // b, a % b, a & b, a | b, a ^ b, ~a),
         lambda dt, g: ((torch.arange(1, 7), torch.tensor([2, 3, 1, 5, 2, 7])), {}), grad=False, dtypes=(F32,)),
    Case("logical", lambda a, b: (flow.logical_and(a, b), flow.logical_or(a, b), flow.logical_xor(a, b), flow.logical_not(a)),
         lambda a, b: (torch.logical_and(a, b), torch.logical_or(a, b), torch.logical_xor(a, b), torch.logical_not(a)),
         lambda dt, g: ((randn(4, 3, gen=g, dtype=dt) > 0, randn(3, gen=g, dtype=dt) > 0), {}), grad=False, dtypes=(F32,)),
    Case("where", flow.where, torch.where,
         lambda dt, g: ((randn(3, 4, gen=g) > 0, randn(3, 4, gen=g, dtype=dt), randn(4, gen=g, dtype=dt)), {}),
         dtypes=(F32, F64, BF16)),
    Case("where-scalar", lambda c, a: flow.where(c, a, 0.0), lambda c, a: torch.where(c, a, 0.0),
         lambda dt, g: ((randn(3, 4, gen=g) > 0, randn(3, 4, gen=g, dtype=dt)), {})),
    Case("clamp", lambda a: flow.clamp(a, -0.5, 0.7), lambda a: torch.clamp(a, -0.5, 0.7),
         lambda dt, g: ((randn(4, 5, gen=g, dtype=dt),), {}), dtypes=(F32, F64, BF16)),
    Case("clamp-min", lambda a: a.clamp(min=0.1), lambda a: a.clamp(min=0.1),
         lambda dt, g: ((randn(4, 5, gen=g, dtype=dt),), {})),
    Case("clamp-tensor", lambda a, lo: flow.clamp(a, min=lo), lambda a, lo: torch.clamp(a, min=lo),
         lambda dt, g: ((randn(4, 5, gen=g, dtype=dt), randn(5, gen=g, dtype=dt)), {})),
    Case("isnan-isinf", lambda a: (a.isnan(), a.isinf(), a.isfinite()),
         lambda a: (a.isnan(), a.isinf(), a.isfinite()),
         lambda dt, g: ((torch.tensor([1.0, float("nan"), float("inf"), -float("inf")], dtype=dt),), {}), grad=False),
    Case("nan_to_num", lambda a: flow.nan_to_num(a, nan=0.5, posinf=9.0), lambda a: torch.nan_to_num(a, nan=0.5, posinf=9.0),
         lambda dt, g: ((torch.tensor([1.0, float("nan"), float("inf"), -3.0], dtype=dt),), {}), gradcheck=False),
    Case("lerp-addcmul-addcdiv", lambda a, b, c: (flow.lerp(a, b, 0.3), flow.addcmul(a, b, c, value=0.5), flow.addcdiv(a, b, c, value=2)),
         lambda a, b, c: (torch.lerp(a, b, 0.3), torch.addcmul(a, b, c, value=0.5), torch.addcdiv(a, b, c, value=2)),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), randn(3, 4, gen=g, dtype=dt), positive(4, gen=g, dtype=dt)), {})),
    Case("lerp-tensor-weight-broadcast", flow.lerp, torch.lerp,
         lambda dt, g: ((randn(4, gen=g, dtype=dt), randn(2, 3, 4, gen=g, dtype=dt), positive(3, 1, gen=g, dtype=dt) / 2), {})),
    Case("special.xlog1py-broadcast", flow.special.xlog1py, torch.special.xlog1py,
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), positive(4, gen=g, dtype=dt)), {})),
    Case("logaddexp", flow.logaddexp, torch.logaddexp,
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt) * 10, randn(4, gen=g, dtype=dt)), {})),
    Case("maximum-ties", flow.maximum, torch.maximum,
         lambda dt, g: ((torch.tensor([1.0, 2.0, 3.0], dtype=dt), torch.tensor([1.0, 5.0, 3.0], dtype=dt)), {}), gradcheck=False),
    Case("to-dtype", lambda a: a.to(flow.float64) * a.double(), lambda a: a.to(torch.float64) * a.double(),
         lambda dt, g: ((randn(3, gen=g, dtype=dt),), {}), dtypes=(F32,)),
    Case("clone", lambda a: a.clone() * 2, lambda a: a.clone() * 2, lambda dt, g: ((randn(3, gen=g, dtype=dt),), {})),
]

globals().update(parametrize(CASES))


def test_inplace_ops_match_torch():
    a = torch.randn(3, 4)
    fa = flow.from_torch(a.clone())
    for f in (lambda x: x.add_(1.5), lambda x: x.mul_(2), lambda x: x.sub_(0.5, alpha=2),
              lambda x: x.div_(3), lambda x: x.exp_(), lambda x: x.clamp_(0, 5), lambda x: x.pow_(2)):
        f(a)
        f(fa)
        torch.testing.assert_close(fa.to_torch(), a)
    fa.zero_()
    assert not fa.to_torch().any()


def test_inplace_on_view_writes_through():
    x = flow.zeros(4)
    v = x[1:3]
    v += 2
    assert x.tolist() == [0, 2, 2, 0]


def test_inplace_autograd_matches_torch():
    def run(lib, x0):
        x = lib.tensor(x0, requires_grad=True)
        y = x * 2
        y.add_(3)
        y.mul_(x)
        y.sigmoid_()
        z = y.exp()
        z.backward(lib.ones_like(z))
        return x.grad
    got = run(flow, [[0.1, 0.2], [0.3, -0.4]])
    want = run(torch, [[0.1, 0.2], [0.3, -0.4]])
    torch.testing.assert_close(got.to_torch(), want)


def test_modified_saved_tensor_raises_like_torch():
    import pytest
    for lib in (torch, flow):
        x = lib.tensor([0.5, 1.5], requires_grad=True)
        y = x * 2
        z = y.exp()   # saves its output
        z.add_(1)
        with pytest.raises(RuntimeError, match="modified by an in-?place operation"):
            z.backward(lib.ones_like(z))


def test_leaf_inplace_raises():
    import pytest
    x = flow.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        x.add_(1)
    with flow.no_grad():
        x.add_(1)
    assert x.tolist() == [2.0, 2.0]


def test_bf16_promotion_and_scalar_keep_dtype():
    x = flow.randn(3, dtype=flow.bfloat16)
    assert (x * 2.5).dtype == flow.bfloat16
    assert (x + flow.randn(3)).dtype == flow.float32
    assert (flow.arange(3) / 2).dtype == flow.float32


@pytest.mark.parametrize("expr", ["sub(True, x)", "sub(x, False)", "rsub(x, True)", "True - x", "x - True"])
def test_bool_scalar_subtraction_raises_like_torch(expr):
    """torch refuses subtraction with a bool (a scalar included): a mask inverted by ``1 - m``'s
    bool spelling; holoflow did ``True - x`` as ``1.0 - x``."""
    x = torch.tensor([1.5, -2.0])
    env_t = {"x": x, "sub": torch.sub, "rsub": torch.rsub}
    env_f = {"x": flow.from_torch(x), "sub": flow.sub, "rsub": flow.rsub}
    with pytest.raises(RuntimeError, match="bool"):
        eval(expr, env_t)
    with pytest.raises(RuntimeError, match="bool"):
        eval(expr, env_f)


def test_lerp_is_torchs_kernel_bit_for_bit():
    """torch computes ``end - (end - input) * (1 - weight)`` where ``|weight| >= 0.5``: the
    composite ``input + weight * (end - input)`` differed from it in the last bit for about half
    the values, and optimizers' lerp updates with it."""
    g = torch.Generator().manual_seed(0)
    a, b, w = (torch.randn(10_000, generator=g) for _ in range(3))
    for weight in (0.3, 0.7, w.abs() / w.abs().max()):
        want = torch.lerp(a, b, weight)
        got = flow.lerp(flow.from_torch(a), flow.from_torch(b),
                        flow.from_torch(weight) if isinstance(weight, torch.Tensor) else weight).to_torch()
        assert torch.equal(got, want)
