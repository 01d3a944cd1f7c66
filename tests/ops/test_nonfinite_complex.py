"""Complex inputs on special values (real and imaginary parts from 0, +-1, +-0.5, +-inf, NaN, a
subnormal-scale -1e-300), with seed gradients of ones, of 1j, of inf and of NaN: the same values
and gradients as torch, compared per real and imaginary component (NaN for NaN, inf for inf).

Found (before, holoflow vs torch):
sgn: (dy - s Re(dy conj s)) / |x| (2.2e284 at x = -1e-300; torch's (dy - s^2 conj(dy)) / (2|x|): 1.1e284).
sqrt: dy * 0.5 / conj(y) gave 0 at x = +-inf (+ 0j, + 1j) where torch's dy / (2 conj(y)) is NaN; NaN parts for inf seeds.
square: dy * 2 * x; torch differentiates pow(x, 2): dy * conj(2 x^1) (all-NaN at infinite x, inf + NaN j before).
reciprocal: -dy * y * y; torch -dy * conj(y * y) (NaN imaginary parts at x = -1e-300 where holoflow gave 0).
sigmoid: with an infinite seed, torch's kernel dy * conj((1 - y) y) (NaN before at real x).
atanh: torch's (dy * 1) / conj(1 - x^2) (inf + NaN j before where torch is all-NaN for an infinite seed).
pow (tensor and number exponents, x ** 0.5, 0 ** x): torch's dy * conj(b a^(b-1)) (inf seeds); 0 ** z with a
  non-real z is NaN (torch's mask needs imag(z) == 0; holoflow gave 0); a real base with a complex exponent took
  the log of a negative base in the real dtype (NaN; torch promotes first: log(-1) = pi j).
div: the divisor's gradient -dy * conj((a / b) / b) in torch's order (was -(dy / conj b) conj(a / b)).
var / std: torch's ((2 / dof) dy) (x - mean) (dy * (x - mean) * scale made NaN real parts with an infinite seed).
logsumexp: the complex gradient was dy * exp(x - out), not conjugated (wrong on finite values too).
irfft / hfft / irfftn: torch doubles only the twinned bins (narrow(...) * 2); the weight vector of ones turned
  a zero imaginary part into NaN for infinite and NaN seeds.
inner (2-d): an einsum's summation order (-inf + NaN j where torch's mm gives NaN); now torch's tensordot, one mm.
addcmul / addcdiv: now torch's fused kernels (the composite gave NaN+NaNj at -0.5+2j, torch -inf+NaNj).
cumprod: torch's cumprod_backward (masked first-zero form; an infinite seed gave NaN+NaNj for inf+NaNj).
cumulative_trapezoid / trapezoid with x: ATen's (left + right) * dx (right + left differed at complex infinities).
Left (see LEFT): mm's gradient for a transposed (column-major) operand (torch picks its BLAS call by the
operand's strides), and diff / trapezoid (scalar spacing) with infinite seeds: the order torch's engine
accumulates gradients in. sinc: torch's zero test is on pi x^2 (0 for tiny x: NaN before).
Matched already: the rest of test_unary_dtypes' NAMES, abs, angle, real / imag / conj, view_as_real /
view_as_complex, complex, polar, add / sub / mul (alpha, scalars), matmul / mv / dot / vdot / outer,
vector norms of every order (zero vector included), fft / ifft / fftn / rfft / ihfft / fft2 / rfftn.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import holoflow as flow
from harness import same_special
from ops.test_unary_dtypes import NAMES

INF, NAN = float("inf"), float("nan")
X = torch.tensor([0j, 1 + 0j, -1 + 0j, 1j, -1j, 1 + 1j, -0.5 + 2j, 0.5 - 0.5j, complex(INF, 0), complex(-INF, 0),
                  complex(0, INF), complex(0, -INF), complex(INF, INF), complex(-INF, 1), complex(1, INF),
                  complex(NAN, 0), complex(0, NAN), complex(NAN, NAN), complex(1, NAN), complex(-1e-300, 0),
                  complex(-1, -0.0)], dtype=torch.complex128)
SEEDS = {"ones": 1 + 0j, "1j": 1j, "inf": complex(INF, 0), "nan": complex(NAN, 0)}
ROWS = torch.tensor([[1 + 1j, 2 - 1j, 0j], [0j, 0j, 0j], [complex(INF, 0), 1j, 1], [complex(NAN, 0), 1, 1j],
                     [complex(0, INF), complex(INF, 0), 0j], [complex(1, NAN), 0j, 0j], [-1e-300 + 0j, 0j, 0j],
                     [complex(INF, INF), 1, 1]], dtype=torch.complex128)
LEGACY = {"DoubleTensor", "FloatTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ShortTensor",
          "CharTensor", "ByteTensor", "BoolTensor"}
NOT_OURS = {"diff", "trapezoid", "trapz"}   # see LEFT



def _check(name: str, fn, x0: torch.Tensor = X) -> bool:
    """Compares ``fn(torch, x)`` and ``fn(holoflow, x)``: values and gradients for every seed;
    False when torch has no gradient to compare with."""
    x = x0.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            y = fn(torch, x)
            if not isinstance(y, torch.Tensor) or not y.requires_grad:
                return False
            torch.autograd.grad(y, x, torch.ones_like(y), retain_graph=True)
        except Exception:   # (torch refuses complex input here, or has no derivative)
            return False
        fx = flow.from_torch(x0.clone()).requires_grad_()
        fy = fn(flow, fx)
        assert same_special(fy.detach().to_torch(), y.detach()), \
            f"{name}: values {fy.detach().to_torch().flatten()[:8]} != {y.detach().flatten()[:8]}"
        for seed_name, v in SEEDS.items():
            seed = torch.full(y.shape, v if y.is_complex() else v.real, dtype=y.dtype)
            (want,) = torch.autograd.grad(y, x, seed, retain_graph=True)
            (got,) = flow.autograd.grad(fy, fx, flow.from_torch(seed), retain_graph=True)
            got = got.to_torch()
            bad = [(x0.flatten()[i].item(), want.flatten()[i].item(), got.flatten()[i].item())
                   for i in range(want.numel()) if not same_special(got.flatten()[i:i + 1], want.flatten()[i:i + 1])]
            assert not bad, f"{name}, seed {seed_name}: (x, torch, holoflow) {bad[:6]}"
    return True


def test_every_one_tensor_function_on_complex_special_values():
    names = [n for n in NAMES if n not in LEGACY | NOT_OURS]
    checked = [n for n in names if _check(n, lambda m, x, n=n: getattr(m, n)(x))]
    assert len(checked) >= 60, f"only {len(checked)} functions had a complex torch gradient to compare"


def _flip(x):
    return x.detach().flip(0)


FUNCTIONS = {
    "abs": lambda m, x: x.abs(), "angle": lambda m, x: x.angle(), "sgn": lambda m, x: x.sgn(),
    "real": lambda m, x: x.real, "imag": lambda m, x: x.imag, "conj": lambda m, x: x.conj(),
    "conj_physical": lambda m, x: m.conj_physical(x), "view_as_real": lambda m, x: m.view_as_real(x),
    "view_as_complex": lambda m, x: m.view_as_complex(m.view_as_real(x * 1)),
    "complex": lambda m, x: m.complex(x.real, x.imag.flip(0)), "polar": lambda m, x: m.polar(x.abs(), x.angle()),
    "polar parts": lambda m, x: m.polar(x.real, x.imag), "abs ** 2": lambda m, x: x.abs() ** 2,
    "square": lambda m, x: m.square(x), "sqrt": lambda m, x: m.sqrt(x), "reciprocal": lambda m, x: m.reciprocal(x),
    "sigmoid": lambda m, x: m.sigmoid(x), "atanh": lambda m, x: m.atanh(x),
    **{f"x ** {e}": (lambda m, x, e=e: x ** e) for e in (0, 0.5, 1, 2, 3, -1, -0.5, 1.5, 1j, 0j, 2 + 1j)},
    **{f"{b} ** x": (lambda m, x, b=b: b ** x) for b in (0, 0j, 2, 1j, -1)},
    "pow base": lambda m, x: m.pow(x, _flip(x)), "pow exponent": lambda m, x: m.pow(_flip(x), x),
    "pow real exponent": lambda m, x: m.pow(x, _flip(x).real), "pow real base": lambda m, x: m.pow(_flip(x).real, x),
    "pow zero base": lambda m, x: m.pow(m.zeros_like(x), x), "pow x * 0": lambda m, x: m.pow(x * 0, x.detach()),
    "add": lambda m, x: x + _flip(x), "sub": lambda m, x: _flip(x) - x, "mul": lambda m, x: x * _flip(x),
    "div": lambda m, x: x / _flip(x), "rdiv": lambda m, x: _flip(x) / x, "add alpha": lambda m, x: m.add(x, x, alpha=2),
    "sub alpha": lambda m, x: m.sub(x.detach(), x, alpha=2), "mul real": lambda m, x: x * _flip(x).real,
    "rdiv real": lambda m, x: _flip(x).real / x, "mul number": lambda m, x: x * (2 - 1j),
    "rdiv number": lambda m, x: (2 - 1j) / x, "div 0": lambda m, x: x / 0, "rsub": lambda m, x: 1 - x,
    "var": lambda m, x: x.reshape(7, 3).var(1), "std": lambda m, x: x.reshape(7, 3).std(1),
    "sum": lambda m, x: x.sum(), "mean": lambda m, x: x.mean(), "prod": lambda m, x: x.reshape(7, 3).prod(1),
    "cumsum": lambda m, x: x.cumsum(0), "lerp": lambda m, x: m.lerp(x, _flip(x), 0.25),
    "where": lambda m, x: m.where(x.real > 0, x, 0), "dot": lambda m, x: m.dot(x, _flip(x)),
    "vdot": lambda m, x: m.vdot(_flip(x), x), "matmul": lambda m, x: m.matmul(x.reshape(7, 3), x.detach().reshape(7, 3).T),
    "matmul other": lambda m, x: m.matmul(x.detach().reshape(7, 3), x.reshape(7, 3).T),
    "mv": lambda m, x: m.mv(x.reshape(7, 3), x.detach()[:3]), "outer": lambda m, x: m.outer(x, x.detach()),
    "inner": lambda m, x: m.inner(x.reshape(7, 3), x.detach().reshape(7, 3)),
    "addcmul": lambda m, x: m.addcmul(x, x, _flip(x)), "addcmul value": lambda m, x: m.addcmul(_flip(x), x, x, value=-0.5),
    "addcmul tensor2": lambda m, x: m.addcmul(x.detach(), _flip(x), x, value=2 - 1j),
    "addcdiv": lambda m, x: m.addcdiv(x, x, _flip(x)), "addcdiv divisor": lambda m, x: m.addcdiv(_flip(x), _flip(x), x),
    "addcdiv value": lambda m, x: m.addcdiv(x, _flip(x), x, value=0.5),
    "addcmul_": lambda m, x: (x * 1).addcmul_(_flip(x), x), "addcdiv_": lambda m, x: (x * 1).addcdiv_(x, _flip(x)),
    "cumprod": lambda m, x: x.cumprod(0),
    "cumulative_trapezoid x": lambda m, x: m.cumulative_trapezoid(x, x.detach().real.flip(0)),
    "cumulative_trapezoid dx": lambda m, x: m.cumulative_trapezoid(x, dx=0.5),
    "trapezoid x": lambda m, x: m.trapezoid(x, x.detach().real.flip(0)),
    "trapezoid complex x": lambda m, x: m.trapezoid(x.detach(), x),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_functions_on_complex_special_values(name):
    assert _check(name, FUNCTIONS[name])


ROW_FUNCTIONS = {
    **{f"vector_norm {p}": (lambda m, x, p=p: m.linalg.vector_norm(x, ord=p, dim=1)) for p in (2, 1, INF, -INF, 0.5,
                                                                                                1.5, 3)},
    "vector_norm zero vector": lambda m, x: m.linalg.vector_norm(x[1]), "norm": lambda m, x: x.norm(dim=1),
    "fft": lambda m, x: m.fft.fft(x, dim=1), "ifft": lambda m, x: m.fft.ifft(x, dim=1),
    "fft ortho": lambda m, x: m.fft.fft(x, dim=1, norm="ortho"), "fftn": lambda m, x: m.fft.fftn(x),
    "ifftn": lambda m, x: m.fft.ifftn(x), "fft2": lambda m, x: m.fft.fft2(x),
    "rfft": lambda m, x: m.fft.rfft(x.real, dim=1), "ihfft": lambda m, x: m.fft.ihfft(x.real, dim=1),
    "rfftn": lambda m, x: m.fft.rfftn(x.real), "irfft": lambda m, x: m.fft.irfft(x, dim=1),
    "irfft n=4": lambda m, x: m.fft.irfft(x, n=4, dim=1), "irfftn": lambda m, x: m.fft.irfftn(x),
    "hfft": lambda m, x: m.fft.hfft(x, dim=1), "fftshift": lambda m, x: m.fft.fftshift(x),
    "matmul": lambda m, x: m.matmul(x, x.detach().T), "matmul vector": lambda m, x: m.matmul(x, x.detach()[0]),
    "inner": lambda m, x: m.inner(x, x.detach()), "sum": lambda m, x: x.sum(1), "prod": lambda m, x: x.prod(1),
    "var": lambda m, x: x.var(1), "std": lambda m, x: x.std(1), "logsumexp": lambda m, x: m.logsumexp(x, 1),
    "normalize": lambda m, x: m.nn.functional.normalize(x, dim=1),
    "vecdot": lambda m, x: m.linalg.vecdot(x, x.detach().flip(0)),
    "cumprod": lambda m, x: x.cumprod(1), "cumprod dim 0": lambda m, x: x.cumprod(0),
    "cumprod no zero": lambda m, x: x[2:4].cumprod(1),
    "cumulative_trapezoid": lambda m, x: m.cumulative_trapezoid(x, dim=1),
}


@pytest.mark.parametrize("name", list(ROW_FUNCTIONS))
def test_rows_of_complex_special_values(name):
    assert _check(name, ROW_FUNCTIONS[name], ROWS)


_ORDER = ("the order torch's engine sums a tensor's gradients in (by node sequence number; its C++ "
          "composites create diff's lo slice and trapezoid's end selects first, GCC evaluating arguments right "
          "to left) differs from holoflow's LIFO engine; a complex add multiplies its second operand by 1, so an "
          "infinite seed's NaN parts land on other elements")
LEFT = {   # differences left, with why (xfail strict: fixing one shows up here)
    "mm transposed": (lambda m, x: m.mm(x.detach(), x.T), ROWS, "torch picks the BLAS call of mm's backward by "
                                                                "the operand's strides (layout-dependent NaN/inf)"),
    "diff": (lambda m, x: m.diff(x), X, _ORDER), "trapezoid": (lambda m, x: m.trapezoid(x), X, _ORDER),
    "trapezoid dx": (lambda m, x: m.trapz(x, dx=0.5), X, _ORDER),
}


@pytest.mark.parametrize("name", list(LEFT))
def test_left_differences(name):
    fn, x0, why = LEFT[name]
    try:
        _check(name, fn, x0)
    except AssertionError:
        pytest.xfail(why)
    pytest.fail(f"{name} now matches torch: move it out of LEFT")
