"""torch's GradientEdges in ``autograd.grad`` / ``autograd.backward`` (torch 2.4+): as outputs, a
backward starting at a node with a given gradient; as inputs, the gradient flowing into a node
(or, for a leaf's AccumulateGrad, the leaf's). The same program on torch and holoflow gives the
same values: torch's own stage_backward_input / stage_backward_weight pattern (input gradients
first, capturing where the weights' paths leave, the weights' gradients later from there). As
``backward``'s inputs, a node's edge runs the node and accumulates nothing, as torch's."""
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


def test_a_gradient_edge_output_needs_its_gradient():
    x = flow.ones(3, requires_grad=True)
    h = x * 2
    edge = flow.autograd.graph.get_gradient_edge(h)
    with pytest.raises(RuntimeError, match="output 0 is a GradientEdge .* pass its gradient in grad_outputs"):
        flow.autograd.grad([edge], [x])


# backward(inputs=) with the GradientEdge of a non-leaf (torch's run live): the edge's node runs (its
# tensor hooks, pre- and post-hooks fire) and stops there; nothing accumulates for it (no .grad, no
# retain_grad, unlike the tensor itself as an input), and the other inputs accumulate as usual.
CALLS = {
    "edge": lambda L, out, e, t: out.backward(inputs=[e["h"]]),
    "edge_alone": lambda L, out, e, t: out.backward(inputs=e["h"]),
    "edge_and_leaf": lambda L, out, e, t: L.autograd.backward([out], inputs=[e["h"], t["w"]]),
    "edge_and_its_tensor": lambda L, out, e, t: L.autograd.backward(out, inputs=[e["h"], t["h"]]),
    "leaf_edge": lambda L, out, e, t: out.backward(inputs=[e["x"], e["h2"]]),
    "piece_edge": lambda L, out, e, t: out.backward(inputs=[e["p1"], t["x"]]),
    "root_edge": lambda L, out, e, t: out.backward(inputs=[e["out"]]),
    "unreached_edge": lambda L, out, e, t: out.backward(inputs=[e["z"], t["w"]]),
    "twice": lambda L, out, e, t: (out.backward(inputs=[e["h"], t["x"]], retain_graph=True),
                                   out.backward(inputs=[t["x"], e["h2"]])),
}


def _edge_inputs_program(lib, call: str):
    g = lib.autograd.graph
    x = lib.tensor([0.5, -1.0, 2.0, 0.25], requires_grad=True)
    w = lib.tensor([1.5, 0.5, -0.5, 1.0], requires_grad=True)
    h = x * w
    h2 = h.exp()
    p0, p1 = h2.split(2)
    z = (w * 3.0).sin()   # a node no backward from out reaches
    out = (lib.cat([p1, p0]) * w).sum() + (p1 * p1).sum()
    t = {"x": x, "w": w, "h": h, "h2": h2, "p1": p1, "z": z, "out": out}
    calls = []
    for name in ("h", "h2", "p1", "z"):
        t[name].register_hook(lambda gr, n=name: calls.append((n, gr.tolist())))
        t[name].grad_fn.register_prehook(lambda go, n=name: calls.append("pre:" + n))
        t[name].grad_fn.register_hook(lambda gi, go, n=name: calls.append("post:" + n))
    for name in ("x", "w"):
        t[name].register_hook(lambda gr, n=name: calls.append((n, gr.tolist())))
    edges = {k: g.get_gradient_edge(v) for k, v in t.items()}
    CALLS[call](lib, out, edges, t)
    grads = {k: (None if v.grad is None else v.grad.tolist()) for k, v in t.items() if v.is_leaf or v.retains_grad}
    return calls, grads, {k: v.retains_grad for k, v in t.items() if not v.is_leaf}


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("call", sorted(CALLS))
def test_backward_inputs_take_a_nodes_gradient_edge_as_torch(call):
    want, got = _edge_inputs_program(torch, call), _edge_inputs_program(flow, call)
    assert [c if isinstance(c, str) else c[0] for c in got[0]] == [c if isinstance(c, str) else c[0] for c in want[0]]
    for a, b in zip(got[0], want[0]):
        if not isinstance(a, str):
            np.testing.assert_allclose(a[1], b[1], rtol=1e-6)
    assert got[1].keys() == want[1].keys() and got[2] == want[2]
    for k in want[1]:
        assert (got[1][k] is None) == (want[1][k] is None), k
        if want[1][k] is not None:
            np.testing.assert_allclose(got[1][k], want[1][k], rtol=1e-6)
