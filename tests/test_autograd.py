"""The autograd engine against torch's: backward/grad arguments, accumulation, hooks, grad
modes, custom Functions, double backward and torch's errors (freed graph, in-place changes)."""
import numpy as np
import pytest
import torch

import holoflow as flow


def both(fn):
    """Runs ``fn(lib)`` under torch and holoflow; returns the two results as torch tensors."""
    def conv(x):
        if isinstance(x, flow.Tensor):
            return x.to_torch()
        if isinstance(x, (list, tuple)):
            return type(x)(conv(v) for v in x)
        return x
    return conv(fn(torch)), conv(fn(flow))


def close(a, b):
    if isinstance(a, (list, tuple)):
        for x, y in zip(a, b):
            close(x, y)
    elif a is None or b is None:
        assert a is None and b is None
    else:
        torch.testing.assert_close(b, a)


X0 = [[0.3, -1.2, 0.7], [1.5, 0.1, -0.4]]


def test_backward_with_gradient_and_accumulation():
    def f(lib):
        x = lib.tensor(X0, requires_grad=True)
        y = (x * x).sin()
        y.backward(lib.ones_like(y) * 0.5, retain_graph=True)
        y.backward(lib.full_like(y, 2.0))      # accumulates into .grad
        return x.grad
    close(*both(f))


def test_autograd_grad_allow_unused_and_create_graph():
    def f(lib):
        x = lib.tensor(X0, requires_grad=True)
        z = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = (x.exp() * x).sum()
        (gx, gz) = lib.autograd.grad(y, [x, z], create_graph=True, allow_unused=True)
        (ggx,) = lib.autograd.grad(gx.sum(), x)   # double backward
        return gx, gz, ggx
    close(*both(f))


def test_double_backward_through_matmul_and_tanh():
    def f(lib):
        a = lib.tensor(X0, requires_grad=True)
        w = lib.tensor([[0.2, -0.3], [0.5, 0.1], [-0.7, 0.4]], requires_grad=True)
        y = (a @ w).tanh().pow(2).sum()
        (ga,) = lib.autograd.grad(y, a, create_graph=True)
        (ga * ga).sum().backward()
        return a.grad, w.grad
    close(*both(f))


def test_hooks_on_leaf_and_non_leaf_and_retain_grad():
    def f(lib):
        x = lib.tensor(X0, requires_grad=True)
        x.register_hook(lambda g: g * 3)
        h = x * 2
        h.retain_grad()
        h.register_hook(lambda g: g + 1)
        h.exp().sum().backward()
        return x.grad, h.grad
    close(*both(f))


def test_removable_hook():
    x = flow.tensor(X0, requires_grad=True)
    handle = x.register_hook(lambda g: g * 10)
    handle.remove()
    (x * 1).sum().backward()
    assert x.grad.tolist() == [[1.0] * 3] * 2


def test_grad_modes():
    x = flow.tensor(X0, requires_grad=True)
    with flow.no_grad():
        assert not (x * 2).requires_grad
        with flow.enable_grad():
            assert (x * 2).requires_grad
    with flow.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert flow.is_grad_enabled()
    with flow.inference_mode():
        assert not (x * 2).requires_grad

    @flow.no_grad()
    def g():
        return x * 2
    assert not g().requires_grad and (x * 2).requires_grad


def test_detach_and_leaf_properties():
    x = flow.tensor(X0, requires_grad=True)
    y = x * 2
    assert x.is_leaf and not y.is_leaf and y.grad_fn is not None
    d = y.detach()
    assert d.is_leaf and not d.requires_grad
    d[0, 0] = 5.0  # shares storage, as torch
    assert y[0, 0].item() == 5.0


class Cube(flow.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x


class TorchCube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x


def test_custom_function_matches_torch():
    def f(lib):
        x = lib.tensor(X0, requires_grad=True)
        (Cube if lib is flow else TorchCube).apply(x).sin().sum().backward()
        return x.grad
    close(*both(f))


def test_backward_through_freed_graph_raises_like_torch():
    for lib in (torch, flow):
        x = lib.tensor(X0, requires_grad=True)
        y = (x.exp() * x).sum()
        y.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            y.backward()


def test_inplace_change_of_saved_tensor_raises_like_torch():
    for lib in (torch, flow):
        x = lib.tensor(X0, requires_grad=True)
        y = x.sigmoid()
        z = y * y
        y.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an in-?place operation"):
            z.sum().backward()


def test_clear_errors():
    x = flow.tensor(X0, requires_grad=True)
    with pytest.raises(RuntimeError, match="only for scalar outputs.*shape \\(2, 3\\)"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        flow.tensor(X0).sum().backward()
    with pytest.raises(RuntimeError, match="floating point"):
        flow.tensor([1, 2]).requires_grad_()
    with pytest.raises(RuntimeError, match="gradient has shape"):
        (x * 2).backward(flow.ones(3))
    with pytest.raises(RuntimeError, match="was not used"):
        flow.autograd.grad((x * 2).sum(), [x, flow.ones(2, requires_grad=True)])
    with pytest.raises(RuntimeError, match="holoflow.add.*\\(2, 3\\).*\\(4,\\)"):
        x + flow.ones(4)
    with pytest.raises(IndexError, match="holoflow.*out of range|holoflow.*out of bounds"):
        x.sum(dim=5)


def test_grads_of_broadcast_and_mixed_dtypes_match_torch():
    def f(lib):
        a = lib.tensor([[1.0], [2.0]], requires_grad=True)
        b = lib.tensor([0.5, -1.0, 2.0], dtype=lib.float64, requires_grad=True)
        (a * b + a).pow(2).sum().backward()
        return a.grad, b.grad
    close(*both(f))


def test_relu_double_backward_through_its_mask_is_zero_as_in_torch():
    """relu's gradient depends on x only through the mask ``out > 0``: its derivative there is a
    zero tensor (torch's), so a second derivative reached only that way is zeros, not "unused"."""
    got = []
    for lib in (torch, flow):
        x = lib.tensor([-1.0, 2.0, 3.0], requires_grad=True)
        (g,) = lib.autograd.grad(lib.relu(x).sum(), x, create_graph=True)
        (gg,) = lib.autograd.grad((g * g * 3).sum(), x)
        got.append(np.asarray(gg.detach().numpy()))
    np.testing.assert_array_equal(got[1], got[0])
    assert got[0].tolist() == [0.0, 0.0, 0.0]


def _leaf_hook_case(lib, kind: str):
    """A leaf reached by several paths: torch sums its gradients first (AccumulateGrad's input
    buffer), so a tensor hook and a post-accumulate hook run once, on the sum."""
    w = lib.tensor([1.0, -2.0, 3.0], requires_grad=True)
    calls, posts = [], []
    w.register_hook(lambda g: calls.append(g.detach().clone()) or g * g)
    w.register_post_accumulate_grad_hook(lambda t: posts.append(t.grad.detach().clone()))
    if kind == "two_paths":
        ((w * 3).sum() + (w * 5).sum()).backward()
    elif kind == "three_paths_and_a_node":
        y = w.exp()
        (y * w).sum().backward()            # w directly, through exp, and through mul
    elif kind == "root_leaf_too":
        y = (w * 2).sum()
        lib.autograd.backward([y, w], [lib.tensor(1.0), lib.ones(3)])
    elif kind == "retained_twice":
        y = (w * w).sum()
        y.backward(retain_graph=True)
        y.backward()
    elif kind == "grad_fn":
        (g,) = lib.autograd.grad((w * 3).sum() + (w * w).sum(), [w])
        return [c.tolist() for c in calls], [p.tolist() for p in posts], g.tolist()
    return [c.tolist() for c in calls], [p.tolist() for p in posts], w.grad.tolist()


@pytest.mark.parametrize("kind", ["two_paths", "three_paths_and_a_node", "root_leaf_too", "retained_twice",
                                  "grad_fn"])
def test_leaf_hooks_run_once_on_the_summed_gradient(kind):
    assert _leaf_hook_case(flow, kind) == _leaf_hook_case(torch, kind)


def test_autograd_grad_takes_torchs_arguments():
    """torch.autograd.grad's signature: only_inputs (deprecated, 6th positional), dict inputs,
    is_grads_batched, materialize_grads; and its argument errors."""
    def f(lib):
        x = lib.tensor(X0, requires_grad=True)
        z = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = (x.exp() * x).sum(0) * z
        # positional: outputs, inputs, grad_outputs, retain_graph, create_graph, only_inputs, allow_unused
        (gx,) = lib.autograd.grad(y, x, lib.ones_like(y), True, True, True, False)
        named = lib.autograd.grad(y.sum(), {"x": x, "z": z}, retain_graph=True, only_inputs=True)
        assert isinstance(named, dict) and list(named) == ["x", "z"]
        eye = lib.eye(3)
        jac = lib.autograd.grad(y, [x, z], eye, retain_graph=True, is_grads_batched=True)
        u = lib.ones(2, requires_grad=True)
        gu = lib.autograd.grad(y.sum(), [z, u], materialize_grads=True)
        return gx, named["x"], named["z"], jac[0], jac[1], gu[0], gu[1]
    close(*both(f))


def test_autograd_grad_argument_errors_like_torch():
    for lib in (torch, flow):
        x = lib.tensor(X0, requires_grad=True)
        y = (x * 2).sum(0)
        with pytest.raises(ValueError, match="allow_unused to be True"):
            lib.autograd.grad(y.sum(), x, materialize_grads=True, allow_unused=False)
        with pytest.raises(RuntimeError, match="cannot be empty"):
            lib.autograd.grad(y.sum(), [])
        with pytest.raises(TypeError, match="must be a dict"):
            import types
            lib.autograd.grad(y.sum(), types.MappingProxyType({"x": x}))
        with pytest.warns(FutureWarning, match="only_inputs argument is deprecated"):
            lib.autograd.grad(y.sum(), x, only_inputs=False, retain_graph=True)
        with pytest.raises(RuntimeError, match="first dimension of each grad_output as the batch"):
            lib.autograd.grad(y, x, lib.ones(2, 4), is_grads_batched=True)


@pytest.mark.parametrize("how", ["grad", "backward_inputs"])
def test_rules_compute_only_the_gradients_asked_for(how):
    """A rule that cannot differentiate one input (zeta in x, igamma in its first argument) still
    gives the others when only they are asked for, as torch's engine computes only the outputs a
    graph task needs; a full backward hook then sees None for the gradients not computed."""
    def run(L):
        L.manual_seed(0)
        x = L.tensor([2.0, 3.0], requires_grad=True)
        q = L.tensor([1.5, 2.5], requires_grad=True)
        a = L.tensor([2.0, 3.0], requires_grad=True)
        seen = []
        lin = L.nn.Linear(2, 2)
        lin.register_full_backward_hook(lambda m, gin, gout: seen.append(gin[0] is None))
        y = (L.special.zeta(x, q) + L.igamma(a, q) + lin(q * x)).sum()
        if how == "grad":
            got = L.autograd.grad(y, q)[0]
        else:
            y.backward(inputs=[q])
            got = q.grad
            assert x.grad is None and a.grad is None
        return got.detach().numpy(), seen
    (theirs, seen_t), (ours, seen_o) = run(torch), run(flow)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert seen_o == seen_t


@pytest.mark.parametrize("make", ["channels_last", "transposed", "strided_slice", "contiguous"])
def test_leaf_gradients_are_laid_out_as_torchs(make):
    """torch's layout contract: a dense leaf's ``.grad`` has the leaf's strides (channels_last
    parameters get channels_last gradients), any other leaf's is contiguous."""
    def run(lib):
        lib.manual_seed(0)
        if make == "channels_last":
            x = lib.randn(2, 3, 4, 5).to(memory_format=lib.channels_last)
        elif make == "transposed":
            x = lib.randn(4, 5).t()
        elif make == "strided_slice":
            x = lib.randn(4, 6)[:, ::2]
        else:
            x = lib.randn(3, 4)
        x = x.detach().requires_grad_()
        (x.sin() * 2).sum().backward()
        return x.grad.stride(), x.grad.detach().numpy()
    (s_t, g_t), (s_f, g_f) = run(torch), run(flow)
    assert s_f == s_t
    np.testing.assert_allclose(g_f, g_t, rtol=1e-6)


@pytest.mark.parametrize("enter", ["mul", "to", "type_as", "cfloat"])
def test_a_real_inputs_gradient_from_complex_math_is_the_real_part_silently(enter):
    """(through ``x.to(torch.cfloat)`` the gradient came back by a complex-to-real ``to`` that
    warned it discards the imaginary part; type_as and cfloat() cast by another op)"""
    import warnings
    enters = {"mul": lambda x, z: x * z, "to": lambda x, z: x.to(z.dtype) * z,
              "type_as": lambda x, z: x.type_as(z) @ z, "cfloat": lambda x, z: (x.cfloat() / z).exp()}

    def run(lib):
        lib.manual_seed(0)
        x = lib.randn(4, requires_grad=True)
        z = lib.randn(4, dtype=lib.cfloat)
        lib.view_as_real(enters[enter](x, z)).sum().backward()
        return x.grad.numpy()
    want = run(torch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # (a cast of complex to real warns: the real part does not)
        got = run(flow)
    np.testing.assert_allclose(got, want, rtol=1e-6)
