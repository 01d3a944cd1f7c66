"""``holoflow.special`` vs ``torch.special``: values and gradients of each function it has, and
a clear AttributeError (through mock_torch) for the ones it lacks."""
import pytest
import torch

import holoflow as flow
from holoflow import mock_torch

X = torch.tensor([[-2.5, -0.3, 0.0, 0.4, 3.0], [1.5, -1.0, 0.2, 2.0, -4.0]], dtype=torch.float64)
U = torch.tensor([[0.1, 0.5, 0.9, 0.01, 0.7], [0.3, 0.2, 0.6, 0.99, 0.45]], dtype=torch.float64)
P = X.abs() + 0.6   # positive
FUNCTIONS = {
    "expit": lambda S, X_, U_, P_: S.expit(X_), "exp2": lambda S, X_, U_, P_: S.exp2(X_), "expm1": lambda S, X_, U_, P_: S.expm1(X_),
    "log1p": lambda S, X_, U_, P_: S.log1p(P_), "erf": lambda S, X_, U_, P_: S.erf(X_), "erfc": lambda S, X_, U_, P_: S.erfc(X_),
    "erfinv": lambda S, X_, U_, P_: S.erfinv(U_ * 2 - 1), "digamma": lambda S, X_, U_, P_: S.digamma(P_), "psi": lambda S, X_, U_, P_: S.psi(P_),
    "gammaln": lambda S, X_, U_, P_: S.gammaln(P_), "polygamma": lambda S, X_, U_, P_: S.polygamma(2, P_),
    "multigammaln": lambda S, X_, U_, P_: S.multigammaln(P_ + 1, 3), "gammainc": lambda S, X_, U_, P_: S.gammainc(P_.detach(), U_ * 3),
    "gammaincc": lambda S, X_, U_, P_: S.gammaincc(P_.detach(), U_ * 3), "i0": lambda S, X_, U_, P_: S.i0(X_), "sinc": lambda S, X_, U_, P_: S.sinc(X_),
    "round": lambda S, X_, U_, P_: S.round(X_ * 3.3) * X_, "logit": lambda S, X_, U_, P_: S.logit(U_, eps=0.05),
    "xlogy": lambda S, X_, U_, P_: S.xlogy(X_, P_) + S.xlogy(0.0, P_) + S.xlogy(X_ * 0, U_),
    "xlog1py": lambda S, X_, U_, P_: S.xlog1py(X_, P_) + S.xlog1py(X_ * 0, U_) + S.xlog1py(2.0, U_) + S.xlog1py(X_ * 0, -1.0),
    "logsumexp": lambda S, X_, U_, P_: S.logsumexp(X_, 1), "softmax": lambda S, X_, U_, P_: S.softmax(X_, 1),
    "log_softmax": lambda S, X_, U_, P_: S.log_softmax(X_, 0, dtype=torch.float32 if S is torch.special
                                                        else flow.float32),
    "ndtr": lambda S, X_, U_, P_: S.ndtr(X_),
    "entr": lambda S, X_, U_, P_: S.entr(U_) + S.entr(P_), "erfcx": lambda S, X_, U_, P_: S.erfcx(X_),
    "ndtri": lambda S, X_, U_, P_: S.ndtri(U_), "log_ndtr": lambda S, X_, U_, P_: S.log_ndtr(X_),
    "i0e": lambda S, X_, U_, P_: S.i0e(X_), "i1": lambda S, X_, U_, P_: S.i1(X_), "i1e": lambda S, X_, U_, P_: S.i1e(X_),
    "zeta": lambda S, X_, U_, P_: S.zeta(P_.detach() + 1, U_ + P_) + S.zeta(2.0, P_),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_matches_torch_special(name):
    res = []
    for lib in (torch, flow):
        leaves = [lib.tensor(t.tolist(), dtype=lib.float64).requires_grad_() for t in (X, U, P)]
        out = FUNCTIONS[name](lib.special, *leaves)
        grads = lib.autograd.grad((out * out).sum(), leaves, allow_unused=True)
        to_t = (lambda t: t) if lib is torch else (lambda t: t.to_torch())
        res.append([to_t(out.detach())] + [None if g is None else to_t(g) for g in grads])
    for t, f in zip(*res):
        if t is None or f is None:
            assert (f if t is None else t) is None or not (f if t is None else t).any()
        else:
            torch.testing.assert_close(f.double(), t.double(), rtol=1e-7, atol=1e-9)


def test_missing_function_names_itself_under_mock_torch():
    with mock_torch.enable():
        import torch as mocked
        with pytest.raises(AttributeError, match="torch.special.no_such_function is not implemented in holoflow"):
            _ = mocked.special.no_such_function
        assert mocked.special.expit is flow.special.expit
        assert mocked.special.zeta is flow.special.zeta   # (torch.special is complete: tests/ops/test_special_round2.py)
