"""The rest of ``torch.linalg`` vs torch: matrix_rank, lstsq, LU (factor, unpack, solve),
solve_triangular, cond, multi_dot, vander, tensorinv/tensorsolve, diagonal, householder_product,
eig/eigvals, the ``_ex`` forms, LDL and the legacy ``torch.lu_solve``/``lu_unpack``/
``triangular_solve``: values, gradients (ATen's), batch SBP rules, named-tuple fields and errors."""
import pytest
import torch

import holoflow as flow
from harness import Case, error_like_torch, parametrize, randn


def _wellcond(*shape):
    """Random matrices far from singular: ``A + n I``."""
    def make(dt, g):
        a = randn(*shape, gen=g, dtype=dt)
        return (a + shape[-1] * torch.eye(shape[-1], dtype=dt),), {}
    return make


def _with_rhs(a_shape, b_shape, tri=None):
    """A well-conditioned (optionally triangular) A and a right-hand side B."""
    def make(dt, g):
        (a,), _ = _wellcond(*a_shape)(dt, g)
        a = a if tri is None else (a.triu() if tri == "upper" else a.tril())
        return (a, randn(*b_shape, gen=g, dtype=dt)), {}
    return make


def _spd(lib, a):
    return a @ a.mT + a.shape[-1] * a.new_ones(a.shape[-1]).diag_embed()   # on a's device


def _lu_args(a_shape, b_shape):
    """``lu_factor`` of a well-conditioned A (LU constant data, pivots int32) and B."""
    def make(dt, g):
        (a, b), _ = _with_rhs(a_shape, b_shape)(dt, g)
        LU, piv = torch.linalg.lu_factor(a)
        return (LU, piv, b), {}
    return make


def both(fn):
    """A case's (holoflow, torch) functions from one ``fn(lib, *xs)``."""
    return (lambda *xs, **kw: fn(flow, *xs, **kw)), (lambda *xs, **kw: fn(torch, *xs, **kw))


def case(name, fn, make, **kw):
    return Case(name, *both(fn), make, **kw)


CASES = []
for shape in ((3, 3), (2, 4, 4)):
    s = list(shape)
    CASES += [
        case(f"matrix_rank{s}", lambda L, a: L.linalg.matrix_rank(a), _wellcond(*shape), grad=False),
        case(f"matrix_rank-lowrank{s}", lambda L, a: L.linalg.matrix_rank(a[..., :2] @ a[..., :2, :]),
             _wellcond(*shape), grad=False),
        case(f"matrix_rank-atol-rtol{s}", lambda L, a: (L.linalg.matrix_rank(a, atol=4.0),
                                                        L.linalg.matrix_rank(a, rtol=0.5),
                                                        L.linalg.matrix_rank(a, atol=0.5, rtol=0.1)),
             _wellcond(*shape), grad=False),
        case(f"matrix_rank-hermitian{s}", lambda L, a: L.linalg.matrix_rank(a + a.mT, hermitian=True),
             _wellcond(*shape), grad=False),
        case(f"lu_factor{s}", lambda L, a: L.linalg.lu_factor(a), _wellcond(*shape)),
        case(f"lu_factor_ex{s}", lambda L, a: L.linalg.lu_factor_ex(a), _wellcond(*shape)),
        # P has no gradient (the harness's gradcheck compares differentiable outputs only: L, U)
        case(f"lu{s}", lambda L, a: L.linalg.lu(a), _wellcond(*shape), gradcheck=False),
        case(f"lu-LU{s}", lambda L, a: tuple(L.linalg.lu(a))[1:], _wellcond(*shape)),
        case(f"lu_solve{s}", lambda L, lu, p, b: L.linalg.lu_solve(lu, p, b), _lu_args(shape, shape[:-1] + (2,))),
        case(f"lu_solve-adjoint-right{s}", lambda L, lu, p, b: L.linalg.lu_solve(lu, p, b.mT, left=False, adjoint=True),
             _lu_args(shape, shape[:-1] + (2,))),
        case(f"torch.lu_solve{s}", lambda L, lu, p, b: L.lu_solve(b, lu, p), _lu_args(shape, shape[:-1] + (2,))),
        case(f"lu_unpack{s}", lambda L, lu, p, b: L.lu_unpack(lu, p), _lu_args(shape, shape), gradcheck=False),
        case(f"lu_unpack-LU{s}", lambda L, lu, p, b: tuple(L.lu_unpack(lu, p))[1:], _lu_args(shape, shape)),
        case(f"solve_triangular-upper{s}", lambda L, a, b: L.linalg.solve_triangular(a, b, upper=True),
             _with_rhs(shape, shape[:-1] + (2,), "upper")),
        case(f"solve_triangular-lower-right-unit{s}",
             lambda L, a, b: L.linalg.solve_triangular(a, b.mT, upper=False, left=False, unitriangular=True),
             _with_rhs(shape, shape[:-1] + (2,), "lower")),
        case(f"triangular_solve{s}", lambda L, a, b: L.triangular_solve(b, a), _with_rhs(shape, shape, "upper")),
        case(f"triangular_solve-transpose-unit{s}",
             lambda L, a, b: L.triangular_solve(b, a, upper=False, transpose=True, unitriangular=True),
             _with_rhs(shape, shape, "lower")),
        case(f"lstsq{s}", lambda L, a, b: L.linalg.lstsq(a, b), _with_rhs(shape, shape[:-1] + (2,))),
        case(f"eigvals{s}", lambda L, a: L.linalg.eigvals(a).abs(), _wellcond(*shape)),
        case(f"eig-values{s}", lambda L, a: L.linalg.eig(a).eigenvalues.abs(), _wellcond(*shape)),
        case(f"eig{s}", lambda L, a: L.linalg.eig(a), _wellcond(*shape), grad=False),
        case(f"inv_ex{s}", lambda L, a: L.linalg.inv_ex(a), _wellcond(*shape)),
        case(f"cholesky_ex{s}", lambda L, a: L.linalg.cholesky_ex(_spd(L, a), upper=True), _wellcond(*shape)),
        case(f"solve_ex{s}", lambda L, a, b: L.linalg.solve_ex(a, b), _with_rhs(shape, shape[:-1] + (2,))),
        case(f"ldl_factor{s}", lambda L, a: L.linalg.ldl_factor(_spd(L, a)), _wellcond(*shape), grad=False),
        case(f"ldl_factor_ex{s}", lambda L, a: L.linalg.ldl_factor_ex(_spd(L, a)), _wellcond(*shape), grad=False),
        case(f"ldl_solve{s}", lambda L, a, b: L.linalg.ldl_solve(*L.linalg.ldl_factor(_spd(L, a)), b),
             _with_rhs(shape, shape[:-1] + (2,)), grad=False),
        case(f"householder_product{s}", lambda L, a, t: L.linalg.householder_product(a[..., :2], t),
             lambda dt, g: ((randn(*shape, gen=g, dtype=dt), torch.rand(*shape[:-2], 2, generator=g,
                                                                          dtype=torch.float64).to(dt)), {})),
        case(f"diagonal{s}", lambda L, a: L.linalg.diagonal(a, offset=1), _wellcond(*shape)),
        case(f"vander{s}", lambda L, x: (L.linalg.vander(x), L.linalg.vander(x, N=5)),
             lambda dt, g: ((randn(*shape, gen=g, dtype=dt),), {})),
    ]
    # torch's cond for p not in (None, 2, -2) is not differentiable (it writes to inv_ex's output in place)
    CASES += [case(f"cond-{p}{s}", lambda L, a, p=p: L.linalg.cond(a, p), _wellcond(*shape), grad=p in (None, 2, -2))
              for p in (None, 2, -2, "fro", "nuc", 1, -1, float("inf"), float("-inf"))]
    CASES += [case(f"matrix_norm-{o}{s}", lambda L, a, o=o: L.linalg.matrix_norm(a, o, keepdim=True),
                   _wellcond(*shape)) for o in (2, -2, "nuc")]
CASES += [
    case("lstsq-tall-gelsd", lambda L, a, b: L.linalg.lstsq(a, b, driver="gelsd"),
         lambda dt, g: ((randn(5, 3, gen=g, dtype=dt), randn(5, 2, gen=g, dtype=dt)), {})),
    case("lstsq-gelss-rcond", lambda L, a, b: L.linalg.lstsq(a, b, 1e-3, driver="gelss"),
         lambda dt, g: ((randn(2, 5, 3, gen=g, dtype=dt), randn(2, 5, 2, gen=g, dtype=dt)), {})),
    case("lstsq-gels", lambda L, a, b: L.linalg.lstsq(a, b, driver="gels"),
         lambda dt, g: ((randn(5, 3, gen=g, dtype=dt), randn(5, 2, gen=g, dtype=dt)), {})),
    case("cond-rect", lambda L, a: L.linalg.cond(a), lambda dt, g: ((randn(4, 3, gen=g, dtype=dt),), {})),
    case("matrix_norm-2-dims", lambda L, a: L.linalg.matrix_norm(a, 2, dim=(2, 0)),
         lambda dt, g: ((randn(3, 2, 4, gen=g, dtype=dt),), {})),
    case("multi_dot", lambda L, a, b, c: L.linalg.multi_dot([a, b, c]),
         lambda dt, g: ((randn(2, 3, gen=g, dtype=dt), randn(3, 4, gen=g, dtype=dt), randn(4, 2, gen=g, dtype=dt)), {})),
    case("multi_dot-vectors", lambda L, a, b, c: L.linalg.multi_dot([a, b, c]),
         lambda dt, g: ((randn(3, gen=g, dtype=dt), randn(3, 4, gen=g, dtype=dt), randn(4, gen=g, dtype=dt)), {})),
    case("tensorinv", lambda L, a: L.linalg.tensorinv(a.reshape(6, 2, 3), ind=1), _wellcond(6, 6)),
    case("tensorinv-ind2", lambda L, a: L.linalg.tensorinv(a.reshape(2, 3, 3, 2)), _wellcond(6, 6)),
    case("tensorsolve", lambda L, a, b: L.linalg.tensorsolve(a.reshape(2, 3, 6), b),
         lambda dt, g: ((_wellcond(6, 6)(dt, g)[0][0], randn(2, 3, gen=g, dtype=dt)), {})),
    case("tensorsolve-dims", lambda L, a, b: L.linalg.tensorsolve(a.reshape(6, 2, 3), b, dims=(0,)),
         lambda dt, g: ((_wellcond(6, 6)(dt, g)[0][0], randn(2, 3, gen=g, dtype=dt)), {})),
]

globals().update(parametrize(CASES))


def test_named_tuple_fields_match_torch():
    a = torch.randn(3, 3, dtype=torch.float64) + 3 * torch.eye(3, dtype=torch.float64)
    fa = flow.from_torch(a)
    spd = a @ a.mT
    LU, piv = torch.linalg.lu_factor(a)
    for name, call in {
        "lu_factor": lambda L, x: L.linalg.lu_factor(x), "lu_factor_ex": lambda L, x: L.linalg.lu_factor_ex(x),
        "lu": lambda L, x: L.linalg.lu(x), "lstsq": lambda L, x: L.linalg.lstsq(x, x),
        "eig": lambda L, x: L.linalg.eig(x), "inv_ex": lambda L, x: L.linalg.inv_ex(x),
        "solve_ex": lambda L, x: L.linalg.solve_ex(x, x), "cholesky_ex": lambda L, x: L.linalg.cholesky_ex(x @ x.mT),
        "ldl_factor": lambda L, x: L.linalg.ldl_factor(x @ x.mT),
        "ldl_factor_ex": lambda L, x: L.linalg.ldl_factor_ex(x @ x.mT),
        "triangular_solve": lambda L, x: L.triangular_solve(x, x.triu()),
    }.items():
        got, want = call(flow, fa), call(torch, a)
        assert got._fields == type(want).__match_args__, name
        assert type(got).__name__ == type(want).__name__, name
    got = flow.lu_unpack(flow.from_torch(LU), flow.from_torch(piv))
    assert got._fields == type(torch.lu_unpack(LU, piv)).__match_args__
    assert flow.linalg.cholesky_ex(flow.from_torch(spd)).info.dtype == flow.int32


def test_ex_forms_report_singular_without_raising():
    z = torch.zeros(2, 3, 3)
    z[0] = torch.eye(3)
    for fn in ("inv_ex", "lu_factor_ex", "cholesky_ex"):
        got, want = getattr(flow.linalg, fn)(flow.from_torch(z)), getattr(torch.linalg, fn)(z)
        assert torch.equal(got.info.to_torch(), want.info), fn


def test_eig_eigenvector_gradient_matches_torch():
    """Complex outputs of a real input: the gradient is real and equals torch's (phase-invariant loss)."""
    a = torch.randn(2, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ta = a.clone().requires_grad_()
    torch.linalg.eig(ta).eigenvectors.abs()[..., 0].sum().backward()
    fa = flow.from_torch(a).requires_grad_()
    flow.linalg.eig(fa).eigenvectors.abs()[..., 0].sum().backward()
    assert fa.grad.dtype == flow.float64
    torch.testing.assert_close(fa.grad.to_torch(), ta.grad)


ERRORS = {
    "inv_ex non-square": lambda L: L.linalg.inv_ex(L.ones(2, 3)),
    "lu_factor singular": lambda L: L.linalg.lu_factor(L.zeros(3, 3)),
    "lu_factor 1-D": lambda L: L.linalg.lu_factor(L.ones(3)),
    "lu 1-D": lambda L: L.linalg.lu(L.ones(3)),
    "inv_ex singular check_errors": lambda L: L.linalg.inv_ex(L.zeros(3, 3), check_errors=True),
    "solve_ex singular check_errors": lambda L: L.linalg.solve_ex(L.zeros(3, 3), L.ones(3, 1), check_errors=True),
    "cholesky_ex not pd check_errors": lambda L: L.linalg.cholesky_ex(-L.eye(3), check_errors=True),
    "solve_triangular non-square": lambda L: L.linalg.solve_triangular(L.ones(2, 3), L.ones(2, 1), upper=True),
    "solve_triangular 1-D B": lambda L: L.linalg.solve_triangular(L.eye(3), L.ones(3), upper=True),
    "lu_solve non-square": lambda L: L.linalg.lu_solve(L.ones(2, 3), L.ones(2, dtype=L.int32), L.ones(2, 1)),
    "lstsq 1-D A": lambda L: L.linalg.lstsq(L.ones(3), L.ones(3)),
    "lstsq bad driver": lambda L: L.linalg.lstsq(L.ones(3, 3), L.ones(3, 1), driver="nope"),
    "eig non-square": lambda L: L.linalg.eig(L.ones(2, 3)),
    "eigvals 1-D": lambda L: L.linalg.eigvals(L.ones(3)),
    "matrix_rank 1-D": lambda L: L.linalg.matrix_rank(L.ones(3)),
    "cond 1-D": lambda L: L.linalg.cond(L.ones(3)),
    "cond bad p": lambda L: L.linalg.cond(L.eye(3), 3),
    "cond non-square p=1": lambda L: L.linalg.cond(L.ones(2, 3), 1),
    "matrix_norm bad ord": lambda L: L.linalg.matrix_norm(L.eye(3), 3),
    "multi_dot one tensor": lambda L: L.linalg.multi_dot([L.eye(3)]),
    "multi_dot 3-D": lambda L: L.linalg.multi_dot([L.eye(3), L.ones(2, 3, 3)]),
    "vander 0-d": lambda L: L.linalg.vander(L.tensor(1.0)),
    "tensorinv bad ind": lambda L: L.linalg.tensorinv(L.eye(4).reshape(2, 2, 4), ind=0),
    "tensorinv bad shape": lambda L: L.linalg.tensorinv(L.ones(2, 3, 4), ind=1),
    "tensorsolve bad shape": lambda L: L.linalg.tensorsolve(L.ones(2, 3, 4), L.ones(2, 3)),
    "householder wide": lambda L: L.linalg.householder_product(L.ones(2, 3), L.ones(2)),
    "ldl_factor non-square": lambda L: L.linalg.ldl_factor(L.ones(2, 3)),
    "triangular_solve non-square": lambda L: L.triangular_solve(L.ones(2, 1), L.ones(2, 3)),
}


@pytest.mark.parametrize("what", list(ERRORS))
def test_errors_like_torch(what):
    error_like_torch(ERRORS[what], what)


def test_singular_raises_linalg_error():
    err = error_like_torch(lambda L: L.linalg.solve_ex(L.zeros(2, 3, 3), L.ones(2, 3, 1), check_errors=True),
                           "singular solve_ex")
    assert isinstance(err, torch.linalg.LinAlgError) and "solve_ex" in str(err)
