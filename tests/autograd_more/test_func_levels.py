"""holoflow.func's transform levels and forward mode against torch.func: levels are per thread,
forward mode runs through no_grad regions and checkpoints, what ``requires_grad`` reports inside
the transforms, in-place writes under forward mode. Each program runs through torch and holoflow
and the values (or exception classes) must agree."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import holoflow as flow


def _t(lib, values, rg: bool = False):
    return lib.tensor(values, dtype=lib.float64, requires_grad=rg)


def _np(x) -> np.ndarray:
    return np.asarray(x.detach().tolist(), dtype=np.float64)


def _same(got, want) -> None:
    np.testing.assert_allclose(_np(got), _np(want), rtol=1e-10, atol=1e-12)


X, T = [0.5, 1.0, 2.0], [1.0, -0.5, 2.0]


# -- levels are per thread ------------------------------------------------------------------------

@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_a_transform_in_another_thread_does_not_change_which_hooks_fire(lib):
    # thread A sits inside grad(f) (one level deep) while this thread runs a plain backward with a
    # hook: holoflow's level was process-wide, so the backward here ran at A's level and skipped
    # the hook registered at level 0 (silent)
    inside, done = threading.Event(), threading.Event()
    got = {}

    def body(a):
        inside.set()
        done.wait(30)
        return (a * a).sum()

    def other():
        got["g"] = lib.func.grad(body)(_t(lib, X))

    x = _t(lib, X, rg=True)
    y = x * 2.0
    y.register_hook(lambda g: g * 10.0)
    th = threading.Thread(target=other)
    th.start()
    try:
        assert inside.wait(30)
        y.sum().backward()
    finally:
        done.set()
        th.join(30)
    _same(x.grad, _t(lib, [20.0] * 3))
    _same(got["g"], _t(lib, [2 * v for v in X]))
