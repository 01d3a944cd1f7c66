"""Activations (and std, rms_norm) bit for bit torch's: forward values and first-order gradients equal torch's exactly
(aten's backward kernels, as torch's autograd calls them), second-order ones to rounding (the
composite formulas run when a graph of the backward is recorded), and a few training steps of
an MLP with AdamW equal torch's exactly."""
import numpy as np
import pytest
import torch

import holoflow as flow

ACTIVATIONS = {
    "tanh": lambda lib, t: lib.tanh(t),
    "sigmoid": lambda lib, t: lib.sigmoid(t),
    "silu": lambda lib, t: lib.nn.functional.silu(t),
    "softplus": lambda lib, t: lib.nn.functional.softplus(t, beta=1.5, threshold=4.0),
    "elu": lambda lib, t: lib.nn.functional.elu(t, alpha=0.8),
    "selu": lambda lib, t: lib.nn.functional.selu(t),
    "celu": lambda lib, t: lib.nn.functional.celu(t, alpha=0.7),
    "mish": lambda lib, t: lib.nn.functional.mish(t),
    "hardsigmoid": lambda lib, t: lib.nn.functional.hardsigmoid(t),
    "logsigmoid": lambda lib, t: lib.nn.functional.logsigmoid(t),
    "glu": lambda lib, t: lib.nn.functional.glu(t, dim=-1),
    "tanhshrink": lambda lib, t: lib.nn.functional.tanhshrink(t),
    "erf": lambda lib, t: lib.erf(t),
    "erfc": lambda lib, t: lib.erfc(t),
    "erfinv": lambda lib, t: lib.erfinv(t.tanh() * 0.9),
    "gelu": lambda lib, t: lib.nn.functional.gelu(t),
    "std": lambda lib, t: t.std(-1),
    "std_all": lambda lib, t: t.std(),
    "rms_norm": lambda lib, t: lib.nn.functional.rms_norm(t, (t.shape[-1],)),
}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a, b, equal_nan=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_forward_and_backward_bit_for_bit(name, dtype):
    g = torch.Generator().manual_seed(len(name))
    x = torch.randn(48, 66, generator=g, dtype=dtype) * 3
    fn = ACTIVATIONS[name]
    xt = x.clone().requires_grad_()
    yt = fn(torch, xt)
    dy = torch.randn(yt.shape, generator=g, dtype=dtype)
    yt.backward(dy)
    xf = flow.from_torch(x.clone()).requires_grad_()
    yf = fn(flow, xf)
    yf.backward(flow.from_torch(dy))
    assert _same(yf.detach().numpy(), yt.detach().numpy()), f"{name} forward"
    assert _same(xf.grad.numpy(), xt.grad.numpy()), f"{name} backward"


@pytest.mark.parametrize("name", [n for n in ACTIVATIONS if n != "hardsigmoid"])   # (torch has no second
def test_double_backward_matches(name):                                               # derivative of it)
    """With create_graph the composite formulas run (differentiable again): the first-order values
    equal torch's to rounding, the second-order ones too."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 6, generator=g, dtype=torch.float64)
    fn = ACTIVATIONS[name]
    out = []
    for lib in (torch, flow):
        xx = (x.clone() if lib is torch else flow.from_torch(x.clone())).requires_grad_()
        (d,) = lib.autograd.grad(fn(lib, xx).sum(), xx, create_graph=True)
        (dd,) = lib.autograd.grad((d * d).sum(), xx)
        out.append((d.detach().numpy(), dd.numpy()))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-9, atol=1e-10)


def test_mlp_training_bit_for_bit():
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.SiLU(),
                             torch.nn.Linear(8, 3))
    fm = flow.nn.Sequential(flow.nn.Linear(6, 8), flow.nn.Tanh(), flow.nn.Linear(8, 8), flow.nn.SiLU(),
                            flow.nn.Linear(8, 3))
    fm.load_state_dict({k: flow.from_torch(v.detach().clone()) for k, v in tm.state_dict().items()})
    gen = torch.Generator().manual_seed(10)
    x, y = torch.randn(4, 6, generator=gen), torch.randn(4, 3, generator=gen)
    topt, fopt = torch.optim.AdamW(tm.parameters(), lr=0.05), flow.optim.AdamW(fm.parameters(), lr=0.05)
    for _ in range(8):
        topt.zero_grad()
        fopt.zero_grad()
        lt = ((tm(x) - y) ** 2).mean()
        lf = ((fm(flow.from_torch(x)) - flow.from_torch(y)) ** 2).mean()
        lt.backward()
        lf.backward()
        topt.step()
        fopt.step()
        assert lf.item() == lt.item()
    for a, b in zip(tm.parameters(), fm.parameters()):
        assert _same(b.detach().numpy(), a.detach().numpy())


POINTWISE_LOSSES = {
    "mse": lambda lib, a, b, r: lib.nn.functional.mse_loss(a, b, reduction=r),
    "smooth_l1": lambda lib, a, b, r: lib.nn.functional.smooth_l1_loss(a, b, reduction=r, beta=0.6),
    "huber": lambda lib, a, b, r: lib.nn.functional.huber_loss(a, b, reduction=r, delta=0.7),
}


@pytest.mark.parametrize("name", list(POINTWISE_LOSSES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_pointwise_loss_bit_for_bit(name, reduction):
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(9, 13, generator=g), torch.randn(9, 13, generator=g)
    at, bt = a.clone().requires_grad_(), b.clone().requires_grad_()
    af, bf = flow.from_torch(a.clone()).requires_grad_(), flow.from_torch(b.clone()).requires_grad_()
    fn = POINTWISE_LOSSES[name]
    lt, lf = fn(torch, at, bt, reduction), fn(flow, af, bf, reduction)
    dy = torch.randn(lt.shape, generator=g)
    lt.backward(dy)
    lf.backward(flow.from_torch(dy))
    assert _same(lf.detach().numpy(), lt.detach().numpy())
    assert _same(af.grad.numpy(), at.grad.numpy()) and _same(bf.grad.numpy(), bt.grad.numpy())
    (d,) = flow.autograd.grad(fn(flow, af, bf, reduction).sum(), af, create_graph=True)
    (dt,) = torch.autograd.grad(fn(torch, at, bt, reduction).sum(), at, create_graph=True)
    np.testing.assert_allclose(d.detach().numpy(), dt.detach().numpy(), rtol=1e-6, atol=1e-7)
    (dd,) = flow.autograd.grad((d * d).sum(), af)   # (the formula differentiates again)
    (ddt,) = torch.autograd.grad((dt * dt).sum(), at)
    np.testing.assert_allclose(dd.numpy(), ddt.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weights", ["", "weight", "pos_weight", "both"])
def test_bce_with_logits_bit_for_bit(reduction, weights):
    g = torch.Generator().manual_seed(6)
    x, t, w, pw = (torch.randn(6, 5, generator=g), torch.rand(6, 5, generator=g), torch.rand(6, 5, generator=g),
                   torch.rand(5, generator=g) * 2)
    dy = torch.full((6, 5) if reduction == "none" else (), 0.7)
    out = []
    for lib in (torch, flow):
        cv = (lambda a: a.clone()) if lib is torch else (lambda a: flow.from_torch(a.clone()))
        xx, tt = cv(x).requires_grad_(), cv(t).requires_grad_()
        kw = {"weight": cv(w)} if weights in ("weight", "both") else {}
        kw.update({"pos_weight": cv(pw)} if weights in ("pos_weight", "both") else {})
        loss = lib.nn.functional.binary_cross_entropy_with_logits(xx, tt, reduction=reduction, **kw)
        loss.backward(cv(dy))
        out.append((loss.detach().numpy(), xx.grad.numpy(), tt.grad.numpy()))
    for a, b in zip(*out):
        assert _same(b, a)


def test_bce_with_logits_differentiates_a_pos_weight_that_requires_grad():
    """torch refuses it; holoflow's composite path gives it its gradient (not silently none)."""
    pw = flow.tensor([2.0, 0.5], requires_grad=True)
    flow.nn.functional.binary_cross_entropy_with_logits(flow.tensor([[0.3, -1.0]]), flow.tensor([[1.0, 0.0]]),
                                                        pos_weight=pw).backward()
    assert pw.grad is not None and pw.grad.abs().sum().item() > 0


@pytest.mark.parametrize("bidirectional", [False, True], ids=["one_way", "bidirectional"])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_recurrent_layers_bit_for_bit(kind, batch_first, bidirectional):
    """2-layer RNN/LSTM/GRU, one way and bidirectional: outputs with and without grad mode, and
    the weights' gradients, exactly torch's (ATen's CPU kernels choose their path by whether the
    weights require grad; holoflow calls them as the module would; a plain RNN's reverse direction
    is ATen's own, not the flipped forward: tanh's last bit differed)."""
    torch.manual_seed(0)
    tm = getattr(torch.nn, kind)(5, 7, num_layers=2, batch_first=batch_first, bidirectional=bidirectional)
    fm = getattr(flow.nn, kind)(5, 7, num_layers=2, batch_first=batch_first, bidirectional=bidirectional)
    fm.load_state_dict({k: flow.from_torch(v.detach().clone()) for k, v in tm.state_dict().items()})
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        yt = tm(x)[0]
    with flow.no_grad():
        yf = fm(flow.from_torch(x))[0]
    assert _same(yf.numpy(), yt.numpy())
    yt, yf = tm(x)[0], fm(flow.from_torch(x))[0]
    (yt * yt).sum().backward()
    (yf * yf).sum().backward()
    assert _same(yf.detach().numpy(), yt.detach().numpy())
    for (name, a), b in zip(tm.named_parameters(), fm.parameters()):
        assert _same(b.grad.numpy(), a.grad.numpy()), name


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_cross_entropy_label_smoothing_bit_for_bit(reduction, ignore_index):
    g = torch.Generator().manual_seed(8)
    x, t = torch.randn(8, 33, generator=g), torch.randint(0, 33, (8,), generator=g)
    t[2] = 3
    a, b = x.clone().requires_grad_(), flow.from_torch(x.clone()).requires_grad_()
    lt = torch.nn.functional.cross_entropy(a, t, label_smoothing=0.1, reduction=reduction, ignore_index=ignore_index)
    lf = flow.nn.functional.cross_entropy(b, flow.from_torch(t), label_smoothing=0.1, reduction=reduction,
                                          ignore_index=ignore_index)
    dy = torch.randn(lt.shape, generator=g)
    lt.backward(dy)
    lf.backward(flow.from_torch(dy))
    assert _same(lf.detach().numpy(), lt.detach().numpy()) and _same(b.grad.numpy(), a.grad.numpy())
