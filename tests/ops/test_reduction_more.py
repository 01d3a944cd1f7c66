"""More reductions, scans and matrix functions vs torch: cummax/cummin, logcumsumexp, nanmean,
nanmedian, mode, quantile/nanquantile (every interpolation, NaN rows, tensor q), trace, dist,
median/kthvalue methods; mv, vdot, cross, addmv/addr/addbmm (and the in-place addmm_ family),
matrix_power, matrix_exp, slogdet/logdet, pinverse, cholesky/cholesky_inverse/cholesky_solve;
take/put, argwhere, diagflat, histogram, Tensor.unfold (a view); in-place cumsum_/cumprod_.
Values, gradients, float64 gradchecks and SBP signatures from the harness; second-order cases
validate the grad ops; errors are torch's exception classes, naming the op."""
import pytest
import torch

import holoflow as flow
from harness import F32, Case, error_like_torch, grad_of, parametrize, randn

# the torch side of the cholesky case calls the deprecated torch.cholesky, which warns
pytestmark = pytest.mark.filterwarnings("ignore:torch.cholesky is deprecated")

NAN = float("nan")


def x_of(*shape, scale=1.0):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt) * scale,), {})


def const(*values):
    """Fixed inputs (ties, NaN) in the case's dtype."""
    return lambda dt, g: (tuple(torch.tensor(v, dtype=dt) for v in values), {})


def with_nan(*shape, where=((0, 1), (1, 2))):
    def make(dt, g):
        x = randn(*shape, gen=g, dtype=dt)
        for idx in where:
            x[idx] = NAN
        return (x,), {}
    return make


def both(fn):
    """The same call under holoflow and torch: ``fn(lib, *args)``."""
    return lambda *a, **k: fn(flow, *a, **k), lambda *a, **k: fn(torch, *a, **k)


def case(name, fn, make, **kw):
    return Case(name, *both(fn), make, **kw)


TIES = [[1.0, 3.0, 3.0, 2.0, 5.0, 5.0], [2.0, 2.0, 0.0, 0.0, 1.0, 2.0]]
NAN_ROWS = [[1.0, NAN, 3.0, 2.0], [0.5, 4.0, -1.0, 2.5], [NAN, NAN, NAN, NAN]]

# -- scans ------------------------------------------------------------------------------------------
SHAPES = (((3, 4, 5), 1), ((6,), 0), ((3, 4), -1), ((0, 3), 1), ((), 0))
CASES = []
for _name in ("cummax", "cummin", "logcumsumexp"):
    for _shape, _dim in SHAPES:
        CASES.append(case(f"{_name}{list(_shape)}-dim{_dim}", lambda lib, x, n=_name, d=_dim: getattr(lib, n)(x, d),
                          x_of(*_shape)))
CASES += [
    case("cummax-ties-nan", lambda lib, x: (lib.cummax(x, 1), x.cummin(-1)),
         const([[1.0, 3.0, 3.0, NAN, 5.0, 2.0], [2.0, 2.0, 0.0, 0.0, 1.0, 2.0]]), gradcheck=False),
    case("cummax-method-ties", lambda lib, x: tuple(x.cummax(0)), const(TIES), gradcheck=False),
    case("logcumsumexp-large", lambda lib, x: x.logcumsumexp(1), x_of(3, 6, scale=200.0)),
    case("logcumsumexp-inf", lambda lib, x: lib.logcumsumexp(x, 0),
         const([float("-inf"), 1.0, float("-inf"), 2.0]), gradcheck=False),
    case("cumsum_-inplace", lambda lib, x: x.clone().cumsum_(1), x_of(3, 4)),
    case("cumprod_-inplace", lambda lib, x: x.clone().cumprod_(-1), x_of(3, 4)),
    case("cumsum_-0d", lambda lib, x: x.clone().cumsum_(0), x_of()),
]

# -- nan* reductions, order statistics ---------------------------------------------------------------
for _dim in (None, 1, (0, 2), -1):
    for _keep in (False, True):
        _args = {} if _dim is None and not _keep else {"dim": _dim, "keepdim": _keep}
        CASES.append(case(f"nanmean-dim{_dim}-keep{_keep}", lambda lib, x, a=_args: lib.nanmean(x, **a),
                          with_nan(3, 4, 5, where=((0, 1, 2), (2, 3, 1), (2, 3, 4)))))
CASES += [
    # sbp=False: 0/0 and x/0 divide the count; the checker's random partial-sum parts of those
    # (inf - inf) are NaN where the whole is +-inf, a property of the data, not of div's rule
    case("nanmean-all-nan-row", lambda lib, x: (lib.nanmean(x, 1), x.nanmean()), const(NAN_ROWS), gradcheck=False,
         sbp=False),
    case("nanmean-dtype", lambda lib, x: lib.nanmean(x, 0, dtype=lib.float64), with_nan(4, 3), dtypes=(F32,)),
    case("nanmean-empty-dim", lambda lib, x: lib.nanmean(x, 1), x_of(3, 0), gradcheck=False, sbp=False),
    case("nanmedian-all", lambda lib, x: (lib.nanmedian(x), x.nanmedian()), with_nan(3, 5)),
    case("nanmedian-all-nan", lambda lib, x: lib.nanmedian(x), const([NAN, NAN]), gradcheck=False),
    case("nanmedian-empty", lambda lib, x: lib.nanmedian(x), x_of(0, 3), gradcheck=False),
    case("nanmedian-ties", lambda lib, x: lib.nanmedian(x), const([[1.0, 2.0, 2.0], [2.0, NAN, 3.0]]),
         gradcheck=False),
    case("nanmedian-dim", lambda lib, x: tuple(lib.nanmedian(x, 1)), with_nan(3, 5)),
    case("nanmedian-dim-neg-keep", lambda lib, x: tuple(x.nanmedian(-1, keepdim=True)),
         with_nan(2, 3, 5, where=((0, 1, 2), (1, 2, 0)))),
    case("nanmedian-dim-rows", lambda lib, x: tuple(lib.nanmedian(x, 1)), const(NAN_ROWS), gradcheck=False),
    case("nanmedian-0d", lambda lib, x: tuple(lib.nanmedian(x, 0)), x_of()),
    case("median-methods", lambda lib, x: (x.median(), *x.median(1), *x.median(0, keepdim=True)), x_of(3, 5)),
    case("median-ties", lambda lib, x: (x.median(), *x.median(1)), const(TIES), gradcheck=False),
    case("kthvalue-method", lambda lib, x: (*x.kthvalue(2), *x.kthvalue(3, 0, True)), x_of(4, 5)),
    case("mode", lambda lib, x: tuple(lib.mode(x)), lambda dt, g: ((randn(3, 7, gen=g, dtype=dt).mul(1.5).round(),), {}),
         gradcheck=False),
    case("mode-dim0-keep", lambda lib, x: tuple(x.mode(0, True)), const(TIES), gradcheck=False),
    case("mode-neg-dim-3d", lambda lib, x: tuple(x.mode(-2)),
         lambda dt, g: ((randn(2, 6, 3, gen=g, dtype=dt).round(),), {}), gradcheck=False),
    case("mode-0d", lambda lib, x: tuple(lib.mode(x, 0)), x_of()),
]

# quantile / nanquantile: q a number, a 0-d or a 1-D tensor (differentiable: linear ranks read it).
# (q away from 0, 1 and from integer ranks: the gradcheck perturbs q too)
Q = {"num": lambda dt: 0.3, "0d": lambda dt: torch.tensor(0.65, dtype=dt),
     "1d": lambda dt: torch.tensor([0.05, 0.3, 0.55, 0.9], dtype=dt)}


def quantile_input(q, *shape, nan=False):
    """(x, q): q made here, so the harness moves it with x (and differentiates a tensor q)."""
    def make(dt, g):
        x = randn(*shape, gen=g, dtype=dt)
        if nan:
            x[0, 1] = NAN
            x[1] = NAN
        return (x, Q[q](dt)), {}
    return make


def q_case(fn, q, interp, dim, keep, nan=False, shape=(4, 5)):
    name = f"{fn}-q{q}-{interp}-dim{dim}-keep{keep}" + ("-nan" if nan else "")

    def call(lib, x, qv, f=fn, i=interp, d=dim, k=keep):
        return getattr(lib, f)(x, qv, d, k, interpolation=i)
    return case(name, call, quantile_input(q, *shape, nan=nan), gradcheck=not nan)


for _fn in ("quantile", "nanquantile"):
    for _interp in ("linear", "lower", "higher", "midpoint", "nearest"):
        CASES.append(q_case(_fn, "1d", _interp, 1, False))
        CASES.append(q_case(_fn, "num", _interp, None, False, nan=True))
    for _q, _dim, _keep in (("num", None, True), ("0d", -1, True), ("1d", 0, True), ("0d", None, False)):
        CASES.append(q_case(_fn, _q, "linear", _dim, _keep))
    CASES.append(q_case(_fn, "1d", "linear", 1, False, nan=True))
    CASES.append(q_case(_fn, "0d", "midpoint", 0, True, nan=True))
CASES += [
    case("quantile-method", lambda lib, x: (x.quantile(0.5), x.nanquantile(0.25, 1)), x_of(3, 4)),
    case("quantile-3d-dim1", lambda lib, x: lib.quantile(x, 0.4, 1), x_of(2, 5, 3)),
    case("quantile-0d", lambda lib, x: (lib.quantile(x, 0.3), lib.quantile(x, 0.3, 0, True)), x_of()),
    case("quantile-ties", lambda lib, x: lib.quantile(x, 0.5, 1), const(TIES), gradcheck=False),
    case("quantile-ends", lambda lib, x: (lib.quantile(x, 0.0, 1), lib.nanquantile(x, 1.0), lib.quantile(x, 0.25, 1)),
         x_of(3, 5)),
]

# trace, dist
CASES += [
    case("trace", lambda lib, x: (lib.trace(x), x.trace()), x_of(3, 3)),
    case("trace-rect", lambda lib, x: lib.trace(x), x_of(3, 5)),
    case("trace-int", lambda lib, x: lib.trace(x), lambda dt, g: ((torch.arange(9, dtype=torch.int32).reshape(3, 3),), {}),
         grad=False, dtypes=(F32,)),
    case("trace-empty", lambda lib, x: lib.trace(x), x_of(0, 2)),
]
for _p in (2, 1, 3.5, float("inf"), 0):
    CASES.append(case(f"dist-p{_p}", lambda lib, a, b, p=_p: (lib.dist(a, b, p), a.dist(b, p)),
                      lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), randn(4, gen=g, dtype=dt)), {}),
                      gradcheck=_p != float("inf"), grad=_p != 0))   # torch's backward of p=0 fails
CASES.append(case("dist-default", lambda lib, a, b: lib.dist(a, b), lambda dt, g: ((randn(5, gen=g, dtype=dt),
                                                                                  randn(5, gen=g, dtype=dt)), {})))


# -- products -----------------------------------------------------------------------------------------
def ins(*shapes):
    return lambda dt, g: (tuple(randn(*s, gen=g, dtype=dt) for s in shapes), {})


def shapes_case(name, fn, shapes, **kw):
    return case(name, fn, ins(*shapes), **kw)


CASES += [
    shapes_case("mv", lambda lib, a, v: (lib.mv(a, v), a.mv(v)), [(3, 4), (4,)]),
    shapes_case("mv-empty", lambda lib, a, v: lib.mv(a, v), [(3, 0), (0,)]),
    shapes_case("vdot", lambda lib, a, b: (lib.vdot(a, b), a.vdot(b)), [(5,), (5,)]),
    shapes_case("cross-dim", lambda lib, a, b: (lib.cross(a, b, dim=1), a.cross(b, -2)), [(2, 3, 4), (2, 3, 4)]),
    shapes_case("cross-bcast", lambda lib, a, b: lib.cross(a, b, dim=-1), [(2, 1, 3), (1, 4, 3)]),
    shapes_case("addmv", lambda lib, i, m, v: (lib.addmv(i, m, v), i.addmv(m, v, beta=0.5, alpha=-2)),
                [(3,), (3, 4), (4,)]),
    shapes_case("addmv-bcast", lambda lib, i, m, v: lib.addmv(i, m, v, beta=2), [(1,), (3, 4), (4,)]),
    shapes_case("addr", lambda lib, i, a, b: (lib.addr(i, a, b), i.addr(a, b, beta=0.5, alpha=3)), [(3, 4), (3,), (4,)]),
    shapes_case("addr-bcast", lambda lib, i, a, b: lib.addr(i, a, b, alpha=-1), [(4,), (3,), (4,)]),
    shapes_case("addbmm", lambda lib, i, a, b: (lib.addbmm(i, a, b), i.addbmm(a, b, beta=2, alpha=0.5)),
                [(3, 5), (2, 3, 4), (2, 4, 5)]),
    shapes_case("addbmm-bcast", lambda lib, i, a, b: lib.addbmm(i, a, b), [(5,), (2, 3, 4), (2, 4, 5)]),
    shapes_case("addmm_", lambda lib, i, a, b: i.clone().addmm_(a, b, beta=0.5, alpha=2), [(3, 5), (3, 4), (4, 5)]),
    shapes_case("baddbmm_", lambda lib, i, a, b: i.clone().baddbmm_(a, b, alpha=-1), [(2, 3, 5), (2, 3, 4), (2, 4, 5)]),
    shapes_case("addbmm_", lambda lib, i, a, b: i.clone().addbmm_(a, b, beta=3), [(3, 5), (2, 3, 4), (2, 4, 5)]),
    shapes_case("addmv_", lambda lib, i, m, v: i.clone().addmv_(m, v, alpha=0.5), [(3,), (3, 4), (4,)]),
    shapes_case("addr_", lambda lib, i, a, b: i.clone().addr_(a, b, beta=-1), [(3, 4), (3,), (4,)]),
]


# -- matrix functions ---------------------------------------------------------------------------------
def spd(lib, m):
    """A well-conditioned symmetric positive-definite matrix from any square ``m``."""
    return m @ m.mT + m.shape[-1] * lib.eye(m.shape[-1], dtype=m.dtype, device=m.device)


def factor(lib, m):
    """A lower-triangular factor with a safe diagonal, differentiable twice (linalg.cholesky's
    backward is ATen's, once)."""
    return m.tril() + 3 * lib.eye(m.shape[-1], dtype=m.dtype, device=m.device)


def well_conditioned(*shape):
    def make(dt, g):
        n = shape[-1]
        return (randn(*shape, gen=g, dtype=dt) * 0.3 + torch.eye(n, dtype=dt),), {}
    return make


for _n in (0, 1, 2, 3, 5, -1, -2):
    CASES.append(case(f"matrix_power-{_n}", lambda lib, a, n=_n: (lib.matrix_power(a, n), a.matrix_power(n)),
                      well_conditioned(2, 3, 3)))
CASES += [
    case("matrix_power-int", lambda lib, a: lib.matrix_power(a, 4),
         lambda dt, g: ((torch.arange(4).reshape(2, 2),), {}), grad=False, dtypes=(F32,)),
    case("matrix_exp", lambda lib, a: (lib.matrix_exp(a), a.matrix_exp()), x_of(3, 3)),
    case("matrix_exp-batch", lambda lib, a: lib.matrix_exp(a), x_of(2, 4, 4, scale=2.0)),
    case("matrix_exp-empty", lambda lib, a: lib.matrix_exp(a), x_of(2, 0, 0)),
    case("slogdet", lambda lib, a: (*lib.slogdet(a), *a.slogdet()), x_of(2, 3, 3)),
    case("logdet-spd", lambda lib, m: (lib.logdet(spd(lib, m)), spd(lib, m).logdet()), x_of(2, 3, 3)),
    case("logdet-any-sign", lambda lib, a: lib.logdet(a), x_of(4, 3, 3), gradcheck=False),
    case("det-inverse-methods", lambda lib, a: (a.det(), a.inverse()), well_conditioned(2, 3, 3)),
    case("pinverse-wide", lambda lib, a: (lib.pinverse(a), a.pinverse()), x_of(3, 5)),
    case("pinverse-tall-batch", lambda lib, a: lib.pinverse(a, rcond=1e-10), x_of(2, 5, 3)),
    case("linalg.pinv-atol", lambda lib, a: lib.linalg.pinv(a, atol=0.2), x_of(2, 5, 3)),
    case("linalg.pinv-hermitian", lambda lib, m: lib.linalg.pinv(spd(lib, m), hermitian=True), x_of(2, 3, 3)),
    case("cholesky", lambda lib, m: (lib.cholesky(spd(lib, m)), spd(lib, m).cholesky(upper=True)), x_of(2, 3, 3)),
    case("cholesky_inverse", lambda lib, m: lib.cholesky_inverse(lib.linalg.cholesky(spd(lib, m))), x_of(2, 3, 3)),
    case("cholesky_inverse-upper", lambda lib, m: lib.linalg.cholesky(spd(lib, m), upper=True).cholesky_inverse(True),
         x_of(3, 3)),
    # the kernel reads only L's triangle while torch's gradient is the full-matrix formula: no gradcheck
    case("cholesky_inverse-direct", lambda lib, low: lib.cholesky_inverse(low),
         lambda dt, g: ((randn(3, 3, gen=g, dtype=dt).tril() + 2 * torch.eye(3, dtype=dt),), {}), gradcheck=False),
    case("cholesky_solve", lambda lib, b, m: lib.cholesky_solve(b, lib.linalg.cholesky(spd(lib, m))),
         ins((3, 2), (3, 3))),
    case("cholesky_solve-bcast-upper", lambda lib, b, m: b.cholesky_solve(lib.linalg.cholesky(spd(lib, m), upper=True),
                                                                        True),
         ins((2, 3, 2), (3, 3))),
    case("cholesky_solve-batch", lambda lib, b, m: lib.cholesky_solve(b, lib.linalg.cholesky(spd(lib, m))),
         ins((2, 3, 4), (2, 3, 3))),
]

# -- flat indexing, argwhere, diagflat, histogram, unfold --------------------------------------------------
IDX = torch.tensor([[0, 5, -1], [11, 2, 5]])
UNIQUE_IDX = torch.tensor([0, 5, -1, 7])


def with_index(shape, index, *more):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt), index.clone(),
                           *(randn(*s, gen=g, dtype=dt) for s in more)), {})


CASES += [
    case("take", lambda lib, x, i: (lib.take(x, i), x.take(i)), with_index((3, 4), IDX)),
    case("take-0d", lambda lib, x, i: lib.take(x, i), with_index((), torch.tensor([0, 0]))),
    case("put", lambda lib, x, i, s: (lib.put(x, i, s), x.put(i, s)), with_index((3, 4), UNIQUE_IDX, (4,))),
    case("put-accumulate-dups", lambda lib, x, i, s: lib.put(x, i, s, accumulate=True), with_index((3, 4), IDX, (2, 3))),
    case("put_-inplace", lambda lib, x, i, s: x.clone().put_(i, s), with_index((3, 4), UNIQUE_IDX, (2, 2))),
    case("put_-accumulate", lambda lib, x, i, s: x.clone().put_(i, s, True), with_index((2, 6), IDX, (6,))),
    case("diagflat", lambda lib, x: (lib.diagflat(x), x.diagflat(1)), x_of(2, 2)),
    case("diagflat-1d-neg", lambda lib, x: lib.diagflat(x, -2), x_of(3)),
]


def torch_histogram(x, bins, **kw):
    """torch.histogram; on meta tensors (no aten kernel there) its output shapes and dtypes, which
    are all the harness compares on meta."""
    if x.device.type != "meta":
        return tuple(torch.histogram(x, bins, **kw))
    n = bins if isinstance(bins, int) else bins.shape[0] - 1
    return x.new_empty(n), x.new_empty(n + 1)


def histogram_case(name, bins, shape, weight=False, **kw):
    """Inputs: x, then the edges tensor when ``bins`` is a list, then the weight if asked."""
    def make(dt, g):
        x = randn(*shape, gen=g, dtype=dt)
        edges = [] if isinstance(bins, int) else [torch.tensor(bins, dtype=dt)]
        weights = [randn(*shape, gen=g, dtype=dt).abs()] if weight else []
        return (x, *edges, *weights), {}

    def args(rest):
        return (bins if isinstance(bins, int) else rest[0]), (rest[-1] if weight else None)

    def flow_fn(x, *rest):
        b, w = args(rest)
        return tuple(flow.histogram(x, b, weight=w, **kw))

    def torch_fn(x, *rest):
        b, w = args(rest)
        return torch_histogram(x, b, weight=w, **kw)
    return Case(name, flow_fn, torch_fn, make, grad=False)


CASES += [
    histogram_case("histogram-range", 5, (4, 6), range=(-2.0, 2.0)),
    histogram_case("histogram-default", 4, (10,)),
    histogram_case("histogram-density", 3, (3, 5), density=True),
    histogram_case("histogram-edges-weight", [-1.0, 0.0, 0.5, 2.0], (3, 4), weight=True),
]
for _shape, _args in (((3, 8), (1, 3, 2)), ((5, 2), (0, 2, 1)), ((2, 3, 4), (-1, 2, 2)), ((4,), (0, 4, 1)),
                      ((), (0, 1, 1)), ((6,), (0, 2, 3)), ((0, 3), (1, 2, 1))):
    CASES.append(case(f"unfold{list(_shape)}{list(_args)}", lambda lib, x, a=_args: x.unfold(*a), x_of(*_shape)))


# -- gradients as forward functions: backward of these is a double backward against torch -----------------


SECOND = {
    "cummax": (lambda lib, x: lib.cummax(x * x, 1).values, [(3, 5), (3, 5)]),
    "logcumsumexp": (lambda lib, x: lib.logcumsumexp(x * x, 1), [(3, 5), (3, 5)]),
    "nanmedian": (lambda lib, x: lib.nanmedian(x * x, 0).values, [(5, 3), (3,)]),
    "nanmedian-all": (lambda lib, x: lib.nanmedian(x * x), [(4, 3), ()]),
    "mode": (lambda lib, x: lib.mode((x * x).round(), 1).values * x.sum(1), [(3, 4), (3,)]),
    "quantile": (lambda lib, x: lib.quantile(x * x, 0.3, 1), [(3, 5), (3,)]),
    "cross": (lambda lib, a, b: lib.cross(a * a, b, dim=1), [(2, 3), (2, 3), (2, 3)]),
    "addmv": (lambda lib, i, m, v: lib.addmv(i, m * m, v, alpha=2), [(3,), (3, 4), (4,), (3,)]),
    "addr": (lambda lib, i, a, b: lib.addr(i, a * a, b), [(3, 4), (3,), (4,), (3, 4)]),
    "addbmm": (lambda lib, i, a, b: lib.addbmm(i, a * a, b), [(3, 5), (2, 3, 4), (2, 4, 5), (3, 5)]),
    "matrix_exp": (lambda lib, a: lib.matrix_exp(a * a), [(3, 3), (3, 3)]),
    "slogdet": (lambda lib, m: lib.slogdet(spd(lib, m)).logabsdet, [(2, 3, 3), (2,)]),
    "pinverse": (lambda lib, a: lib.pinverse(a * 1.5), [(3, 4), (4, 3)]),
    "cholesky_inverse": (lambda lib, m: lib.cholesky_inverse(factor(lib, m)), [(3, 3), (3, 3)]),
    "cholesky_solve": (lambda lib, b, m: lib.cholesky_solve(b * b, factor(lib, m)), [(3, 2), (3, 3), (3, 2)]),
    "take": (lambda lib, x: lib.take(x * x, lib.tensor([[0, 5], [5, -1]], device=x.device)), [(3, 4), (2, 2)]),
    "put": (lambda lib, x, s: lib.put(x * x, lib.tensor([1, 4, -1], device=x.device), s * s), [(2, 3), (3,), (2, 3)]),
    "unfold": (lambda lib, x: (x * x).unfold(1, 3, 1), [(2, 5), (2, 3, 3)]),
}
for _name, (_f, _shapes) in SECOND.items():
    CASES.append(Case(f"grad-of-{_name}", grad_of(flow, _f), grad_of(torch, _f), ins(*_shapes),
                      gradcheck=_name not in ("cummax", "nanmedian", "nanmedian-all", "mode"),
                      sbp=_name != "quantile"))   # (quantile's cast: see the quantile cases)

globals().update(parametrize(CASES))


# -- views, in-place, errors --------------------------------------------------------------------------------

def test_unfold_is_a_view_of_its_input():
    base = flow.arange(8.0).reshape(2, 4)
    win = base.unfold(1, 2, 2)
    assert win._view is not None
    win.mul_(10)
    base[0, 0] = -1.0
    want = torch.arange(8.0).reshape(2, 4) * 10
    want[0, 0] = -1.0
    torch.testing.assert_close(base.to_torch(), want)
    assert win.to_torch()[0, 0, 0].item() == -1.0


def test_write_through_unfold_view_reaches_base_gradient():
    def run(lib):
        x = lib.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], requires_grad=True)
        y = x * 1.0
        y.unfold(1, 2, 2).mul_(3.0)
        (g,) = lib.autograd.grad([(y * y).sum()], [x])
        return y.detach(), g
    for got, want in zip(run(flow), run(torch)):
        torch.testing.assert_close(got.to_torch(), want)


def test_inplace_methods_write_the_target():
    x = flow.ones(2, 3)
    same = x.addmm_(flow.ones(2, 4), flow.ones(4, 3), beta=2, alpha=0.5)
    assert same is x and x.tolist() == [[4.0] * 3] * 2
    c = flow.tensor([1.0, 2.0, 3.0])
    assert c.cumsum_(0) is c and c.tolist() == [1.0, 3.0, 6.0]
    assert c.cumprod_(0).tolist() == [1.0, 3.0, 18.0]
    p = flow.zeros(4)
    p.put_(flow.tensor([1, 1, 3]), flow.tensor([1.0, 2.0, 3.0]), accumulate=True)
    assert p.tolist() == [0.0, 3.0, 0.0, 3.0]


def test_cross_without_dim_warns_and_uses_first_size3_dim():
    a, b = torch.randn(3, 2), torch.randn(3, 2)
    with pytest.warns(UserWarning, match="holoflow.cross"):
        got = flow.cross(flow.from_torch(a), flow.from_torch(b))
    torch.testing.assert_close(got.to_torch(), torch.linalg.cross(a, b, dim=0))


def test_argwhere_matches_torch():
    for x in (torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]]), torch.tensor(3.0), torch.tensor(0.0), torch.zeros(0, 2)):
        fx = flow.from_torch(x)
        for got in (flow.argwhere(fx), fx.argwhere()):
            assert torch.equal(got.to_torch(), torch.argwhere(x))


def test_histogram_method_and_weights():
    x, w = torch.randn(20, dtype=torch.float64), torch.rand(20, dtype=torch.float64)
    got = flow.from_torch(x).histogram(6, range=(-1.0, 1.0), weight=flow.from_torch(w), density=True)
    want = torch.histogram(x, 6, range=(-1.0, 1.0), weight=w, density=True)
    for g, t in zip(got, want):
        torch.testing.assert_close(g.to_torch(), t)


def test_namedtuple_fields():
    x = flow.tensor([[1.0, 3.0, 2.0], [4.0, 4.0, 0.0]])
    assert x.cummax(1).indices.tolist() == [[0, 1, 1], [0, 1, 1]]
    assert flow.mode(x, 1).values.tolist() == [1.0, 4.0]
    assert flow.nanmedian(x, 0).indices.tolist() == [0, 0, 1]
    s = flow.slogdet(flow.tensor([[2.0, 0.0], [0.0, -3.0]]))
    assert s.sign.item() == -1.0 and abs(s.logabsdet.item() - torch.log(torch.tensor(6.0)).item()) < 1e-6
    h = flow.histogram(flow.tensor([0.0, 1.0, 1.0]), 2)
    assert h.hist.tolist() == [1.0, 2.0] and h.bin_edges.tolist() == [0.0, 0.5, 1.0]


def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


ERRORS = {
    "trace-3d": lambda m: m.trace(m.ones(2, 2, 2)),
    "mv-mismatch": lambda m: m.mv(m.ones(2, 3), m.ones(2)),
    "vdot-mismatch": lambda m: m.vdot(m.ones(2), m.ones(3)),
    "cross-no-size3": lambda m: m.cross(m.ones(2, 4), m.ones(2, 4), dim=1),
    "cross-ndim": lambda m: m.cross(m.ones(2, 3), m.ones(3), dim=-1),
    "quantile-q-range": lambda m: m.quantile(m.ones(3), 1.5),
    "quantile-q-tensor-range": lambda m: m.quantile(m.ones(3), m.tensor([0.5, 2.0])),
    "quantile-interp": lambda m: m.quantile(m.ones(3), 0.5, interpolation="foo"),
    "quantile-empty": lambda m: m.quantile(m.ones(0), 0.5),
    "quantile-int": lambda m: m.quantile(m.arange(3), 0.5),
    "quantile-q-dtype": lambda m: m.quantile(m.ones(3), m.tensor([0.5], dtype=m.float64)),
    "nanmean-int": lambda m: m.nanmean(m.arange(3)),
    "nanmedian-empty-dim": lambda m: m.nanmedian(m.ones(0, 3), 0),
    "mode-empty-dim": lambda m: m.mode(m.ones(0, 3), 0),
    "cummax-bad-dim": lambda m: m.cummax(m.ones(2), 3),
    "logcumsumexp-bad-dim": lambda m: m.logcumsumexp(m.ones(2, 2), -3),
    "kthvalue-k": lambda m: m.ones(3).kthvalue(5),
    "take-out-of-range": lambda m: m.take(m.ones(3), m.tensor([5])),
    "take-float-index": lambda m: m.take(m.ones(3), m.tensor([1.0])),
    "put-numel": lambda m: m.put(m.ones(3), m.tensor([1]), m.ones(2)),
    "matrix_power-rect": lambda m: m.matrix_power(m.ones(2, 3), 2),
    "matrix_exp-rect": lambda m: m.matrix_exp(m.ones(2, 3)),
    "logdet-rect": lambda m: m.logdet(m.ones(2, 3)),
    "slogdet-1d": lambda m: m.slogdet(m.ones(3)),
    "pinverse-1d": lambda m: m.pinverse(m.ones(3)),
    "cholesky_solve-sizes": lambda m: m.cholesky_solve(m.ones(3, 2), m.eye(2)),
    "addmv-mismatch": lambda m: m.addmv(m.ones(2), m.ones(2, 3), m.ones(2)),
    "addbmm-batch": lambda m: m.addbmm(m.ones(2, 2), m.ones(2, 2, 3), m.ones(3, 3, 2)),
    "addmm_-shape": lambda m: m.ones(2, 1).addmm_(m.ones(2, 3), m.ones(3, 2)),
    "unfold-size": lambda m: m.ones(3).unfold(0, 5, 1),
    "unfold-step": lambda m: m.ones(3).unfold(0, 2, 0),
    "unfold-dim": lambda m: m.ones(3).unfold(1, 2, 1),
    "histogram-int": lambda m: m.histogram(m.arange(4), 2),
}



@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_are_torchs_class_and_name_the_op(name):
    error_like_torch(ERRORS[name], name)


def test_linalg_namespace_spellings_match_torch_linalg():
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(3, 4, 3, generator=g, dtype=torch.float64) for _ in range(2))
    sq = torch.randn(2, 3, 3, generator=g, dtype=torch.float64)
    f = flow.from_torch
    pairs = [(flow.linalg.cross(f(a), f(b)), torch.linalg.cross(a, b)),   # dim=-1 by default, unlike torch.cross
             (flow.linalg.cross(f(a.transpose(1, 2)), f(b.transpose(1, 2)), dim=1),
              torch.linalg.cross(a.transpose(1, 2), b.transpose(1, 2), dim=1)),
             (flow.linalg.pinv(f(a)), torch.linalg.pinv(a)),
             (flow.linalg.pinv(f(a), rtol=0.5), torch.linalg.pinv(a, rtol=0.5)),
             (flow.linalg.matrix_exp(f(sq)), torch.linalg.matrix_exp(sq)),
             (flow.linalg.matrix_power(f(sq), -2), torch.linalg.matrix_power(sq, -2)),
             (flow.linalg.slogdet(f(sq))[1], torch.linalg.slogdet(sq)[1])]
    for got, want in pairs:
        torch.testing.assert_close(got.to_torch(), want)
