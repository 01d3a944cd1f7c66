"""``config.enable_compile()`` as a user meets it: a compiled nn.Graph returns what the same graph
uncompiled and eager holoflow return, in the corners where compiled code could differ (outputs
that are views of state, state whose dtype changes between calls)."""
import numpy as np
import torch

import holoflow as flow
from holoflow.graph.graph import Graph as NNGraph


def _compiled_states(g) -> dict:
    return {n: t.state for c in g._compiled.values() for n, t in c.lowered.compiled.items()}


def _view_of_weight_graph(compile_: bool):
    flow.manual_seed(0)
    m = flow.nn.Linear(6, 3)
    opt = flow.optim.SGD(m.parameters(), lr=0.1)

    class Train(NNGraph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.enable_compile(compile_)

        def build(self, x, y):
            loss = (self.m(x) - y).square().mean()
            loss.backward()
            return loss, self.m.weight.t()
    return m, Train()


def test_a_returned_view_of_a_parameter_shows_the_update():
    """``return self.m.weight.t()`` from a training graph is a view of the parameter: after the
    call it shows the step's update (eager: the view, then ``opt.step()``; the uncompiled
    graph). Compiled, it was made contiguous inside the task: a copy of the weight before the
    update."""
    rng = np.random.default_rng(0)
    x, y = (flow.tensor(rng.standard_normal(s).astype(np.float32)) for s in ((8, 6), (8, 3)))
    flow.manual_seed(0)
    eager = flow.nn.Linear(6, 3)
    opt = flow.optim.SGD(eager.parameters(), lr=0.1)
    (eager(x) - y).square().mean().backward()
    opt.step()
    want = eager.weight.detach().numpy().T.copy()
    for compile_ in (False, True):
        m, g = _view_of_weight_graph(compile_)
        _, wt = g(x, y)
        np.testing.assert_allclose(wt.numpy(), want, rtol=1e-6, atol=1e-7)
        assert np.array_equal(wt.numpy(), m.weight.detach().numpy().T)
    assert set(_compiled_states(g).values()) == {"compiled"}


def test_state_cast_between_calls_is_read_in_its_new_dtype():
    """``model.to(float64)`` between calls keeps the plan (keyed by the feeds); the compiled task
    recompiles for the new dtype instead of reading float64 memory as float32 (uncompiled and
    eager: a float64 result of the same values)."""
    rng = np.random.default_rng(0)
    x = flow.tensor(rng.standard_normal((2, 4)).astype(np.float32))
    got = {}
    for compile_ in (False, True):
        m = flow.nn.Module()
        m.scale = flow.nn.Parameter(flow.tensor([2.0, -1.0, 0.5, 3.0]))

        class Fwd(NNGraph):
            def __init__(self):
                super().__init__()
                self.m = m
                self.config.enable_compile(compile_)

            def build(self, x):
                return (x * self.m.scale).exp()
        g = Fwd()
        g(x)
        m.to(flow.float64)
        got[compile_] = g(x)
    want = (x._data.double() * torch.tensor([2.0, -1.0, 0.5, 3.0], dtype=torch.float64)).exp()
    for out in got.values():
        assert out.dtype == flow.float64
        torch.testing.assert_close(out._data, want, rtol=1e-6, atol=0)
    assert set(_compiled_states(g).values()) == {"compiled"}


def _mlp_train(configure, steps: int = 3):
    """Losses and parameters of a small MLP trained ``steps`` SGD steps by a graph set up by
    ``configure(graph.config)``; and the graph."""
    flow.manual_seed(0)
    m = flow.nn.Sequential(flow.nn.Linear(6, 16), flow.nn.GELU(), flow.nn.Linear(16, 3))
    opt = flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    x, y = (flow.tensor(rng.standard_normal(s).astype(np.float32)) for s in ((8, 6), (8, 3)))

    class Train(NNGraph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            configure(self.config)

        def build(self, x, y):
            loss = (self.m(x).tanh() * 2 - y).square().mean()
            loss.backward()
            return loss
    g = Train()
    losses = [g(x, y).numpy().copy() for _ in range(steps)]
    return losses + [p.detach().numpy().copy() for p in m.parameters()], g


def test_fused_elementwise_regions_compile_inside_their_task():
    """``allow_fuse_elementwise`` with ``enable_compile``: the fused regions' kernels (each its own
    torch.compile) are traced as their Python sequence, so the task compiles whole (it fell back
    to plain, "CURRENT_PATCHER is None", and started region compiles on fake tensors); the
    numbers equal the plain graph's."""
    want, _ = _mlp_train(lambda c: None)

    def both(c):
        c.allow_fuse_elementwise(True)
        c.enable_compile(True)
    got, g = _mlp_train(both)
    assert any(n.op == "fused_elementwise" for c in g._compiled.values() for n in c.ir.nodes)
    assert set(_compiled_states(g).values()) == {"compiled"}, \
        {n: t.reason for c in g._compiled.values() for n, t in c.lowered.compiled.items()}
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_task_holding_einsum_compiles():
    """``flow.einsum`` checked whether its result aliases an operand by storage pointer, which
    fake tensors do not have: every task holding an einsum ran plain under ``enable_compile``.
    Now it compiles, and trains as the plain graph does."""
    def einsum_mlp(c):
        flow.manual_seed(0)
        m = flow.nn.Linear(6, 6)
        opt = flow.optim.SGD(m.parameters(), lr=0.1)
        rng = np.random.default_rng(0)
        x = flow.tensor(rng.standard_normal((4, 6)).astype(np.float32))

        class Train(NNGraph):
            def __init__(self):
                super().__init__()
                self.m = m
                self.add_optimizer(opt)
                self.config.enable_compile(c)

            def build(self, x):
                h = self.m(x)
                loss = flow.einsum("ij,kj->ik", h, x).softmax(-1).square().sum()
                loss.backward()
                return loss
        g = Train()
        return [g(x).numpy().copy() for _ in range(3)] + [p.detach().numpy().copy() for p in m.parameters()], g
    want, _ = einsum_mlp(False)
    got, g = einsum_mlp(True)
    assert set(_compiled_states(g).values()) == {"compiled"}
    assert want[0] != want[2]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _draws(gen, x):
    """Draws from ``gen`` in a fixed order: a mask, applied (compiled code between draws), then
    creations of four kinds."""
    masked = x * flow.bernoulli(flow.full((2, 4), 0.5), generator=gen) + 1
    return (masked, flow.randint(0, 100, (2, 4), generator=gen), flow.randn(2, 4, generator=gen),
            flow.normal(0.0, 1.0, (2, 4), generator=gen), flow.randperm(6, generator=gen))


def test_draws_from_a_generator_are_eagers_draws_every_call():
    """Random creations in ``build`` given a generator (``randint``, ``randperm``, ``normal``,
    ``randn``) draw from it at each call, in program order, the numbers eager code draws: the
    graph dropped the generator of ``randn`` and froze ``randint``/``randperm``/``normal`` as
    constants of the trace; compiled, the draws were tasks of their own that ran in any order."""
    gen = flow.Generator()
    gen.manual_seed(3)
    want = [[t.numpy().copy() for t in _draws(gen, flow.ones(2, 4))] for _ in range(2)]
    assert not np.array_equal(want[0][1], want[1][1])
    for compile_ in (False, True):
        class Draw(NNGraph):
            def __init__(self):
                super().__init__()
                self.config.enable_compile(compile_)

            def build(self, x):
                return _draws(gen, x)
        g = Draw()
        gen.manual_seed(3)
        got = [[t.numpy().copy() for t in g(flow.ones(2, 4))] for _ in range(2)]
        for a, b in zip(got, want):
            for x, y in zip(a, b):
                assert x.dtype == y.dtype
                np.testing.assert_array_equal(x, y)
