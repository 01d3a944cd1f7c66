"""A run-time error inside a task compiled by Inductor (``config.enable_compile()``) names the
failing op and the user's source line, as an uncompiled task's does: Inductor's code names no op,
so the task is re-run plain to locate it; where the plain run does not fail, every op of the task
is named with its line. The graph runs on after the error."""
import os
import re

import pytest
import torch

import holoflow as flow
from holoflow.graph import GraphRunError
from holoflow.graph.compile_tasks import CompiledTask, compile_task
from holoflow.graph.graph import Graph as NNGraph

pytestmark = pytest.mark.skipif(getattr(torch, "compile", None) is None, reason="torch.compile missing")

HERE = os.path.basename(__file__)


def _line_of(text: str) -> str:
    """``HERE:<line>`` of the line of this file that holds ``text``."""
    with open(__file__) as f:
        k = next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)
    return f"{HERE}:{k}"


class Pick(NNGraph):
    def __init__(self) -> None:
        super().__init__()
        self.config.enable_compile()

    def build(self, x, i):
        y = x * 2 + 1
        z = y.index_select(0, i)   # PICK
        return z.exp()


def _tasks(g) -> dict:
    return next(iter(g._compiled.values())).lowered.compiled


def test_index_out_of_range_names_the_op_and_its_line():
    g, x = Pick(), torch.arange(12.0).reshape(4, 3) / 12
    x = flow.tensor(x.numpy())
    assert g(x, flow.tensor([0, 1])).shape == (2, 3)
    tasks = _tasks(g)
    assert tasks and all(isinstance(t, CompiledTask) and t.state == "compiled" for t in tasks.values())
    with pytest.raises(GraphRunError) as e:
        g(x, flow.tensor([0, 9]))                     # out of range only at run time
    msg = str(e.value)
    assert "op 'index_select'" in msg and isinstance(e.value.__cause__, IndexError)
    assert f"source: {_line_of('# PICK')}\n" in msg     # the op's own line, not the task's first
    assert re.search(r"program line \d+: .*= index_select\(", msg) and "located by running the task uncompiled" in msg
    assert e.value.__cause__.__cause__ is not None      # the compiled code's own error stays chained
    got = g(x, flow.tensor([3, 0]))                   # the graph still runs, compiled
    torch.testing.assert_close(got.to_torch(), (x.to_torch() * 2 + 1)[[3, 0]].exp())
    assert all(t.state == "compiled" for t in _tasks(g).values())


def test_a_failure_only_the_compiled_code_has_names_every_op_of_the_task(monkeypatch):
    g, x = Pick(), flow.randn(4, 3)
    g(x, flow.tensor([0, 1]))
    (task,) = _tasks(g).values()

    def broken(*args):
        raise RuntimeError("a kernel of the compiled code failed")
    monkeypatch.setattr(task, "_compiled", broken)
    with pytest.raises(GraphRunError) as e:
        g(x, flow.tensor([1, 2]))                     # the plain run of the same task succeeds
    msg = str(e.value)
    assert "compiled task 'compute0' failed" in msg and "a kernel of the compiled code failed" in msg
    for op, text in (("mul", "y = x * 2 + 1"), ("index_select", "# PICK"), ("exp", "return z.exp()")):
        assert f"{op} at {_line_of(text)}" in msg, msg


class Shift(NNGraph):
    def __init__(self, m) -> None:
        super().__init__()
        self.m = m
        self.config.enable_compile()

    def build(self, x):
        y = x.sin()
        return y + self.m.bias   # ADD


def test_a_state_shape_that_changes_between_calls_names_the_op_and_its_line():
    """Inductor's code asserts its inputs' sizes; the new shape cannot be compiled, so that layout
    runs plain, where the op raises from its line; the compiled layout is kept."""
    m = flow.nn.Module()
    m.register_buffer("bias", flow.ones(3))
    g, x = Shift(m), flow.randn(4, 3)
    torch.testing.assert_close(g(x).to_torch(), x.to_torch().sin() + 1)
    m.bias.data = flow.ones(5)                          # read live by the compiled task: no retrace
    with pytest.raises(GraphRunError) as e:
        g(x)
    msg = str(e.value)
    assert "op 'add'" in msg and f"source: {_line_of('# ADD')}\n" in msg, msg
    m.bias.data = flow.full((3,), 2.0)                  # fixed: the task still runs compiled
    torch.testing.assert_close(g(x).to_torch(), x.to_torch().sin() + 2)
    assert all(t.state == "compiled" for t in _tasks(g).values())


def test_the_success_path_runs_only_the_compiled_function():
    calls = []

    def task(x):
        calls.append(1)                   # runs while tracing only: the compiled code is not Python
        return (x * 2,)
    t = compile_task("compute0", "compute", task)
    for _ in range(3):
        torch.testing.assert_close(t(torch.arange(3.0))[0], torch.arange(3.0) * 2)
    assert t.state == "compiled" and len(calls) == 1


def test_a_plain_error_is_raised_from_the_plain_run_chained_to_the_compiled_one():
    def task(x, i):
        return (x.index_select(0, i) + 1,)
    t = compile_task("compute0", "compute", task)
    x = torch.arange(4.0)
    torch.testing.assert_close(t(x, torch.tensor([1]))[0], torch.tensor([2.0]))
    with pytest.raises(IndexError) as e:
        t(x, torch.tensor([7]))
    assert isinstance(e.value.__cause__, RuntimeError) and "out of bounds" in str(e.value.__cause__)  # Inductor's check
    assert t.state == "compiled"
