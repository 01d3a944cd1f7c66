"""kl_divergence against torch for the pairs torch registers with LowRankMultivariateNormal and
ContinuousBernoulli (values, +inf where torch masks, gradients w.r.t. both parameter sets); the
event-shape refusals of the low-rank pairs; the Bregman divergences of ContinuousBernoulli and
Wishart (torch registers no pair of its own for them)."""
import pytest
import torch

import holoflow as flow
from holoflow import distributions as FD
from torch import distributions as TD
from torch.distributions import kl as TKL

from lib.dist_checks import F64, ft as _ft, grads_close, tt as _tt

NEW = {"LowRankMultivariateNormal", "ContinuousBernoulli", "VonMises", "Wishart", "LKJCholesky", "GeneralizedPareto"}


# class name in torch's registry -> (maker(D, params), p's parameters, q's parameters)
MAKERS = {
    "LowRankMultivariateNormal": (lambda D, p: D.LowRankMultivariateNormal(p[0], p[1], p[2]),
                                  [[[0.5, -1.0], [0.1, 0.2], [2.0, 1.0]], [[1.0], [0.3]], [[1.0, 0.5], [2.0, 0.7],
                                                                                           [0.4, 1.2]]],
                                  [[[0.0, 0.2], [1.0, -1.0], [0.5, 0.5]], [[[0.4, 0.1], [-1.0, 0.2]],
                                                                          [[0.2, 0.0], [0.3, 0.9]],
                                                                          [[1.0, -0.5], [0.5, 0.5]]],
                                   [[0.8, 1.1], [0.6, 0.6], [1.5, 0.3]]]),
    "MultivariateNormal": (lambda D, p: D.MultivariateNormal(p[0], scale_tril=p[1]),
                           [[[0.5, -1.0], [0.1, 0.2], [2.0, 1.0]], [[[1.0, 0.0], [0.3, 0.8]]]],
                           [[[0.0, 0.2], [1.0, -1.0], [0.5, 0.5]], [[[2.0, 0.0], [-0.4, 0.5]], [[1.0, 0.0], [0.0, 1.0]],
                                                                   [[0.7, 0.0], [0.2, 1.3]]]]),
    "ContinuousBernoulli": (lambda D, p: D.ContinuousBernoulli(probs=p[0]), [[0.2, 0.4995, 0.9]], [[0.4, 0.7, 0.5002]]),
    "Beta": (lambda D, p: D.Beta(p[0], p[1]), [[0.5, 1.5, 3.0], [1.0, 2.0, 0.7]], [[2.0, 0.7, 1.2], [0.4, 3.0, 1.1]]),
    "Exponential": (lambda D, p: D.Exponential(p[0]), [[0.5, 1.5, 3.0]], [[1.0, 2.0, 0.7]]),
    "Gamma": (lambda D, p: D.Gamma(p[0], p[1]), [[0.5, 1.5, 3.0], [1.0, 2.0, 0.7]], [[2.0, 0.7, 1.2], [0.4, 3.0, 1.1]]),
    "Gumbel": (lambda D, p: D.Gumbel(p[0], p[1]), [[0.5, -1.0, 2.0], [1.0, 0.3, 2.5]], [[0.0, 0.2, 1.0], [2.0, 0.5, 1.0]]),
    "Laplace": (lambda D, p: D.Laplace(p[0], p[1]), [[0.5, -1.0, 2.0], [1.0, 0.3, 2.5]], [[0.0, 0.2, 1.0], [2.0, 0.5, 1.0]]),
    "Normal": (lambda D, p: D.Normal(p[0], p[1]), [[0.5, -1.0, 2.0], [1.0, 0.3, 2.5]], [[0.0, 0.2, 1.0], [2.0, 0.5, 1.0]]),
    "Pareto": (lambda D, p: D.Pareto(p[0], p[1]), [[1.0, 0.5, 2.0], [0.8, 1.5, 3.0]], [[0.5, 1.0, 2.5], [2.0, 0.7, 1.2]]),
    # p: finite against ContinuousBernoulli where 0 < low and high < 1; q: finite where low < 0 and 1 < high
    "Uniform": (lambda D, p: D.Uniform(p[0], p[1]), [[0.1, 0.2, -0.5], [0.5, 0.9, 0.5]],
                [[-0.5, 0.1, -1.0], [1.5, 2.0, 0.9]]),
}
PAIRS = sorted((p.__name__, q.__name__) for p, q in TKL._KL_REGISTRY if NEW & {p.__name__, q.__name__})


def _make(name, D, which):
    make, pp, qp = MAKERS[name]
    ts = [torch.tensor(a, dtype=F64, requires_grad=True) for a in (pp if which == "p" else qp)]
    fs = [flow.from_torch(t.detach().clone()).requires_grad_() for t in ts]
    params = ts if D is TD else fs
    return make(D, params), params


def test_every_torch_pair_of_the_new_families_is_registered():
    ours = {(p.__name__, q.__name__) for p, q in FD.kl._KL_REGISTRY}
    assert set(PAIRS) <= ours, sorted(set(PAIRS) - ours)
    assert len(PAIRS) == 16 and all(p in MAKERS and q in MAKERS for p, q in PAIRS)


@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
def test_kl_matches_torch(pair):
    pn, qn = pair
    tp, tpp = _make(pn, TD, "p")
    tq, tqp = _make(qn, TD, "q")
    fp, fpp = _make(pn, FD, "p")
    fq, fqp = _make(qn, FD, "q")
    want, got = TD.kl_divergence(tp, tq), FD.kl_divergence(fp, fq)
    assert tuple(got.shape) == tuple(want.shape) and got.to_torch().dtype == want.dtype
    torch.testing.assert_close(got.to_torch(), want.detach(), equal_nan=True)
    if not want.requires_grad:
        assert not bool(want.isfinite().any())   # the +inf pairs: nothing to differentiate
        return
    tin, fin = tpp + tqp, fpp + fqp
    grads_close([got], [want], fin, tin, f"{pair}")


def test_kl_masks_are_torchs():
    """Some entries finite and some +inf in the masked ContinuousBernoulli/Uniform pairs."""
    for pn, qn in (("ContinuousBernoulli", "Uniform"), ("Uniform", "ContinuousBernoulli")):
        got = FD.kl_divergence(_make(pn, FD, "p")[0], _make(qn, FD, "q")[0]).to_torch()
        assert bool(got.isfinite().any()) and bool(got.isinf().any()), (pn, qn, got)


def test_lowrank_pairs_refuse_other_event_shapes():
    lr3 = lambda D, T: D.LowRankMultivariateNormal(T([0.0, 0.0, 0.0]), T([[1.0], [0.0], [0.5]]), T([1.0, 1.0, 1.0]))
    lr2 = lambda D, T: D.LowRankMultivariateNormal(T([0.0, 0.0]), T([[1.0], [0.0]]), T([1.0, 1.0]))
    mvn2 = lambda D, T: D.MultivariateNormal(T([0.0, 0.0]), scale_tril=T([[1.0, 0.0], [0.2, 1.0]]))
    for a, b in ((lr3, lr2), (lr3, mvn2), (mvn2, lr3)):
        with pytest.raises(ValueError):
            TD.kl_divergence(a(TD, _tt), b(TD, _tt))
        with pytest.raises(ValueError, match="holoflow"):
            FD.kl_divergence(a(FD, _ft), b(FD, _ft))


def test_lowrank_kl_equals_full_covariance_kl():
    """A self-check beside torch: the Woodbury forms equal the dense MultivariateNormal KL."""
    fp, _ = _make("LowRankMultivariateNormal", FD, "p")
    fq, _ = _make("LowRankMultivariateNormal", FD, "q")
    dense = [FD.MultivariateNormal(d.loc, covariance_matrix=d.covariance_matrix) for d in (fp, fq)]
    want = FD.kl_divergence(*dense).to_torch().detach()
    for p, q in ((fp, fq), (fp, dense[1]), (dense[0], fq)):
        torch.testing.assert_close(FD.kl_divergence(p, q).to_torch().detach(), want)


def test_continuous_bernoulli_bregman_kl():
    tp, _ = _make("ContinuousBernoulli", TD, "p")
    tq, _ = _make("ContinuousBernoulli", TD, "q")
    fp, _ = _make("ContinuousBernoulli", FD, "p")
    fq, _ = _make("ContinuousBernoulli", FD, "q")
    want, got = TKL._kl_expfamily_expfamily(tp, tq), FD.kl._kl_expfamily_expfamily(fp, fq)
    torch.testing.assert_close(got.to_torch(), want.detach())


def _wishart(D, T, df, scale):
    return D.Wishart(T(df), covariance_matrix=T(scale))


def test_wishart_kl_is_torchs_bregman_divergence():
    """torch registers no Wishart pair: ExponentialFamily's Bregman divergence answers, for both."""
    S = [[2.0, 0.3], [0.3, 1.0]]
    S2 = [[[2.0, 0.3], [0.3, 1.0]], [[1.0, -0.2], [-0.2, 0.5]]]
    for pa, qa in (((3.0, S), (5.0, [[4.0, 0.6], [0.6, 2.0]])), (([3.0, 4.5], S2), ([5.0, 3.5], S2))):
        want = TD.kl_divergence(_wishart(TD, _tt, *pa), _wishart(TD, _tt, *qa))
        got = FD.kl_divergence(_wishart(FD, _ft, *pa), _wishart(FD, _ft, *qa))
        torch.testing.assert_close(got.to_torch(), want.detach())
    dfp = torch.tensor(3.0, dtype=F64, requires_grad=True)
    dfq = torch.tensor(5.0, dtype=F64, requires_grad=True)
    fdfp, fdfq = (flow.from_torch(t.detach().clone()).requires_grad_() for t in (dfp, dfq))
    want = TD.kl_divergence(TD.Wishart(dfp, covariance_matrix=_tt(S)), TD.Wishart(dfq, covariance_matrix=2 * _tt(S)))
    got = FD.kl_divergence(FD.Wishart(fdfp, covariance_matrix=_ft(S)), FD.Wishart(fdfq, covariance_matrix=2 * _ft(S)))
    tg = torch.autograd.grad(want, [dfq])
    fg = flow.autograd.grad(got, [fdfq])
    torch.testing.assert_close(fg[0].to_torch(), tg[0])
