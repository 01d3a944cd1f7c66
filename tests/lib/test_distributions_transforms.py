"""The event-shaped transforms (Independent, Reshape, Softmax, StickBreaking, LowerCholesky,
PositiveDefinite, CorrCholesky, Cat, Stack, CumulativeDistribution) and biject_to / transform_to
against torch: forward and inverse values, log-det-Jacobians and their gradients, domains, codomains
and shapes; the registry's transforms for every constraint, and distributions built on them."""
import pytest
import torch

import holoflow as flow
from holoflow import distributions as FD
from torch import distributions as TD

F64 = torch.float64


def _tt(a):
    return torch.tensor(a, dtype=F64)


def _ft(a):
    return flow.from_torch(torch.tensor(a, dtype=F64))


def _close(got, want, what):
    got = got.to_torch() if isinstance(got, flow.Tensor) else got
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} vs torch {tuple(want.shape)}"
    torch.testing.assert_close(got.detach(), want.detach(), equal_nan=True, msg=lambda m: f"{what}: {m}")


# name -> (maker(D, T), input shape)
TRANSFORMS = {
    "Independent": (lambda D, T: D.transforms.IndependentTransform(D.transforms.ExpTransform(), 1), (3, 4)),
    "Reshape": (lambda D, T: D.transforms.ReshapeTransform((4,), (2, 2)), (3, 4)),
    "Softmax": (lambda D, T: D.transforms.SoftmaxTransform(), (3, 4)),
    "StickBreaking": (lambda D, T: D.transforms.StickBreakingTransform(), (3, 4)),
    "LowerCholesky": (lambda D, T: D.transforms.LowerCholeskyTransform(), (2, 3, 3)),
    "PositiveDefinite": (lambda D, T: D.transforms.PositiveDefiniteTransform(), (2, 3, 3)),
    "CorrCholesky": (lambda D, T: D.transforms.CorrCholeskyTransform(), (3, 6)),
    "Cat-event": (lambda D, T: D.transforms.CatTransform([D.transforms.ExpTransform(),
                                                          D.transforms.AffineTransform(1.0, 2.0)], dim=-1,
                                                         lengths=[2, 2]), (3, 4)),
    "Cat-batch": (lambda D, T: D.transforms.CatTransform([D.transforms.IndependentTransform(D.transforms.ExpTransform(), 1),
                                                          D.transforms.AffineTransform(1.0, T([2.0, 3.0, 0.5, 1.0]),
                                                                                       event_dim=1)],
                                                         dim=0, lengths=[1, 2]), (3, 4)),
    "Stack": (lambda D, T: D.transforms.StackTransform([D.transforms.ExpTransform(), D.transforms.AffineTransform(1.0, 2.0),
                                                        D.transforms.SigmoidTransform()], dim=1), (4, 3)),
    "CumulativeDistribution": (lambda D, T: D.transforms.CumulativeDistributionTransform(D.Normal(T([0.5, -1.0, 2.0]),
                                                                                                  T([1.0, 0.3, 2.5]))),
                               (2, 3)),
}


def _inputs(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=F64) * 0.7
    return x.requires_grad_(), flow.from_torch(x.detach().clone()).requires_grad_()


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transform_matches_torch(name):
    make, shape = TRANSFORMS[name]
    tt, ft = make(TD, _tt), make(FD, _ft)
    tx, fx = _inputs(shape)
    ty, fy = tt(tx), ft(fx)
    _close(fy, ty, f"{name} forward")
    _close(ft.inv(fy), tt.inv(ty), f"{name} inverse")
    _close(ft.inv(flow.from_torch(ty.detach())), tt.inv(ty.detach()), f"{name} inverse (uncached)")
    assert ft.bijective == tt.bijective
    assert (ft.domain.event_dim, ft.codomain.event_dim) == (tt.domain.event_dim, tt.codomain.event_dim)
    assert type(ft.codomain).__name__ == type(tt.codomain).__name__
    assert tuple(ft.forward_shape(shape)) == tuple(tt.forward_shape(torch.Size(shape)))
    assert tuple(ft.inverse_shape(ty.shape)) == tuple(tt.inverse_shape(ty.shape))
    assert bool(ft.codomain.check(fy).all()) == bool(tt.codomain.check(ty).all())
    try:
        tl = tt.log_abs_det_jacobian(tx, ty)
    except NotImplementedError:
        with pytest.raises(NotImplementedError):
            ft.log_abs_det_jacobian(fx, fy)
        outs = [ty]
        fouts = [fy]
    else:
        fl = ft.log_abs_det_jacobian(fx, fy)
        _close(fl, tl, f"{name} log_abs_det_jacobian")
        outs, fouts = [ty, tl], [fy, fl]
    ws = [torch.randn(o.shape, generator=torch.Generator().manual_seed(1), dtype=F64) for o in outs]
    (tg,) = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, ws)), [tx])
    (fg,) = flow.autograd.grad(sum((o * flow.from_torch(w)).sum() for o, w in zip(fouts, ws)), [fx])
    _close(fg, tg, f"{name} gradient")


def test_transform_errors_and_cache():
    for D in (TD, FD):
        with pytest.raises(ValueError):
            D.transforms.ReshapeTransform((4,), (3,))
        with pytest.raises(ValueError):
            D.transforms.CorrCholeskyTransform().forward_shape((5,))
    with pytest.raises(ValueError, match="holoflow"):
        FD.transforms.ReshapeTransform((2, 2), (4,)).forward_shape((3, 4))
    t = FD.transforms.IndependentTransform(FD.transforms.TanhTransform(), 1, cache_size=1)
    x = flow.tensor([[0.3, 40.0]], dtype=flow.float64)
    y = t(x)
    assert t.inv(y) is x      # the cached pair: exact although tanh(40) is 1
    assert FD.transforms.StickBreakingTransform() == FD.transforms.StickBreakingTransform()


CONSTRAINTS = [
    ("real", lambda C, T: C.real, (3,)),
    ("real_vector", lambda C, T: C.real_vector, (3,)),
    ("positive", lambda C, T: C.positive, (3,)),
    ("nonnegative", lambda C, T: C.nonnegative, (3,)),
    ("greater_than", lambda C, T: C.greater_than(T([1.0, -2.0, 0.5])), (3,)),
    ("greater_than_eq", lambda C, T: C.greater_than_eq(2.0), (3,)),
    ("less_than", lambda C, T: C.less_than(T([1.0, -2.0, 0.5])), (3,)),
    ("unit_interval", lambda C, T: C.unit_interval, (3,)),
    ("interval", lambda C, T: C.interval(T([-1.0, 0.0, 2.0]), T([1.0, 5.0, 3.0])), (3,)),
    ("half_open_interval", lambda C, T: C.half_open_interval(-2.0, 3.0), (3,)),
    ("simplex", lambda C, T: C.simplex, (2, 4)),
    ("lower_cholesky", lambda C, T: C.lower_cholesky, (2, 3, 3)),
    ("positive_definite", lambda C, T: C.positive_definite, (2, 3, 3)),
    ("positive_semidefinite", lambda C, T: C.positive_semidefinite, (2, 3, 3)),
    ("corr_cholesky", lambda C, T: C.corr_cholesky, (2, 6)),
    ("independent", lambda C, T: C.independent(C.positive, 1), (2, 3)),
    ("cat", lambda C, T: C.cat([C.positive, C.real, C.unit_interval], dim=-1, lengths=[1, 2, 1]), (2, 4)),
    ("stack", lambda C, T: C.stack([C.positive, C.real, C.unit_interval], dim=-1), (2, 3)),
]


@pytest.mark.parametrize("name,make,shape", CONSTRAINTS, ids=[c[0] for c in CONSTRAINTS])
@pytest.mark.parametrize("registry", ["biject_to", "transform_to"])
def test_constraint_registry_matches_torch(registry, name, make, shape):
    tc, fc = make(TD.constraints, _tt), make(FD.constraints, _ft)
    try:
        tt = getattr(TD, registry)(tc)
    except NotImplementedError:
        with pytest.raises(NotImplementedError, match="holoflow"):
            getattr(FD, registry)(fc)
        return
    ft = getattr(FD, registry)(fc)
    assert repr(ft).replace(" ", "") == repr(tt).replace(" ", "") or type(ft).__name__ == type(tt).__name__
    assert ft.bijective == tt.bijective
    tx, fx = _inputs(shape)
    ty, fy = tt(tx), ft(fx)
    _close(fy, ty, f"{registry}({name})")
    assert bool(fc.check(fy).all()) and bool(tc.check(ty).all())
    if tt.bijective:
        _close(ft.inv(flow.from_torch(ty.detach())), tt.inv(ty.detach()), f"{registry}({name}).inv")
        _close(ft.log_abs_det_jacobian(fx, fy), tt.log_abs_det_jacobian(tx, ty), f"{registry}({name}) log-det")


def test_registry_register_and_errors():
    reg = FD.constraint_registry.ConstraintRegistry()
    with pytest.raises(NotImplementedError, match="holoflow"):
        reg(FD.constraints.positive)
    reg.register(FD.constraints.positive, lambda c: FD.transforms.ExpTransform())
    assert isinstance(reg(FD.constraints.positive), FD.transforms.ExpTransform)
    with pytest.raises(TypeError):
        reg.register(int, lambda c: None)


def test_distributions_on_the_new_transforms():
    """A logistic-normal by StickBreaking, a Wishart-like PD matrix, a copula's uniform marginals."""
    loc, scale = _tt([[0.2, -0.4, 1.0]]), _tt([[1.0, 0.5, 2.0]])
    td = TD.TransformedDistribution(TD.Normal(loc, scale), TD.transforms.StickBreakingTransform())
    fd = FD.TransformedDistribution(FD.Normal(flow.from_torch(loc), flow.from_torch(scale)),
                                    FD.transforms.StickBreakingTransform())
    assert (tuple(fd.batch_shape), tuple(fd.event_shape)) == (tuple(td.batch_shape), tuple(td.event_shape))
    assert repr(fd.support) == repr(td.support)
    v = _tt([[0.1, 0.2, 0.3, 0.4]])
    _close(fd.log_prob(flow.from_torch(v)), td.log_prob(v), "stick-breaking log_prob")
    torch.manual_seed(4)
    ts = td.sample((2,))
    flow.manual_seed(4)
    _close(fd.sample((2,)), ts, "stick-breaking sample")
    base_t, base_f = TD.Normal(_tt([0.5, -1.0]), _tt([1.0, 0.3])), FD.Normal(_ft([0.5, -1.0]), _ft([1.0, 0.3]))
    tt = TD.TransformedDistribution(base_t, TD.transforms.CumulativeDistributionTransform(base_t))
    ft = FD.TransformedDistribution(base_f, FD.transforms.CumulativeDistributionTransform(base_f))
    u = _tt([0.3, 0.8])
    _close(ft.log_prob(flow.from_torch(u)), tt.log_prob(u), "uniform marginal log_prob")
    tx = TD.TransformedDistribution(TD.Normal(_tt([0.1, 0.2]), _tt([1.0, 1.0])),
                                    TD.transforms.ReshapeTransform((2,), (1, 2)))
    fx = FD.TransformedDistribution(FD.Normal(_ft([0.1, 0.2]), _ft([1.0, 1.0])),
                                    FD.transforms.ReshapeTransform((2,), (1, 2)))
    assert tuple(fx.event_shape) == tuple(tx.event_shape) and tuple(fx.batch_shape) == tuple(tx.batch_shape)
    e_t, e_f = tx.expand((3,)), fx.expand((3,))
    assert tuple(e_f.batch_shape) == tuple(e_t.batch_shape)
    w = _tt([[0.3, -0.2]])
    _close(e_f.log_prob(flow.from_torch(w)), e_t.log_prob(w), "expanded reshape log_prob")
