"""Boxing under autograd against torch on the whole logical tensor: to_global between SBPs mixed
with views and in-place writes (partial-sum tensors included), and ops with unusual SBP rules
(scans, sorts, top-k, gathers/scatters, normalisations over a split dim) on uneven shards (5 rows
over 2 ranks, 5x6 over a 2x2 mesh). Each case checks the value and every input's gradient."""
import pytest
import torch

import holoflow as flow
from holoflow.core.sbp import B, P, S
from holoflow.distributed import world
from holoflow.distributed.global_tensor import from_full

ONE = [(S(0),), (S(1),), (B,), (P,)]
MESH = [[0, 1], [2, 3]]
TWO = [(a, b) for a in (S(0), S(1), B, P) for b in (S(0), S(1), B, P)]


class _Torch:
    lib = torch

    def box(self, t, sbp):
        return t

    def const(self, t, sbp):
        return t


class _Flow:
    lib = flow

    def __init__(self, place):
        self.place = place

    def box(self, t, sbp):
        return t.to_global(sbp=sbp)

    def const(self, t, sbp):
        return from_full(t.clone(), self.place, sbp)


def _whole(t):
    return t.to_global(sbp=(B,) * len(t.sbp)).to_local().to_torch().clone()


def _differential(f, shapes, sbps_list, mesh=(0, 1)):
    """``f(side, *inputs)`` on torch and on global inputs of each SBP assignment: the value and
    the gradients of ``(f * w).sum()`` must equal torch's."""
    gen = torch.Generator().manual_seed(0)
    data = [torch.randn(*s, generator=gen) for s in shapes]
    ts = [d.clone().requires_grad_(True) for d in data]
    want = f(_Torch(), *ts)
    w = torch.randn(want.shape, generator=gen)
    (want * w).sum().backward()
    n = 4 if isinstance(mesh[0], list) else len(mesh)
    for sbps in sbps_list:
        def run(rank):
            place = flow.placement("cpu", list(mesh))
            xs = [from_full(d.clone(), place, s).detach().requires_grad_(True) for d, s in zip(data, sbps)]
            out = f(_Flow(place), *xs)
            value = _whole(out)
            (out * from_full(w, place, (B,) * place.ndim)).sum().backward()
            return value, [_whole(x.grad) for x in xs]
        for value, grads in world.simulate(n, run, timeout=60):
            torch.testing.assert_close(value, want.detach(), rtol=1e-5, atol=1e-5, msg=str(sbps))
            for g, t in zip(grads, ts):
                torch.testing.assert_close(g, t.grad, rtol=1e-5, atol=1e-5, msg=str(sbps))


# --- boxing, views and in-place writes -----------------------------------------------------------

def _box_view_write(s, x):
    y = s.box(x * 2, (S(1),))
    y[:, 1:4].mul_(3)             # a view across the column split, written in place
    return s.box(y, (S(0),)) + 1


def _stale_view(s, x):
    y = x * 1
    v = y[:, 2]
    y.mul_(2)                     # the base changes after the view was taken
    return v[:, None] * y


def _view_of_view(s, x):
    y = x * 1
    a = y[1:4]
    a[:, ::2].mul_(-1)
    return a.sum(0, keepdim=True) + y


def _reshape_write(s, x):
    y = x * 1
    y.reshape(35)[3:20].add_(1)   # a flat range crossing the row split
    return y * y


def _partial_writes(s, x, w):
    y = x @ w.t()                 # partial_sum for S(1) x S(1)
    y += 1.5
    y[0, 0] = 0.0
    y.clamp_(max=1.0)
    return y.abs()


def _copy_across(s, x, w):
    y = x * 1
    y[1:3] = w[1:3] * 2
    y.copy_(s.box(y, (B,)) + w)
    return y * x


@pytest.mark.parametrize("f,shapes", [(_box_view_write, [(5, 7)]), (_stale_view, [(5, 7)]),
                                      (_view_of_view, [(5, 7)]), (_reshape_write, [(5, 7)])])
def test_views_and_inplace_writes_around_boxing_equal_torch(f, shapes):
    _differential(f, shapes, ONE)


@pytest.mark.parametrize("f", [_partial_writes, _copy_across])
def test_inplace_writes_on_partial_and_mixed_sbps_equal_torch(f):
    _differential(f, [(5, 7), (5, 7)], [(a, b) for a in ONE for b in ONE])


def test_boxing_chain_on_a_2x2_mesh_under_autograd_equals_torch():
    def f(s, x):
        y = s.box(x.exp() * 1, (S(1), S(0)))
        y[1:4, 2:5].mul_(0.5)
        z = s.box(y, (P, S(1))) if isinstance(s, _Flow) else y   # B -> P: zeros on all but one
        return s.box(z * 3, (B, B)) - y.t().t()
    _differential(f, [(5, 6)], [(s,) for s in TWO], mesh=MESH)


# --- ops with unusual SBP rules on uneven shards ----------------------------------------------

def _unusual(s, x):
    F = s.lib
    h = x * 1
    a = h.cumsum(0) * h.softmax(0)
    b = F.nn.functional.layer_norm(h, (h.shape[1],))
    v, _ = h.topk(2, dim=0)
    srt = h.sort(1)[0]
    g = h.gather(1, h.argmax(1, keepdim=True))
    return a.sum(1) + b.square().mean(1) + v.sum() + srt[:, :2].sum(1) + g[:, 0] + h.logsumexp(1)


def _scatter(s, x, src):
    F = s.lib
    idx = s.const(torch.tensor([[0, 2], [1, 1], [6, 3], [2, 0], [5, 5]]), (S(0),) if isinstance(s, _Flow) and
                  s.place.ndim == 1 else (S(0), B))
    return x.scatter_add(1, idx, src).cumsum(1) + F.zeros_like(x)


def test_unusual_sbp_ops_on_uneven_shards_equal_torch():
    _differential(_unusual, [(5, 7)], ONE)


def test_unusual_sbp_ops_on_uneven_shards_of_a_2x2_mesh_equal_torch():
    _differential(_unusual, [(5, 6)], [(s,) for s in TWO], mesh=MESH)


def test_scatter_add_with_uneven_shards_equals_torch():
    _differential(_scatter, [(5, 7), (5, 2)], [(a, b) for a in ONE for b in ONE])
