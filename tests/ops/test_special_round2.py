"""The rest of ``torch.special`` vs torch: the Bessel functions, the orthogonal polynomials and the
Hurwitz zeta function through the op-table harness (values, dtypes, broadcasting with tensor or
number arguments, gradients, SBP rules on simulated ranks); torch's missing derivatives raise the
same exception class; the ops inside nn.Graph and on a global tensor of 2 simulated ranks."""
import pytest
import torch

import holoflow as flow
from harness import Case, error_like_torch, parametrize, randn

BESSEL = ["airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0", "modified_bessel_i1",
          "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k0", "scaled_modified_bessel_k1",
          "spherical_bessel_j0"]
POLYNOMIALS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
               "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
               "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
               "laguerre_polynomial_l", "legendre_polynomial_p"]
# the second kind (y, k) is defined for x > 0 only (NaN or inf elsewhere: compared too, on their own case)
POSITIVE_ONLY = {"bessel_y0", "bessel_y1", "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k0",
                 "scaled_modified_bessel_k1"}


def both(fn):
    return (lambda *a: fn(flow, *a)), (lambda *a: fn(torch, *a))


def _n(*shapes, low=None, scale=1.0):
    return lambda dt, g: (tuple(randn(*s, gen=g, dtype=dt, low=low) * scale for s in shapes), {})


def _x_and_degrees(xshape, nshape, hi=7, n_dtype=torch.int64):
    """x in about [-1.5, 1.5] and integer degrees 0..hi-1 (an int or a float tensor)."""
    return lambda dt, g: ((randn(*xshape, gen=g, dtype=dt) * 0.6,
                           torch.randint(0, hi, nshape, generator=g).to(n_dtype)), {})


P = {}
for name in BESSEL:
    low = 0.1 if name in POSITIVE_ONLY else None
    P[name] = (lambda L, x, f=name: getattr(L.special, f)(x * 3), _n((3, 4), low=low))
P["bessel_y0-nonpositive"] = (lambda L, x: L.special.bessel_y0(-x), _n((2, 3), low=0.0))
P["modified_bessel_k1-nonpositive"] = (lambda L, x: L.special.modified_bessel_k1(-x), _n((2, 3), low=0.0))
for name in POLYNOMIALS:
    P[name] = (lambda L, x, n, f=name: getattr(L.special, f)(x, n), _x_and_degrees((3, 4), (3, 4)))
    P[f"{name}-broadcast"] = (lambda L, x, n, f=name: getattr(L.special, f)(x, n), _x_and_degrees((3, 1), (4,)))
    P[f"{name}-number-n"] = (lambda L, x, f=name: getattr(L.special, f)(x, 3), _n((2, 5), scale=0.6))
    P[f"{name}-number-x"] = (lambda L, n, f=name: getattr(L.special, f)(0.3, n), lambda dt, g: (
        (torch.randint(0, 7, (5,), generator=g),), {}))
P["chebyshev_polynomial_t-float-n"] = (lambda L, x, n: L.special.chebyshev_polynomial_t(x, n.detach()),
                                       _x_and_degrees((3, 4), (4,), n_dtype=torch.float64))
P["hermite_polynomial_h-fractional-and-negative-n"] = (lambda L, x: L.special.hermite_polynomial_h(x, -1) +
                                                       L.special.hermite_polynomial_h(x, 2.7), _n((5,)))
P["legendre_polynomial_p-large-n"] = (lambda L, x: L.special.legendre_polynomial_p(x.tanh(), 40), _n((6,)))
P["laguerre_polynomial_l-int-x"] = (lambda L, x, n: L.special.laguerre_polynomial_l(x, n), lambda dt, g: (
    (torch.randint(-3, 4, (3, 4), generator=g), torch.randint(0, 5, (4,), generator=g)), {}))
P["bessel_j0-int"] = (lambda L, x: L.special.bessel_j0(x), lambda dt, g: (
    (torch.randint(-5, 6, (3, 4), generator=g),), {}))
# zeta: differentiable in q (x a constant, a number, or detached)
P["zeta-q"] = (lambda L, q: L.special.zeta(L.tensor([[2.0], [3.5], [1.5]], dtype=q.dtype, device=q.device), q),
               _n((3, 4), low=0.3))
P["zeta-number-x"] = (lambda L, q: L.special.zeta(2.5, q), _n((3, 4), low=0.3))
P["zeta-detached-x-broadcast"] = (lambda L, x, q: L.special.zeta(x.detach(), q), _n((3, 1), (4,), low=1.2))
P["zeta-int-x"] = (lambda L, q: L.special.zeta(L.tensor([2, 3, 4, 5], device=q.device), q), _n((3, 4), low=0.3))

# (finite differences would move the detached x too)
CASES = [Case(name, *both(fn), make, gradcheck=name != "zeta-detached-x-broadcast") for name, (fn, make) in P.items()]
# x requires grad: the values only (torch's backward raises, tested below)
CASES += [Case("zeta-number-q", *both(lambda L, x: L.special.zeta(x, 2.0)), _n((3, 4), low=1.2), grad=False),
          Case("zeta-both-tensors", *both(lambda L, x, q: L.special.zeta(x, q)), _n((3, 4), (3, 4), low=1.2),
               grad=False)]
globals().update(parametrize(CASES))


def test_every_public_function_of_torch_special_is_here():
    public = [n for n in dir(torch.special) if not n.startswith("_") and callable(getattr(torch.special, n))
              and getattr(getattr(torch.special, n), "__module__", "") != "typing"]
    missing = [n for n in public if n not in ("torch",) and not hasattr(flow.special, n)]
    assert not missing, missing
    assert set(BESSEL + POLYNOMIALS + ["zeta"]) <= set(flow.special.__all__)


@pytest.mark.parametrize("name", BESSEL + POLYNOMIALS)
def test_not_differentiable_as_in_torch(name):
    """torch's outputs don't require grad (no derivative is declared): the same, and asking for
    one raises the same class."""
    def call(L):
        x = L.tensor([0.5, 1.5], dtype=L.float64, requires_grad=True)
        y = getattr(L.special, name)(*((x,) if name in BESSEL else (x, 3)))
        assert not y.requires_grad
        L.autograd.grad(y.sum(), x)
    error_like_torch(call, f"the gradient of {name}")


def test_zeta_derivative_in_x_raises_like_torch():
    def call(L, x_grad_only):
        x = L.tensor([2.0, 3.0], dtype=L.float64, requires_grad=True)
        q = L.tensor([1.5, 2.5], dtype=L.float64, requires_grad=not x_grad_only)
        y = L.special.zeta(x, q) if not x_grad_only else L.special.zeta(x, 2.0)
        assert y.requires_grad
        L.autograd.grad(y.sum(), x)
    for x_grad_only in (True, False):
        e = error_like_torch(lambda L: call(L, x_grad_only), "zeta's derivative in x")
        assert isinstance(e, NotImplementedError) and "zeta" in str(e)


def test_zeta_double_and_triple_backward_in_q_match_torch():
    """d/dq zeta(x, q) = -x zeta(x + 1, q) is written with the op: higher derivatives compose."""
    q0 = torch.tensor([0.7, 1.5, 3.0, 7.25], dtype=torch.float64)
    x0 = torch.tensor([2.0, 1.5, 3.25, 4.0], dtype=torch.float64)
    out = {}
    for L, conv in ((torch, lambda t: t.clone()), (flow, lambda t: flow.from_torch(t.clone()))):
        q = conv(q0).requires_grad_()
        g1, = L.autograd.grad(L.special.zeta(conv(x0), q).sum(), [q], create_graph=True)
        g2, = L.autograd.grad((g1 * g1).sum(), [q], create_graph=True)
        g3, = L.autograd.grad(g2.sum(), [q])
        out[L.__name__] = (g1.detach(), g2.detach(), g3)
    for h, t in zip(out["holoflow"], out["torch"]):
        torch.testing.assert_close(h.to_torch(), t)


@pytest.mark.parametrize("args", [(0.5, 2), (1, 2.0)])
def test_two_numbers_are_refused_like_torch(args):
    for name in ("zeta", "chebyshev_polynomial_t", "hermite_polynomial_he"):
        error_like_torch(lambda L, f=name: getattr(L.special, f)(*args), f"{name}{args}")


def test_complex_inputs_are_refused_like_torch():
    error_like_torch(lambda L: L.special.bessel_j0(L.ones(2, dtype=L.complex64)), "a complex bessel_j0")
    error_like_torch(lambda L: L.special.legendre_polynomial_p(L.ones(2, dtype=L.complex64), 2),
                     "a complex legendre_polynomial_p")
    error_like_torch(lambda L: L.special.zeta(L.ones(2, dtype=L.complex64), 2.0), "a complex zeta")


def _program(L, x, n):
    q = x.abs() + 0.5
    return (L.special.bessel_j0(x) + L.special.modified_bessel_k1(q) + L.special.chebyshev_polynomial_t(x, n)
            + L.special.hermite_polynomial_he(x, 3) + L.special.zeta(2.0, q) + L.special.airy_ai(x))


def test_new_special_functions_inside_nn_graph_match_torch():
    class G(flow.nn.Graph):
        def build(self, x, n):
            return _program(flow, x, n)
    g = torch.Generator().manual_seed(0)
    x, n = torch.randn(3, 4, generator=g), torch.randint(0, 6, (4,), generator=g)
    torch.testing.assert_close(G()(flow.from_torch(x), flow.from_torch(n)).to_torch(), _program(torch, x, n))


def test_new_special_functions_on_a_global_tensor_of_2_ranks():
    """Split rows (S(0)) and the degrees broadcast: the elementwise rules keep the split; zeta's
    gradient in q comes back to the local leaf."""
    from holoflow.core.sbp import B, S
    from holoflow.distributed import world
    g = torch.Generator().manual_seed(0)
    x0, n0 = torch.randn(4, 3, generator=g), torch.randint(0, 6, (3,), generator=g)

    def run(rank):
        pl = flow.placement("cpu", ranks=[0, 1])
        x = flow.from_torch(x0.clone()).requires_grad_()
        gx = x.to_global(placement=pl, sbp=[B]).to_global(sbp=[S(0)])
        y = _program(flow, gx, flow.from_torch(n0).to_global(placement=pl, sbp=[B]))
        sbp = tuple(y.sbp)
        y.sum().backward()
        return sbp, y.to_global(sbp=[B]).to_local().to_torch(), x.grad.to_torch()
    xt = x0.clone().requires_grad_()
    want = _program(torch, xt, n0)
    want.sum().backward()
    for sbp, y, xg in world.simulate(2, run, timeout=60):
        assert sbp == (S(0),)
        torch.testing.assert_close(y, want.detach())
        torch.testing.assert_close(xg, xt.grad)
