"""The interpreter stack: composition in any order, context-locality, no leftovers."""
import threading

import numpy as np
import torch

import holoflow as flow
from holoflow.core import interpret


def _mlp():
    flow.manual_seed(0)
    return flow.nn.Sequential(flow.nn.Linear(8, 16), flow.nn.GELU(), flow.nn.Linear(16, 4))


def _graph(m, autocast_inside: bool):
    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, x):
            if autocast_inside:
                with flow.autocast("cpu"):
                    return self.m(x)
            return self.m(x)
    return G()


def test_autocast_around_a_graph_equals_autocast_inside_build_and_eager():
    m = _mlp()
    x = flow.randn(5, 8)
    with flow.autocast("cpu"):
        eager = m(x)
        outside = _graph(m, False)(x)
    inside = _graph(m, True)(x)
    assert eager.dtype == outside.dtype == inside.dtype == flow.bfloat16
    np.testing.assert_array_equal(outside.float().numpy(), eager.detach().float().numpy())
    np.testing.assert_array_equal(inside.float().numpy(), eager.detach().float().numpy())


def test_the_stack_is_context_local():
    seen = {}
    barrier = threading.Barrier(2)

    def worker(name, amp):
        ctx = flow.autocast("cpu") if amp else flow.autocast("cpu", enabled=False)
        with ctx:
            barrier.wait()
            y = flow.matmul(flow.ones(2, 2), flow.ones(2, 2))
            depth = len(interpret.stack())
            barrier.wait()
        seen[name] = (y.dtype, depth, len(interpret.stack()))
    ts = [threading.Thread(target=worker, args=("amp", True)), threading.Thread(target=worker, args=("fp32", False))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # (a disabled region inside none pushes nothing: the amp thread's region must not show there)
    assert seen == {"amp": (flow.bfloat16, 2, 1), "fp32": (flow.float32, 1, 1)}
    assert interpret.stack() == [interpret.current()]   # this thread never saw theirs


def test_nothing_is_left_on_the_stack_after_a_failing_trace():
    class Bad(flow.nn.Graph):
        def build(self, x):
            raise ValueError("boom")
    try:
        Bad()(flow.ones(2))
    except Exception:
        pass
    assert len(interpret.stack()) == 1 and not interpret.is_lazy()
    assert flow.Tensor.backward.__qualname__ == "Tensor.backward"   # never patched


def test_observer_counts_the_backward_ops_too():
    names = []
    w = flow.randn(3, 3, requires_grad=True)
    with interpret.pushed(interpret.Observe(lambda op, ins, attrs: names.append(op.name))):
        (w @ w).sum().backward()
    assert names[:2] == ["matmul", "sum"] and len(names) > 2   # the grad ops bind through it too
    assert torch.allclose(w.grad.to_torch(), (torch.ones(3, 3) @ w.to_torch().T.detach()) +
                          (w.to_torch().T.detach() @ torch.ones(3, 3)), atol=1e-5)
