"""The backward engine's fast paths: leaves own their .grad buffers, outputs nobody differentiated
reach grad rules that ignore them as None, and the results equal torch's."""
from __future__ import annotations

import numpy as np
import torch

import holoflow as flow
from holoflow.core import autograd


def test_leaves_sharing_one_gradient_get_separate_buffers():
    # add's grad hands the same dy to both inputs; mul makes it a fresh contiguous tensor
    a, b = flow.randn(3, requires_grad=True), flow.randn(3, requires_grad=True)
    c = flow.randn(3)
    ((a + b) * c).sum().backward()
    assert a.grad._data.data_ptr() != b.grad._data.data_ptr()
    a.grad.mul_(2.0)  # an in-place update of one (clip_grad_norm_'s _foreach_mul_) leaves the other
    np.testing.assert_allclose(b.grad.numpy(), c.numpy())
    np.testing.assert_allclose(a.grad.numpy(), 2 * c.numpy())


def test_leaf_grad_does_not_alias_the_callers_gradient():
    a = flow.randn(4, requires_grad=True)
    g = flow.ones(4)
    (a + 0.0).backward(g)     # add passes the seed gradient through unchanged
    assert a.grad._data.data_ptr() != g._data.data_ptr()
    a.grad.zero_()
    np.testing.assert_allclose(g.numpy(), np.ones(4))


def test_clip_after_shared_gradient_scales_each_once():
    ta, tb = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    fa, fb = (flow.tensor(t.detach().numpy(), requires_grad=True) for t in (ta, tb))
    tc = torch.randn(5)
    fc = flow.tensor(tc.numpy())
    ((ta + tb) * tc).sum().backward()
    ((fa + fb) * fc).sum().backward()
    torch.nn.utils.clip_grad_norm_([ta, tb], 0.1)
    flow.nn.utils.clip_grad_norm_([fa, fb], 0.1)
    np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(fb.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_unread_output_gradients_are_not_materialized(monkeypatch):
    made = []
    real = autograd._zeros_for
    monkeypatch.setattr(autograd, "_zeros_for", lambda meta: made.append(meta) or real(meta))
    x = flow.randn(2, 5, 8, requires_grad=True)
    w, b = flow.randn(8, requires_grad=True), flow.randn(8, requires_grad=True)
    flow.nn.functional.layer_norm(x, (8,), w, b).sum().backward()
    assert made == []   # layer_norm's grad reads only the output's gradient (grad_reads=(0,))
    tx, tw, tb = (torch.tensor(t.detach().numpy(), requires_grad=True) for t in (x, w, b))
    torch.nn.functional.layer_norm(tx, (8,), tw, tb).sum().backward()
    for f, t in ((x, tx), (w, tw), (b, tb)):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_read_output_gradient_is_still_zero_filled():
    # a multi-output op whose rule reads every output gradient (no grad_reads): a missing one is zeros
    x = flow.randn(4, 3, requires_grad=True)
    q, r = flow.linalg.qr(x)
    q.sum().backward()
    tx = torch.tensor(x.detach().numpy(), requires_grad=True)
    tq, _ = torch.linalg.qr(tx)
    tq.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
