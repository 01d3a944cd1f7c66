"""The ops that were ops/extra_ops.py (now ops/special, pointwise, stacking, scatter, flat_index, ...) vs
torch through the op-table harness: special functions, binary math, frexp,
isin/bucketize/histc/unravel_index, diff/kron/tensordot/rot90/trapezoid (composites), diag_embed,
block_diag, cartesian_prod, vander, cov/corrcoef, renorm, index_copy, masked_scatter, scatter_reduce;
forward, backward (ATen's derivatives), gradcheck, SBP rules on simulated ranks; the Tensor methods and
in-place forms; nbytes/itemsize/storage_offset."""
import sys

import pytest
import torch

import holoflow as flow
from harness import Case, parametrize, randn, torch_differentiates


def both(fn):
    return (lambda *a: fn(flow, *a)), (lambda *a: fn(torch, *a))


def _n(*shapes, low=None):
    return lambda dt, g: (tuple(randn(*s, gen=g, dtype=dt, low=low) for s in shapes), {})


def _ints(*shapes, lo=-20, hi=20):
    return lambda dt, g: (tuple(torch.randint(lo, hi, s, generator=g) for s in shapes), {})


P = {}
# special functions (lgamma/digamma/polygamma away from the poles)
P["lgamma"] = (lambda L, x: L.lgamma(x), _n((3, 4)))
P["lgamma-method"] = (lambda L, x: x.lgamma(), _n((5,), low=0.2))
P["digamma"] = (lambda L, x: L.digamma(x), _n((3, 4), low=0.3))
P["polygamma1"] = (lambda L, x: L.polygamma(1, x), _n((3, 4), low=0.3))
P["polygamma2-method"] = (lambda L, x: x.polygamma(2), _n((6,), low=0.5))
P["i0"] = (lambda L, x: L.i0(x), _n((3, 4)))
P["sinc"] = (lambda L, x: L.sinc(x), _n((3, 4)))
P["sinc-zero"] = (lambda L, x: L.sinc(x * 0), _n((4,)))
# torch.special's functions with kernels of their own (entr and ndtri on (0, 1) through a sigmoid)
P["special.entr"] = (lambda L, x: L.special.entr(x.sigmoid()), _n((3, 4)))
P["special.erfcx"] = (lambda L, x: L.special.erfcx(x), _n((3, 4)))
P["special.ndtri"] = (lambda L, x: L.special.ndtri(x.sigmoid()), _n((3, 4)))
P["special.log_ndtr"] = (lambda L, x: L.special.log_ndtr(x), _n((3, 4)))
P["special.i0e"] = (lambda L, x: L.special.i0e(x), _n((3, 4)))
P["special.i1"] = (lambda L, x: L.special.i1(x), _n((3, 4)))
P["special.i1e"] = (lambda L, x: L.special.i1e(x), _n((3, 4)))
P["hypot"] = (lambda L, a, b: L.hypot(a, b), _n((3, 4), (3, 4)))
P["hypot-broadcast"] = (lambda L, a, b: a.hypot(b), _n((3, 1), (4,)))
P["copysign"] = (lambda L, a, b: L.copysign(a, b), _n((3, 4), (3, 4)))
P["copysign-scalar"] = (lambda L, a: a.copysign(-1.0), _n((3, 4)))
P["ldexp"] = (lambda L, a, e: L.ldexp(a, e), lambda dt, g: (
    (randn(3, 4, gen=g, dtype=dt), torch.randint(0, 4, (3, 4), generator=g)), {}))
P["ldexp-float-exponent"] = (lambda L, a, e: a.ldexp(e), _n((3, 4), (3, 4)))


def _torch_nextafter(a, b):
    """torch.nextafter, or where the installed torch has no derivative for it (2.11) the same
    values with ATen's later derivative: d/da = 1 where a != b, else 0; d/db = 0 (here None, which
    the harness takes as zero). ``n - a`` is one ulp, exact, and ``a + (n - a)`` is ``n`` exactly."""
    if _NEXTAFTER_GRAD:
        return torch.nextafter(a, b)
    return torch.where(a != b, a, a.detach()) + (torch.nextafter(a, b) - a).detach()


_NEXTAFTER_GRAD = torch_differentiates(torch.nextafter, torch.zeros(1), torch.ones(1))
NEXTAFTER_CASES = {"nextafter": (lambda a, b: flow.nextafter(a, b), _n((3, 4), (3, 4))),
                   "nextafter-method-broadcast": (lambda a, b: a.nextafter(b), _n((3, 4), (3, 1))),
                   # ties (a == b: the output is b, and the gradient 0) in some elements
                   "nextafter-ties": (lambda a, b: a.nextafter(b), lambda dt, g: (
                       (torch.tensor([[1.0, 2.0, -3.0], [0.0, 5.0, 6.0]], dtype=dt),
                        torch.tensor([[1.0, 3.0, -3.0], [0.0, 5.0, 7.0]], dtype=dt)), {}))}
P["frexp"] = (lambda L, x: tuple(L.frexp(x * 10)), _n((3, 4)))
# composites
P["diff"] = (lambda L, x: L.diff(x), _n((3, 5)))
P["diff-n2-dim0-prepend-append"] = (lambda L, x, p, a: L.diff(x, 2, 0, prepend=p, append=a), _n((3, 4), (1, 4), (2, 4)))
P["diff-n-large"] = (lambda L, x: x.diff(n=4), _n((2, 3)))
P["kron"] = (lambda L, a, b: L.kron(a, b), _n((2, 3), (4, 2)))
P["kron-ranks"] = (lambda L, a, b: a.kron(b), _n((2,), (3, 2, 2)))
P["tensordot-2"] = (lambda L, a, b: L.tensordot(a, b), _n((3, 4, 5), (4, 5, 2)))
P["tensordot-lists"] = (lambda L, a, b: L.tensordot(a, b, dims=([0, 2], [2, 0])), _n((3, 4, 5), (5, 2, 3)))
P["tensordot-0"] = (lambda L, a, b: L.tensordot(a, b, dims=0), _n((2, 3), (4,)))
for k in (1, 2, 3, -1, 4):
    P[f"rot90-k{k}"] = (lambda L, x, k=k: L.rot90(x, k, (1, 2)), _n((2, 3, 4)))
P["rot90-method"] = (lambda L, x: x.rot90(), _n((3, 4)))
P["trapezoid"] = (lambda L, y: L.trapezoid(y), _n((3, 5)))
P["trapezoid-dx"] = (lambda L, y: L.trapezoid(y, dx=0.5, dim=0), _n((4, 3)))
P["trapezoid-x1d"] = (lambda L, y, x: L.trapezoid(y, x), _n((3, 5), (5,)))
P["trapezoid-xnd"] = (lambda L, y, x: L.trapezoid(y, x, dim=0), _n((4, 3), (4, 3)))
P["trapz"] = (lambda L, y, x: L.trapz(y, x), _n((2, 4), (4,)))
P["trapz-dx"] = (lambda L, y: L.trapz(y, dx=2.0), _n((2, 4)))
# primitives with ATen's derivative
P["diag_embed"] = (lambda L, x: L.diag_embed(x), _n((2, 3)))
P["diag_embed-offset-dims"] = (lambda L, x: x.diag_embed(1, 0, 2), _n((2, 3)))
P["block_diag"] = (lambda L, a, b, c: L.block_diag(a, b, c), _n((2, 3), (1,), (2, 2)))
P["cartesian_prod"] = (lambda L, a, b: L.cartesian_prod(a, b), _n((3,), (2,)))
P["cov"] = (lambda L, x: L.cov(x), _n((3, 6)))
P["cov-weights"] = (lambda L, x, a: x.cov(correction=0, fweights=L.tensor([1, 2, 1, 3, 1], device=x.device), aweights=a),
                    _n((2, 5), (5,), low=0.5))
P["corrcoef"] = (lambda L, x: x.corrcoef(), _n((3, 6)))
P["renorm"] = (lambda L, x: L.renorm(x, 2, 0, 1.0), _n((4, 3)))
P["renorm-p1-dim1"] = (lambda L, x: x.renorm(1, 1, 0.5), _n((4, 3)))
P["index_copy"] = (lambda L, x, s: L.index_copy(x, 1, L.tensor([3, 0], device=x.device), s), _n((3, 4), (3, 2)))
P["index_copy-method"] = (lambda L, x, s: x.index_copy(0, L.tensor([2, 1], device=x.device), s), _n((3, 4), (2, 4)))
P["masked_scatter"] = (lambda L, x, s: L.masked_scatter(x, x > 0, s), _n((3, 4), (12,)))
P["masked_scatter-broadcast"] = (lambda L, x, s: x.masked_scatter(L.tensor([True, False, True, False], device=x.device), s),
                                 _n((3, 4), (2, 4)))
for red in ("sum", "prod", "mean", "amax", "amin"):
    for inc in (True, False):
        P[f"scatter_reduce-{red}-{inc}"] = (
            lambda L, x, s, r=red, i=inc: L.scatter_reduce(x, 0, L.tensor([[0, 1, 0], [2, 0, 1]], device=x.device), s, r,
                                                           include_self=i), _n((3, 3), (2, 3)))
P["scatter_reduce-method-dim1"] = (lambda L, x, s: x.scatter_reduce(1, L.tensor([[0, 0], [1, 2], [2, 2]], device=x.device), s, "sum"),
                                   _n((3, 3), (3, 2)))

CASES = [Case(name, *both(fn), make) for name, (fn, make) in P.items()]
# gradcheck: finite differences see the ulp step's slope 1 at the ties too, ATen's rule says 0 there
CASES += [Case(name, fn, _torch_nextafter, make, gradcheck=name != "nextafter-ties")
          for name, (fn, make) in NEXTAFTER_CASES.items()]
# torch's gradient of an integer exponent is pow(2, e) in integers: 0 where e < 0 (matched, not
# what finite differences give)
CASES.append(Case("ldexp-negative-int-exponent", flow.ldexp, torch.ldexp, lambda dt, g: (
    (randn(3, 4, gen=g, dtype=dt), torch.randint(-3, 4, (3, 4), generator=g)), {}), gradcheck=False))


def _torch_vander(x, N=None, increasing=False):
    """torch.vander's algorithm out of place (torch's own backward of vander fails on its in-place
    cumprod_): the gradient oracle; values are checked against torch.vander itself below."""
    n = x.shape[0] if N is None else N
    cols = torch.cat([torch.ones_like(x).unsqueeze(1), x.unsqueeze(1).expand(-1, n - 1)], 1).cumprod(1)
    return cols if increasing else cols.flip(1)


for args in ((), (3, True), (1,), (6, False)):
    CASES.append(Case(f"vander{args}", lambda x, a=args: flow.vander(x, *a), lambda x, a=args: _torch_vander(x, *a),
                      _n((4,))))
    CASES.append(Case(f"vander-values{args}", lambda x, a=args: flow.vander(x, *a),
                      lambda x, a=args: torch.vander(x, *a), _n((4,)), grad=False))

# not differentiable
NP = {
    "heaviside": (lambda L, x, v: L.heaviside(x.round(), v), _n((3, 4), (4,))),
    "heaviside-method": (lambda L, x, v: x.round().heaviside(v), _n((3, 4), (3, 4))),
    "gcd": (lambda L, a, b: L.gcd(a, b), _ints((3, 4), (3, 4))),
    "gcd-method-broadcast": (lambda L, a, b: a.gcd(b), _ints((3, 4), (4,))),
    "isin": (lambda L, a, b: L.isin(a, b), _ints((3, 4), (6,), lo=0, hi=8)),
    "isin-invert-unique": (lambda L, a, b: L.isin(a, b.unique(), assume_unique=True, invert=True),
                           _ints((3, 4), (6,), lo=0, hi=8)),
    "isin-scalar-test": (lambda L, a: L.isin(a, 3), _ints((3, 4), lo=0, hi=5)),
    "isin-scalar-elem": (lambda L, b: L.isin(3, b), _ints((5,), lo=0, hi=5)),
    "isin-float": (lambda L, a, b: L.isin(a.round(), b.round()), _n((3, 4), (5,))),
    "bucketize": (lambda L, x: L.bucketize(x, L.tensor([-1.0, 0.0, 0.5], device=x.device)), _n((3, 4))),
    "bucketize-right-int32": (lambda L, x: L.bucketize(x.round(), L.tensor([-1.0, 0.0, 1.0], device=x.device), right=True,
                                                       out_int32=True), _n((3, 4))),
    "histc": (lambda L, x: L.histc(x, 5), _n((3, 4))),
    "histc-range": (lambda L, x: x.histc(4, -1, 1), _n((3, 5))),
    "unravel_index": (lambda L, i: L.unravel_index(i, (3, 4, 5)), _ints((2, 3), lo=0, hi=60)),
    "unravel_index-int-shape": (lambda L, i: L.unravel_index(i, 7), _ints((4,), lo=0, hi=7)),
}
CASES += [Case(name, *both(fn), make, grad=False) for name, (fn, make) in NP.items()]
globals().update(parametrize(CASES))


INPLACE = {
    "lgamma_": lambda L, x, y: x.lgamma_(),
    "digamma_": lambda L, x, y: x.digamma_(),
    "polygamma_": lambda L, x, y: x.polygamma_(1),
    "i0_": lambda L, x, y: x.i0_(),
    "sinc_": lambda L, x, y: x.sinc_(),
    "hypot_": lambda L, x, y: x.hypot_(y),
    "copysign_": lambda L, x, y: x.copysign_(y),
    "heaviside_": lambda L, x, y: x.heaviside_(y),
    "nextafter_": lambda L, x, y: x.nextafter_(y),
    "ldexp_": lambda L, x, y: x.ldexp_(L.tensor([1, -2, 3, 0])),
    "renorm_": lambda L, x, y: x.renorm_(2, 0, 1.0),
    "index_copy_": lambda L, x, y: x.index_copy_(0, L.tensor([1, 2]), y[:2]),
    "masked_scatter_": lambda L, x, y: x.masked_scatter_(y > 0, y * 3),
    "scatter_reduce_": lambda L, x, y: x.scatter_reduce_(1, L.tensor([[0, 0, 1, 1]] * 3), y, "amax"),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_methods_match_torch(name):
    """Values (the tensor itself is returned and written) and gradients through the write."""
    g = torch.Generator().manual_seed(0)
    x0, y0 = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    up = torch.randn(3, 4, generator=g)
    got = {}
    for L, conv in ((torch, lambda t: t.clone()), (flow, lambda t: flow.from_torch(t.clone()))):
        a, b = conv(x0).requires_grad_(), conv(y0).requires_grad_()
        x, y = a * 1, b * 1
        r = INPLACE[name](L, x, y)
        assert r is x
        differentiable = name != "heaviside_"
        if differentiable:
            (x * conv(up)).sum().backward()
        got[L.__name__] = (x.detach(), a.grad, b.grad)
    for h, t in zip(got["holoflow"], got["torch"]):
        if t is None:
            assert h is None or not h.to_torch().any()
        else:
            torch.testing.assert_close(h.to_torch(), t, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_inplace_on_leaf_that_requires_grad_raises_like_torch():
    for L in (torch, flow):
        with pytest.raises(RuntimeError, match="leaf"):
            L.ones(3, 4, requires_grad=True).renorm_(2, 0, 1.0)
        with pytest.raises(RuntimeError, match="leaf"):
            L.ones(3, requires_grad=True).lgamma_()


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "bool", "complex64"])
def test_nbytes_itemsize_storage_offset(dtype):
    t = torch.ones(4, 6, dtype=getattr(torch, dtype))
    f = flow.from_torch(t.clone())
    assert (f.nbytes, f.itemsize, f.storage_offset()) == (t.nbytes, t.itemsize, t.storage_offset())
    assert f[1:, 2:].storage_offset() == t[1:, 2:].storage_offset()
    assert f[2:].nbytes == t[2:].nbytes


def test_tensor_methods_exist_where_torch_has_them():
    names = ["diff", "kron", "rot90", "diag_embed", "histc", "lgamma", "digamma", "polygamma", "i0", "sinc",
             "hypot", "copysign", "heaviside", "frexp", "ldexp", "cov", "corrcoef", "renorm", "index_copy",
             "masked_scatter", "scatter_reduce", "gcd", "nextafter", "angle", "real", "imag"]
    names += [n + "_" for n in names if hasattr(torch.Tensor, n + "_")]
    missing = [n for n in names if hasattr(torch.Tensor, n) and not hasattr(flow.Tensor, n)]
    assert not missing, missing
    top = ["isin", "diff", "kron", "tensordot", "rot90", "diag_embed", "block_diag", "cartesian_prod", "bucketize",
           "histc", "lgamma", "digamma", "polygamma", "i0", "sinc", "hypot", "copysign", "heaviside", "frexp",
           "ldexp", "trapezoid", "trapz", "vander", "cov", "corrcoef", "renorm", "index_copy", "masked_scatter",
           "scatter_reduce", "unravel_index", "gcd", "nextafter"]
    assert not [n for n in top if not hasattr(flow, n)]


def test_frexp_is_a_named_tuple_and_exponent_not_differentiable():
    m, e = flow.frexp(flow.tensor([8.0, 0.3], requires_grad=True))
    assert m.requires_grad and not e.requires_grad and e.dtype == flow.int32
    assert flow.frexp(flow.tensor([8.0])).mantissa.tolist() == [0.5]


def test_composites_record_no_new_primitive():
    """diff, kron, tensordot, rot90, trapezoid are written from existing ops (exact, no grad code)."""
    from holoflow.core.interpret import Observe, pushed
    seen = []
    with pushed(Observe(lambda op, ins, attrs: (seen.append(op.name), ins)[1])):
        x = flow.randn(3, 4)
        flow.diff(x), flow.kron(x, x), flow.tensordot(x, x.t(), 1), flow.rot90(x), flow.trapezoid(x)
    assert not {"diff", "kron", "tensordot", "rot90", "trapezoid"} & set(seen)


@pytest.mark.parametrize("fn", ["lgamma", "digamma", "polygamma1", "polygamma3"])
def test_gamma_family_double_and_triple_backward_match_torch(fn):
    """lgamma' = digamma, digamma' = polygamma(1), polygamma(n)' = polygamma(n + 1), written as
    ops, so higher derivatives compose (torch's are the same chain)."""
    f = {"lgamma": lambda L, x: L.lgamma(x), "digamma": lambda L, x: L.digamma(x),
         "polygamma1": lambda L, x: L.polygamma(1, x), "polygamma3": lambda L, x: x.polygamma(3)}[fn]
    x0 = torch.tensor([0.7, 1.5, 3.0, 7.25], dtype=torch.float64)
    out = {}
    for L, conv in ((torch, lambda t: t.clone()), (flow, lambda t: flow.from_torch(t.clone()))):
        x = conv(x0).requires_grad_()
        g1, = L.autograd.grad(f(L, x).sum(), [x], create_graph=True)
        g2, = L.autograd.grad(g1.sum(), [x], create_graph=True)
        g3, = L.autograd.grad(g2.sum(), [x])
        out[L.__name__] = (g1.detach(), g2.detach(), g3)
    for h, t in zip(out["holoflow"], out["torch"]):
        torch.testing.assert_close(h.to_torch(), t)


def test_extra_ops_inside_nn_graph_match_torch():
    """Traced (meta shapes, then the plan): frexp's two outputs, ldexp, hypot, sinc, copysign, i0,
    and the composites, equal to torch eager."""
    def prog(L, x, e):
        m, ex = L.frexp(x * 3)
        y = m * 2 + L.ldexp(x, e) + L.hypot(x, x + 1) + L.sinc(x) + L.copysign(x, -1.0) + L.i0(x)
        return y + L.rot90(L.diff(x, dim=0, append=x[:1]), 2) + L.tensordot(x, x.t(), 1)[:, :1], ex

    class G(flow.nn.Graph):
        def build(self, x, e):
            return prog(flow, x, e)
    g = torch.Generator().manual_seed(0)
    x, e = torch.randn(3, 4, generator=g), torch.randint(-2, 3, (3, 4), generator=g)
    got, want = G()(flow.from_torch(x), flow.from_torch(e)), prog(torch, x, e)
    torch.testing.assert_close(got[0].to_torch(), want[0])
    assert torch.equal(got[1].to_torch(), want[1])


@pytest.mark.parametrize("fn", ["heaviside"])
def test_no_derivative_ops_require_grad_and_raise_in_backward_like_torch(fn):
    for L in (torch, flow):
        x = L.tensor([-1.0, 0.0, 2.0], requires_grad=True)
        y = getattr(L, fn)(x, L.tensor([0.5, 0.5, 0.5]))
        assert y.requires_grad
        with pytest.raises(RuntimeError, match="derivative for .*" + fn + ".* not implemented"):
            y.sum().backward()
    assert not flow.gcd(flow.tensor([4]), flow.tensor([6])).requires_grad


def test_nextafter_reference_without_torch_derivative_is_atens(monkeypatch):
    """The reference the cases use under torch 2.11 (no derivative) has the gradient of the
    installed torch's ATen derivative, ties included (run where torch has one)."""
    if not _NEXTAFTER_GRAD:
        pytest.skip("the installed torch has no derivative for nextafter")
    a0 = torch.tensor([[1.0, 2.0, -3.0], [0.0, 5.0, 6.0]])
    b0 = torch.tensor([[1.0, 3.0, -3.0], [0.0, 5.0, 7.0]])
    up = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    res = []
    for has in (True, False):
        monkeypatch.setattr(sys.modules[__name__], "_NEXTAFTER_GRAD", has)
        a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
        out = _torch_nextafter(a, b)
        ga, gb = torch.autograd.grad(out, (a, b), up, allow_unused=True)
        res.append((out.detach(), ga, torch.zeros_like(b0) if gb is None else gb))
    for x, y in zip(*res):
        assert torch.equal(x, y)


def test_sinc_double_backward_is_torchs():
    """sinc's gradient is written with ops (torch's formula), so it differentiates again: the
    same first and second derivatives as torch, NaN at 0 included (torch's masked formula)."""
    import numpy as np
    got = []
    for lib in (torch, flow):
        x = lib.tensor([-1.3, -0.5, 0.0, 0.25, 1.0, 2.2], dtype=lib.float64, requires_grad=True)
        (g,) = lib.autograd.grad(lib.sinc(x).sum(), x, create_graph=True)
        (gg,) = lib.autograd.grad((g * g).sum(), x)
        got.append((g.detach().numpy(), gg.numpy()))
    np.testing.assert_allclose(got[1][0], got[0][0], rtol=1e-12)
    np.testing.assert_allclose(got[1][1], got[0][1], rtol=1e-12, equal_nan=True)
