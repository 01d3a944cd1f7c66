"""Bad inputs raise torch's exception class (``except`` clauses written for torch catch them),
with holoflow's message naming the op; a float size is an error, never truncated."""
import pytest
import torch

import holoflow as flow
from holoflow.core.errors import check_grad_assignment
from harness import error_like_torch

CASES = {
    "randn('3')": lambda m: m.randn("3"),
    "zeros('3')": lambda m: m.zeros("3"),
    "ones(2.5)": lambda m: m.ones(2.5),
    "ones(-1)": lambda m: m.ones(-1),
    "empty('a')": lambda m: m.empty("a"),
    "new_zeros('a')": lambda m: m.ones(2).new_zeros("a"),
    "reshape(3.7)": lambda m: m.arange(4.0).reshape(3.7),
    "reshape(2.0, 2)": lambda m: m.arange(4.0).reshape(2.0, 2),
    "view(2.0, 2)": lambda m: m.arange(4.0).view(2.0, 2),
    "expand(2.5)": lambda m: m.ones(1).expand(2.5),
    "ones(device='gpu')": lambda m: m.ones(2, device="gpu"),
    "to('floaty')": lambda m: m.ones(2).to("floaty"),
}



@pytest.mark.parametrize("name", sorted(CASES))
def test_exception_class_matches_torch(name):
    error_like_torch(CASES[name], name)


def test_integer_like_sizes_still_work():
    import numpy as np
    assert tuple(flow.zeros(np.int64(2), flow.tensor(3)).shape) == (2, 3)
    assert tuple(flow.arange(6.0).reshape(np.int32(2), -1).shape) == (2, 3)


def _functions(m):
    class Wrong(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g[:1]

    class Broadcast(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.sum()

        @staticmethod
        def backward(ctx, g):
            return g * m.ones(4, 3, 1, dtype=m.float64)   # expandable from x's (3, 1): summed back
    return Wrong, Broadcast


def test_custom_function_gradient_shape_checked_as_torch():
    for m, mk in ((torch, lambda: torch.ones(3, 1, requires_grad=True)),
                  (flow, lambda: flow.ones(3, 1, requires_grad=True))):
        wrong, bcast = _functions(m)
        x = mk()
        with pytest.raises(RuntimeError, match=r"invalid gradient at index 0 - got \[1, 1\] but expected "
                                               r"shape compatible with \[3, 1\]"):
            wrong.apply(x).sum().backward()
        x = mk()
        bcast.apply(x).backward()
        assert tuple(x.grad.shape) == (3, 1) and x.grad.dtype == (torch.float32 if m is torch else flow.float32)
        assert x.grad.tolist() == [[4.0], [4.0], [4.0]]


@pytest.mark.parametrize("bad,cls", [("shape", RuntimeError), ("dtype", RuntimeError), ("int", TypeError)])
def test_grad_assignment_checks_match_torch(bad, cls):
    g = {"shape": lambda m: m.ones(3), "dtype": lambda m: m.ones(2, dtype=m.float64), "int": lambda m: 3}[bad]
    t = torch.ones(2, requires_grad=True)
    with pytest.raises(cls):
        t.grad = g(torch)
    with pytest.raises(cls, match="assigned grad|assign a gradient with dtype"):   # (torch 2.13's dtype message)
        check_grad_assignment(flow.ones(2, requires_grad=True), g(flow))
    check_grad_assignment(flow.ones(2), flow.zeros(2))
    check_grad_assignment(flow.ones(2), None)
