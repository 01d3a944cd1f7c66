"""An in-place write of a value with no gradient history (``y.copy_(constant)``, ``fill_``,
``zero_``, ``y[...] = 4``) cuts what ``y`` held before out of the gradient, on a whole tensor and
on a view (the base's gradient is zero on the overwritten slice), then the result is used through
the tensor, its base and the view: gradients equal torch's. (A whole-tensor overwrite kept the
old history: ``y = w.clone(); y.copy_(c); (y * w).sum()`` gave ``c + w`` instead of ``c``.)"""
import pytest
import torch

import holoflow as flow

WRITES = {
    "copy_": lambda lib, t: t.copy_(lib.tensor([5.0, 6.0, 7.0])[: t.shape[0]]),
    "fill_": lambda lib, t: t.fill_(3.0),
    "zero_": lambda lib, t: t.zero_(),
    "setitem": lambda lib, t: t.__setitem__(0, 4.0),
}


def _grads(lib, write: str, where: str, use: str):
    w = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = w * 2
    target = y if where == "whole" else y[1:]
    WRITES[write](lib, target)
    part = {"base": y, "view": y[1:] if where == "whole" else target}[use]
    loss = (part * part).sum() + (y * w).sum()
    loss.backward()
    return w.grad


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("where", ["whole", "slice"])
@pytest.mark.parametrize("use", ["base", "view"])
def test_gradient_equals_torch(write, where, use):
    got = _grads(flow, write, where, use)
    want = _grads(torch, write, where, use)
    torch.testing.assert_close(got.to_torch(), want, rtol=0, atol=0)


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("where", ["whole", "slice"])
def test_under_no_grad_the_history_stays(write, where):
    """torch keeps the tensor's old history for a write under no_grad (and leaves keep
    requires_grad): the gradient still flows through what it held before."""
    def grads(lib):
        w = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = w * 2
        with lib.no_grad():
            WRITES[write](lib, y if where == "whole" else y[1:])
        assert y.requires_grad
        (y * w).sum().backward()
        return w.grad
    torch.testing.assert_close(grads(flow).to_torch(), grads(torch), rtol=0, atol=0)


def test_a_leaf_written_under_no_grad_keeps_requires_grad():
    for lib in (flow, torch):
        w = lib.zeros(3, requires_grad=True)
        with lib.no_grad():
            w.copy_(lib.tensor([1.0, 2.0, 3.0]))
            w.add_(1.0)
        assert w.requires_grad and w.grad_fn is None
        (w * w).sum().backward()
        assert w.grad.tolist() == [4.0, 6.0, 8.0]


def test_a_leaf_detached_and_written_with_grad_since_its_use_is_refused_in_backward():
    """torch's AccumulateGrad check: ``d`` was used as a leaf, then ``detach_()``ed and written in
    place with a value that requires grad (it has a history now); backward through the earlier
    use raises "leaf variable has been moved into the graph interior". holoflow put the earlier
    use's gradient into the non-leaf's ``.grad`` (global fuzzer, seed 665 of 20 steps on 2x2)."""
    for lib in (torch, flow):
        d = lib.ones(3, requires_grad=True)
        c = lib.ones(3, requires_grad=True)
        y = (d * 2).sum()
        d.detach_()
        d.add_(c)
        with pytest.raises(RuntimeError, match="leaf variable has been moved into the graph interior"):
            y.backward()
    # written with a value that needs no grad, it stays a leaf that stopped requiring grad: skipped
    d = flow.ones(3, requires_grad=True)
    y = (d * 2).sum()
    d.detach_()
    d.add_(1.0)
    y.backward()
    assert d.grad is None
