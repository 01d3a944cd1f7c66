"""prelu's double backward against torch: d2/dx2 is zeros (a tensor, not "unused"), the cross
terms between the input and the weight are real gradients, for a weight of 1 or C entries, the
channels in dim 1 and 1-D inputs; and the backward op's own rules (values, SBP) through the
op-table harness, differentiating ``grad(prelu)`` once more."""
import pytest
import torch

import holoflow as flow
from harness import Case, grad_of, parametrize, randn

SHAPES = [((2, 3), 3), ((2, 3), 1), ((2, 3, 4), 3), ((2, 3, 4, 2), 1), ((3, 2, 2, 2), 2), ((5,), 1), ((), 1)]


def _prelu(L, x, w):
    return L.nn.functional.prelu(x, w)


def _make(shape, n):
    def make(dt, g):
        x = randn(*shape, gen=g, dtype=dt)
        w = torch.rand(n, generator=g, dtype=torch.float64).to(dt) * 0.5 + 0.1
        dy = randn(*shape, gen=g, dtype=dt)
        return (x, w, dy), {}
    return make


# grad_of: the outputs are (dL/dx, dL/dw) of prelu for the upstream dy, differentiated again by the
# harness against torch (input, weight and dy all need grad); gradcheck away from the kink at 0
CASES = [Case(f"prelu-grad{shape}-w{n}", grad_of(flow, _prelu), grad_of(torch, _prelu), _make(shape, n))
         for shape, n in SHAPES]
globals().update(parametrize(CASES))


def _lib(L, t, rg):
    t = t.clone() if L is torch else flow.from_torch(t.clone())
    return t.requires_grad_(rg)


def _second(L, x0, w0, x_rg, w_rg, upstream):
    """All second derivatives torch gives (no allow_unused: zeros where the dependence is flat)."""
    x, w = _lib(L, x0, x_rg), _lib(L, w0, w_rg)
    live = [t for t in (x, w) if t.requires_grad]
    y = _prelu(L, x, w)
    loss = (y * y).sum() if upstream == "square" else (y * _lib(L, x0.cos(), False)).sum()
    firsts = L.autograd.grad(loss, live, create_graph=True)
    out = [g.detach() for g in firsts]
    mix = _lib(L, torch.linspace(-1, 2, x0.numel(), dtype=x0.dtype).reshape(x0.shape), False)
    for g in firsts:
        s = (g * mix).sum() if g.shape == x.shape else (g * g).sum()
        out += [h for h in L.autograd.grad(s, live, retain_graph=True)]
    return [t if L is torch else t.to_torch() for t in out]


@pytest.mark.parametrize("shape,n", SHAPES)
@pytest.mark.parametrize("needs", ["both", "x", "w"])
@pytest.mark.parametrize("upstream", ["square", "constant"])
def test_second_derivatives_match_torch(shape, n, needs, upstream):
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(shape, generator=g, dtype=torch.float64)
    if x0.numel() > 1:
        x0.view(-1)[0] = 0.0   # the kink: torch's slope there is the weight's
    w0 = torch.rand(n, generator=g, dtype=torch.float64) * 0.5 + 0.1
    x_rg, w_rg = needs in ("both", "x"), needs in ("both", "w")
    want = _second(torch, x0, w0, x_rg, w_rg, upstream)
    got = _second(flow, x0, w0, x_rg, w_rg, upstream)
    assert len(got) == len(want)
    for h, t in zip(got, want):
        torch.testing.assert_close(h, t, rtol=1e-12, atol=1e-12)


def test_d2_dx2_is_zeros_not_unused():
    x = flow.tensor([[-1.0, 2.0, -3.0], [0.5, -0.2, 1.0]], dtype=flow.float64, requires_grad=True)
    w = flow.tensor([0.25, 0.1, 0.3], dtype=flow.float64, requires_grad=True)
    gx, gw = flow.autograd.grad(_prelu(flow, x, w).sum(), [x, w], create_graph=True)
    assert gx.requires_grad and gw.requires_grad
    (gxx,) = flow.autograd.grad(gx.sum(), x, retain_graph=True)
    assert gxx.to_torch().eq(0).all() and gxx.shape == x.shape
    (gww,) = flow.autograd.grad(gw.sum(), w, retain_graph=True)
    assert gww.to_torch().eq(0).all() and gww.shape == w.shape
    (gxw,) = flow.autograd.grad(gx.sum(), w, retain_graph=True)
    assert gxw.tolist() == [1.0, 1.0, 1.0]   # one negative entry in each channel


def test_prelu_refuses_mixed_dtypes_like_torch():
    for L in (torch, flow):
        with pytest.raises(RuntimeError, match="[Tt]ype promoting"):
            _prelu(L, L.randn(2, 3), L.rand(3, dtype=L.float64))


def test_prelu_under_autocast_casts_both_like_torch():
    """On autocast's lower-precision list: a bfloat16 input with a float32 weight is fine there."""
    x0, w0 = torch.randn(2, 3), torch.rand(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _prelu(torch, x0.bfloat16(), w0)
    with flow.autocast("cpu", dtype=flow.bfloat16):
        got = _prelu(flow, flow.from_torch(x0.bfloat16()), flow.from_torch(w0))
    assert want.dtype == torch.bfloat16
    torch.testing.assert_close(got.to_torch(), want)


def test_gradient_penalty_matches_torch():
    """A loss with a gradient penalty, differentiated in the weight (the cross term)."""
    g = torch.Generator().manual_seed(0)
    x0, w0 = torch.randn(4, 3, 2, generator=g), torch.rand(3, generator=g)

    def penalty(L, x, w):
        y = _prelu(L, x, w)
        gx, = L.autograd.grad((y * y).sum(), [x], create_graph=True)
        return (gx * gx).sum() + y.sum()

    xt, wt = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    want = torch.autograd.grad(penalty(torch, xt, wt), [xt, wt])
    xf, wf = flow.from_torch(x0.clone()).requires_grad_(), flow.from_torch(w0.clone()).requires_grad_()
    got = flow.autograd.grad(penalty(flow, xf, wf), [xf, wf])
    for h, t in zip(got, want):
        torch.testing.assert_close(h.to_torch(), t)


@pytest.mark.parametrize("n", [1, 3])
def test_prelu_inside_nn_graph_matches_torch(n):
    """The primitive traced (its shape rule) with a training step's backward (prelu_backward)."""
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(4, 3, 2, generator=g)
    tm, fm = torch.nn.PReLU(n), flow.nn.PReLU(n)
    opt = flow.optim.SGD(fm.parameters(), lr=0.5)

    class Step(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = fm
            self.add_optimizer(opt)

        def build(self, x):
            loss = (self.m(x) ** 2).sum()
            loss.backward()
            return loss

    got = Step()(flow.from_torch(x0))
    want = (tm(x0) ** 2).sum()
    want.backward()
    torch.testing.assert_close(got.to_torch(), want.detach())
    torch.testing.assert_close(fm.weight.detach().to_torch(), (tm.weight - 0.5 * tm.weight.grad).detach())


@pytest.mark.parametrize("split_channels", [False, True])
def test_prelu_on_a_global_tensor_of_2_ranks(split_channels):
    """Batch split (weight broadcast: its gradient a partial sum) or channel split (the weight
    split alike): values and both gradients equal torch's."""
    from holoflow.core.sbp import B, S
    from holoflow.distributed import world
    g = torch.Generator().manual_seed(0)
    x0, w0, up = torch.randn(4, 4, 3, generator=g), torch.rand(4, generator=g), torch.randn(4, 4, 3, generator=g)

    def run(rank):
        pl = flow.placement("cpu", ranks=[0, 1])
        x, w = flow.from_torch(x0.clone()).requires_grad_(), flow.from_torch(w0.clone()).requires_grad_()
        gx = x.to_global(placement=pl, sbp=[B]).to_global(sbp=[S(1) if split_channels else S(0)])
        gw = w.to_global(placement=pl, sbp=[B])
        if split_channels:
            gw = gw.to_global(sbp=[S(0)])
        y = _prelu(flow, gx, gw)
        sbp = tuple(y.sbp)
        (y * flow.from_torch(up).to_global(placement=pl, sbp=[B])).sum().backward()
        return sbp, y.to_global(sbp=[B]).to_local().to_torch(), x.grad.to_torch(), w.grad.to_torch()
    xt, wt = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    want = _prelu(torch, xt, wt)
    (want * up).sum().backward()
    for sbp, y, xg, wg in world.simulate(2, run, timeout=60):
        assert sbp == ((S(1),) if split_channels else (S(0),))
        torch.testing.assert_close(y, want.detach())
        torch.testing.assert_close(xg, xt.grad)
        torch.testing.assert_close(wg, wt.grad)
