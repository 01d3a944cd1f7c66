"""holoflow.distributions vs torch.distributions: samples under one seed, log_prob/entropy values
and their gradients w.r.t. the parameters, rsample gradients, kl_divergence, argument errors."""
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
