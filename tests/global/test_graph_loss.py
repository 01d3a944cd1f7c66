"""Class losses of batch-split global inputs: 'mean' is computed as a per-rank sum and a per-rank
denominator (two partial-sum scalars all-reduced), never by gathering the input. Values and
gradients against torch on simulated ranks, eager and in a global graph, with ignore_index,
class weights, label smoothing and probability targets."""
import itertools

import pytest
import torch
import torch.nn.functional as TF

import holoflow as flow
from holoflow.distributed import world
from holoflow.distributed.global_tensor import from_full
from holoflow.sbp import B, S

N, C = 12, 5


def _case(kind: str, d: int = 0):
    g = torch.Generator().manual_seed(3)
    shape = (N, C) + (3,) * d
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if kind == "prob":
        t = torch.softmax(torch.randn(*shape, generator=g, dtype=torch.float64), 1)
    else:
        t = torch.randint(0, C, (N,) + (3,) * d, generator=g)
        t[::3] = -100 if kind != "ignore7" else 7    # some targets ignored
        if kind == "ignore7":
            t[1::4] = 7
    w = torch.rand(C, generator=g, dtype=torch.float64) + 0.5
    return x, t, w


CASES = [(fn, kind, weighted, ls, d)
         for fn in ("cross_entropy", "nll_loss")
         for kind in ("ignore", "ignore7", "prob")
         for weighted, ls, d in itertools.product((False, True), (0.0, 0.2), (0, 1))
         if not (fn == "nll_loss" and (kind == "prob" or ls))]


def _kwargs(fn, kind, ls):
    kw = {"ignore_index": 7 if kind == "ignore7" else -100}
    if fn == "cross_entropy":
        kw["label_smoothing"] = ls
    return kw


def _torch(fn, kind, weighted, ls, d):
    x, t, w = _case(kind, d)
    x = x.clone().requires_grad_(True)
    inp = x if fn == "cross_entropy" else torch.log_softmax(x, 1)
    loss = getattr(TF, fn)(inp, t, w if weighted else None, **_kwargs(fn, kind, ls))
    loss.backward()
    return loss.detach(), x.grad


def _global_loss(fn, kind, weighted, ls, x, t, w):
    inp = x if fn == "cross_entropy" else flow.nn.functional.log_softmax(x, 1)
    return getattr(flow.nn.functional, fn)(inp, t, w if weighted else None, **_kwargs(fn, kind, ls))


def _inputs(place, kind, d, axis):
    x, t, w = _case(kind, d)
    sx = S(axis)
    st = S(axis if kind == "prob" or axis == 0 else axis - 1)
    xg = from_full(x, place, (sx,)).detach().requires_grad_(True)
    return xg, from_full(t, place, (st,)), from_full(w, place, (B,))


@pytest.mark.parametrize("fn,kind,weighted,ls,d", CASES)
def test_split_mean_loss_matches_torch_eager(fn, kind, weighted, ls, d):
    want_loss, want_grad = _torch(fn, kind, weighted, ls, d)
    place = flow.placement("cpu", [0, 1])

    def run(rank):
        outs = []
        for axis in (0, 2) if d else (0,):
            x, t, w = _inputs(place, kind, d, axis)
            calls = world.comm().calls   # simulated: rank 0 logs every collective of the pair
            n0 = len(calls)
            loss = _global_loss(fn, kind, weighted, ls, x, t, w)
            loss.backward()
            gathers = sum(kind_ == "all_gather" for kind_, _, _ in calls[n0:]) if rank == 0 else 0
            outs.append((loss.to_global(sbp=B).to_local().to_torch(),
                         x.grad.to_global(sbp=B).to_local().to_torch(), gathers))
        return outs

    for per_rank in world.simulate(2, run):
        for loss, grad, gathers in per_rank:
            assert gathers == 0          # the input is never gathered
            torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fn,kind,weighted,ls,d", [c for c in CASES if c[4] == 0])
def test_split_mean_loss_matches_torch_in_a_graph(fn, kind, weighted, ls, d):
    want_loss, want_grad = _torch(fn, kind, weighted, ls, d)
    place = flow.placement("cpu", [0, 1])

    def run(rank):
        x, t, w = _inputs(place, kind, d, 0)
        lin = flow.nn.Linear(C, C, bias=False).double()
        with flow.no_grad():
            lin.weight.copy_(flow.from_torch(torch.eye(C, dtype=torch.float64)))
        lin.to_global(place, B)
        opt = flow.optim.SGD(lin.parameters(), lr=1.0)

        class Loss(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.lin = lin
                self.add_optimizer(opt)

            def build(self, x, t):
                loss = _global_loss(fn, kind, weighted, ls, self.lin(x), t, w)
                loss.backward()
                return loss
        g = Loss()
        loss = g(x.detach(), t)
        kinds = {k for p in g.boxing() for k in (s.kind for s in p.steps)}
        # logits = x W^T with W = I: dL/dW = dlogits^T x, and one SGD step (lr 1) leaves I - dL/dW
        return (loss.to_global(sbp=B).to_local().to_torch(),
                torch.eye(C, dtype=torch.float64) - lin.weight.to_global(sbp=B).to_local().to_torch(), kinds,
                x.detach().to_global(sbp=B).to_local().to_torch())

    for loss, wgrad, kinds, xfull in world.simulate(2, run):
        assert "all_gather" not in kinds, kinds
        torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(wgrad, want_grad.T @ xfull, rtol=1e-10, atol=1e-12)
