"""The last torch.distributions families (LowRankMultivariateNormal, ContinuousBernoulli, VonMises,
Wishart, LKJCholesky, GeneralizedPareto) against torch.distributions: shapes and flags, log_prob/
entropy and their gradients w.r.t. the parameters, the moments and lazy matrices, cdf/icdf, samples
and rsamples (values and gradients) under one seed, expand, repr, argument and sample errors, and
torch's quirks that holoflow keeps (Wishart's correction loop) or leaves (GeneralizedPareto in
float64); ``holoflow.distributions.distribution`` as torch's module."""
import warnings

import pytest
import torch

import holoflow as flow
import holoflow.distributions.distribution as FDD
import torch.distributions.distribution as TDD
from holoflow import distributions as FD
from torch import distributions as TD

from lib.dist_checks import F64, both as _both, close as _close, ft as _ft, grads_close as _grads_close
from lib.dist_checks import params as _params, tt as _tt

F32 = torch.float32


_S = [[[2.0, 0.3, 0.1], [0.3, 1.0, -0.2], [0.1, -0.2, 1.5]], [[1.0, -0.2, 0.0], [-0.2, 0.5, 0.1], [0.0, 0.1, 0.8]]]
_CORR = torch.tensor([[[1.0, 0.3, -0.2], [0.3, 1.0, 0.4], [-0.2, 0.4, 1.0]],
                      [[1.0, -0.5, 0.1], [-0.5, 1.0, 0.2], [0.1, 0.2, 1.0]]], dtype=F64)
_L_CORR = torch.linalg.cholesky(_CORR)
_TRIL = torch.linalg.cholesky(torch.tensor(_S, dtype=F64)).tolist()

# name -> (maker(D, params, T), parameter arrays, a value in the support, dtype)
SPECS = {
    "LowRankMultivariateNormal": (lambda D, p, T: D.LowRankMultivariateNormal(p[0], p[1], p[2]),
                                  [[[0.5, -1.0, 0.2], [0.0, 1.0, 2.0]],
                                   [[[1.0, 0.3], [0.2, -0.5], [0.0, 0.7]], [[0.4, 0.1], [-1.0, 0.2], [0.3, 0.3]]],
                                   [[1.0, 0.5, 2.0], [0.3, 0.9, 1.1]]], [[0.1, 0.2, 0.3], [-0.4, 0.5, 1.0]], F64),
    "LowRankMultivariateNormal-broadcast": (lambda D, p, T: D.LowRankMultivariateNormal(p[0], p[1], p[2]),
                                            [[0.5, -1.0, 0.2], [[[1.0], [0.2], [0.0]], [[0.4], [-1.0], [0.3]]],
                                             [1.0, 0.5, 2.0]], [0.1, 0.2, 0.3], F64),
    "ContinuousBernoulli-probs": (lambda D, p, T: D.ContinuousBernoulli(probs=p[0]), [[0.2, 0.4995, 0.8, 0.5]],
                                  [0.1, 0.5, 0.9, 0.3], F64),
    "ContinuousBernoulli-logits": (lambda D, p, T: D.ContinuousBernoulli(logits=p[0]), [[-1.0, 0.001, 2.0, 0.0]],
                                   [0.1, 0.5, 0.9, 0.3], F64),
    "ContinuousBernoulli-lims": (lambda D, p, T: D.ContinuousBernoulli(p[0], lims=(0.3, 0.7)), [[0.2, 0.45, 0.8]],
                                 [0.1, 0.5, 0.9], F64),
    "VonMises": (lambda D, p, T: D.VonMises(p[0], p[1]), [[0.5, -2.0, 3.0, 0.0], [0.1, 1.0, 10.0, 4.0]],
                 [0.1, 0.5, 7.0, -3.0], F64),
    "Wishart-covariance": (lambda D, p, T: D.Wishart(p[0], covariance_matrix=p[1]), [[3.0, 4.5], _S], _S, F64),
    "Wishart-precision": (lambda D, p, T: D.Wishart(p[0], precision_matrix=p[1]), [[3.5, 2.5], _S], _S, F64),
    "Wishart-scale_tril": (lambda D, p, T: D.Wishart(p[0], scale_tril=p[1]), [[3.0, 6.0], _TRIL], _S, F64),
    "LKJCholesky": (lambda D, p, T: D.LKJCholesky(3, p[0]), [[0.5, 2.0]], _L_CORR, F64),
    "LKJCholesky-2": (lambda D, p, T: D.LKJCholesky(2, p[0]), [[1.0, 3.0]], _L_CORR[:, :2, :2] /
                      _L_CORR[:, :2, :2].norm(dim=-1, keepdim=True), F64),
    # float32: torch's GeneralizedPareto compares with a float32 zero (see test_generalized_pareto_float64)
    "GeneralizedPareto": (lambda D, p, T: D.GeneralizedPareto(p[0], p[1], p[2]),
                          [[0.1, 0.2, 0.0, -1.0], [2.0, 1.0, 1.5, 0.5], [0.4, 0.0, -0.3, 1.2]],
                          [0.3, 0.6, 0.15, 2.0], F32),
}


def _build(name):
    make, arrays, value, dtype = SPECS[name]
    tp, fp = _params(arrays, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # Wishart's low-df warning
        td, fd = make(TD, tp, _tt), make(FD, fp, _ft)
    return td, fd, tp, fp, _tt(value, dtype)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_shapes_flags_support_and_repr(name):
    td, fd, *_ = _build(name)
    assert (tuple(fd.batch_shape), tuple(fd.event_shape)) == (tuple(td.batch_shape), tuple(td.event_shape))
    assert fd.has_rsample == td.has_rsample and fd.has_enumerate_support == td.has_enumerate_support
    assert list(fd.arg_constraints) == list(td.arg_constraints)
    for k, c in td.arg_constraints.items():
        assert type(fd.arg_constraints[k]).__name__ == type(c).__name__, k
    assert type(fd.support).__name__ == type(td.support).__name__
    assert fd.support.is_discrete == td.support.is_discrete and fd.support.event_dim == td.support.event_dim
    assert isinstance(fd, FD.ExponentialFamily) == isinstance(td, TD.ExponentialFamily)
    assert type(fd).__name__ == type(td).__name__ and type(fd).__module__.split(".")[-1] == \
        type(td).__module__.split(".")[-1]
    assert repr(fd) == repr(td)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_log_prob_entropy_and_grads(name):
    td, fd, tp, fp, v = _build(name)
    tl, fl = td.log_prob(v), fd.log_prob(flow.from_torch(v))
    _close(fl, tl, f"{name} log_prob")
    touts, fouts = [tl], [fl]
    te, fe = _both(td.entropy, fd.entropy)
    if te is not None:
        _close(fe, te, f"{name} entropy")
        touts.append(te)
        fouts.append(fe)
    _grads_close(fouts, touts, fp, tp, name)


PROPS = ("mean", "mode", "variance", "stddev", "scale_tril", "covariance_matrix", "precision_matrix")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_moments_matrices_cdf_icdf(name):
    td, fd, tp, fp, v = _build(name)
    touts, fouts = [], []
    for prop in PROPS:
        if not hasattr(type(td), prop):
            assert not hasattr(type(fd), prop), f"{name}.{prop}: torch has none"
            continue
        t, f = _both(lambda: getattr(td, prop), lambda: getattr(fd, prop))
        if t is not None:
            _close(f, t, f"{name}.{prop}")
            touts.append(t)
            fouts.append(f)
    tc, fc = _both(lambda: td.cdf(v), lambda: fd.cdf(flow.from_torch(v)))
    if tc is not None:
        _close(fc, tc, f"{name}.cdf")
        touts.append(tc)
        fouts.append(fc)
    q = torch.linspace(0.05, 0.95, td.batch_shape.numel(), dtype=v.dtype).reshape(td.batch_shape)
    ti, fi = _both(lambda: td.icdf(q), lambda: fd.icdf(flow.from_torch(q)))
    if ti is not None:
        _close(fi, ti, f"{name}.icdf")
        touts.append(ti)
        fouts.append(fi)
    touts = [t for t in touts if t.requires_grad]
    fouts = [f for f in fouts if f.requires_grad]
    assert len(touts) == len(fouts)
    if touts:
        _grads_close(fouts, touts, fp, tp, f"{name} moments")


def _sample(d, seed, lib, *args, method="sample"):
    (torch if lib is TD else flow).manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(d, method)(*args)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_samples_equal_torchs_under_one_seed(name):
    td, fd, *_ = _build(name)
    ts, fs = _sample(td, 7, TD, (4, 2)), _sample(fd, 7, FD, (4, 2))
    _close(fs, ts, f"{name}.sample")
    assert not fs.requires_grad
    _close(_sample(fd, 8, FD), _sample(td, 8, TD), f"{name}.sample()")


RSAMPLED = sorted(n for n in SPECS if _build(n)[0].has_rsample)


@pytest.mark.parametrize("name", RSAMPLED)
def test_rsample_values_and_grads_under_one_seed(name):
    td, fd, tp, fp, _ = _build(name)
    ts, fs = _sample(td, 3, TD, (5,), method="rsample"), _sample(fd, 3, FD, (5,), method="rsample")
    _close(fs, ts, f"{name}.rsample")
    if name.startswith("Wishart"):
        # torch's own backward fails here (its correction loop writes into the mask index_put saved);
        # its draws are the second Bartlett batch (every regular sample is redrawn once): differentiate that
        torch.manual_seed(3)
        td._bartlett_sampling((5,))
        ts = td._bartlett_sampling((5,))
        _close(fs, ts, f"{name}.rsample (second Bartlett batch)")
    w = torch.randn(ts.shape, dtype=ts.dtype)
    _grads_close([fs * flow.from_torch(w)], [ts * w], fp, tp, f"{name}.rsample")


def test_not_reparameterizable_families_refuse_rsample():
    names = sorted(set(SPECS) - set(RSAMPLED))
    assert names == ["LKJCholesky", "LKJCholesky-2", "VonMises"]
    for name in names:
        td, fd, *_ = _build(name)
        with pytest.raises(NotImplementedError):
            td.rsample()
        with pytest.raises(NotImplementedError, match="holoflow"):
            fd.rsample()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_expand(name):
    td, fd, _, _, v = _build(name)
    shape = (4,) + tuple(td.batch_shape)
    te, fe = td.expand(shape), fd.expand(shape)
    assert type(fe) is type(fd) and tuple(fe.batch_shape) == tuple(te.batch_shape)
    assert tuple(fe.event_shape) == tuple(te.event_shape)
    assert fe._validate_args == fd._validate_args
    _close(fe.log_prob(flow.from_torch(v)), te.log_prob(v), f"{name}.expand log_prob")
    _close(_sample(fe, 2, FD), _sample(te, 2, TD), f"{name}.expand sample")
    _close(_sample(fe, 2, FD, (3,)), _sample(te, 2, TD, (3,)), f"{name}.expand sample((3,))")


def test_scalar_parameters():
    """Python numbers as parameters: batch shape (), torch's default dtype."""
    cases = [(lambda D, T: D.ContinuousBernoulli(0.3), 0.4), (lambda D, T: D.ContinuousBernoulli(logits=-0.7), 0.4),
             (lambda D, T: D.VonMises(1.0, 2.0), 0.4), (lambda D, T: D.LKJCholesky(3, 0.7), _L_CORR[0].float()),
             (lambda D, T: D.GeneralizedPareto(0.0, 1.0, 0.2), 0.4),
             (lambda D, T: D.Wishart(4, covariance_matrix=T(_S[0])), torch.tensor(_S[0]))]
    for make, value in cases:
        td, fd = make(TD, lambda a: torch.tensor(a)), make(FD, lambda a: flow.tensor(a))
        assert tuple(fd.batch_shape) == tuple(td.batch_shape) == ()
        v = torch.as_tensor(value)
        _close(fd.log_prob(flow.from_torch(v)), td.log_prob(v), type(td).__name__)
        _close(_sample(fd, 0, FD, (3,)), _sample(td, 0, TD, (3,)), f"{type(td).__name__} sample")
        assert repr(fd) == repr(td)


def test_von_mises_float32_and_tiny_concentrations():
    """Sampling runs in float64 and casts back; a tiny concentration (the Taylor proposal) samples."""
    for loc, conc, dtype in (([0.5, -1.0], [1e-6, 50.0], F32), ([3.0, 0.0], [1e-7, 0.3], F64)):
        td, fd = TD.VonMises(_tt(loc, dtype), _tt(conc, dtype)), FD.VonMises(_ft(loc, dtype), _ft(conc, dtype))
        ts, fs = _sample(td, 11, TD, (200,)), _sample(fd, 11, FD, (200,))
        _close(fs, ts, f"VonMises {dtype} sample")
        assert bool((fs.to_torch().abs() <= torch.pi).all())
        _close(fd._proposal_r, td._proposal_r, "VonMises _proposal_r")
    # the circular mean of many draws is loc
    fd = FD.VonMises(_ft([1.0]), _ft([5.0]))
    s = _sample(fd, 1, FD, (4000,)).to_torch()
    assert abs(torch.atan2(s.sin().mean(), s.cos().mean()).item() - 1.0) < 0.05


def test_wishart_keeps_torchs_correction_loop():
    """torch's eager correction treats a regular sample as singular: it warns and redraws once, so the
    draws (and the RNG state after them) are torch's; max_try_correction=0 keeps the first draw."""
    cov = _ft(_S)
    for D, T, lib in ((TD, _tt, TD), (FD, _ft, FD)):
        with pytest.warns(UserWarning, match="Singular sample detected"):
            _sample(D.Wishart(T(4.0), covariance_matrix=T(_S[0])), 1, lib, method="rsample").sum()
            (torch if lib is TD else flow).manual_seed(1)
            D.Wishart(T(4.0), covariance_matrix=T(_S[0])).rsample()
    td, fd = TD.Wishart(_tt([4.0, 5.0]), covariance_matrix=_tt(_S)), FD.Wishart(_ft([4.0, 5.0]), covariance_matrix=cov)
    for n in (0, 1, 3):
        ts = _sample(td, 5, TD, (2,), n, method="rsample")
        fs = _sample(fd, 5, FD, (2,), n, method="rsample")
        _close(fs, ts, f"Wishart rsample max_try_correction={n}")
    _close(flow.rand(3).to_torch().to(F64), torch.rand(3, dtype=F32).to(F64), "RNG state after", atol=1.0, rtol=0)


def test_wishart_low_df_warns_as_torch():
    for D, T in ((TD, _tt), (FD, _ft)):
        with pytest.warns(UserWarning, match="Low df values detected"):
            D.Wishart(T(2.5), covariance_matrix=T(_S[0]))


def test_generalized_pareto_float64():
    """torch raises for float64 (its zero is float32); holoflow answers torch's float32 values."""
    args = [[0.1, 0.2, 0.0], [2.0, 1.0, 1.5], [0.4, 0.0, -0.3]]
    v = [0.3, 0.6, 0.15]
    with pytest.raises(RuntimeError):
        TD.GeneralizedPareto(*[_tt(a) for a in args]).log_prob(_tt(v))
    td = TD.GeneralizedPareto(*[_tt(a, F32) for a in args])
    fd = FD.GeneralizedPareto(*[_ft(a) for a in args])
    for fn in ("log_prob", "cdf", "log_survival_function", "log_cdf"):
        _close(getattr(fd, fn)(_ft(v)), getattr(td, fn)(_tt(v, F32)).to(F64), f"GeneralizedPareto f64 {fn}",
               rtol=1e-5, atol=1e-6)
    _close(fd.support.upper_bound, td.support.upper_bound.to(F64), "support")


def test_continuous_bernoulli_validation_and_exponential_family():
    # probs are checked before their clamp only when validate_args is given (even False), as torch's
    for D, T in ((TD, _tt), (FD, _ft)):
        D.ContinuousBernoulli(T([1.5]))                        # clamped, passes
        with pytest.raises(ValueError):
            D.ContinuousBernoulli(T([1.5]), validate_args=True)
        with pytest.raises(ValueError):
            D.ContinuousBernoulli(T([0.5]), T([0.0]))
        with pytest.raises(ValueError):                      # any validate_args given, False included
            D.ContinuousBernoulli(T([1.5]), validate_args=False)
    with pytest.raises(ValueError, match="holoflow"):
        FD.ContinuousBernoulli(_ft([-0.5]), validate_args=True)
    td, fd, tp, fp, _ = _build("ContinuousBernoulli-logits")
    x = torch.tensor([-2.0, -0.0005, 0.0, 0.3], dtype=F64)
    _close(fd._log_normalizer(flow.from_torch(x)), td._log_normalizer(x), "_log_normalizer")
    want, got = TD.ExponentialFamily.entropy(td), FD.ExponentialFamily.entropy(fd)
    _close(got, want, "Bregman entropy")
    _close(fd._cont_bern_log_norm(), td._cont_bern_log_norm(), "_cont_bern_log_norm")
    assert fd.param_shape == td.param_shape


BAD_PARAMS = [
    ("LowRank-diag", lambda D, T: D.LowRankMultivariateNormal(T([0.0, 0.0]), T([[0.0], [0.0]]), T([-1.0, 1.0]))),
    ("LowRank-0d-loc", lambda D, T: D.LowRankMultivariateNormal(T(0.0), T([[1.0]]), T([1.0]))),
    ("LowRank-1d-factor", lambda D, T: D.LowRankMultivariateNormal(T([0.0]), T([1.0]), T([1.0]))),
    ("LowRank-factor-rows", lambda D, T: D.LowRankMultivariateNormal(T([0.0, 0.0]), T([[1.0]]), T([1.0, 1.0]))),
    ("LowRank-diag-size", lambda D, T: D.LowRankMultivariateNormal(T([0.0, 0.0]), T([[1.0], [1.0]]), T([1.0]))),
    ("LowRank-batch", lambda D, T: D.LowRankMultivariateNormal(T([[0.0, 0.0]] * 2), T([[[1.0], [1.0]]] * 3),
                                                               T([1.0, 1.0]))),
    ("ContinuousBernoulli-neither", lambda D, T: D.ContinuousBernoulli()),
    ("VonMises", lambda D, T: D.VonMises(T([0.0]), T([0.0]))),
    ("VonMises-nan-loc", lambda D, T: D.VonMises(T([float("nan")]), T([1.0]))),
    ("Wishart-df", lambda D, T: D.Wishart(T([1.0]), covariance_matrix=T([[[2.0, 0.3], [0.3, 1.0]]]))),
    ("Wishart-df-number", lambda D, T: D.Wishart(2, covariance_matrix=T(_S[0]))),
    ("Wishart-1d", lambda D, T: D.Wishart(T(3.0), covariance_matrix=T([1.0, 2.0]))),
    ("Wishart-not-pd", lambda D, T: D.Wishart(T(3.0), covariance_matrix=T([[1.0, 2.0], [2.0, 1.0]]))),
    ("Wishart-tril", lambda D, T: D.Wishart(T(3.0), scale_tril=T([[1.0, 0.5], [0.0, 1.0]]))),
    ("LKJCholesky-dim", lambda D, T: D.LKJCholesky(1, T(1.0))),
    ("LKJCholesky-conc", lambda D, T: D.LKJCholesky(3, T([1.0, -1.0]))),
    ("GeneralizedPareto", lambda D, T: D.GeneralizedPareto(T([0.0]), T([0.0]), T([0.1]))),
]


@pytest.mark.parametrize("name,make", BAD_PARAMS, ids=[b[0] for b in BAD_PARAMS])
def test_bad_parameters_raise_value_error(name, make):
    with pytest.raises(ValueError):
        make(TD, _tt)
    with pytest.raises(ValueError, match="holoflow"):
        make(FD, _ft)


def test_wishart_needs_exactly_one_matrix():
    for D, T in ((TD, _tt), (FD, _ft)):
        with pytest.raises(AssertionError):
            D.Wishart(T(3.0))
        with pytest.raises(AssertionError):
            D.Wishart(T(3.0), covariance_matrix=T(_S[0]), scale_tril=T(_TRIL[0]))


BAD_SAMPLES = [
    ("LowRank-event", lambda D, T: D.LowRankMultivariateNormal(T([0.0, 0.0]), T([[1.0], [0.0]]), T([1.0, 1.0])),
     [0.5, 0.5, 0.5]),
    ("LowRank-nan", lambda D, T: D.LowRankMultivariateNormal(T([0.0, 0.0]), T([[1.0], [0.0]]), T([1.0, 1.0])),
     [0.5, float("nan")]),
    ("ContinuousBernoulli", lambda D, T: D.ContinuousBernoulli(T([0.3])), [1.5]),
    ("VonMises-nan", lambda D, T: D.VonMises(T([0.0]), T([1.0])), [float("nan")]),
    ("Wishart", lambda D, T: D.Wishart(T(3.0), covariance_matrix=T(_S[0])), [[1.0, 2.0, 0.0], [2.0, 1.0, 0.0],
                                                                               [0.0, 0.0, 1.0]]),
    ("LKJCholesky", lambda D, T: D.LKJCholesky(2, T(1.0)), [[1.0, 0.0], [0.5, 0.5]]),
    ("LKJCholesky-upper", lambda D, T: D.LKJCholesky(2, T(1.0)), [[0.6, 0.8], [0.0, 1.0]]),
    ("GeneralizedPareto", lambda D, T: D.GeneralizedPareto(T([1.0]), T([1.0]), T([-0.5])), [3.5]),
    ("GeneralizedPareto-below", lambda D, T: D.GeneralizedPareto(T([1.0]), T([1.0]), T([0.5])), [0.5]),
]


@pytest.mark.parametrize("name,make,value", BAD_SAMPLES, ids=[b[0] for b in BAD_SAMPLES])
def test_bad_samples_raise_value_error(name, make, value):
    dtype = F32 if name.startswith("GeneralizedPareto") else F64
    with pytest.raises(ValueError):
        make(TD, lambda a: _tt(a, dtype)).log_prob(_tt(value, dtype))
    with pytest.raises(ValueError, match="holoflow"):
        make(FD, lambda a: _ft(a, dtype)).log_prob(_ft(value, dtype))


def test_validate_args_false_skips_checks():
    TD.VonMises(_tt([0.0]), _tt([-1.0]), validate_args=False)
    d = FD.VonMises(_ft([0.0]), _ft([-1.0]), validate_args=False)
    assert not d._validate_args
    _close(FD.ContinuousBernoulli(_ft([0.3]), validate_args=False).log_prob(_ft([1.5])),
           TD.ContinuousBernoulli(_tt([0.3]), validate_args=False).log_prob(_tt([1.5])), "unchecked log_prob")
    # VonMises.expand keeps validate_args only where it was given, as torch's
    for D, T in ((TD, _tt), (FD, _ft)):
        assert D.VonMises(T([0.0]), T([1.0]), validate_args=False).expand((3, 1))._validate_args is False
        assert D.VonMises(T([0.0]), T([1.0])).expand((3, 1))._validate_args is True


def test_distribution_module_is_torchs():
    assert FDD.Distribution is FD.Distribution
    assert FDD.__all__ == TDD.__all__ == ["Distribution"]
    assert FD.distribution is FDD
    for name in ("ContinuousBernoulli", "GeneralizedPareto", "LKJCholesky", "LowRankMultivariateNormal",
                 "VonMises", "Wishart"):
        assert name in FD.__all__ and issubclass(getattr(FD, name), FDD.Distribution)
    assert set(TD.__all__) <= set(FD.__all__), sorted(set(TD.__all__) - set(FD.__all__))
