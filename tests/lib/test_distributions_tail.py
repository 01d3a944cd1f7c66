"""The last torch.distributions families (LowRankMultivariateNormal, ContinuousBernoulli, VonMises,
Wishart, LKJCholesky, GeneralizedPareto) beyond the checks every family gets
(tests/lib/test_distributions_more.py, which holds their bad parameters too): Python-number
parameters, sample errors, and torch's quirks that holoflow keeps (Wishart's correction loop) or
leaves (GeneralizedPareto in float64); ``holoflow.distributions.distribution`` as torch's module."""

import pytest
import torch

import holoflow as flow
import holoflow.distributions.distribution as FDD
import torch.distributions.distribution as TDD
from holoflow import distributions as FD
from torch import distributions as TD

from lib.dist_checks import F32, F64, L_CORR, S_MATS, TRIL, close as _close, ft as _ft, sample, tt as _tt


def _sample(d, seed, lib, *args, method="sample"):
    return sample(d, seed, lib is TD, *args, method=method)

def test_scalar_parameters():
    """Python numbers as parameters: batch shape (), torch's default dtype."""
    cases = [(lambda D, T: D.ContinuousBernoulli(0.3), 0.4), (lambda D, T: D.ContinuousBernoulli(logits=-0.7), 0.4),
             (lambda D, T: D.VonMises(1.0, 2.0), 0.4), (lambda D, T: D.LKJCholesky(3, 0.7), L_CORR[0].float()),
             (lambda D, T: D.GeneralizedPareto(0.0, 1.0, 0.2), 0.4),
             (lambda D, T: D.Wishart(4, covariance_matrix=T(S_MATS[0])), torch.tensor(S_MATS[0]))]
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
    cov = _ft(S_MATS)
    for D, T, lib in ((TD, _tt, TD), (FD, _ft, FD)):
        with pytest.warns(UserWarning, match="Singular sample detected"):
            _sample(D.Wishart(T(4.0), covariance_matrix=T(S_MATS[0])), 1, lib, method="rsample").sum()
            (torch if lib is TD else flow).manual_seed(1)
            D.Wishart(T(4.0), covariance_matrix=T(S_MATS[0])).rsample()
    td, fd = TD.Wishart(_tt([4.0, 5.0]), covariance_matrix=_tt(S_MATS)), FD.Wishart(_ft([4.0, 5.0]), covariance_matrix=cov)
    for n in (0, 1, 3):
        ts = _sample(td, 5, TD, (2,), n, method="rsample")
        fs = _sample(fd, 5, FD, (2,), n, method="rsample")
        _close(fs, ts, f"Wishart rsample max_try_correction={n}")
    _close(flow.rand(3).to_torch().to(F64), torch.rand(3, dtype=F32).to(F64), "RNG state after", atol=1.0, rtol=0)


def test_wishart_low_df_warns_as_torch():
    for D, T in ((TD, _tt), (FD, _ft)):
        with pytest.warns(UserWarning, match="Low df values detected"):
            D.Wishart(T(2.5), covariance_matrix=T(S_MATS[0]))


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
    td = TD.ContinuousBernoulli(logits=_tt([-1.0, 0.001, 2.0, 0.0]))
    fd = FD.ContinuousBernoulli(logits=_ft([-1.0, 0.001, 2.0, 0.0]))
    x = torch.tensor([-2.0, -0.0005, 0.0, 0.3], dtype=F64)
    _close(fd._log_normalizer(flow.from_torch(x)), td._log_normalizer(x), "_log_normalizer")
    want, got = TD.ExponentialFamily.entropy(td), FD.ExponentialFamily.entropy(fd)
    _close(got, want, "Bregman entropy")
    _close(fd._cont_bern_log_norm(), td._cont_bern_log_norm(), "_cont_bern_log_norm")
    assert fd.param_shape == td.param_shape


def test_wishart_needs_exactly_one_matrix():
    for D, T in ((TD, _tt), (FD, _ft)):
        with pytest.raises(AssertionError):
            D.Wishart(T(3.0))
        with pytest.raises(AssertionError):
            D.Wishart(T(3.0), covariance_matrix=T(S_MATS[0]), scale_tril=T(TRIL[0]))


BAD_SAMPLES = [
    ("LowRank-event", lambda D, T: D.LowRankMultivariateNormal(T([0.0, 0.0]), T([[1.0], [0.0]]), T([1.0, 1.0])),
     [0.5, 0.5, 0.5]),
    ("LowRank-nan", lambda D, T: D.LowRankMultivariateNormal(T([0.0, 0.0]), T([[1.0], [0.0]]), T([1.0, 1.0])),
     [0.5, float("nan")]),
    ("ContinuousBernoulli", lambda D, T: D.ContinuousBernoulli(T([0.3])), [1.5]),
    ("VonMises-nan", lambda D, T: D.VonMises(T([0.0]), T([1.0])), [float("nan")]),
    ("Wishart", lambda D, T: D.Wishart(T(3.0), covariance_matrix=T(S_MATS[0])), [[1.0, 2.0, 0.0], [2.0, 1.0, 0.0],
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
