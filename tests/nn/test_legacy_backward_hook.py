"""``Module.register_backward_hook`` (torch's deprecated non-full hook) vs torch: the hook sees the
gradients of the module's last op, may replace them, warns where torch warns, and cannot be mixed
with full backward hooks."""
import warnings

import numpy as np
import pytest
import torch

import holoflow as flow

X = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
Y = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)


class Mul:
    """``a * b``: a forward of one op with two inputs."""

    @staticmethod
    def make(lib):
        class M(lib.nn.Module):
            def forward(self, a, b):
                return a * b
        return M()


def _np(g):
    return None if g is None else g.detach().numpy()


def _run(lib, make, hook_result=None, n_inputs=1, warn_record=None):
    seen = []

    def hook(module, grad_input, grad_output):
        seen.append(([_np(g) for g in grad_input], [_np(g) for g in grad_output], module))
        if hook_result is not None:
            return hook_result(grad_input)
        return None

    m = make(lib)
    m.register_backward_hook(hook)
    x = lib.tensor(X, requires_grad=True)
    y = lib.tensor(Y, requires_grad=True)
    inputs = (x * 1, y * 1)[:n_inputs]   # non-leaf inputs: the last op's inputs are the module's
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = m(*inputs)
    if warn_record is not None:
        warn_record.extend(str(x.message) for x in w if issubclass(x.category, FutureWarning))
    (out * lib.tensor(Y)).sum().backward()
    return seen, m, _np(x.grad), _np(y.grad)


def _same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert (u is None) == (v is None)
        if u is not None:
            np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make,n", [(lambda lib: lib.nn.Sigmoid(), 1), (lambda lib: lib.nn.Tanh(), 1),
                                    (lambda lib: lib.nn.ReLU(), 1), (Mul.make, 2)],
                         ids=["sigmoid", "tanh", "relu", "mul"])
def test_hook_sees_last_op_gradients_like_torch(make, n):
    ts, tm, tx, ty = _run(torch, make, n_inputs=n)
    fs, fm, fx, fy = _run(flow, make, n_inputs=n)
    assert len(fs) == len(ts) == 1
    _same(fs[0][0], ts[0][0])   # grad_input
    _same(fs[0][1], ts[0][1])   # grad_output
    assert fs[0][2] is fm
    _same([fx, fy], [tx, ty])


@pytest.mark.parametrize("make,n", [(lambda lib: lib.nn.Sigmoid(), 1), (Mul.make, 2)], ids=["sigmoid", "mul"])
def test_hook_may_replace_grad_input_like_torch(make, n):
    def double(gi):
        return tuple(None if g is None else g * 2 for g in gi)
    _, _, tx, ty = _run(torch, make, double, n_inputs=n)
    _, _, fx, fy = _run(flow, make, double, n_inputs=n)
    _same([fx, fy], [tx, ty])
    _, _, plain, _ = _run(flow, make, n_inputs=n)
    np.testing.assert_allclose(fx, 2 * plain, rtol=1e-6)


@pytest.mark.filterwarnings("ignore::FutureWarning")   # (an input needing no gradient: torch warns)
def test_input_needing_no_gradient_gets_none_like_torch():
    def run(lib):
        seen = []
        m = Mul.make(lib)
        m.register_backward_hook(lambda mod, gi, go: seen.append(gi))
        x = lib.tensor(X, requires_grad=True)
        m(x * 1, lib.tensor(Y)).sum().backward()
        return seen[0]
    t, f = run(torch), run(flow)
    assert [g is None for g in f] == [g is None for g in t] == [False, True]


def test_several_hooks_chain_and_remove_like_torch():
    def run(lib):
        calls = []
        m = lib.nn.Sigmoid()
        m.register_backward_hook(lambda mod, gi, go: (calls.append("a"), (gi[0] * 3,))[1])
        h = m.register_backward_hook(lambda mod, gi, go: (calls.append("b"), (gi[0] + 1,))[1])
        x = lib.tensor(X, requires_grad=True)
        m(x * 1).sum().backward()
        g1 = x.grad.detach().numpy().copy()
        h.remove()
        x.grad = None
        m(x * 1).sum().backward()
        return calls, g1, x.grad.detach().numpy()
    tc, t1, t2 = run(torch)
    fc, f1, f2 = run(flow)
    assert fc == tc == ["a", "b", "a"]
    np.testing.assert_allclose(f1, t1, rtol=1e-6)
    np.testing.assert_allclose(f2, t2, rtol=1e-6)


def test_mixing_with_full_hooks_raises_like_torch():
    msg = "Cannot use both regular backward hooks and full backward hooks on a single Module"
    for lib in (torch, flow):
        m = lib.nn.Sigmoid()
        m.register_backward_hook(lambda *a: None)
        with pytest.raises(RuntimeError, match=msg):
            m.register_full_backward_hook(lambda *a: None)
        m = lib.nn.Sigmoid()
        m.register_full_backward_hook(lambda *a: None)
        with pytest.raises(RuntimeError, match=msg):
            m.register_backward_hook(lambda *a: None)


def test_legacy_hook_is_not_run_as_a_full_hook():
    # the full-hook machinery wraps inputs and outputs; a legacy hook must not be called by it
    calls = []
    m = flow.nn.Sigmoid()
    m.register_backward_hook(lambda mod, gi, go: calls.append(len(gi)))
    x = flow.tensor(X, requires_grad=True)
    m(x * 1).sum().backward()
    assert calls == [1]


def test_warnings_like_torch():
    def warned(lib, make, n, leaf=False):
        record = []
        if leaf:
            m = make(lib)
            m.register_backward_hook(lambda *a: None)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                m(lib.tensor(X, requires_grad=True))
            return [str(x.message) for x in w if issubclass(x.category, FutureWarning)]
        _run(lib, make, n_inputs=n, warn_record=record)
        return record

    class TwoOps:
        @staticmethod
        def make(lib):
            class M(lib.nn.Module):
                def forward(self, a):
                    return a.exp() * 2
            return M()
    sig = lambda lib: lib.nn.Sigmoid()  # noqa: E731
    # one op on the module's inputs: no warning
    assert warned(torch, sig, 1) == warned(flow, sig, 1) == []
    assert warned(torch, Mul.make, 2) == warned(flow, Mul.make, 2) == []
    # several ops, or a leaf input (its AccumulateGrad is not an input's grad_fn): torch warns
    for make, n, leaf in ((TwoOps.make, 1, False), (sig, 1, True)):
        t, f = warned(torch, make, n, leaf), warned(flow, make, n, leaf)
        assert len(t) == len(f) == 1
        assert "multiple autograd Nodes" in t[0] and "multiple autograd Nodes" in f[0]


def test_bad_hook_results_raise_like_torch():
    for lib in (torch, flow):
        m = lib.nn.Sigmoid()
        m.register_backward_hook(lambda mod, gi, go: gi[0])
        with pytest.raises(TypeError, match="expected tuple"):
            m(lib.tensor(X, requires_grad=True) * 1).sum().backward()
        m = lib.nn.Sigmoid()
        m.register_backward_hook(lambda mod, gi, go: (gi[0], gi[0]))
        with pytest.raises(RuntimeError, match="incorrect number of values"):
            m(lib.tensor(X, requires_grad=True) * 1).sum().backward()


def test_nested_modules_hooking_the_same_op_run_inner_first_like_torch():
    def run(lib):
        calls = []
        inner = lib.nn.Sigmoid()
        outer = lib.nn.Sequential(inner)
        inner.register_backward_hook(lambda *a: calls.append("inner"))
        outer.register_backward_hook(lambda *a: calls.append("outer"))
        x = lib.tensor(X, requires_grad=True)
        outer(x * 1).sum().backward()
        return calls
    assert run(flow) == run(torch) == ["inner", "outer"]
