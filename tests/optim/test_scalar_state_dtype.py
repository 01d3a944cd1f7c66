"""Optimizers' scalar state (``step``, NAdam's ``mu_product``, ASGD's ``eta``/``mu``) takes torch's
dtype: float64 under a float64 default dtype, float32 otherwise and always for fused kernels.
A float32 ``mu_product`` or ``eta`` under float64 rounded every update of a float64 model away from
torch's. And ``Adagrad(fused=True)`` runs torch's fused kernel with torch's numbers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow import optim

RNG = np.random.default_rng(11)
INIT = RNG.standard_normal((3, 4))
GRADS = [RNG.standard_normal((3, 4)) for _ in range(6)]

CASES = [("NAdam", {}), ("NAdam", {"decoupled_weight_decay": True, "weight_decay": 0.1}),
         ("ASGD", {"t0": 2}), ("Adam", {}), ("AdamW", {"fused": True}), ("Adagrad", {"lr_decay": 0.1}),
         ("Adagrad", {"fused": True}), ("RAdam", {}), ("Adamax", {}), ("Adadelta", {}), ("RMSprop", {}),
         ("Rprop", {}), ("SGD", {"momentum": 0.9, "fused": True}), ("Adafactor", {})]


@pytest.fixture
def default_float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _run(lib, name, kw, dtype):
    p = lib.nn.Parameter(lib.tensor(INIT.astype(dtype)))
    opt = getattr(lib.optim, name)([p], lr=0.05, **kw)
    for g in GRADS:
        p.grad = lib.tensor(g.astype(dtype))
        opt.step()
    scalars = {k: str(v.dtype).split(".")[-1] for k, v in opt.state[p].items() if v.dim() == 0}
    return p.detach().numpy().copy(), scalars


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_float64_default_scalar_state_and_updates_equal_torch(default_float64, name, kw):
    got, got_scalars = _run(flow, name, kw, np.float64)
    want, want_scalars = _run(torch, name, kw, np.float64)
    assert got_scalars == want_scalars
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_float32_default_scalar_state_is_float32(name, kw):
    got, got_scalars = _run(flow, name, kw, np.float32)
    want, want_scalars = _run(torch, name, kw, np.float32)
    assert got_scalars == want_scalars and set(got_scalars.values()) <= {"float32"}
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kw", [{}, {"weight_decay": 0.1, "lr_decay": 0.05}, {"maximize": True},
                                {"initial_accumulator_value": 0.5, "eps": 1e-3}])
def test_fused_adagrad_equals_torch_fused_over_mixed_dtypes(kw):
    inits = [RNG.standard_normal((2, 3)).astype(np.float32), RNG.standard_normal(5),
             RNG.standard_normal(4).astype(np.float32)]
    grads = [[RNG.standard_normal(a.shape).astype(a.dtype) for a in inits] for _ in range(4)]
    out = []
    for lib in (flow, torch):
        ps = [lib.nn.Parameter(lib.tensor(a.copy())) for a in inits]
        opt = lib.optim.Adagrad(ps, lr=0.1, fused=True, **kw)
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = lib.tensor(g.copy())
            opt.step()
        out.append([p.detach().numpy().copy() for p in ps])
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


def test_fused_adagrad_refusals_match_torch():
    p = flow.nn.Parameter(flow.zeros(2))
    with pytest.raises(RuntimeError, match="differentiable"):
        optim.Adagrad([p], fused=True, differentiable=True)
    with pytest.raises(RuntimeError, match="differentiable"):
        torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(2))], fused=True, differentiable=True)
    with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together"):
        optim.Adagrad([p], fused=True, foreach=True)
