"""clip_grad_norm_ / clip_grad_value_: the foreach fast path for local tensors gives torch's
numbers, dispatches no per-parameter ops, and agrees with the op-by-op path (foreach=False)."""
import math

import pytest
import torch

import holoflow as flow
from holoflow import nn
from holoflow.core.interpret import Observe, pushed

F32, F64 = torch.float32, torch.float64


def _grads():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 3, generator=g, dtype=F64), torch.randn(7, generator=g, dtype=F64),
            torch.randn(2, 2, generator=g, dtype=F32)]


def _params(lib, grads):
    ps = []
    for x in grads:
        p = lib.nn.Parameter(lib.zeros(*x.shape, dtype=getattr(lib, str(x.dtype).split(".")[1])))
        p.grad = x.clone() if lib is torch else flow.from_numpy(x.numpy().copy())
        ps.append(p)
    return ps


class _Count:
    """Counts dispatched ops through an observing interpreter."""

    def __init__(self):
        self.ops: list[str] = []

    def __enter__(self):
        self._ctx = pushed(Observe(lambda op, inputs, attrs: self.ops.append(op.name)))
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 0.0, 3.0, math.inf, -math.inf])
@pytest.mark.parametrize("max_norm", [0.05, 1e3])
@pytest.mark.parametrize("foreach", [None, False])
def test_clip_grad_norm_matches_torch(norm_type, max_norm, foreach):
    grads = _grads()
    tps, fps = _params(torch, grads), _params(flow, grads)
    tn = torch.nn.utils.clip_grad_norm_(tps, max_norm, norm_type)
    fn = nn.utils.clip_grad_norm_(fps, max_norm, norm_type, foreach=foreach)
    torch.testing.assert_close(fn.to_torch(), tn)
    for tp, fp in zip(tps, fps):
        torch.testing.assert_close(fp.grad.to_torch(), tp.grad)


def test_fast_path_dispatches_no_per_parameter_ops():
    fps = _params(flow, _grads() * 10)
    with _Count() as c:
        nn.utils.clip_grad_norm_(fps, 0.1)
    assert c.ops == []
    with _Count() as c:
        nn.utils.clip_grad_norm_(fps, 0.1, foreach=False)
    assert len(c.ops) >= len(fps), c.ops


def test_fast_path_error_if_nonfinite_and_value_clip():
    p = nn.Parameter(flow.zeros(3))
    p.grad = flow.tensor([float("inf"), 1.0, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    grads = _grads()
    tps, fps = _params(torch, grads), _params(flow, grads)
    torch.nn.utils.clip_grad_value_(tps, 0.5)
    nn.utils.clip_grad_value_(fps, 0.5)
    for tp, fp in zip(tps, fps):
        torch.testing.assert_close(fp.grad.to_torch(), tp.grad)
