"""Every one-tensor function holoflow shares with torch (and nn.functional's activations) on the
special values (0, +-1, large, +-inf, NaN), with seed gradients of ones, of infinities and mixed
(inf, NaN, 0): the same values and the same gradients as torch, NaN for NaN and inf for inf.

Found: masks multiplied into gradients (clamp, hardsigmoid, hardswish, sinc at 0, maximum /
minimum's losers) turned an infinite seed into NaN where torch selects 0; maximum / minimum gave
a NaN operand no gradient (torch passes it to both); elu / selu / celu sent a NaN input's gradient
down the exponential side; mish's product rule summed inf - inf; acosh's real gradient was NaN
below -1 (torch's is ``(x^2 - 1)^-1/2``); xlogy gave 0 for ``d/dx`` at ``x = 0`` (torch: log y where
y > 0); clamp with tensor bounds split a tie in halves (torch gives x the whole gradient).
Binary functions on every pair of special values: pow's base gradient at exponent 0 and its
exponent gradient at base 0 (0 * log 0), atan2's at the origin, remainder's divisor gradient with
an infinite divisor (torch's floor division), and xlog1py's value at x = 0 where log1p(y) is NaN.
Reductions over rows of special values: std of a constant row (0 * inf: NaN, torch 0), max() / min()
of all elements with a NaN (torch's gradient goes to the NaN elements), vector norms (the inf-norm
counts NaNs as maxima; p < 1, 1 < p < 2, p > 2 and p = 0 as torch's cases), prod of a row with an
infinity (torch takes the other elements' product when the tensor holds a zero)."""
from __future__ import annotations

import warnings

import pytest
import torch

import holoflow as flow
from harness import same_special
from ops.test_unary_dtypes import NAMES

X = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 30.0, -30.0, float("inf"), float("-inf"), float("nan")],
                 dtype=torch.float64)
INF, NAN = float("inf"), float("nan")
SEEDS = {"ones": torch.ones(12, dtype=torch.float64), "inf": torch.full((12,), INF, dtype=torch.float64),
         "mixed": torch.tensor([INF, NAN, 0.0, -INF, 1.0, 0.0, INF, 2.0, INF, 1.0, 1.0, 0.0], dtype=torch.float64)}
ACTIVATIONS = ["relu", "relu6", "hardtanh", "elu", "selu", "celu", "gelu", "silu", "mish", "softplus", "logsigmoid",
               "hardswish", "hardsigmoid", "leaky_relu", "softsign", "tanhshrink", "hardshrink", "softshrink"]
FUNCTIONS = {**{n: (getattr(torch, n), getattr(flow, n)) for n in NAMES if n != "DoubleTensor"},
             **{f"F.{n}": (getattr(torch.nn.functional, n), getattr(flow.nn.functional, n)) for n in ACTIVATIONS}}
TWO = {   # functions of x and a second tensor built from it (ties at 0, NaN on both sides)
    "maximum": lambda m, x: m.maximum(x, x.detach().flip(0) * 0 + 0.5),
    "minimum": lambda m, x: m.minimum(x, m.zeros_like(x)),
    "clamp tensors": lambda m, x: m.clamp(x, m.zeros_like(x), m.ones_like(x)),
    "clamp tensor min": lambda m, x: m.clamp(x, min=m.zeros_like(x)),
    "clamp_ scalars": lambda m, x: x.clone().clamp_(0.0, 1.0),
    "xlogy x": lambda m, x: m.xlogy(x, x.detach().flip(0)),
    "xlogy y": lambda m, x: m.xlogy(x.detach().flip(0), x),
    "lerp": lambda m, x: m.lerp(x, x.detach().flip(0), 0.75),
    "where": lambda m, x: m.where(x > 1, m.zeros_like(x), x),
    "masked_fill": lambda m, x: x.masked_fill(x > 1, 0.0),
    "addcmul": lambda m, x: m.addcmul(x, x, x.detach().flip(0)), "addcmul t2": lambda m, x: m.addcmul(x.detach().flip(0), x, x, value=-0.5),
    "addcdiv": lambda m, x: m.addcdiv(x, x, x.detach().flip(0)), "addcdiv t2": lambda m, x: m.addcdiv(x.detach().flip(0), x, x, value=2),
    "addcdiv divisor": lambda m, x: m.addcdiv(x.detach(), x.detach().flip(0), x),
}



def _check(name: str, torch_fn, flow_fn) -> bool:
    """Compares values and gradients; False when torch has no gradient to compare with."""
    x = X.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            y = torch_fn(x)
            torch.autograd.grad(y, x, SEEDS["ones"], retain_graph=True)
        except Exception:   # (torch refuses this input, or has no derivative)
            return False
        if not isinstance(y, torch.Tensor) or y.shape != x.shape:
            return False
        fx = flow.from_torch(X.clone()).requires_grad_()
        fy = flow_fn(fx)
    assert same_special(fy.detach().to_torch(), y.detach()), f"{name}: values {fy.detach().to_torch()} != {y.detach()}"
    for seed_name, seed in SEEDS.items():
        (want,) = torch.autograd.grad(y, x, seed, retain_graph=True)
        (got,) = flow.autograd.grad(fy, fx, flow.from_torch(seed), retain_graph=True)
        got = got.to_torch()
        assert same_special(got, want), (f"{name}, seed {seed_name}: (x, seed, torch, holoflow) " + str(
            [(X[i].item(), seed[i].item(), want[i].item(), got[i].item()) for i in range(12)
             if not same_special(got[i:i + 1], want[i:i + 1])]))
    return True


def test_every_one_tensor_function_on_special_values():
    checked = [name for name, (tf, ff) in sorted(FUNCTIONS.items()) if _check(name, tf, ff)]
    assert len(checked) >= 90, f"only {len(checked)} functions had a torch gradient to compare"


@pytest.mark.parametrize("name", list(TWO))
def test_two_operand_functions_on_special_values(name):
    fn = TWO[name]
    assert _check(name, lambda x: fn(torch, x), lambda x: fn(flow, x))


_PAIR_VALUES = [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, INF, -INF, NAN]
A = torch.tensor([a for a in _PAIR_VALUES for _ in _PAIR_VALUES], dtype=torch.float64)
B = torch.tensor([b for _ in _PAIR_VALUES for b in _PAIR_VALUES], dtype=torch.float64)
BINARY = ["add", "sub", "mul", "div", "pow", "atan2", "fmod", "remainder", "hypot", "copysign", "maximum",
          "minimum", "fmax", "fmin", "logaddexp", "logaddexp2", "xlogy", "float_power", "special.xlog1py",
          "special.xlogy"]


def _get(lib, name: str):
    for part in name.split("."):
        lib = getattr(lib, part)
    return lib


@pytest.mark.parametrize("name", BINARY)
def test_binary_functions_on_every_pair_of_special_values(name):
    tf, ff = _get(torch, name), _get(flow, name)
    a, b = A.clone().requires_grad_(), B.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = tf(a, b)
        fa, fb = flow.from_torch(A.clone()).requires_grad_(), flow.from_torch(B.clone()).requires_grad_()
        fy = ff(fa, fb)
    assert same_special(fy.detach().to_torch(), y.detach()), f"{name}: values"
    for seed_name in ("ones", "inf"):
        seed = torch.full(A.shape, 1.0 if seed_name == "ones" else INF, dtype=torch.float64)
        want = torch.autograd.grad(y, (a, b), seed, retain_graph=True)
        got = flow.autograd.grad(fy, (fa, fb), flow.from_torch(seed), retain_graph=True)
        for which, w, g in zip("ab", want, got):
            g = g.to_torch()
            assert same_special(g, w), (f"{name}, seed {seed_name}, d/d{which}: (a, b, torch, holoflow) " + str(
                [(A[i].item(), B[i].item(), w[i].item(), g[i].item()) for i in range(A.numel())
                 if not same_special(g[i:i + 1], w[i:i + 1])][:6]))


_ROWS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 0.0], [INF, 1.0, 2.0, 3.0],
                      [-INF, -INF, -INF, -INF], [-INF, 1.0, 2.0, 3.0], [NAN, 1.0, 2.0, 3.0], [2.0, 2.0, 1.0, 0.5],
                      [0.0, 0.0, 0.0, 0.0], [INF, INF, 1.0, 0.0], [-1.0, 1.0, -INF, INF]], dtype=torch.float64)
REDUCTIONS = {
    "sum": lambda m, x: x.sum(1), "mean": lambda m, x: x.mean(1), "prod": lambda m, x: x.prod(1),
    "prod-all": lambda m, x: x.prod(), "prod-no-zero": lambda m, x: x[3:8].abs().prod(1),
    "amax": lambda m, x: x.amax(1), "amin": lambda m, x: x.amin(1), "max": lambda m, x: x.max(1).values,
    "min": lambda m, x: x.min(1).values, "max-all": lambda m, x: x.max(), "min-all": lambda m, x: x.min(),
    **{f"norm{p}": (lambda m, x, p=p: x.norm(p=p, dim=1)) for p in (0.5, 1, 1.5, 2, 3, INF, -INF)},
    "vector_norm": lambda m, x: m.linalg.vector_norm(x, dim=1), "logsumexp": lambda m, x: m.logsumexp(x, 1),
    "softmax": lambda m, x: m.softmax(x, 1), "log_softmax": lambda m, x: m.log_softmax(x, 1),
    "std": lambda m, x: x.std(1), "std-all": lambda m, x: x[8].std(), "var": lambda m, x: x.var(1),
    "std_mean": lambda m, x: m.std_mean(x, 1)[0], "cumsum": lambda m, x: x.cumsum(1),
    "cumprod": lambda m, x: x.cumprod(1), "cumprod dim 0": lambda m, x: x.cumprod(0),
    "cumprod no zero": lambda m, x: x[3:8].cumprod(1),
    "logcumsumexp": lambda m, x: m.logcumsumexp(x, 1), "nansum": lambda m, x: m.nansum(x, 1),
    "nanmean": lambda m, x: m.nanmean(x, 1), "median": lambda m, x: x.median(1).values,
    "sort": lambda m, x: x.sort(1).values, "topk": lambda m, x: x.topk(2, 1).values,
    "normalize": lambda m, x: m.nn.functional.normalize(x, dim=1),
    "layer_norm": lambda m, x: m.nn.functional.layer_norm(x, (4,)),
    "rms_norm": lambda m, x: m.nn.functional.rms_norm(x, (4,)),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions_over_rows_of_special_values(name):
    fn = REDUCTIONS[name]
    x = _ROWS.clone().requires_grad_()
    fx = flow.from_torch(_ROWS.clone()).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y, fy = fn(torch, x), fn(flow, fx)
    assert same_special(fy.detach().to_torch(), y.detach()), f"{name}: values"
    for fill in (1.0, INF):
        seed = torch.full(y.shape, fill, dtype=torch.float64)
        (want,) = torch.autograd.grad(y, x, seed, retain_graph=True)
        (got,) = flow.autograd.grad(fy, fx, flow.from_torch(seed), retain_graph=True)
        got = got.to_torch()
        bad = [i for i in range(_ROWS.shape[0]) if not same_special(got[i], want[i])]
        assert not bad, f"{name}, seed {fill}: rows {bad}, e.g. {_ROWS[bad[0]].tolist()}: torch {want[bad[0]].tolist()}, " \
                        f"holoflow {got[bad[0]].tolist()}"


def test_cumprod_double_backward_with_zeros():
    """cumprod's gradient with create_graph is torch's differentiable O(n^2) form where a slice
    holds a zero (the masked O(n) form's derivative is not cumprod's second derivative)."""
    x0 = torch.tensor([[1.0, 0.0, 2.0, 3.0], [0.0, 2.0, 0.0, 4.0], [1.5, 2.0, 3.0, 4.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, -2.0, 3.0, 0.5]], dtype=torch.float64).expand(3, 4).contiguous()
    x, fx = x0.clone().requires_grad_(), flow.from_torch(x0.clone()).requires_grad_()
    (g,) = torch.autograd.grad(x.cumprod(1), x, v, create_graph=True)
    (fg,) = flow.autograd.grad(fx.cumprod(1), fx, flow.from_torch(v), create_graph=True)
    assert torch.allclose(fg.detach().to_torch(), g.detach())
    (h,) = torch.autograd.grad((g * g).sum(), x)
    (fh,) = flow.autograd.grad((fg * fg).sum(), fx)
    assert torch.allclose(fh.to_torch(), h)
