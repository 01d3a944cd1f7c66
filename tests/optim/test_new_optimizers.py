"""ASGD, Rprop and SparseAdam vs torch.optim: steps on the same init and gradients (eager, with
foreach on and off), torch's state dicts loaded into holoflow, LR schedulers, and an nn.Graph
training step equal to eager."""
import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.graph import Graph

RNG = np.random.default_rng(0)
W = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal(4).astype(np.float32)
X = RNG.standard_normal((5, 3)).astype(np.float32)
Y = RNG.standard_normal((5, 4)).astype(np.float32)

CASES = [
    ("ASGD", dict()),
    ("ASGD", dict(lr=0.05, lambd=1e-2, alpha=0.5, t0=2, weight_decay=0.1)),   # averaging from step 3
    ("ASGD", dict(lr=0.05, t0=0, maximize=True)),
    ("Rprop", dict()),
    ("Rprop", dict(lr=0.1, etas=(0.3, 1.5), step_sizes=(1e-3, 0.2))),
    ("Rprop", dict(lr=0.05, maximize=True)),
]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(CASES)]


def _loss(lib, w, b, x, y):
    return ((x @ w + b - y) ** 2).sum() + (w ** 3).sum()


def _train(lib, name, kw, steps=6, foreach=None, round_trip_at=None):
    w = lib.nn.Parameter(lib.tensor(W.copy()))
    b = lib.nn.Parameter(lib.tensor(B.copy()))
    x, y = lib.tensor(X), lib.tensor(Y)
    make = lambda: getattr(lib.optim, name)([w, b], foreach=foreach, **kw)  # noqa: E731
    opt = make()
    for i in range(steps):
        opt.zero_grad()
        _loss(lib, w, b, x, y).backward()
        opt.step()
        if i == round_trip_at:
            sd = opt.state_dict()
            opt = make()
            opt.load_state_dict(sd)
    return w.detach().numpy(), b.detach().numpy(), opt


def _np(v):
    return v.detach().numpy() if hasattr(v, "detach") else np.asarray(v)


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
@pytest.mark.parametrize("foreach", [None, False])
def test_steps_match_torch(name, kw, foreach):
    tw, tb, topt = _train(torch, name, kw)
    fw, fb, fopt = _train(flow, name, kw, foreach=foreach)
    np.testing.assert_allclose(fw, tw, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fb, tb, rtol=1e-6, atol=1e-6)
    tstate, fstate = topt.state_dict()["state"], fopt.state_dict()["state"]
    assert set(tstate) == set(fstate)
    for k in tstate:
        assert set(tstate[k]) == set(fstate[k])
        for name_ in tstate[k]:
            np.testing.assert_allclose(_np(fstate[k][name_]), _np(tstate[k][name_]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_state_dict_round_trip_continues_like_torch(name, kw):
    tw, tb, _ = _train(torch, name, kw, round_trip_at=2)
    fw, fb, _ = _train(flow, name, kw, round_trip_at=2)
    np.testing.assert_allclose(fw, tw, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fb, tb, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_load_torch_state_dict(name, kw):
    # three torch steps, then torch's state dict continues in holoflow as in torch
    _, _, topt = _train(torch, name, kw, steps=3)
    w = flow.nn.Parameter(flow.tensor(topt.param_groups[0]["params"][0].detach().numpy()))
    b = flow.nn.Parameter(flow.tensor(topt.param_groups[0]["params"][1].detach().numpy()))
    fopt = getattr(flow.optim, name)([w, b], **kw)
    fopt.load_state_dict(topt.state_dict())
    x, y = flow.tensor(X), flow.tensor(Y)
    tx, ty = torch.tensor(X), torch.tensor(Y)
    tw, tb = topt.param_groups[0]["params"]
    for _ in range(3):
        topt.zero_grad()
        _loss(torch, tw, tb, tx, ty).backward()
        topt.step()
        fopt.zero_grad()
        _loss(flow, w, b, x, y).backward()
        fopt.step()
    np.testing.assert_allclose(w.detach().numpy(), tw.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(b.detach().numpy(), tb.detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["ASGD", "Rprop"])
def test_lr_scheduler_like_torch(name):
    def run(lib):
        w = lib.nn.Parameter(lib.tensor(W.copy()))
        b = lib.nn.Parameter(lib.tensor(B.copy()))
        x, y = lib.tensor(X), lib.tensor(Y)
        opt = getattr(lib.optim, name)([w, b], lr=0.1)
        sch = lib.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        lrs = []
        for _ in range(5):
            opt.zero_grad()
            _loss(lib, w, b, x, y).backward()
            opt.step()
            sch.step()
            lrs.append(opt.param_groups[0]["lr"])
        return w.detach().numpy(), lrs
    tw, tl = run(torch)
    fw, fl = run(flow)
    assert fl == tl
    np.testing.assert_allclose(fw, tw, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name,kw", [CASES[1], CASES[4]], ids=["ASGD", "Rprop"])
def test_graph_training_step_equals_eager(name, kw):
    def make():
        flow.manual_seed(0)
        m = flow.nn.Linear(3, 4)
        opt = getattr(flow.optim, name)(m.parameters(), **kw)
        return m, opt, flow.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    x, y = flow.tensor(X), flow.tensor(Y)

    class Train(Graph):
        def __init__(self, m, opt, sch):
            super().__init__()
            self.model = m
            self.add_optimizer(opt, lr_sch=sch)

        def build(self, x, y):
            loss = ((self.model(x) - y) ** 2).mean()
            loss.backward()
            return loss

    m, opt, sch = make()
    eager = []
    for _ in range(4):
        opt.zero_grad()
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        sch.step()
        eager.append(loss.item())
    gm, gopt, gsch = make()
    g = Train(gm, gopt, gsch)
    graph = [g(x, y).item() for _ in range(4)]
    np.testing.assert_allclose(graph, eager, rtol=1e-6, atol=1e-6)
    for p, q in zip(m.parameters(), gm.parameters()):
        torch.testing.assert_close(q._data, p._data, rtol=1e-6, atol=1e-6)
    assert gopt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert eager[-1] < eager[0]


def test_complex_params_step_like_torch():
    # torch steps a complex parameter as its real view; Rprop's step sizes start at lr + lr*j
    rng = np.random.default_rng(1)
    wc = (rng.standard_normal((2, 3)) + 1j * rng.standard_normal((2, 3))).astype(np.complex64)
    gs = [(rng.standard_normal((2, 3)) + 1j * rng.standard_normal((2, 3))).astype(np.complex64)
          for _ in range(4)]
    for name in ("ASGD", "Rprop"):
        out = []
        for lib in (torch, flow):
            p = lib.tensor(wc.copy(), requires_grad=True)
            opt = getattr(lib.optim, name)([p], lr=0.1)
            for g in gs:
                p.grad = lib.tensor(g.copy())
                opt.step()
            out.append(p.detach().numpy())
        np.testing.assert_allclose(out[1], out[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name,kw", [
    ("ASGD", dict(lr=-1.0)), ("ASGD", dict(weight_decay=-0.1)),
    ("Rprop", dict(lr=-1.0)), ("Rprop", dict(etas=(1.2, 0.5))), ("Rprop", dict(etas=(0.0, 1.2))),
    ("SparseAdam", dict(lr=0.0)), ("SparseAdam", dict(eps=0.0)), ("SparseAdam", dict(betas=(1.0, 0.9))),
    ("SparseAdam", dict(betas=(0.9, -0.1))),
])
def test_invalid_hyper_parameters_raise_value_error_like_torch(name, kw):
    with pytest.raises(ValueError):
        getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(2))], **kw)
    with pytest.raises(ValueError, match=f"holoflow.optim.{name}"):
        getattr(flow.optim, name)([flow.nn.Parameter(flow.zeros(2))], **kw)


def test_defaults_match_torch():
    for name in ("ASGD", "Rprop", "SparseAdam"):
        t = getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(2))]).defaults
        f = getattr(flow.optim, name)([flow.nn.Parameter(flow.zeros(2))]).defaults
        assert f == t, name


def test_sparse_adam_raises_for_dense_gradients_like_torch():
    # holoflow has no sparse gradients: every gradient is dense, and torch's SparseAdam raises
    # RuntimeError for dense gradients
    msg = "SparseAdam does not support dense gradients, please consider Adam instead"
    tp = torch.nn.Parameter(torch.ones(3))
    tp.grad = torch.ones(3)
    with pytest.raises(RuntimeError, match=msg):
        torch.optim.SparseAdam([tp]).step()
    fp = flow.nn.Parameter(flow.ones(3))
    fp.grad = flow.ones(3)
    opt = flow.optim.SparseAdam([fp])
    with pytest.raises(RuntimeError, match=msg):
        opt.step()
    np.testing.assert_array_equal(fp.detach().numpy(), np.ones(3, np.float32))
    assert len(opt.state) == 0
    fp.grad = None
    opt.step()   # no gradients: nothing to do, as torch


def test_sparse_adam_rejects_complex_params_like_torch():
    with pytest.raises(ValueError, match="Complex params"):
        torch.optim.SparseAdam([torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))])
    with pytest.raises(ValueError, match="complex params at indices \\[\\[0, 0\\]\\]"):
        flow.optim.SparseAdam([flow.nn.Parameter(flow.zeros(2, dtype=flow.complex64))])


def test_sparse_adam_loads_torch_state_dict():
    emb = torch.nn.Embedding(5, 3, sparse=True)
    topt = torch.optim.SparseAdam(emb.parameters())
    emb(torch.tensor([1, 3])).sum().backward()
    topt.step()
    fopt = flow.optim.SparseAdam([flow.nn.Parameter(flow.tensor(emb.weight.detach().numpy()))])
    fopt.load_state_dict(topt.state_dict())
    st = fopt.state_dict()["state"][0]
    assert st["step"] == 1
    np.testing.assert_array_equal(st["exp_avg"].numpy(), topt.state_dict()["state"][0]["exp_avg"].numpy())


def test_sparse_adam_in_graph_raises_like_eager():
    m = flow.nn.Linear(3, 2)
    opt = flow.optim.SparseAdam(m.parameters())

    class Train(Graph):
        def __init__(self):
            super().__init__()
            self.model = m
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.model(x).sum()
            loss.backward()
            return loss
    with pytest.raises(RuntimeError, match="SparseAdam does not support dense gradients"):
        Train()(flow.tensor(X))
