"""A traced ``x.detach()`` is an alias of ``x`` without its history, as eager's shares ``x``'s
storage: an in-place write through either reaches the other inside ``nn.Graph.build()`` (graph
inputs, intermediates, views, parameters and buffers), and no gradient flows through the detach.
Every program runs eagerly on torch, eagerly on holoflow and in a training graph (SGD, lr 1: the
parameters after each step carry the gradients); losses, outputs, parameters, buffers and the
inputs (a program may write them) must agree."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.graph import Graph

RNG = np.random.default_rng(7)
X0 = RNG.standard_normal((3, 4)).astype(np.float32)
W0 = RNG.standard_normal((3, 4)).astype(np.float32)
STEPS = 2


def _module(lib):
    class M(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = lib.nn.Parameter(lib.tensor(W0))
            self.u = lib.nn.Parameter(lib.tensor(W0[0]))   # never given a gradient: never stepped
            self.register_buffer("buf", lib.zeros(4))
    return M()


# -- the programs: (lib, module, x) -> (loss, output) ------------------------------------------------

def write_through_detach(lib, m, x):
    z = x * m.w
    z.detach().relu_()
    return (z * z).sum(), z


def write_to_source_seen_by_detached(lib, m, x):
    z = x * m.w
    d = z.detach()
    z.mul_(2.0)
    return (d * m.w).sum() + z.sin().sum(), d


def detach_of_a_view(lib, m, x):
    z = x * m.w
    z[0].detach().mul_(2.0)
    return z.sin().sum(), z


def detach_then_view_then_write(lib, m, x):
    z = x * m.w
    d = z.detach()
    d[:, 1:3].mul_(-1.0)
    return (z * z).sum() + d.sum(), z


def view_taken_before_the_write(lib, m, x):
    z = x * m.w
    v = z[1]
    t = z.t()
    z.detach().add_(1.0)
    return (v * v).sum() + (t * 3.0).sum(), v


def detach_of_a_detached(lib, m, x):
    z = x * m.w
    d = z.detach()
    d.detach().relu_()
    return (z * z).sum() + d.cos().sum(), d


def source_written_through_its_view(lib, m, x):
    z = x * m.w
    d = z.detach()
    z[0].mul_(0.0)
    v = d[2]
    z[2].add_(5.0)   # seen by ``v``, a view of the detached alias
    return (z * m.w).sum() + (d * m.w).sum(), v * 1.0


def write_with_a_grad_operand(lib, m, x):
    z = x * m.w
    d = z.detach()
    d.mul_(m.w)   # the detached tensor takes the write's history; z keeps its own
    return d.sin().sum() + (z * 2.0).sum(), z


def write_through_data(lib, m, x):
    z = x * m.w
    z.data.relu_()
    return (z * z).sum(), z


def saved_input_written_in_place(lib, m, x):
    d = x * 2.0
    d.mul_(m.w)   # (no detach: the grad rule of the write reads d's value from before it)
    return (d * d).sum(), d


def parameter_without_grad_written_through_detach(lib, m, x):
    m.u.detach().mul_(-2.0)
    u = m.u.detach()
    u[1:].add_(1.0)
    return (x * m.w).sum(), x + m.u.detach()


def parameter_written_through_detach(lib, m, x):
    m.w.detach().mul_(0.5)
    return (x * m.w).sin().sum(), m.w * 1.0


def parameter_view_written_through_detach(lib, m, x):
    m.w[1].detach().add_(1.0)
    return (x * m.w).sin().sum(), m.w * 1.0


def buffer_written_through_detach(lib, m, x):
    m.buf.detach().add_(1.0)
    b = m.buf.detach()
    b[1:3].mul_(3.0)
    return (x * m.w).sum() + (x * m.buf).sum(), x + m.buf


def input_written_through_detach(lib, m, x):
    x.detach().relu_()
    return (x * m.w).sum(), x * 1.0


def detach_in_place(lib, m, x):
    y = x * m.w
    y.detach_()
    y.relu_()
    return (y * m.w).sum(), y


def detached_written_then_returned(lib, m, x):
    z = x * m.w
    d = z.detach()
    z.add_(1.0)
    d.mul_(2.0)
    return (z * m.w).sum(), d


def region_of_a_detached_expanded_view_written(lib, m, x):
    """A region of ``e.detach()``, ``e`` an expanded view of ``z``: its one element per place of
    ``z`` writes ``z`` (the write went on as the alias's whole value, whose unwritten aliases of
    each place hold the old one, and the graph refused it at run time: fuzz seed 6722)."""
    z = x * m.w
    e = z.unsqueeze(-1).expand(3, 4, 2)
    e.detach()[..., 1:2] = 2.0
    d = e.detach()
    d[:2, :, 0:1].mul_(-3.0)
    return (z * z).sum() + e.sum(), z


PROGRAMS = [write_through_detach, write_to_source_seen_by_detached, detach_of_a_view,
            region_of_a_detached_expanded_view_written,
            detach_then_view_then_write, view_taken_before_the_write, detach_of_a_detached,
            source_written_through_its_view, write_with_a_grad_operand, write_through_data,
            saved_input_written_in_place, parameter_without_grad_written_through_detach,
            buffer_written_through_detach, input_written_through_detach, detach_in_place,
            detached_written_then_returned]
# writes of a parameter the optimizer then steps (test_training_graph_steps_a_parameter_written_in_build:
# the write-back runs before the step, as build()'s program order has it)
STEPPED = [parameter_written_through_detach, parameter_view_written_through_detach]


def no_grad_parameter_write(lib, m, x):
    with lib.no_grad():
        m.w.mul_(0.5)
    return (x * m.w).sin().sum(), m.w * 1.0


def _np(t) -> np.ndarray:
    t = t._data if hasattr(t, "_data") else t
    return t.detach().numpy().copy()


def _eager(lib, program) -> list:
    m = _module(lib)
    opt = lib.optim.SGD(m.parameters(), lr=1.0)
    x = lib.tensor(X0)
    got = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss, out = program(lib, m, x)
        loss.backward()
        opt.step()
        got.append((_np(loss), _np(out), _np(m.w), _np(m.buf), _np(x), _np(m.u)))
    return got


class _Train(Graph):
    def __init__(self, m, program):
        super().__init__()
        self.m, self.program = m, program
        self.add_optimizer(flow.optim.SGD(m.parameters(), lr=1.0))

    def build(self, x):
        loss, out = self.program(flow, self.m, x)
        loss.backward()
        return loss, out


def _graph(program) -> list:
    m = _module(flow)
    g = _Train(m, program)
    x = flow.tensor(X0)
    got = []
    for _ in range(STEPS):
        loss, out = g(x)
        got.append((_np(loss), _np(out), _np(m.w), _np(m.buf), _np(x), _np(m.u)))
    return got


def _assert_same(got: list, want: list, what: str) -> None:
    names = ("loss", "output", "w (its gradients)", "buf", "input x", "u")
    for step, (a, b) in enumerate(zip(got, want)):
        for name, u, v in zip(names, a, b):
            torch.testing.assert_close(torch.from_numpy(u), torch.from_numpy(v), rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"{what}, step {step}, {name}: {m}")


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_detach_alias_graph_agrees_with_eager_and_torch(program):
    want = _eager(torch, program)
    eager = _eager(flow, program)
    _assert_same(eager, want, "holoflow eager vs torch")
    _assert_same(_graph(program), want, "graph vs torch")


@pytest.mark.parametrize("program", [*STEPPED, no_grad_parameter_write], ids=lambda p: p.__name__)
def test_training_graph_steps_a_parameter_written_in_build(program):
    want = _eager(torch, program)
    _assert_same(_eager(flow, program), want, "holoflow eager vs torch")
    _assert_same(_graph(program), want, "graph vs torch")


@pytest.mark.parametrize("program", [*PROGRAMS, *STEPPED], ids=lambda p: p.__name__)
def test_detach_alias_forward_graph_agrees_with_eager(program):
    """The same programs in an inference graph (no backward), against eager ``no_grad``."""
    class Infer(Graph):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def build(self, x):
            return program(flow, self.m, x)
    m1, m2 = _module(flow), _module(flow)
    x1, x2 = flow.tensor(X0), flow.tensor(X0)
    g = Infer(m1)
    for _ in range(STEPS):
        got = g(x1)
        with flow.no_grad():
            want = program(flow, m2, x2)
        for a, b in zip(got, want):
            torch.testing.assert_close(a._data, b._data)
        torch.testing.assert_close(x1._data, x2._data)
        torch.testing.assert_close(m1.w._data, m2.w._data)
        torch.testing.assert_close(m1.buf._data, m2.buf._data)
        torch.testing.assert_close(m1.u._data, m2.u._data)


def test_write_through_detach_of_a_saved_tensor_is_refused_eagerly():
    """torch refuses the backward when the write through the detach changed a tensor a grad
    rule saved (one version counter); holoflow eager too. (A graph computes such programs in SSA
    form, as it does for any in-place write of a saved intermediate: the rule reads the value saved;
    a saved parameter or buffer written so is refused while tracing, as in eager:
    test_graph_state_write_order.py.)"""
    for lib in (torch, flow):
        leaf = lib.tensor(W0).requires_grad_()
        z = leaf * 1.0
        y = z.sin()
        z.detach().relu_()
        with pytest.raises(RuntimeError, match="modified by an in-?place operation"):
            y.sum().backward()


def test_gradient_scaled_through_detach_after_backward():
    """``p.grad.detach().mul_(c)`` after ``loss.backward()`` in build() (torch's own gradient
    clipping writes this way) scales the gradient the optimizer's step reads, as in eager."""
    def step(lib, m, x):
        loss = (x * m.w).sin().sum()
        loss.backward()
        m.w.grad.detach().mul_(0.25)
        m.w.grad.detach()[0].zero_()
        return loss

    class G(Graph):
        def __init__(self, m):
            super().__init__()
            self.m = m
            self.add_optimizer(flow.optim.SGD(m.parameters(), lr=1.0))

        def build(self, x):
            return step(flow, self.m, x)
    runs = {}
    for lib in (torch, flow):
        m = _module(lib)
        opt = lib.optim.SGD(m.parameters(), lr=1.0)
        x = lib.tensor(X0)
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            step(lib, m, x)
            opt.step()
        runs[lib.__name__] = _np(m.w)
    m = _module(flow)
    g = G(m)
    for _ in range(STEPS):
        g(flow.tensor(X0))
    torch.testing.assert_close(runs["holoflow"], runs["torch"])
    torch.testing.assert_close(_np(m.w), runs["torch"])
