"""autograd.graph's Node, node hooks, register_multi_grad_hook, GradientEdge and increment_version
against torch: the same program under both libraries. Node names differ by design (holoflow's are
``<MulBackward>``, torch's ``MulBackward0``); the structure, the values and the errors are compared."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow

GRAPH = {torch: torch.autograd.graph, flow: flow.autograd.graph}
LIBS = (torch, flow)


def _leaf(lib, *shape, seed=0, rg=True):
    return lib.tensor(np.random.default_rng(seed).standard_normal(shape), dtype=lib.float32, requires_grad=rg)


def _shape(fns) -> tuple:
    """``next_functions`` as (kind, index): node, leaf accumulator or None."""
    return tuple(("none" if n is None else "acc" if "AccumulateGrad" in n.name() else "node", i) for n, i in fns)


def test_grad_fn_is_a_node_with_next_functions_and_metadata():
    for lib in LIBS:
        a, b = _leaf(lib, 3), _leaf(lib, 3, seed=1, rg=False)
        c = a * b
        d = c.exp() * a
        node = GRAPH[lib].Node
        assert isinstance(d.grad_fn, node) and not isinstance(a, node)
        assert "MulBackward" in d.grad_fn.name()
        assert _shape(c.grad_fn.next_functions) == (("acc", 0), ("none", 0))
        assert _shape(d.grad_fn.next_functions) == (("node", 0), ("acc", 0))
        acc = c.grad_fn.next_functions[0][0]
        assert isinstance(acc, node) and acc.variable is a and acc.next_functions == ()
        assert acc is d.grad_fn.next_functions[1][0]   # one accumulator per leaf
        assert d.grad_fn.next_functions[0][0].next_functions[0][0] is c.grad_fn
        assert d.grad_fn.metadata == {}
        d.grad_fn.metadata["k"] = 1
        assert d.grad_fn.metadata == {"k": 1}


def test_node_hooks_order_and_replacement():
    res = {}
    for lib in LIBS:
        a = _leaf(lib, 2)
        b = a * 2
        order = []
        b.register_hook(lambda g: order.append("tensor"))
        b.grad_fn.register_prehook(lambda go: order.append(("pre", len(go))) or (go[0] * 3,))
        b.grad_fn.register_hook(lambda gi, go: order.append(("post", len(gi), len(go))) or (gi[0] + 1, gi[1]))
        b.sum().backward()
        res[lib] = (order, a.grad.numpy())
    assert res[flow][0] == res[torch][0] == ["tensor", ("pre", 1), ("post", 2, 1)]
    np.testing.assert_allclose(res[flow][1], res[torch][1])


def test_node_hook_handles_remove():
    res = {}
    for lib in LIBS:
        a = _leaf(lib, 3)
        b = a.clone()
        h = b.grad_fn.register_hook(lambda gi, go: (go[0] * 2,))
        b.sum().backward(retain_graph=True)
        first = a.grad.numpy().copy()
        h.remove()
        a.grad = None
        p = b.grad_fn.register_prehook(lambda go: (go[0] * 5,))
        b.sum().backward(retain_graph=True)
        second = a.grad.numpy().copy()
        p.remove()
        a.grad = None
        b.sum().backward()
        res[lib] = (first, second, a.grad.numpy())
    for f, t in zip(res[flow], res[torch]):
        np.testing.assert_allclose(f, t)


def test_hook_returning_the_wrong_number_of_values_raises():
    for lib in LIBS:
        a = _leaf(lib, 3)
        b = a * 2
        b.grad_fn.register_hook(lambda gi, go: (gi[0],))
        with pytest.raises(RuntimeError, match=r"returned an incorrect number of values \(got 1, but expected 2\)"):
            b.sum().backward()


def test_accumulate_grad_pre_and_post_hooks():
    res = {}
    for lib in LIBS:
        a = _leaf(lib, 2)
        acc = (a * 2).grad_fn.next_functions[0][0]
        seen = []
        acc.register_prehook(lambda go: seen.append(("pre", go[0].numpy().tolist(), a.grad)) or (go[0] * 10,))
        acc.register_hook(lambda gi, go: seen.append(("post", gi, go[0].numpy().tolist(), a.grad.numpy().tolist())))
        (a * 2).sum().backward()
        res[lib] = seen
    assert res[flow] == res[torch]


def test_multi_grad_hook_all_mode_torch_docstring_example():
    res = {}
    for lib in LIBS:
        a, b = _leaf(lib, 2, 3), _leaf(lib, 2, 3, seed=1)
        c, d = a * b, a * b
        calls = []
        GRAPH[lib].register_multi_grad_hook((a, b, c, d), lambda grads: calls.append([g is not None for g in grads]))
        c.sum().backward(retain_graph=True)
        c.sum().backward(inputs=(a,), retain_graph=True)
        (c.sum() + d.sum()).backward(retain_graph=True)
        res[lib] = calls
    assert res[flow] == res[torch]
    assert res[flow][:2] == [[True, True, True, False], [True, False, True, False]]
    # a known divergence: torch refuses a leaf here under autograd.grad ("A leaf node was passed to
    # _will_engine_execute_node but we are currently running autograd.grad()"); holoflow answers
    flow.autograd.grad(c.sum(), (b,))
    assert calls[-1] == [False, True, True, False]


def test_multi_grad_hook_all_mode_passes_the_gradients_and_removes():
    res = {}
    for lib in LIBS:
        a, b = _leaf(lib, 3), _leaf(lib, 3, seed=1)
        got = []
        h = GRAPH[lib].register_multi_grad_hook((a, b), lambda grads: got.append([g.numpy().copy() for g in grads]))
        (a * b).sum().backward()
        h.remove()
        (a * b).sum().backward()
        res[lib] = got
    assert len(res[flow]) == len(res[torch]) == 1
    for f, t in zip(res[flow][0], res[torch][0]):
        np.testing.assert_allclose(f, t)


def test_multi_grad_hook_any_mode_calls_once_per_backward():
    res = {}
    for lib in LIBS:
        a, b = _leaf(lib, 3), _leaf(lib, 3, seed=1)
        n = _leaf(lib, 3, seed=2, rg=False)
        got = []
        GRAPH[lib].register_multi_grad_hook((a, b, n), lambda g: got.append(tuple(g.shape)), mode="any")
        (a * b).sum().backward()
        (a * 2).sum().backward()
        res[lib] = got
    assert res[flow] == res[torch] == [(3,), (3,)]


def test_multi_grad_hook_errors():
    for lib in LIBS:
        a, n = _leaf(lib, 3), _leaf(lib, 3, rg=False)
        with pytest.raises(ValueError, match="Expects mode to be one of"):
            GRAPH[lib].register_multi_grad_hook((a,), print, mode="some")
        with pytest.raises(AssertionError):
            GRAPH[lib].register_multi_grad_hook((a, n), print)


def test_gradient_edge():
    for lib in LIBS:
        g = GRAPH[lib]
        a = _leaf(lib, 3)
        b = a * 2
        e = g.get_gradient_edge(b)
        assert isinstance(e, g.GradientEdge) and e.node is b.grad_fn and e.output_nr == 0
        assert g.get_gradient_edge(a).node.variable is a
        with pytest.raises(RuntimeError, match="not possible to get the gradient edge"):
            g.get_gradient_edge(_leaf(lib, 3, rg=False))
    assert list(flow.autograd.graph.GradientEdge._fields) == list(torch.autograd.graph.GradientEdge._fields)


def test_increment_version_is_seen_by_backward():
    for lib in LIBS:
        a = _leaf(lib, 3)
        h = a * 1
        out = h.sin()
        v = h._version
        GRAPH[lib].increment_version(h)
        GRAPH[lib].increment_version([h, a.detach()])
        assert h._version == v + 2
        with pytest.raises(RuntimeError, match="modified by an inplace operation|modified by an in-place"):
            out.sum().backward()
