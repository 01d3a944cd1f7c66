"""``autograd.graph.allow_mutation_on_saved_tensors`` against torch's: inside the block a tensor
saved for backward may be written in place (directly, through a view, by item assignment, under
no_grad, by an optimizer's foreach kernels, or as a saved output) and backward reads the values
forward saved; outside it the same writes are the version error; backward after the block and
nested blocks raise torch's classes."""
import pytest
import torch

import holoflow as flow


def _programs():
    def clone_then_write(lib):
        a = lib.ones(2, 3, requires_grad=True)
        b = a.clone()
        out = (b ** 2).sum()
        b.sin_()
        return out, [a]

    def saved_output(lib):
        x = lib.tensor([0.5, 1.0, -2.0], requires_grad=True)
        y = x.exp()
        y.add_(1)
        return y.sum(), [x]

    def through_views_and_setitem(lib):
        w = lib.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
        h = w.clone()
        v = h[0]
        out = (lib.tensor([[0.5, -1.0]]) @ h).sum() + (h * h.t()).sum()
        v.mul_(10)
        h[1] = 0.0
        return out, [w]

    def optimizer_step_between(lib):
        w = lib.nn.Parameter(lib.tensor([[1.0, -2.0], [0.5, 3.0]]))
        x = lib.tensor([[1.0, 2.0], [3.0, 4.0]])
        out = (x @ w).tanh().sum()
        opt = lib.optim.SGD([w], lr=0.1, momentum=0.9)
        w.grad = lib.ones(2, 2)
        opt.step()   # (a foreach kernel writes w, which mm saved)
        w.grad = None
        return out, [w]

    def leaf_data_write(lib):
        w = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        out = (w * w.sin()).sum()
        with lib.no_grad():
            w.mul_(0.5)
        return out, [w]

    return {f.__name__: f for f in (clone_then_write, saved_output, through_views_and_setitem,
                                    optimizer_step_between, leaf_data_write)}


PROGRAMS = _programs()


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_backward_reads_what_forward_saved_as_torchs(name):
    grads = []
    for lib in (torch, flow):
        with lib.autograd.graph.allow_mutation_on_saved_tensors():
            out, leaves = PROGRAMS[name](lib)
            out.backward()
        grads.append([t.grad.detach() if lib is torch else t.grad.to_torch() for t in leaves])
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", ["clone_then_write", "saved_output", "through_views_and_setitem"])
def test_without_the_block_the_write_is_the_version_error(name):
    for lib in (torch, flow):
        out, _ = PROGRAMS[name](lib)
        with pytest.raises(RuntimeError, match="modified by an inplace operation|modified by an in-place"):
            out.backward()


def test_backward_after_the_block_and_nested_blocks_raise_as_torch():
    for lib in (torch, flow):
        with lib.autograd.graph.allow_mutation_on_saved_tensors():
            a = lib.ones(2, requires_grad=True)
            out = (a.clone() * a).sum()
        with pytest.raises(AssertionError, match="outside of the 'allow_mutation_on_saved_tensors' context"):
            out.backward()
        with pytest.raises(RuntimeError, match="cannot be nested"):
            with lib.autograd.graph.allow_mutation_on_saved_tensors():
                with lib.autograd.graph.allow_mutation_on_saved_tensors():
                    pass
        with lib.autograd.graph.allow_mutation_on_saved_tensors():   # (usable again after both)
            pass
