"""torch's GradientEdges in ``autograd.grad`` / ``autograd.backward`` (torch 2.4+): as outputs, a
backward starting at a node with a given gradient; as inputs, the gradient flowing into a node
(or, for a leaf's AccumulateGrad, the leaf's). The same program on torch and holoflow gives the
same values: torch's own stage_backward_input / stage_backward_weight pattern (input gradients
first, capturing where the weights' paths leave, the weights' gradients later from there)."""
import numpy as np
import pytest
import torch

import holoflow as flow


def _program(lib):
    g = lib.autograd.graph
    w1 = lib.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), requires_grad=True)
    w2 = lib.tensor(np.linspace(0.5, -0.5, 8, dtype=np.float32).reshape(4, 2), requires_grad=True)
    x = lib.tensor(np.linspace(-2, 2, 15, dtype=np.float32).reshape(5, 3), requires_grad=True)
    h = lib.tanh(x @ w1)
    y = (h @ w2).sin()
    dy = lib.ones_like(y)
    edge_h = g.get_gradient_edge(h)
    # the input part: x's gradient, and the gradient flowing into h's node
    gx, gh = lib.autograd.grad(y, [x, edge_h], dy, retain_graph=True)
    # the weight parts: from h's edge with that gradient to w1 (not through x), from y to w2
    (gw1,) = lib.autograd.grad([edge_h], [w1], [gh], retain_graph=True)
    (gw2,) = lib.autograd.grad([g.get_gradient_edge(y)], [g.get_gradient_edge(w2)], [dy], retain_graph=True)
    lib.autograd.backward([edge_h], [gh], inputs=[w1], retain_graph=True)
    return [t.detach().numpy().copy() for t in (gx, gh, gw1, gw2, w1.grad)]


def test_gradient_edges_as_outputs_and_inputs_equal_torchs():
    want, got = _program(torch), _program(flow)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)


def test_a_gradient_edge_output_needs_its_gradient_and_backward_takes_leaves_only():
    x = flow.ones(3, requires_grad=True)
    h = x * 2
    edge = flow.autograd.graph.get_gradient_edge(h)
    with pytest.raises(RuntimeError, match="output 0 is a GradientEdge .* pass its gradient in grad_outputs"):
        flow.autograd.grad([edge], [x])
    with pytest.raises(RuntimeError, match="inputs= takes tensors .* use autograd.grad"):
        flow.autograd.backward([h.sum()], inputs=[edge])
