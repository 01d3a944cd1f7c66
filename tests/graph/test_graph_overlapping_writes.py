"""In-place writes into overlapping views (``unfold`` windows) inside ``nn.Graph`` and
``holoflow.compile``: torch's kernel writes such a view element after element, each write seen by
the next window holding the element (``x.unfold(1, 2, 1).mul_(2)`` doubles an element held twice
twice). Eager holoflow leaves torch's values (tests/test_views_inplace.py); a traced write was
computed out of place and written once, silently. Each program trains 2 steps (SGD) in a graph
and in torch eager, or runs forward only."""
import numpy as np
import pytest
import torch

import holoflow as flow
from test_views_inplace import _OVERLAPPING_WRITES

WRITES = {**_OVERLAPPING_WRITES,
          "cumsum_": lambda u, t: u.cumsum_(2),
          "tril_": lambda u, t: u[0].tril_(),
          "clamp_ tensor": lambda u, t: u.clamp_(min=t * 0.9),   # (a composite)
          "hypot_": lambda u, t: u.hypot_(t)}
# (hypot_'s gradient through overlapping windows is not torch's, eagerly either: torch's reads its
# saved values, which are not the derivative of what its kernel wrote; values only)
TRAINED = [(w, "base") for w in sorted(WRITES) if w != "hypot_"] + \
    [(w, "operand") for w in ("add_ tensor", "addcmul_", "div_ tensor", "mul_ tensor", "lerp_", "clamp_ tensor")]


def _program(lib, d, t, w, write):
    x = (d * 1.0).reshape(2, 2, 3)
    u = x.unfold(2, 2, 1)
    WRITES[write](u, t)
    return x, (x * 1.5).sum() + (u * w).sum()


class _Module:
    """The same parameters on each library: ``d`` and ``t`` trainable as asked."""

    def __init__(self, lib, trains: str):
        rng = np.random.default_rng(0)
        d_np, t_np = rng.uniform(0.2, 0.9, (4, 3)), rng.uniform(0.2, 0.9, (2, 2, 2, 2))
        self.w = lib.tensor(rng.standard_normal((2, 2, 2, 2)))
        self.m = lib.nn.Module()
        self.m.d = lib.nn.Parameter(lib.tensor(d_np), requires_grad=trains == "base")
        self.m.t = lib.nn.Parameter(lib.tensor(t_np), requires_grad=trains == "operand")


def _torch_steps(write: str, trains: str, steps: int):
    s = _Module(torch, trains)
    trained = [p for p in s.m.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trained, lr=0.1) if trained else None
    losses = []
    for _ in range(steps):
        x, loss = _program(torch, s.m.d, s.m.t, s.w, write)
        if opt is not None:
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses, x.detach().numpy(), [p.detach().numpy() for p in (s.m.d, s.m.t)]


@pytest.mark.parametrize("write, trains", TRAINED)
def test_a_graph_trains_through_writes_into_overlapping_windows_as_torch(write, trains):
    want = _torch_steps(write, trains, 2)
    s = _Module(flow, trains)
    opt = flow.optim.SGD([p for p in s.m.parameters() if p.requires_grad], lr=0.1)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = s.m
            self.add_optimizer(opt)

        def build(self):
            x, loss = _program(flow, self.m.d, self.m.t, s.w, write)
            loss.backward()
            return x, loss

    g = Train()
    losses = []
    for _ in range(2):
        x, loss = g()
        losses.append(loss.item())
    np.testing.assert_allclose(losses, want[0], rtol=1e-12)
    np.testing.assert_allclose(x.numpy(), want[1], rtol=1e-12)
    for got, ref in zip((s.m.d, s.m.t), want[2]):
        np.testing.assert_allclose(got.detach().numpy(), ref, rtol=1e-12)


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_forward_graph_writes_overlapping_windows_as_torch(write):
    want = _torch_steps(write, "none", 1)

    class Forward(flow.nn.Graph):
        def build(self, d, t, w):
            return _program(flow, d, t, w, write)

    s = _Module(flow, "none")
    x, loss = Forward()(s.m.d.detach(), s.m.t.detach(), s.w)
    np.testing.assert_allclose(x.numpy(), want[1], rtol=1e-12)
    np.testing.assert_allclose(loss.item(), want[0][0], rtol=1e-12)


@pytest.mark.parametrize("write", ["mul_", "addcmul_", "lerp_", "cumsum_"])
def test_a_compiled_module_writes_overlapping_windows_as_torch(write):
    want = _torch_steps(write, "base", 1)
    s = _Module(flow, "base")

    class M(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = s.m

        def forward(self, w):
            return _program(flow, self.inner.d, self.inner.t, w, write)

    x, loss = flow.compile(M(), backend="eager")(s.w)
    loss.backward()
    np.testing.assert_allclose(x.detach().numpy(), want[1], rtol=1e-12)
    np.testing.assert_allclose(loss.item(), want[0][0], rtol=1e-12)
    d_grad = s.m.d.grad.numpy()
    ref = _Module(torch, "base")
    _, ref_loss = _program(torch, ref.m.d, ref.m.t, ref.w, write)
    ref_loss.backward()
    np.testing.assert_allclose(d_grad, ref.m.d.grad.numpy(), rtol=1e-12)


def test_a_traced_write_into_overlapping_windows_of_a_global_tensor_is_refused():
    placement = flow.placement("cpu", ranks=[0])   # one rank: the trace's refusal, not a world's

    class Forward(flow.nn.Graph):
        def build(self, d):
            x = d * 1.0
            x.unfold(1, 2, 1).mul_(2.0)
            return x

    d = flow.ones(2, 6).to_global(placement=placement, sbp=flow.sbp.broadcast)
    with pytest.raises(RuntimeError, match=r"mul_.*overlapping windows.*clone\(\)"):
        Forward()(d)
