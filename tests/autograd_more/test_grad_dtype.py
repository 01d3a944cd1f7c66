"""``Tensor.grad_dtype`` (torch 2.13) against torch: a leaf's own dtype by default; set to a dtype,
the engine casts incoming gradients to it (accumulation included); set to None, ``.grad`` may be
assigned any dtype; non-leaves refuse it; assignment errors name both dtypes."""
from __future__ import annotations

import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.sbp import B, S

LIBS = {"torch": torch, "holoflow": flow}


def _name(dtype) -> str:
    return str(dtype).split(".")[-1]


@pytest.mark.parametrize("grad_dtype", ["default", "float64", "float16", "bfloat16", None])
def test_backward_gives_grad_in_grad_dtype_and_accumulates_there(grad_dtype):
    results = {}
    for key, lib in LIBS.items():
        x = lib.tensor([0.25, -1.5, 3.0], requires_grad=True)
        if grad_dtype != "default":
            x.grad_dtype = None if grad_dtype is None else getattr(lib, grad_dtype)
        (x * 3).sum().backward()
        (x * x).sum().backward()
        g = x.grad.to_torch() if lib is flow else x.grad
        results[key] = (_name(x.grad_dtype) if x.grad_dtype is not None else None, g)
    assert results["holoflow"][0] == results["torch"][0]
    assert results["holoflow"][1].dtype == results["torch"][1].dtype
    torch.testing.assert_close(results["holoflow"][1], results["torch"][1])


@pytest.mark.parametrize("grad_dtype", ["default", "float64", None])
def test_assigning_grad_checks_grad_dtype(grad_dtype):
    outcomes = {}
    for key, lib in LIBS.items():
        x = lib.zeros(2, requires_grad=True)
        if grad_dtype != "default":
            x.grad_dtype = None if grad_dtype is None else getattr(lib, grad_dtype)
        try:
            x.grad = lib.ones(2, dtype=lib.float64)
            outcomes[key] = _name(x.grad.dtype)
        except RuntimeError as e:
            assert "grad_dtype" in str(e) and ("float32" in str(e) or "Float" in str(e))
            outcomes[key] = "refused"
    assert outcomes["holoflow"] == outcomes["torch"]


def test_non_leaves_refuse_grad_dtype():
    for lib in LIBS.values():
        y = lib.ones(2, requires_grad=True) * 2
        with pytest.raises(RuntimeError, match="grad_dtype can only be accessed on leaf tensors"):
            _ = y.grad_dtype
        with pytest.raises(RuntimeError, match="grad_dtype can only be set on leaf tensors"):
            y.grad_dtype = lib.float64


@pytest.mark.parametrize("sbp", [B, S(0)], ids=["B", "S0"])
def test_a_global_leaf_gets_its_grad_in_grad_dtype(sbp):
    want = torch.tensor([0.25, 0.5, 1.0, 2.0]) * 2   # d(x*x)/dx

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        x = flow.tensor([0.25, 0.5, 1.0, 2.0]).to_global(placement=place, sbp=[B]).to_global(sbp=[sbp])
        x = x.detach().requires_grad_()
        x.grad_dtype = flow.float64
        (x * x).sum().backward()
        return x.grad.dtype, x.grad.sbp, x.grad.to_global(sbp=[B]).to_local().to_torch()
    for dtype, grad_sbp, got in world.simulate(2, run):
        assert dtype == flow.float64 and tuple(grad_sbp) == (sbp,)
        torch.testing.assert_close(got, want.double())


def test_nn_graph_refuses_a_parameter_with_another_grad_dtype():
    """A graph's gradients and updates are in the parameters' dtypes: a grad_dtype it would ignore
    is refused by name (never silently dropped); resetting it to the dtype compiles."""
    m = flow.nn.Linear(3, 2)
    opt = flow.optim.SGD(m.parameters(), lr=0.1)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.m(x).sum()
            loss.backward()
            return loss
    m.weight.grad_dtype = flow.float64
    with pytest.raises(NotImplementedError, match="grad_dtype"):
        Train()(flow.ones(4, 3))
    m.weight.grad_dtype = flow.float32
    assert Train()(flow.ones(4, 3)).shape == ()
