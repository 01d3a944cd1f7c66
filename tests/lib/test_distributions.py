"""holoflow.distributions vs torch.distributions: samples under one seed, log_prob/entropy values
and their gradients w.r.t. the parameters, rsample gradients, kl_divergence, argument errors."""
import math

import pytest
import torch

import holoflow as flow
from holoflow import distributions as FD
from torch import distributions as TD


def _params(*arrays):
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    fs = [flow.from_torch(t.detach().clone()).requires_grad_() for t in ts]
    return ts, fs


MAKERS = {
    "Normal": (lambda D, p: D.Normal(p[0], p[1]), [[0.5, -1.0, 2.0], [1.0, 0.3, 2.5]], [0.1, -0.7, 3.0]),
    "Uniform": (lambda D, p: D.Uniform(p[0], p[1]), [[0.0, -1.0, 2.0], [1.0, 0.5, 4.0]], [0.5, 0.0, 3.0]),
    "Bernoulli-probs": (lambda D, p: D.Bernoulli(probs=p[0]), [[0.2, 0.5, 0.9]], [1.0, 0.0, 1.0]),
    "Bernoulli-logits": (lambda D, p: D.Bernoulli(logits=p[0]), [[-1.0, 0.3, 2.0]], [0.0, 1.0, 1.0]),
    "Categorical-probs": (lambda D, p: D.Categorical(probs=p[0]), [[[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]]], [2, 0]),
    "Categorical-logits": (lambda D, p: D.Categorical(logits=p[0]), [[[0.2, -1.0, 0.5], [2.0, 0.1, 0.3]]], [1, 2]),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_log_prob_entropy_and_grads_match_torch(name):
    make, arrays, value = MAKERS[name]
    tp, fp = _params(*arrays)
    td, fd = make(TD, tp), make(FD, fp)
    dt = torch.int64 if name.startswith("Categorical") else torch.float64
    tv = torch.tensor(value, dtype=dt)
    tl, fl = td.log_prob(tv), fd.log_prob(flow.from_torch(tv.clone()))
    te, fe = td.entropy(), fd.entropy()
    torch.testing.assert_close(fl.to_torch(), tl)
    torch.testing.assert_close(fe.to_torch(), te)
    (tl.sum() + te.sum()).backward()
    (fl.sum() + fe.sum()).backward()
    for t, f in zip(tp, fp):
        torch.testing.assert_close(f.grad.to_torch(), t.grad)
    assert tuple(fd.batch_shape) == tuple(td.batch_shape)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_samples_equal_torchs_under_one_seed(name):
    make, arrays, _ = MAKERS[name]
    tp, fp = _params(*arrays)
    torch.manual_seed(3)
    ts = make(TD, tp).sample((4, 2))
    flow.manual_seed(3)
    fs = make(FD, fp).sample((4, 2))
    assert tuple(fs.shape) == tuple(ts.shape)
    torch.testing.assert_close(fs.to_torch(), ts)


@pytest.mark.parametrize("name", ["Normal", "Uniform"])
def test_rsample_gradients_match_torch(name):
    make, arrays, _ = MAKERS[name]
    tp, fp = _params(*arrays)
    torch.manual_seed(1)
    ts = make(TD, tp).rsample((5,))
    flow.manual_seed(1)
    fs = make(FD, fp).rsample((5,))
    torch.testing.assert_close(fs.to_torch(), ts.detach())
    (ts ** 2).sum().backward()
    (fs ** 2).sum().backward()
    for t, f in zip(tp, fp):
        torch.testing.assert_close(f.grad.to_torch(), t.grad)


def test_kl_divergence_matches_torch():
    tp, fp = _params([0.5, -1.0], [1.0, 0.3], [0.0, 0.2], [2.0, 0.5])
    tk = TD.kl_divergence(TD.Normal(tp[0], tp[1]), TD.Normal(tp[2], tp[3]))
    fk = FD.kl_divergence(FD.Normal(fp[0], fp[1]), FD.Normal(fp[2], fp[3]))
    torch.testing.assert_close(fk.to_torch(), tk)
    tk.sum().backward()
    fk.sum().backward()
    for t, f in zip(tp, fp):
        torch.testing.assert_close(f.grad.to_torch(), t.grad)
    tb, fb = _params([0.2, 0.7], [0.5, 0.4])
    torch.testing.assert_close(FD.kl_divergence(FD.Bernoulli(fb[0]), FD.Bernoulli(fb[1])).to_torch(),
                               TD.kl_divergence(TD.Bernoulli(tb[0]), TD.Bernoulli(tb[1])))


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="scale"):
        FD.Normal(flow.zeros(2), -flow.ones(2))
    with pytest.raises(ValueError, match="either `probs` or `logits`"):
        FD.Bernoulli()
    with pytest.raises(ValueError, match="probs"):
        FD.Bernoulli(probs=flow.tensor([1.5]))


@pytest.mark.parametrize("ndims", [0, 1, 2])
def test_independent_matches_torch(ndims):
    """Independent(Normal, n): shapes, log_prob/entropy summed over the reinterpreted dims and their
    gradients, rsample under one seed, KL of two Independents."""
    tp, fp = _params([[0.5, -1.0, 2.0], [0.1, 0.0, -0.3]], [[1.0, 0.3, 2.5], [0.7, 1.2, 0.4]],
                     [[0.0, 0.2, 1.0], [0.3, -0.1, 0.0]], [[2.0, 0.5, 1.0], [0.6, 0.9, 1.1]])
    td, fd = TD.Independent(TD.Normal(tp[0], tp[1]), ndims), FD.Independent(FD.Normal(fp[0], fp[1]), ndims)
    tq, fq = TD.Independent(TD.Normal(tp[2], tp[3]), ndims), FD.Independent(FD.Normal(fp[2], fp[3]), ndims)
    assert (tuple(fd.batch_shape), tuple(fd.event_shape)) == (tuple(td.batch_shape), tuple(td.event_shape))
    assert fd.has_rsample and not fd.has_enumerate_support
    torch.manual_seed(4)
    ts = td.rsample((3,))
    flow.manual_seed(4)
    fs = fd.rsample((3,))
    torch.testing.assert_close(fs.to_torch(), ts.detach())
    torch.testing.assert_close(fd.mean.to_torch(), td.mean.detach())
    torch.testing.assert_close(fd.variance.to_torch(), td.variance.detach())
    v = torch.tensor([[0.1, -0.7, 3.0], [1.0, 0.5, -0.2]], dtype=torch.float64)
    tl, fl = td.log_prob(v), fd.log_prob(flow.from_torch(v))
    te, fe = td.entropy(), fd.entropy()
    tk, fk = TD.kl_divergence(td, tq), FD.kl_divergence(fd, fq)
    for f, t in ((fl, tl), (fe, te), (fk, tk)):
        assert tuple(f.shape) == tuple(t.shape)
        torch.testing.assert_close(f.to_torch(), t.detach())
    (tl.sum() + te.sum() * 0.5 + tk.sum() * 2 + (ts ** 2).sum()).backward()
    (fl.sum() + fe.sum() * 0.5 + fk.sum() * 2 + (fs ** 2).sum()).backward()
    for t, f in zip(tp, fp):
        torch.testing.assert_close(f.grad.to_torch(), t.grad)


def test_independent_of_categorical_samples_and_errors_like_torch():
    logits = torch.tensor([[[0.2, -1.0, 0.5], [2.0, 0.1, 0.3]]] * 2, dtype=torch.float64)
    td, fd = TD.Independent(TD.Categorical(logits=logits), 1), FD.Independent(FD.Categorical(logits=flow.from_torch(logits)), 1)
    torch.manual_seed(2)
    ts = td.sample((5,))
    flow.manual_seed(2)
    fs = fd.sample((5,))
    torch.testing.assert_close(fs.to_torch(), ts)
    torch.testing.assert_close(fd.log_prob(fs).to_torch(), td.log_prob(ts))
    for lib in (TD, FD):
        base = lib.Normal(*(x if lib is TD else flow.from_torch(x) for x in (torch.zeros(2, 3), torch.ones(2, 3))))
        with pytest.raises(ValueError, match=r"reinterpreted_batch_ndims <= len\(base_distribution.batch_shape\), "
                                             r"actual 3 vs 2"):
            lib.Independent(base, 3)
        with pytest.raises(NotImplementedError):
            lib.kl_divergence(lib.Independent(base, 1), lib.Independent(base, 2))
    with pytest.raises(ValueError, match="must be >= 0"):
        FD.Independent(FD.Normal(flow.zeros(2), flow.ones(2)), -1)
    with pytest.raises(TypeError, match="must be an int"):
        FD.Independent(FD.Normal(flow.zeros(2), flow.ones(2)), 1.5)


def test_mode_variance_and_enumerate_support_match_torch():
    logits = torch.tensor([[0.2, -1.0, 3.0], [2.0, 0.1, 0.3]], dtype=torch.float64)
    probs = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    pairs = [(TD.Categorical(logits=logits), FD.Categorical(logits=flow.from_torch(logits))),
             (TD.Bernoulli(probs), FD.Bernoulli(flow.from_torch(probs)))]
    for td, fd in pairs:
        assert fd.has_enumerate_support == td.has_enumerate_support
        for name in ("mode", "mean", "variance"):
            got, want = getattr(fd, name), getattr(td, name)
            assert isinstance(got, flow.Tensor), name
            torch.testing.assert_close(got.to_torch(), want, equal_nan=True)
        for expand in (True, False):
            torch.testing.assert_close(fd.enumerate_support(expand).to_torch(), td.enumerate_support(expand))
    with pytest.raises(NotImplementedError, match="cartesian product"):
        FD.Independent(pairs[0][1], 1).enumerate_support()


def test_set_default_validate_args_like_torch():
    for D, lib in ((TD, torch), (FD, flow)):
        with pytest.raises(ValueError):
            D.Distribution.set_default_validate_args("yes")
        try:
            D.Distribution.set_default_validate_args(False)
            D.Normal(lib.zeros(2), -lib.ones(2))                   # not validated
            with pytest.raises(ValueError, match="scale"):
                D.Normal(lib.zeros(2), -lib.ones(2), validate_args=True)
        finally:
            D.Distribution.set_default_validate_args(True)
        with pytest.raises(ValueError, match="scale"):
            D.Normal(lib.zeros(2), -lib.ones(2))
        D.Normal(lib.zeros(2), -lib.ones(2), validate_args=False)


def _mixtures(D, logits, loc, scale):
    """A batch of 2 mixtures of 3 bivariate diagonal Gaussians, and of 3 univariate ones."""
    mv = D.MixtureSameFamily(D.Categorical(logits=logits), D.Independent(D.Normal(loc, scale), 1))
    uni = D.MixtureSameFamily(D.Categorical(logits=logits), D.Normal(loc[..., 0], scale[..., 0]))
    return mv, uni


def test_mixture_same_family_matches_torch():
    """log_prob (and its gradients), mean, variance, cdf, samples under one seed, shapes."""
    g = torch.Generator().manual_seed(0)
    arrays = [torch.randn(2, 3, generator=g).tolist(), torch.randn(2, 3, 2, generator=g).tolist(),
              (torch.rand(2, 3, 2, generator=g) + 0.5).tolist()]
    tp, fp = _params(*arrays)
    (tmv, tuni), (fmv, funi) = _mixtures(TD, *tp), _mixtures(FD, *fp)
    assert (tuple(fmv.batch_shape), tuple(fmv.event_shape)) == (tuple(tmv.batch_shape), tuple(tmv.event_shape))
    x = torch.randn(4, 2, 2, generator=g, dtype=torch.float64)
    tl, fl = tmv.log_prob(x), fmv.log_prob(flow.from_torch(x.clone()))
    torch.testing.assert_close(fl.to_torch(), tl)
    tl.sum().backward()
    fl.sum().backward()
    for t, f in zip(tp, fp):
        torch.testing.assert_close(f.grad.to_torch(), t.grad)
    for attr in ("mean", "variance", "stddev"):
        torch.testing.assert_close(getattr(fmv, attr).to_torch().detach(), getattr(tmv, attr).detach())
    v = x[:, :, 0]
    torch.testing.assert_close(funi.cdf(flow.from_torch(v.clone())).to_torch().detach(), tuni.cdf(v).detach())
    for tm, fm in ((tmv, fmv), (tuni, funi)):
        torch.manual_seed(5)
        ts = tm.sample((3,))
        torch.manual_seed(5)
        fs = fm.sample((3,))
        assert not fs.requires_grad
        torch.testing.assert_close(fs.to_torch(), ts)


def test_mixture_same_family_errors_like_torch():
    cat, normal = FD.Categorical(logits=flow.zeros(3)), FD.Normal(flow.zeros(4), flow.ones(4))
    with pytest.raises(ValueError, match="does not equal"):
        FD.MixtureSameFamily(cat, normal)
    with pytest.raises(ValueError, match="Categorical"):
        FD.MixtureSameFamily(normal, normal)
    with pytest.raises(ValueError, match="not compatible"):
        FD.MixtureSameFamily(FD.Categorical(logits=flow.zeros(2, 3)),
                             FD.Normal(flow.zeros(5, 3), flow.ones(5, 3)))


def _mvn_params():
    a = torch.tensor([[1.0, 0.2, -0.3], [0.4, 1.5, 0.1], [-0.2, 0.3, 0.8]], dtype=torch.float64)
    cov = a @ a.T + 0.5 * torch.eye(3, dtype=torch.float64)
    loc = torch.tensor([[0.5, -1.0, 2.0], [0.0, 0.3, -0.4]], dtype=torch.float64)     # batch of 2
    return loc, cov


@pytest.mark.parametrize("param", ["scale_tril", "covariance_matrix", "precision_matrix"])
def test_multivariate_normal_matches_torch(param):
    """MultivariateNormal (once missing): log_prob, entropy, their gradients w.r.t. loc and the
    matrix, the derived parameterizations, and rsample under one seed, with loc's batch broadcast
    against one matrix."""
    loc, cov = _mvn_params()
    matrix = {"scale_tril": torch.linalg.cholesky(cov), "covariance_matrix": cov,
              "precision_matrix": torch.linalg.inv(cov)}[param]
    (tl, tm), (fl, fm) = _params(loc.tolist(), matrix.tolist())
    td = TD.MultivariateNormal(tl, **{param: tm})
    fd = FD.MultivariateNormal(fl, **{param: fm})
    assert tuple(fd.batch_shape) == tuple(td.batch_shape) == (2,)
    assert tuple(fd.event_shape) == tuple(td.event_shape) == (3,)
    value = torch.tensor([[0.1, -0.7, 3.0], [1.0, 0.0, -1.0]], dtype=torch.float64)
    t_lp, f_lp = td.log_prob(value), fd.log_prob(flow.from_torch(value.clone()))
    torch.testing.assert_close(f_lp.to_torch(), t_lp)
    torch.testing.assert_close(fd.entropy().to_torch(), td.entropy())
    for attr in ("mean", "mode", "variance", "scale_tril", "covariance_matrix", "precision_matrix"):
        torch.testing.assert_close(getattr(fd, attr).to_torch(), getattr(td, attr).detach(), msg=attr)
    torch.manual_seed(5)
    t_s = td.rsample((4,))
    flow.manual_seed(5)
    f_s = fd.rsample((4,))
    torch.testing.assert_close(f_s.to_torch(), t_s.detach())
    (t_lp.sum() + td.entropy().sum() + (t_s ** 2).sum()).backward()
    (f_lp.sum() + fd.entropy().sum() + (f_s ** 2).sum()).backward()
    for t, f in zip((tl, tm), (fl, fm)):
        torch.testing.assert_close(f.grad.to_torch(), t.grad)


def test_multivariate_normal_errors_like_torch():
    loc, cov = _mvn_params()
    for D, lib_loc, lib_cov in ((TD, loc, cov), (FD, flow.from_torch(loc), flow.from_torch(cov))):
        with pytest.raises(ValueError, match="Exactly one of covariance_matrix or precision_matrix or scale_tril"):
            D.MultivariateNormal(lib_loc, covariance_matrix=lib_cov, scale_tril=lib_cov)
        with pytest.raises(ValueError, match="Exactly one of"):
            D.MultivariateNormal(lib_loc)
    # torch accepts this and fails later in log_prob; holoflow says so when it is built
    with pytest.raises(ValueError, match="does not match loc's event size 2"):
        FD.MultivariateNormal(flow.from_torch(loc)[0, :2], covariance_matrix=flow.from_torch(cov))


TRANSFORMS = {
    "tanh": lambda D: [D.TanhTransform()],
    "tanh-affine": lambda D: [D.TanhTransform(cache_size=1), D.AffineTransform(0.5, 2.0)],
    "compose": lambda D: [D.ComposeTransform([D.AffineTransform(-1.0, 0.5), D.SigmoidTransform()])],
    "exp-power": lambda D: [D.ExpTransform(), D.PowerTransform(2.0)],
    "softplus": lambda D: [D.SoftplusTransform()],
    "inverse-sigmoid": lambda D: [D.SigmoidTransform(), D.SigmoidTransform().inv],
}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transformed_distribution_matches_torch(name):
    """TransformedDistribution and the transforms (once missing): rsample under one seed, log_prob
    of those samples and of fresh values (through the inverses), and the parameter gradients."""
    (tl, ts), (fl, fs) = _params([0.3, -0.4, 1.1], [0.5, 0.8, 0.3])
    td = TD.TransformedDistribution(TD.Normal(tl, ts), TRANSFORMS[name](TD))
    fd = FD.TransformedDistribution(FD.Normal(fl, fs), TRANSFORMS[name](FD))
    assert tuple(fd.batch_shape) == tuple(td.batch_shape) and tuple(fd.event_shape) == tuple(td.event_shape)
    torch.manual_seed(7)
    t_x = td.rsample((4,))
    flow.manual_seed(7)
    f_x = fd.rsample((4,))
    torch.testing.assert_close(f_x.to_torch(), t_x.detach())
    t_lp, f_lp = td.log_prob(t_x), fd.log_prob(f_x)
    torch.testing.assert_close(f_lp.to_torch(), t_lp.detach())
    value = t_x.detach().clone() * 0.9 + 0.05
    t_lp2, f_lp2 = td.log_prob(value), fd.log_prob(flow.from_torch(value.clone()))
    torch.testing.assert_close(f_lp2.to_torch(), t_lp2)
    (t_lp.sum() + t_lp2.sum() + t_x.sum()).backward()
    (f_lp.sum() + f_lp2.sum() + f_x.sum()).backward()
    for t, f in zip((tl, ts), (fl, fs)):
        torch.testing.assert_close(f.grad.to_torch(), t.grad)


def test_transform_cache_and_user_subclass_like_torch():
    """cache_size=1 returns the remembered input for the last output (exact at tanh's +-1, where
    atanh is inf); a user Transform subclass with constraints and _call/_inverse works."""
    from holoflow.distributions import constraints

    class Cube(FD.transforms.Transform):
        domain, codomain, bijective, sign = constraints.real, constraints.real, True, +1

        def _call(self, x):
            return x ** 3

        def _inverse(self, y):
            return y.sign() * y.abs() ** (1 / 3)

        def log_abs_det_jacobian(self, x, y):
            return (3 * x ** 2).log()

    x = flow.tensor([20.0, -0.5])
    cached = FD.TanhTransform(cache_size=1)
    y = cached(x)
    assert cached.inv(y) is x and cached(x) is y
    assert bool(flow.isinf(FD.TanhTransform().inv(y)[0]))
    cube = Cube(cache_size=1)
    assert cube.inv(cube(x)) is x and cube.inv.inv is cube
    torch.testing.assert_close(FD.ComposeTransform([cube, FD.ExpTransform()]).log_abs_det_jacobian(
        flow.tensor([0.5]), flow.tensor([0.125]).exp()).to_torch(), torch.tensor([math.log(0.75) + 0.125]))
    with pytest.raises(ValueError, match="cache_size must be 0 or 1"):
        FD.TanhTransform(cache_size=2)
    assert constraints.interval(-1.0, 1.0).check(y).tolist() == [True, True]
    assert constraints.real_vector.event_dim == 1 and constraints.simplex.event_dim == 1


def test_log_normal_matches_torch():
    (tl, ts), (fl, fs) = _params([0.3, -0.4], [0.5, 0.8])
    td, fd = TD.LogNormal(tl, ts), FD.LogNormal(fl, fs)
    value = torch.tensor([0.7, 2.0], dtype=torch.float64)
    for attr in ("mean", "mode", "variance"):
        torch.testing.assert_close(getattr(fd, attr).to_torch(), getattr(td, attr).detach(), msg=attr)
    t_out = td.log_prob(value).sum() + td.entropy().sum() + td.cdf(value).sum()
    f_out = fd.log_prob(flow.from_torch(value)).sum() + fd.entropy().sum() + fd.cdf(flow.from_torch(value)).sum()
    torch.testing.assert_close(f_out.to_torch(), t_out.detach())
    t_out.backward()
    f_out.backward()
    for t, f in zip((tl, ts), (fl, fs)):
        torch.testing.assert_close(f.grad.to_torch(), t.grad)


@pytest.mark.parametrize("given", ["precision_matrix", "covariance_matrix", "scale_tril"])
def test_multivariate_normal_factors_are_torchs_bit_for_bit(given):
    """From a precision matrix torch takes an inverse-free factor (flipped Cholesky, triangular
    solve) and its precision from the factor (cholesky_inverse); holoflow inverted first, off in
    the last bits and less stable for ill-conditioned matrices."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 4, generator=g, dtype=torch.float64)
    p = a @ a.T + 0.1 * torch.eye(4, dtype=torch.float64)
    arg = torch.linalg.cholesky(p) if given == "scale_tril" else p
    want = torch.distributions.MultivariateNormal(torch.zeros(4, dtype=torch.float64), **{given: arg})
    got = flow.distributions.MultivariateNormal(flow.zeros(4, dtype=flow.float64), **{given: flow.from_torch(arg)})
    for name in ("scale_tril", "covariance_matrix", "precision_matrix"):
        assert torch.equal(getattr(got, name).to_torch(), getattr(want, name)), name
