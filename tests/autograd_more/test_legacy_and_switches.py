"""Variable, torch.autograd.variable, the multithreading and view-replay switches, and the package's
names, against torch."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

import holoflow as flow

LIBS = (torch, flow)


def test_variable_is_the_tensor_type_and_returns_a_detached_alias():
    for lib in LIBS:
        V = lib.autograd.Variable
        t = lib.ones(2)
        assert isinstance(t, V) and not isinstance(np.ones(2), V)
        v = V(t)
        assert type(v) is type(t) and v is not t and not v.requires_grad
        t.add_(1)   # shares the storage
        np.testing.assert_allclose(v.numpy(), [2.0, 2.0])
        h = lib.ones(2, requires_grad=True) * 2
        v2 = V(h)
        assert v2.grad_fn is None and v2.is_leaf and not v2.requires_grad
        v3 = V(h, True)
        assert v3.requires_grad and v3.grad_fn is None
        assert tuple(V().shape) == (0,) and tuple(V(None).shape) == (0,)
        assert not V(t, name="x").requires_grad


def test_variable_errors_and_warnings():
    for lib in LIBS:
        V = lib.autograd.Variable
        with pytest.raises(TypeError, match="Variable data has to be a tensor, but got list"):
            V([1, 2])
        with pytest.raises(RuntimeError, match="(?i)only tensors of floating point"):
            V(lib.ones(2, dtype=lib.int64), requires_grad=True)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            V(lib.ones(2), volatile=True)
        assert any("volatile was removed and now has no effect" in str(m.message) for m in w)


def test_lowercase_variable_is_refused():
    for lib in LIBS:
        with pytest.raises(RuntimeError, match=r"autograd\.variable\(\.\.\.\) is deprecated"):
            lib.autograd.variable(lib.ones(1))


def test_multithreading_switch_like_torch():
    for lib in LIBS:
        A = lib.autograd
        assert A.is_multithreading_enabled() is True
        with A.set_multithreading_enabled(False):
            assert A.is_multithreading_enabled() is False
            seen = []
            th = threading.Thread(target=lambda: seen.append(A.is_multithreading_enabled()))
            th.start()
            th.join()
            assert seen == [True]   # per thread
        assert A.is_multithreading_enabled() is True
        d = A.set_multithreading_enabled(False)
        f = d(lambda: A.is_multithreading_enabled())
        assert (A.is_multithreading_enabled(), f(), A.is_multithreading_enabled()) == (False, False, False)
        A.set_multithreading_enabled(True)
        assert A.is_multithreading_enabled() is True
        x = lib.ones(2, requires_grad=True)
        with A.set_multithreading_enabled(False):   # backward still works
            (x * 3).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_view_replay_is_what_holoflow_always_does():
    # torch: False unless _force_original_view_tracking; holoflow always re-derives a view's
    # history by replaying its view ops (core/views.py), so it answers True (a documented divergence)
    assert torch.autograd.is_view_replay_enabled() is False
    assert flow.autograd.is_view_replay_enabled() is True


def test_public_names_of_torch_autograd_exist():
    missing = [n for n in torch.autograd.__all__ if not hasattr(flow.autograd, n)]
    # NestedIOFunction (a deprecated Function variant) and enforce_grad_layout_policy are not provided
    assert set(missing) <= {"NestedIOFunction", "enforce_grad_layout_policy", "grad_mode"}, missing
    assert all(hasattr(flow.autograd.graph, n) for n in ("saved_tensors_hooks", "save_on_cpu",
                                                         "disable_saved_tensors_hooks", "register_multi_grad_hook",
                                                         "Node", "GradientEdge", "get_gradient_edge",
                                                         "increment_version"))
