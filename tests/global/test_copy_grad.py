"""``dst.copy_(src)`` carries the gradient to ``src`` (and a zero gradient to the part of ``dst``'s
old history it overwrote), as ``torch.Tensor.copy_``: eager local, eager global (B and S(0), 2 and
4 simulated ranks), nn.Graph local and nn.Graph global, each against single-process torch.

Weights come from numpy: simulated ranks are threads sharing torch's RNG."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.sbp import B, S

W = (np.arange(12.0, dtype=np.float32).reshape(4, 3) - 5) / 7    # src's leaf
V = (np.arange(12.0, dtype=np.float32).reshape(4, 3) + 3) / 11   # dst's leaf, where dst requires grad


def _buffer(w, v, zeros):
    d = zeros((4, 3), torch.float32)
    d.copy_(w)
    return d


def _nonleaf_src(w, v, zeros):
    d = zeros((4, 3), torch.float32)
    d.copy_(w * 2 + 1)
    return d


def _view_of_other(w, v, zeros):
    base = zeros((3, 4), torch.float32)
    base.t().copy_(w)
    return base


def _slice(w, v, zeros):
    x = zeros((6, 3), torch.float32)
    x[1:3].copy_(w[1:3] * 3)
    return x


def _column(w, v, zeros):
    x = zeros((4, 3), torch.float32)
    x[:, 1].copy_(w[:, 0] * 2)
    return x


def _column_dst_requires_grad(w, v, zeros):
    x = v * 1.0
    x[:, 2][1:].copy_(w[:3, 1])
    return x


def _dst_requires_grad(w, v, zeros):
    x = v * 1.0
    x.copy_(w)
    return x


def _dst_requires_grad_slice(w, v, zeros):
    x = v * 1.0
    x[1:3].copy_(w[:2])
    return x * x


def _dst_requires_grad_view(w, v, zeros):
    x = v * 1.0
    x.t()[1].copy_(w[:, 2] * w[:, 0])
    return x


def _dtype_wider(w, v, zeros):
    d = zeros((4, 3), torch.float64)
    d.copy_(w)
    return d * 2


def _dtype_narrower(w, v, zeros):
    x = v * 1.0
    x.copy_(w.double() * 3)
    return x


def _broadcast(w, v, zeros):
    d = zeros((4, 3), torch.float32)
    d.copy_(w[1])
    return d


def _broadcast_slice_dst_requires_grad(w, v, zeros):
    x = v * 1.0
    x[1:3].copy_(w[0:1] - w[3:4])
    return x


CASES: dict[str, Callable] = {f.__name__[1:]: f for f in (
    _buffer, _nonleaf_src, _view_of_other, _slice, _column, _column_dst_requires_grad, _dst_requires_grad, _dst_requires_grad_slice,
    _dst_requires_grad_view, _dtype_wider, _dtype_narrower, _broadcast, _broadcast_slice_dst_requires_grad)}
USES_V = {"column_dst_requires_grad", "dst_requires_grad", "dst_requires_grad_slice", "dst_requires_grad_view", "dtype_narrower",
          "broadcast_slice_dst_requires_grad"}


def _loss(out):
    # 2*out + 1 as the output's gradient: nonzero wherever a gradient should arrive
    return (out * out + out).sum()


def _torch_ref(name: str) -> tuple:
    w = torch.tensor(W, requires_grad=True)
    v = torch.tensor(V, requires_grad=True)
    out = CASES[name](w, v, lambda shape, dt: torch.zeros(shape, dtype=dt))
    _loss(out).backward()
    return out.detach().numpy(), w.grad.numpy(), None if v.grad is None else v.grad.numpy()


def _check(name: str, got: tuple, where: str) -> None:
    out, gw, gv = got
    want_out, want_w, want_v = _torch_ref(name)
    np.testing.assert_allclose(out, want_out, rtol=1e-6, atol=1e-6, err_msg=f"{name} {where}: value")
    assert gw is not None, f"{name} {where}: src's gradient is None"
    np.testing.assert_allclose(gw, want_w, rtol=1e-5, atol=1e-6, err_msg=f"{name} {where}: src's gradient")
    if name in USES_V:
        assert gv is not None, f"{name} {where}: dst's gradient is None"
        np.testing.assert_allclose(gv, want_v, rtol=1e-5, atol=1e-6, err_msg=f"{name} {where}: dst's gradient")


# -- eager ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_eager_local(name):
    w = flow.tensor(W).requires_grad_(True)
    v = flow.tensor(V).requires_grad_(True)
    out = CASES[name](w, v, lambda shape, dt: flow.zeros(*shape, dtype=dt))
    _loss(out).backward()
    _check(name, (out.detach().numpy(), None if w.grad is None else w.grad.numpy(),
                  None if v.grad is None else v.grad.numpy()), "eager local")


def _whole(t):
    return None if t is None else t.to_global(sbp=[B] * t.placement.ndim).to_local().numpy()


def _eager_global(rank: int, n: int, nd) -> dict:
    place = flow.placement("cpu", list(range(n)))
    res = {}
    for name, case in CASES.items():
        w = flow.tensor(W).to_global(placement=place, sbp=B).to_global(sbp=nd).detach().requires_grad_(True)
        v = flow.tensor(V).to_global(placement=place, sbp=B).to_global(sbp=nd).detach().requires_grad_(True)
        out = case(w, v, lambda shape, dt: flow.zeros(*shape, dtype=dt, placement=place, sbp=nd))
        _loss(out).backward()
        res[name] = (_whole(out.detach()), _whole(w.grad), _whole(v.grad))
    return res


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("nd", [B, S(0)], ids=["B", "S0"])
def test_eager_global(n, nd):
    for rank, res in enumerate(world.simulate(n, lambda r: _eager_global(r, n, nd))):
        for name, got in res.items():
            _check(name, got, f"eager global {nd} rank {rank}/{n}")


# -- nn.Graph ------------------------------------------------------------------------------------

WD = 0.5   # weight decay: a parameter whose gradient is zero still moves, one whose gradient is None does not


def _graph_step(name: str, w, v, zeros) -> tuple:
    """One graph step (SGD, lr 1, weight decay) through the case; returns the traced output and
    both parameters after the step."""
    m = flow.nn.Module()
    m.w = flow.nn.Parameter(w)
    m.v = flow.nn.Parameter(v)
    opt = flow.optim.SGD(m.parameters(), lr=1.0, weight_decay=WD)
    case = CASES[name]

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)

        def build(self):
            out = case(self.m.w, self.m.v, zeros)
            _loss(out).backward()
            return out
    out = Train()()
    return out, m.w.detach(), m.v.detach()


def _from_step(out, w, v) -> tuple:
    """(value, src's gradient, dst's gradient) read back from the parameters after the step
    ``p - (g + WD * p)``; a parameter the step left alone had a None gradient."""
    def grad(before, after):
        before, after = before.astype(np.float64), after.astype(np.float64)
        return None if np.array_equal(before, after) else before - after - WD * before
    return out, grad(W, w), grad(V, v)


@pytest.mark.parametrize("name", list(CASES))
def test_graph_local(name):
    out, w, v = _graph_step(name, flow.tensor(W), flow.tensor(V), lambda shape, dt: flow.zeros(*shape, dtype=dt))
    _check(name, _from_step(out.numpy(), w.numpy(), v.numpy()), "graph local")


def _graph_global(rank: int, n: int, nd) -> dict:
    place = flow.placement("cpu", list(range(n)))
    res = {}
    for name in CASES:
        w = flow.tensor(W).to_global(placement=place, sbp=B).to_global(sbp=nd)
        v = flow.tensor(V).to_global(placement=place, sbp=B).to_global(sbp=nd)
        out, w, v = _graph_step(name, w, v, lambda shape, dt: flow.zeros(*shape, dtype=dt, placement=place, sbp=nd))
        res[name] = _from_step(_whole(out), _whole(w), _whole(v))
    return res


@pytest.mark.parametrize("nd", [B, S(0)], ids=["B", "S0"])
def test_graph_global(nd):
    for rank, res in enumerate(world.simulate(2, lambda r: _graph_global(r, 2, nd))):
        for name, got in res.items():
            _check(name, got, f"graph global {nd} rank {rank}")


# -- what a traced copy_ hands out ---------------------------------------------------------------

class _CopyInto(flow.nn.Graph):
    def __init__(self, scale: float | None):
        super().__init__()
        self.scale = scale

    def build(self, x):
        d = flow.zeros(4, 3)
        d.copy_(x if self.scale is None else x * self.scale)
        return d


def _clones(g) -> int:
    return sum(n.op == "clone" for n in next(iter(g._compiled.values())).ir.nodes)


def test_graph_copy_of_an_input_is_its_own_memory():
    """``d.copy_(x)`` of a graph input returns a tensor of its own, as eager's: a later write to
    the caller's ``x`` does not show through it (the trace copies the value once)."""
    x = flow.tensor(W)
    g = _CopyInto(None)
    out = g(x)
    x.add_(100)
    np.testing.assert_array_equal(out.numpy(), W)
    assert _clones(g) == 1


def test_graph_copy_of_an_intermediate_adds_no_copy():
    g = _CopyInto(2.0)
    np.testing.assert_allclose(g(flow.tensor(W)).numpy(), W * 2)
    assert _clones(g) == 0
