"""Inference tensors against torch: what ops make inside ``inference_mode`` is one (a view by its
base's making); autograd outside refuses to save one for backward and to make one require grad,
while ops that save nothing of it, clones and no_grad tensors go on. Each program runs through torch
and holoflow: the same values and gradients, or the same exception class."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow

A = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], np.float32)


def _made(lib, how):
    a = lib.tensor(A)
    with {"inference": lib.inference_mode, "no_grad": lib.no_grad}[how]():
        return a * 2.0, a


PROGRAMS = {
    # (a saved factor: refused)
    "mul": lambda lib, i, n, w: i * w,
    "matmul": lambda lib, i, n, w: i @ w.t(),
    "saved by a later op": lambda lib, i, n, w: (w * 2.0).mul(i),
    "written into a clone": lambda lib, i, n, w: w.clone().mul_(i),
    "view of it": lambda lib, i, n, w: i[0] * w,
    "reshape of it": lambda lib, i, n, w: i.reshape(3, 2).t() * w,
    "saved by a custom rule": lambda lib, i, n, w: lib.nn.functional.softplus(w + 0.0) * i.sin(),
    # (nothing of it saved, or a normal tensor: computed)
    "add": lambda lib, i, n, w: i + w,
    "where": lambda lib, i, n, w: lib.where(i > 0, w, i),
    "clone outside": lambda lib, i, n, w: i.clone() * w,
    "no_grad tensor": lambda lib, i, n, w: n * w,
    "view taken inside of a normal tensor": lambda lib, i, n, w: _inner_view(lib, w) * w,
    "no_grad use": lambda lib, i, n, w: _no_grad_mul(lib, i, w) + w,
}


def _inner_view(lib, w):
    base = lib.tensor(A) * 1.0
    with lib.inference_mode():
        v = base[0:2]
    return v


def _no_grad_mul(lib, i, w):
    with lib.no_grad():
        return i * w


def _run(lib, name):
    i, _ = _made(lib, "inference")
    n, _ = _made(lib, "no_grad")
    w = lib.tensor(A, requires_grad=True)
    try:
        y = PROGRAMS[name](lib, i, n, w)
        y.sum().backward()
    except Exception as e:   # noqa: BLE001 - the class is what is compared
        return type(e), str(e)
    return y.detach().numpy(), w.grad.numpy()


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_saving_an_inference_tensor_for_backward_is_refused_as_torchs(name):
    # holoflow made no inference tensors: it saved them and computed where torch refuses
    want, got = _run(torch, name), _run(flow, name)
    if isinstance(want[0], type):
        assert got[0] is want[0], f"torch raised {want}, holoflow gave {got}"
        assert "Inference tensors cannot be saved for backward" in got[1] and "holoflow." in got[1], got[1]
    else:
        assert not isinstance(got[0], type), f"holoflow raised {got}"
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def _flags(lib):
    i, a = _made(lib, "inference")
    n, _ = _made(lib, "no_grad")
    with lib.inference_mode():
        ones = lib.ones(2)
        view_of_normal = a[0]
        made_rg = lib.ones(2, requires_grad=True)
    return [i.is_inference(), n.is_inference(), a.is_inference(), ones.is_inference(), i[0].is_inference(),
            i.clone().is_inference(), view_of_normal.is_inference(), made_rg.requires_grad]


def test_what_inference_mode_makes_is_an_inference_tensor():
    assert _flags(flow) == _flags(torch)


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_an_inference_tensor_cannot_require_grad_outside_inference_mode(lib):
    i, _ = _made(lib, "inference")
    with pytest.raises(RuntimeError, match="inference tensor outside InferenceMode"):
        i.requires_grad_()
    with lib.inference_mode():   # (inside, it may)
        assert i.requires_grad_().requires_grad


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_an_inference_tensor_under_saved_tensor_hooks_is_refused_too(lib):
    # (holoflow's C path hands saves under hooks to the Python one)
    i, _ = _made(lib, "inference")
    w = lib.tensor(A, requires_grad=True)
    with lib.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
            i * w


@pytest.mark.parametrize("how", ["grad", "jacrev", "jvp", "jacfwd", "vmap"])
@pytest.mark.parametrize("made", ["from the input", "fresh"])
def test_inference_mode_inside_a_transform_as_torchs(how, made):
    # reverse transforms refuse the saved inference tensor; forward mode and vmap save nothing in
    # torch (holoflow's forward mode, reverse mode inside, must not refuse what it saves itself)
    def run(lib):
        def f(a):
            with lib.inference_mode():
                b = a.sin() if made == "from the input" else lib.ones(3) * 2.0
            return (b * a).sum()
        x = lib.tensor(A[0])
        F = lib.func
        return {"grad": lambda: F.grad(f)(x), "jacrev": lambda: F.jacrev(f)(x),
                "jvp": lambda: F.jvp(f, (x,), (x * 0.5,))[1], "jacfwd": lambda: F.jacfwd(f)(x),
                "vmap": lambda: F.vmap(f)(lib.tensor(A))}[how]()
    if how in ("grad", "jacrev"):
        for lib in (torch, flow):
            with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
                run(lib)
    else:
        np.testing.assert_allclose(run(flow).numpy(), run(torch).numpy(), rtol=1e-6)
