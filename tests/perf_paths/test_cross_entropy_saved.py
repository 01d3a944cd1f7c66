"""cross_entropy's common eager case keeps log_softmax from the forward (torch's log_softmax +
nll_loss, saving the log-probs and the total weight) instead of recomputing it in the backward;
values, gradients and what is saved against torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.core.interpret import Observe, pushed


def _pair(shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    t = torch.randint(0, shape[1], (shape[0],), generator=g)
    return x, t


@pytest.mark.parametrize("reduction,ignore_index", [("mean", -100), ("sum", -100), ("mean", 2), ("sum", 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_reads_the_saved_log_softmax(reduction, ignore_index, dtype):
    tx, tt = _pair((9, 5), dtype)
    tx.requires_grad_()
    tl = torch.nn.functional.cross_entropy(tx, tt, reduction=reduction, ignore_index=ignore_index)
    tl.backward()
    fx, ft = flow.tensor(tx.detach().numpy(), requires_grad=True), flow.tensor(tt.numpy())
    fl = flow.nn.functional.cross_entropy(fx, ft, reduction=reduction, ignore_index=ignore_index)
    seen: list[str] = []
    with pushed(Observe(lambda op, inputs, attrs: seen.append(op.name))):
        fl.backward()
    assert seen == ["cross_entropy_log_softmax_backward"], seen   # one op, no log_softmax recomputed
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(fl.item(), tl.item(), rtol=tol)
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=tol, atol=tol)


def test_logits_written_in_place_after_the_loss_as_torch():
    # torch saves the log-probs, not the logits: changing the logits afterwards is legal
    tx, tt = _pair((4, 3))
    leaf_t = tx.clone().requires_grad_()
    x = leaf_t * 1.0
    loss = torch.nn.functional.cross_entropy(x, tt)
    x.add_(1.0)
    loss.backward()
    leaf_f = flow.tensor(tx.numpy(), requires_grad=True)
    xf = leaf_f * 1.0
    lf = flow.nn.functional.cross_entropy(xf, flow.tensor(tt.numpy()))
    xf.add_(1.0)
    lf.backward()
    np.testing.assert_allclose(leaf_f.grad.numpy(), leaf_t.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("kwargs", [{"reduction": "none"}, {"label_smoothing": 0.1}])
def test_other_cases_keep_the_general_op(kwargs):
    tx, tt = _pair((4, 3))
    seen: list[str] = []
    with pushed(Observe(lambda op, inputs, attrs: seen.append(op.name))):
        flow.nn.functional.cross_entropy(flow.tensor(tx.numpy()), flow.tensor(tt.numpy()), **kwargs)
    assert seen == ["cross_entropy"], seen
