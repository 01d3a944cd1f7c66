"""Random ops: same seed -> same values as torch (holoflow draws from torch's generator),
statistical sanity, dropout gradients under the same seed."""
import pytest
import torch
import torch.nn.functional as F

import holoflow as flow
import holoflow.nn.functional as HF
from harness import BF16, F32, F64, Case, parametrize, randn

CASES = [
    Case("dropout-p0.3", lambda x: HF.dropout(x, 0.3), lambda x: F.dropout(x, 0.3), lambda dt, g: ((randn(6, 7, gen=g, dtype=dt),), {}),
         random=True, dtypes=(F32, F64, BF16)),
    Case("dropout-p0.5-3d", lambda x: HF.dropout(x), lambda x: F.dropout(x), lambda dt, g: ((randn(2, 3, 4, gen=g, dtype=dt),), {}),
         random=True),
    Case("dropout-empty", lambda x: HF.dropout(x, 0.2), lambda x: F.dropout(x, 0.2), lambda dt, g: ((randn(0, 3, gen=g, dtype=dt),), {}),
         random=True),
    Case("dropout-p1", lambda x: HF.dropout(x, 1.0), lambda x: F.dropout(x, 1.0), lambda dt, g: ((randn(3, 3, gen=g, dtype=dt),), {}),
         random=True),
    Case("dropout-eval", lambda x: HF.dropout(x, 0.4, training=False) * 1, lambda x: F.dropout(x, 0.4, training=False) * 1,
         lambda dt, g: ((randn(3, 3, gen=g, dtype=dt),), {})),
    Case("bernoulli", flow.bernoulli, torch.bernoulli,
         lambda dt, g: ((torch.rand(5, 6, generator=g, dtype=dt),), {}), random=True, grad=False),
    Case("bernoulli-p", lambda x: flow.bernoulli(x, 0.3), lambda x: torch.bernoulli(x, 0.3),
         lambda dt, g: ((torch.rand(5, 6, generator=g, dtype=dt),), {}), random=True, grad=False),
    Case("multinomial-replacement", lambda x: flow.multinomial(x, 7, True), lambda x: torch.multinomial(x, 7, True),
         lambda dt, g: ((torch.rand(3, 5, generator=g, dtype=dt),), {}), random=True, grad=False),
    Case("multinomial-no-replacement", lambda x: flow.multinomial(x, 4), lambda x: torch.multinomial(x, 4),
         lambda dt, g: ((torch.rand(3, 5, generator=g, dtype=dt),), {}), random=True, grad=False),
    Case("multinomial-1d", lambda x: x.multinomial(3), lambda x: x.multinomial(3),
         lambda dt, g: ((torch.rand(6, generator=g, dtype=dt),), {}), random=True, grad=False),
]
SAMPLERS = [("normal_", (0.5, 2.0)), ("uniform_", (-1.0, 3.0)), ("random_", (3, 9)), ("random_", (5,)), ("random_", ()),
            ("exponential_", (2.0,)), ("bernoulli_", (0.3,))]
for name, args in SAMPLERS:
    CASES.append(Case(f"{name}{args}", lambda x, n=name, a=args: getattr(x.clone(), n)(*a),
                      lambda x, n=name, a=args: getattr(x.clone(), n)(*a),
                      lambda dt, g: ((randn(4, 5, gen=g, dtype=dt),), {}), random=True, grad=False, dtypes=(F32, F64, BF16)))
CASES.append(Case("bernoulli_-tensor-p", lambda x, p: x.clone().bernoulli_(p), lambda x, p: x.clone().bernoulli_(p),
                  lambda dt, g: ((randn(4, 5, gen=g, dtype=dt), torch.rand(5, generator=g, dtype=dt)), {}), random=True, grad=False))
CASES.append(Case("normal-tensor-mean-std", flow.normal, torch.normal,
                  lambda dt, g: ((randn(4, 5, gen=g, dtype=dt), torch.rand(4, 5, generator=g, dtype=dt) + 0.1), {}),
                  random=True, grad=False))
CASES.append(Case("normal-tensor-mean", lambda m: flow.normal(m, 2.0), lambda m: torch.normal(m, 2.0),
                  lambda dt, g: ((randn(3, 4, gen=g, dtype=dt),), {}), random=True, grad=False))
CASES.append(Case("fill_", lambda x: x.clone().fill_(2.5) * x, lambda x: x.clone().fill_(2.5) * x,
                  lambda dt, g: ((randn(3, 4, gen=g, dtype=dt),), {})))

globals().update(parametrize(CASES))


def test_dropout_grad_matches_torch_under_seed():
    x = torch.randn(50, 40)
    fx, tx = flow.from_torch(x.clone()).requires_grad_(), x.clone().requires_grad_()
    flow.manual_seed(3)
    y = HF.dropout(fx * 2, 0.25)
    torch.manual_seed(3)
    ty = F.dropout(tx * 2, 0.25)
    torch.testing.assert_close(y.to_torch(), ty.detach())
    up = torch.randn(50, 40)
    y.backward(flow.from_torch(up))
    ty.backward(up)
    torch.testing.assert_close(fx.grad.to_torch(), tx.grad)


def test_dropout_statistics():
    flow.manual_seed(0)
    y = HF.dropout(flow.ones(200, 100), 0.3)
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.7) < 0.02
    assert torch.allclose(y.to_torch()[y.to_torch() != 0], torch.tensor(1 / 0.7))


def test_dropout_inplace_and_p_check():
    x = flow.ones(4, 4)
    flow.manual_seed(1)
    assert HF.dropout(x, 0.5, inplace=True) is x
    assert set(x.to_torch().unique().tolist()) <= {0.0, 2.0}
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        HF.dropout(x, 1.5)


def test_samplers_statistics_and_inplace_identity():
    flow.manual_seed(0)
    x = flow.empty(100000)
    assert x.normal_(1.0, 2.0) is x
    assert abs(x.to_torch().mean().item() - 1.0) < 0.05 and abs(x.to_torch().std().item() - 2.0) < 0.05
    x.uniform_(2.0, 4.0)
    assert 2.0 <= x.to_torch().min().item() and x.to_torch().max().item() < 4.0
    assert abs(x.to_torch().mean().item() - 3.0) < 0.02
    x.exponential_(4.0)
    assert abs(x.to_torch().mean().item() - 0.25) < 0.01
    x.bernoulli_(0.2)
    assert abs(x.to_torch().mean().item() - 0.2) < 0.01
    x.random_(0, 10)
    assert set(x.to_torch().unique().tolist()) == set(range(10))


def test_multinomial_without_replacement_is_distinct_and_respects_zeros():
    flow.manual_seed(0)
    w = flow.tensor([[0.0, 1.0, 2.0, 3.0, 0.0]] * 50)
    s = flow.multinomial(w, 3).to_torch()
    assert all(len(set(r.tolist())) == 3 for r in s)
    assert not ((s == 0) | (s == 4)).any()
    with pytest.raises(ValueError, match="cannot draw 6 samples without replacement from 5"):
        flow.multinomial(w, 6)


def test_samplers_under_no_grad_on_leaf_and_generator():
    w = flow.empty(3, 4, requires_grad=True)
    with flow.no_grad():
        w.normal_(0, 0.02)
    g1, g2 = flow.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    a = flow.empty(5).uniform_(generator=g1)
    torch.testing.assert_close(a.to_torch(), torch.empty(5).uniform_(generator=g2))
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        w.normal_()
