"""A value with no history (a Python number, a constant tensor) written into the whole of a view
inside ``nn.Graph`` and ``holoflow.compile``: the view's history must be re-derived from its base's
new one (torch's rebase_history), so no gradient reaches what the view held before. The trace kept
the view's history from before the write: ``c = b[:, :]; c[..., 0:3] = 2.0; c.sum()`` sent
``c``'s gradient on to ``b``'s old value (silent; global graph fuzzer seed 700385). A write into a
part of the view made a fresh view object and was right."""
import numpy as np
import pytest
import torch

import holoflow as flow


def _whole_slice(lib, c):
    c[..., 0:3] = 2.0


def _ellipsis(lib, c):
    c[...] = -1.0


def _copy_constant(lib, c):
    c.copy_(lib.ones(2, 3))


def _part(lib, c):
    c[:, 1:] = 2.0


WRITES = [_whole_slice, _ellipsis, _copy_constant, _part]


def _program(lib, w, write):
    b = w * 2
    c = b[:, :]
    write(lib, c)
    return c.sin().sum() + (b * b).sum() * 0.5


def _torch_grad(write) -> np.ndarray:
    w = torch.tensor(np.linspace(-1.0, 1.0, 6).reshape(2, 3), requires_grad=True)
    _program(torch, w, write).backward()
    return w.grad.numpy()


def _module():
    m = flow.nn.Module()
    m.w = flow.nn.Parameter(flow.tensor(np.linspace(-1.0, 1.0, 6).reshape(2, 3)))
    return m


@pytest.mark.parametrize("write", WRITES, ids=lambda f: f.__name__.strip("_"))
def test_a_graph_cuts_the_history_of_a_view_written_with_a_constant(write):
    m = _module()
    before = m.w.detach().numpy().copy()

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(flow.optim.SGD(m.parameters(), lr=1.0))

        def build(self):
            loss = _program(flow, self.m.w, write)
            loss.backward()
            return loss

    Train()()
    np.testing.assert_allclose(before - m.w.detach().numpy(), _torch_grad(write), rtol=1e-12, atol=1e-12)


class _Net(flow.nn.Module):
    def __init__(self, write):
        super().__init__()
        self.w = _module().w
        self.write = write

    def forward(self):
        return _program(flow, self.w, self.write)


def test_compile_cuts_the_history_of_a_view_written_with_a_constant():
    # (a Python number set into a view makes a tensor holoflow.compile doesn't trace: it runs those
    # eagerly, so a constant tensor made inside the call is written here)
    write = _copy_constant
    m = _Net(write)
    compiled = flow.compile(m, backend="eager")
    for _ in range(2):   # (the first call traces, the second runs the plan)
        m.w.grad = None
        compiled().backward()
        np.testing.assert_allclose(m.w.grad.numpy(), _torch_grad(write), rtol=1e-12, atol=1e-12)
    assert any(type(p).__name__ == "_Plan" for p in compiled._compiler.plans.values())   # (traced, not eager)
