"""The per-op bookkeeping's shortcuts (what the interpreter stack answers once per push, nodes
built without per-call helpers) keep torch's results and autograd semantics."""
from __future__ import annotations

import numpy as np
import torch

import holoflow as flow
from holoflow.core import interpret
from holoflow.core.interpret import Interpreter, Observe, pushed
from holoflow.core.registry import REGISTRY
from holoflow.core.views import stamp_of


class _Tokens(Interpreter):
    """Binds on unchanged but gives every value a token (as a trace does)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def value_token(self, x):
        self.asked += 1
        return ("token", id(x))


class _Lazy(Observe):
    lazy = True


def test_token_source_is_the_nearest_interpreter_that_defines_one():
    x = flow.randn(3)
    assert stamp_of(x)[2] is None                  # eager: storage identifies the value
    with pushed(_Tokens()) as tok:
        with pushed(Observe(lambda *a: None)):      # defers value_token to its parent
            assert stamp_of(x)[2] == ("token", id(x))
            assert tok.asked == 1
    with pushed(Observe(lambda *a: None)):
        assert stamp_of(x)[2] is None


def test_is_lazy_sees_a_lazy_interpreter_anywhere_below():
    assert not interpret.is_lazy()
    with pushed(_Lazy(lambda *a: None)):
        with pushed(Observe(lambda *a: None)):
            assert interpret.is_lazy()
        assert interpret.is_lazy()
    with pushed(Observe(lambda *a: None)):
        assert not interpret.is_lazy()
    assert not interpret.is_lazy()


def test_view_rederived_after_base_write_under_a_pushed_interpreter():
    # the stale-view check in recording runs with an interpreter on the stack (autocast's case)
    ta = torch.randn(4, 3, requires_grad=True)
    fa = flow.tensor(ta.detach().numpy(), requires_grad=True)
    results = []
    for lib, a in ((torch, ta), (flow, fa)):
        ctx = pushed(Observe(lambda *a: None)) if lib is flow else torch.enable_grad()
        with ctx:
            base = a * 1.0
            v = base[1:]
            base.mul_(3.0)                          # v's history must be re-derived from base's
            (v * v).sum().backward()
        results.append(a.grad.numpy() if lib is flow else a.grad.detach().numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)


def test_saved_inputs_follow_the_needs_grad_flags():
    mul = REGISTRY["mul"]
    a, b = flow.randn(3), flow.randn(3)
    # mul's rule for a reads b only, and b's reads a only
    assert mul.saved_of((a, b), (object(), None)) == (None, b)
    assert mul.saved_of((a, b), (None, object())) == (a, None)
    both = mul.saved_of((a, b), (object(), object()))
    assert both[0] is a and both[1] is b
    ln = REGISTRY["layer_norm"]
    outs = (flow.randn(2), flow.randn(1), flow.randn(1))
    kept = ln.outputs_of(outs)
    assert kept[0] is None and kept[1] is outs[1] and kept[2] is outs[2]


def test_multi_output_op_gradients_match_torch():
    # split (several outputs, views) and layer_norm (several outputs, one gradient read)
    tx = torch.randn(2, 6, requires_grad=True)
    fx = flow.tensor(tx.detach().numpy(), requires_grad=True)
    for lib, x in ((torch, tx), (flow, fx)):
        p, q, r = x.split(2, dim=1)
        y = lib.nn.functional.layer_norm(p * q + r, (2,))
        (y * y.detach() + p).sum().backward()
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_grad_rule_returning_a_lone_gradient():
    class Double(flow.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2                           # not a tuple

    x = flow.randn(3, requires_grad=True)
    Double.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 2.0))
