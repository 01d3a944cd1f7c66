"""autograd.graph's saved-tensor hooks against torch: the same program under torch and holoflow,
with the same hooks; what the hooks see (calls, shapes, requires_grad, grad_fn), the gradients,
retain_graph, double backward, custom Functions, the errors, nn.Graph and global tensors."""
from __future__ import annotations

import gc
import inspect
import weakref

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.graph import Graph, GraphBuildError

GRAPH = {torch: torch.autograd.graph, flow: flow.autograd.graph}


def _params(f) -> list:
    return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]


def _leaves(lib, n=2, dtype=None, seed=0):
    g = np.random.default_rng(seed)
    dt = (torch.float64 if lib is torch else flow.float64) if dtype == "f64" else None
    return [lib.tensor(g.standard_normal((3, 4)), dtype=dt or (torch.float32 if lib is torch else flow.float32),
                       requires_grad=True) for _ in range(n)]


def _logging_hooks(log, copy=False):
    def pack(x):
        log.append(("pack", tuple(x.shape), x.requires_grad, x.grad_fn is not None))
        return x.detach().clone() if copy else x.detach()

    def unpack(p):
        log.append(("unpack", tuple(p.shape)))
        return p
    return pack, unpack


PROGRAMS = {
    "mul": lambda L, a, b: (a * b).sum(),
    "mul_exp": lambda L, a, b: (a * b).exp().sum(),
    "sin_tanh": lambda L, a, b: (a.sin() + b).tanh().sum(),
    "matmul": lambda L, a, b: (a @ b.t()).sum(),
    "add_only": lambda L, a, b: (a + b).sum(),
    "sigmoid_pow": lambda L, a, b: (L.sigmoid(a) * b).pow(2).sum(),
}


def _run(lib, name, copy=False):
    a, b = _leaves(lib)
    log = []
    with GRAPH[lib].saved_tensors_hooks(*_logging_hooks(log, copy)):
        loss = PROGRAMS[name](lib, a, b)
    packs = list(log)
    loss.backward()
    return packs, log[len(packs):], loss.detach().numpy(), a.grad.numpy(), b.grad.numpy()


@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.parametrize("copy", [False, True])
def test_hooks_see_what_torch_saves_and_gradients_match(name, copy):
    tp, tu, tl, tga, tgb = _run(torch, name, copy)
    fp, fu, fl, fga, fgb = _run(flow, name, copy)
    assert sorted(fp) == sorted(tp)   # the same tensors packed (shape, requires_grad, has grad_fn)
    assert sorted(fu) == sorted(tu)   # and each unpacked once
    np.testing.assert_allclose(fl, tl, rtol=1e-5)
    np.testing.assert_allclose(fga, tga, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fgb, tgb, rtol=1e-5, atol=1e-6)


def test_without_hooks_nothing_is_packed_and_no_grad_saves_nothing():
    for lib in (torch, flow):
        a, b = _leaves(lib)
        log = []
        with lib.no_grad(), GRAPH[lib].saved_tensors_hooks(*_logging_hooks(log)):
            (a * b).exp()
        assert log == []


def test_retain_graph_unpacks_again_on_each_backward():
    counts = {}
    for lib in (torch, flow):
        a, b = _leaves(lib)
        log = []
        with GRAPH[lib].saved_tensors_hooks(*_logging_hooks(log)):
            loss = (a * b).exp().sum()
        n = len(log)
        loss.backward(retain_graph=True)
        first = len(log) - n
        loss.backward()
        counts[lib] = (n, first, len(log) - n - first, a.grad.numpy())
    assert counts[flow][:3] == counts[torch][:3] == (3, 3, 3)
    np.testing.assert_allclose(counts[flow][3], counts[torch][3], rtol=1e-5)


def test_a_rule_reading_saved_tensors_twice_unpacks_each_once():
    # layer_norm's rule reads its saved input and its saved statistics (outputs) separately
    log = []
    x = flow.randn(2, 5, requires_grad=True)
    w, b = flow.randn(5, requires_grad=True), flow.randn(5, requires_grad=True)
    with flow.autograd.graph.saved_tensors_hooks(*_logging_hooks(log)):
        y = flow.nn.functional.layer_norm(x, (5,), w, b)
    packs = len(log)
    y.sum().backward()
    assert len(log) - packs == packs


def test_double_backward_reaches_the_graph_not_the_unpacked_values_history():
    res = {}
    for lib in (torch, flow):
        x = _leaves(lib, 1, "f64")[0]
        z = _leaves(lib, 1, "f64", seed=1)[0]
        # the unpacked value carries z's history; the gradient must follow x's own
        with GRAPH[lib].saved_tensors_hooks(lambda t: t.detach().clone(), lambda p: p * 1 + z * 0):
            y = (x * x).sin().sum()
        g, = lib.autograd.grad(y, x, create_graph=True)
        assert g.requires_grad
        gg = lib.autograd.grad(g.sum(), (x, z), allow_unused=True)
        res[lib] = (g.detach().numpy(), gg[0].numpy(), gg[1])
    np.testing.assert_allclose(res[flow][0], res[torch][0], rtol=1e-10)
    np.testing.assert_allclose(res[flow][1], res[torch][1], rtol=1e-10)
    assert res[flow][2] is None and res[torch][2] is None


def test_hooks_active_during_create_graph_backward_pack_what_backward_saves():
    res = {}
    for lib in (torch, flow):
        x = _leaves(lib, 1, "f64")[0]
        log = []
        with GRAPH[lib].saved_tensors_hooks(*_logging_hooks(log)):
            y = (x * x).sin().sum()
            g, = lib.autograd.grad(y, x, create_graph=True)
            g.sum().backward()
        res[lib] = x.grad.numpy()
        assert any(e[0] == "pack" for e in log[3:])   # the backward's own ops saved through the hooks
    np.testing.assert_allclose(res[flow], res[torch], rtol=1e-10)


def _custom(lib):
    class Cube(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x * x * x
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return 3 * y / x * g
    return Cube


def test_custom_function_saved_tensors_go_through_the_hooks():
    res = {}
    for lib in (torch, flow):
        x = _leaves(lib, 1, "f64")[0]
        log = []
        with GRAPH[lib].saved_tensors_hooks(*_logging_hooks(log, copy=True)):
            y = _custom(lib).apply(x)
        g, = lib.autograd.grad(y.sum(), x, create_graph=True)
        g.sum().backward()
        res[lib] = (sorted(log), g.detach().numpy(), x.grad.numpy())
    assert res[flow][0] == res[torch][0]
    np.testing.assert_allclose(res[flow][1], res[torch][1], rtol=1e-10)
    np.testing.assert_allclose(res[flow][2], res[torch][2], rtol=1e-10)


@pytest.mark.parametrize("copy", [False, True])
def test_in_place_write_after_packing_is_not_checked_as_in_torch(copy):
    # torch checks no version counter of a packed tensor: the gradient reads what the hooks kept
    res = {}
    for lib in (torch, flow):
        a, b = _leaves(lib)
        with GRAPH[lib].saved_tensors_hooks(*_logging_hooks([], copy)):
            c = a * 2
            d = c * b
        with lib.no_grad():
            c.add_(1)
        d.sum().backward()
        res[lib] = b.grad.numpy()
    np.testing.assert_allclose(res[flow], res[torch], rtol=1e-6)


def test_in_place_write_is_still_caught_once_the_hooks_are_gone():
    for lib in (torch, flow):
        a, b = _leaves(lib)
        with GRAPH[lib].saved_tensors_hooks(*_logging_hooks([])):
            pass
        c = a * 2
        d = c * b
        c.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation|modified by an in-place"):
            d.sum().backward()


def test_pack_hook_writing_its_input_raises():
    for lib in (torch, flow):
        a, b = _leaves(lib)

        def bad(x):
            x.add_(1)
            return x
        with GRAPH[lib].saved_tensors_hooks(bad, lambda p: p):
            with pytest.raises(RuntimeError, match="pack hook is modifying its input in place"):
                (a * 1) * b


def test_unpack_hook_returning_a_non_tensor_raises_type_error():
    for lib in (torch, flow):
        a, b = _leaves(lib)
        with GRAPH[lib].saved_tensors_hooks(lambda x: 1, lambda p: p):
            c = a * b
        with pytest.raises(TypeError, match="unpack_hook expected to be a Tensor but got result of type int"):
            c.sum().backward()


def test_nested_hooks_innermost_pair_acts():
    for lib in (torch, flow):
        a, b = _leaves(lib)
        outer, inner = [], []
        with GRAPH[lib].saved_tensors_hooks(*_logging_hooks(outer)):
            with GRAPH[lib].saved_tensors_hooks(*_logging_hooks(inner)):
                c = a * b
            c.exp()
        assert len(inner) == 2 and len(outer) == 1


def test_disable_saved_tensors_hooks():
    for lib in (torch, flow):
        g = GRAPH[lib]
        with g.disable_saved_tensors_hooks("no hooks here"):
            with pytest.raises(RuntimeError, match="^no hooks here$"):
                with g.saved_tensors_hooks(lambda x: x, lambda x: x):
                    pass
            with g.disable_saved_tensors_hooks("inner message"):
                with pytest.raises(RuntimeError, match="^inner message$"):
                    g.saved_tensors_hooks(lambda x: x, lambda x: x).__enter__()
            with pytest.raises(RuntimeError, match="^no hooks here$"):   # the outer message is back
                g.saved_tensors_hooks(lambda x: x, lambda x: x).__enter__()
        with g.saved_tensors_hooks(lambda x: x, lambda x: x):   # enabled again
            with pytest.raises(RuntimeError, match="^active$"):   # refused while hooks are active
                with g.disable_saved_tensors_hooks("active"):
                    pass
        with g.saved_tensors_hooks(lambda x: x, lambda x: x):   # and that left hooks enabled
            pass


def test_save_on_cpu_signature_and_gradients():
    assert _params(flow.autograd.graph.save_on_cpu) == _params(torch.autograd.graph.save_on_cpu)
    for pin in (False, True):
        res = {}
        for lib in (torch, flow):
            a, b = _leaves(lib)
            with GRAPH[lib].save_on_cpu(pin_memory=pin):
                loss = (a * b).sin().sum()
            loss.backward()
            res[lib] = (a.grad.numpy(), b.grad.numpy())
        for f, t in zip(res[flow], res[torch]):
            np.testing.assert_allclose(f, t, rtol=1e-6)


def test_a_packed_node_does_not_keep_the_original_tensor():
    # what the node saves is only the packed copy: the activation itself can be freed
    a, b = flow.randn(3, 4, requires_grad=True), flow.randn(3, 4, requires_grad=True)
    with flow.autograd.graph.saved_tensors_hooks(lambda x: x.detach().clone(), lambda p: p):
        h = a * b
        out = h.exp()
    ref = weakref.ref(h._data)
    grad_fn = out.grad_fn
    del h
    gc.collect()
    assert ref() is None and grad_fn is not None
    out.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), (b * (a * b).exp()).detach().numpy(), rtol=1e-6)


class _Train(Graph):
    def __init__(self, hooks_inside: bool):
        super().__init__()
        self.m, self.hooks_inside = flow.nn.Linear(4, 3), hooks_inside
        self.add_optimizer(flow.optim.SGD(self.m.parameters(), lr=0.1))

    def build(self, x):
        if self.hooks_inside:
            with flow.autograd.graph.save_on_cpu():
                loss = self.m(x).tanh().sum()
        else:
            loss = self.m(x).tanh().sum()
        loss.backward()
        return loss


@pytest.mark.parametrize("inside", [True, False])
def test_hooks_while_an_nn_graph_traces_raise_naming_what_to_do(inside):
    # a compiled plan would run later steps without the hooks: refused, never silently ignored
    g = _Train(inside)
    with pytest.raises(GraphBuildError, match="activation_checkpointing") as e:
        if inside:
            g(flow.randn(2, 4))
        else:
            with flow.autograd.graph.save_on_cpu():
                g(flow.randn(2, 4))
    assert isinstance(e.value, NotImplementedError) and "saved_tensors_hooks" in str(e.value)
    assert np.isfinite(float(_Train(False)(flow.randn(2, 4))))   # without the hooks it compiles


_X0, _W0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), \
    torch.randn(3, generator=torch.Generator().manual_seed(1))   # (made once: rank threads share torch's generator)


def _global_grads(rank, hooks):
    place = flow.placement("cpu", [0, 1])
    x0, w0 = _X0, _W0
    x = flow.from_torch(x0).to_global(place, flow.sbp.broadcast).to_global(sbp=flow.sbp.split(0))
    x.requires_grad_(True)
    w = flow.from_torch(w0).to_global(place, flow.sbp.broadcast).requires_grad_(True)
    if hooks:
        with flow.autograd.graph.saved_tensors_hooks(lambda t: t.detach().clone(), lambda p: p):
            loss = (x * w).sin().sum()
    else:
        loss = (x * w).sin().sum()
    loss.backward()
    return [t.grad.to_global(sbp=flow.sbp.broadcast).to_local().to_torch() for t in (x, w)]


def test_global_tensors_with_hooks_on_simulated_ranks():
    plain = world.simulate(2, lambda r: _global_grads(r, False))
    hooked = world.simulate(2, lambda r: _global_grads(r, True))
    for p, h in zip(plain, hooked):
        for a, b in zip(p, h):
            torch.testing.assert_close(a, b)
    x0, w0 = _X0.clone().requires_grad_(), _W0.clone().requires_grad_()   # and against torch on one process
    (x0 * w0).sin().sum().backward()
    torch.testing.assert_close(hooked[0][0], x0.grad)
    torch.testing.assert_close(hooked[0][1], w0.grad)


def test_a_compiled_training_graph_called_under_hooks_is_refused_and_inference_is_not():
    """The trace refuses the hooks; a plan compiled before them would run its backward without
    them (silently): its call is refused too. An inference graph saves nothing: it runs."""
    g = _Train(False)
    x = flow.randn(2, 4)
    g(x)   # compiled without hooks
    with flow.autograd.graph.save_on_cpu():
        with pytest.raises(NotImplementedError, match="saved_tensors_hooks.*activation_checkpointing"):
            g(x)
    assert np.isfinite(float(g(x)))

    class Infer(Graph):
        def __init__(self):
            super().__init__()
            self.m = flow.nn.Linear(4, 3)

        def build(self, x):
            return self.m(x)
    infer = Infer()
    want = infer(x).to_torch()
    with flow.autograd.graph.save_on_cpu():
        torch.testing.assert_close(infer(x).to_torch(), want)
