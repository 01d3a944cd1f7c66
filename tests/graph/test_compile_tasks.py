"""``config.enable_compile()``: each task's generated function compiled by Inductor equals the
uncompiled graph over training steps (CNN with batch-norm, GPT-mini); off, nothing changes; a task
that cannot be traced warns once and runs plain."""
import logging

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.examples import cnn, gpt
from holoflow.graph.compile_tasks import CompiledTask, compile_task
from holoflow.graph.graph import Graph as NNGraph

pytestmark = pytest.mark.skipif(getattr(torch, "compile", None) is None, reason="torch.compile missing")


def _cnn():
    flow.manual_seed(0)
    m = cnn.build(flow)(16)
    rng = np.random.default_rng(0)
    x = flow.tensor(rng.standard_normal((16, 1, 8, 8)).astype(np.float32))
    y = flow.tensor(rng.integers(0, 10, (16,)))
    return m, flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), (x, y), \
        lambda m, x, y: flow.nn.functional.cross_entropy(m(x), y)


def _gpt():
    flow.manual_seed(0)
    m = gpt.build(flow)(65, 16, 2, 32, 4)
    rng = np.random.default_rng(0)
    x, y = (flow.tensor(rng.integers(0, 65, (4, 16))) for _ in range(2))
    return m, flow.optim.AdamW(m.parameters(), lr=1e-3), (x, y), lambda m, x, y: m(x, y)[1]


def _train(case, compile_: bool | None, executor: str = "actor", steps: int = 3, profile: bool = False):
    m, opt, batch, loss_fn = case()

    class Train(NNGraph):
        def __init__(self):
            super().__init__()
            self.model = m
            self.add_optimizer(opt)
            self.config.set_executor(executor)
            if compile_ is not None:
                self.config.enable_compile(compile_)
            if profile:
                self.config.enable_profiling(True)

        def build(self, x, y):
            loss = loss_fn(self.model, x, y)
            loss.backward()
            return loss
    g = Train()
    losses = [g(*batch).numpy().copy() for _ in range(steps)]
    params = [p.detach().numpy().copy() for p in m.parameters()]
    buffers = [b.numpy().copy() for b in m.buffers()]
    lowered = next(iter(g._compiled.values())).lowered
    fns = {s.name: lowered.compiled.get(s.name, s.fn) for s in lowered.plan.tasks}
    return losses, params, buffers, fns


@pytest.mark.parametrize("case,executor", [(_cnn, "actor"), (_gpt, "sequential")], ids=["cnn", "gpt"])
def test_compiled_tasks_equal_uncompiled(case, executor):
    ref_l, ref_p, ref_b, ref_fns = _train(case, None, executor)
    got_l, got_p, got_b, fns = _train(case, True, executor)
    assert not any(isinstance(f, CompiledTask) for f in ref_fns.values())
    compute = [f for n, f in fns.items() if n.startswith("compute")]
    assert compute and all(isinstance(f, CompiledTask) and f.state == "compiled" for f in compute), \
        {n: (getattr(f, "state", None), getattr(f, "reason", None)) for n, f in fns.items()}
    assert len(got_l) == 3 and ref_l[0] != ref_l[-1]          # it trained
    for a, b in zip(got_l, ref_l):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=0)
    # Inductor reorders float sums: gradients differ in the last bits (AdamW's normalized step
    # turns those into ~1e-6 absolute differences on parameters of size ~1e-1)
    assert len(got_p) == len(ref_p) and len(got_b) == len(ref_b)
    for a, b in zip(got_p + got_b, ref_p + ref_b):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_opaque_kernels_run_plain_between_compiled_tasks(monkeypatch):
    """On CUDA attention runs torch's autograd (ops/attention.py FUSED_VJP_DEVICES), which dynamo
    cannot trace: those nodes get plain tasks of their own and everything between them compiles
    (on CUDA today the whole compute task fell back to plain). Run here by giving the CPU the
    CUDA path; equal to the uncompiled graph on that path."""
    from holoflow.ops import attention
    monkeypatch.setattr(attention, "FUSED_VJP_DEVICES", {"cuda", "cpu"})
    ref_l, ref_p, _, _ = _train(_gpt, None, "sequential")
    got_l, got_p, _, fns = _train(_gpt, True, "sequential")
    compute = {n: f for n, f in fns.items() if n.startswith("compute")}
    compiled = [n for n, f in compute.items() if isinstance(f, CompiledTask)]
    plain = [n for n, f in compute.items() if not isinstance(f, CompiledTask)]
    assert all(compute[n].state == "compiled" for n in compiled), {n: compute[n].reason for n in compiled}
    assert len(plain) == 4 and len(compiled) >= 4       # 2 layers: attention forward and backward each
    for a, b in zip(got_l + got_p, ref_l + ref_p):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(attention, "FUSED_VJP_DEVICES", {"cuda"})
    _, _, _, fns = _train(_gpt, True, "sequential", steps=1)   # the CPU path compiles whole
    assert [n for n in fns if n.startswith("compute")] == ["compute0"]


def test_forward_and_backward_of_a_convnet_compile_apart():
    """Compiled, a graph holding a convolution (an op whose layout Inductor chooses: Op.layout)
    runs its step's forward and backward as two tasks (as AOTAutograd partitions them), the
    memory plan scheduled inside each: the forward task holds no backward node (the gradient
    seed, made from nothing, joins it), the backward task no forward node. (GPT-mini, without
    one, compiles whole: test above.)"""
    m, opt, batch, loss_fn = _cnn()

    class Train(NNGraph):
        def __init__(self):
            super().__init__()
            self.model = m
            self.add_optimizer(opt)
            self.config.enable_compile()

        def build(self, x, y):
            loss = loss_fn(self.model, x, y)
            loss.backward()
            return loss
    g = Train()
    g(*batch)
    fw, bw = [t for t in next(iter(g._compiled.values())).lowered.tasks if t.stream == "compute"]
    assert all("bw" not in n.tags or not n.value_inputs() for n in fw.nodes)
    assert all("bw" in n.tags for n in bw.nodes)
    # the whole backward is there: each forward convolution's and batch norm's gradient
    for op in ("convolution", "batch_norm"):
        assert sum(n.op == op + "_backward" for n in bw.nodes) == sum(n.op == op for n in fw.nodes) > 0


def test_outputs_leaving_compiled_code_are_dense():
    """Values passed between compiled tasks keep Inductor's layouts; an output a plain task, the
    optimizer or the user reads (``leaving``) is made contiguous, with the same values."""
    def task(x):
        return (x * 2).t(), (x + 1).t()
    x = torch.arange(12.0).reshape(3, 4)
    t = compile_task("compute0", "compute", task, leaving=(1,))
    for _ in range(2):
        a, b = t(x)
        torch.testing.assert_close(a, (x * 2).t(), rtol=0, atol=0)
        torch.testing.assert_close(b, (x + 1).t(), rtol=0, atol=0)
        assert b.is_contiguous()
    assert t.state == "compiled"


def test_switch_off_is_todays_graph():
    """Off (explicitly or by default): the plan runs the generated functions themselves, and the
    numbers are bit-identical to the default graph's."""
    ref_l, ref_p, _, ref_fns = _train(_cnn, None)
    off_l, off_p, _, fns = _train(_cnn, False)
    assert all(not isinstance(f, CompiledTask) and f.__code__.co_name == n for n, f in fns.items())
    for a, b in zip(ref_l + ref_p, off_l + off_p):
        assert np.array_equal(a, b)


def test_profiled_graph_stays_plain():
    *_, fns = _train(_cnn, True, steps=1, profile=True)
    assert not any(isinstance(f, CompiledTask) for f in fns.values())


def test_copy_and_update_tasks_stay_plain():
    def f(x):
        return x
    assert compile_task("copy0", "copy", f) is f
    assert compile_task("update1", "update", f) is f
    assert isinstance(compile_task("compute0", "compute", f), CompiledTask)


def test_untraceable_task_warns_once_and_runs_plain(caplog):
    def task(x):
        x.add_(1)                          # a write the failed compile must not have made
        if x.sum() > 0:                    # a branch on a value: fake tensors cannot take it
            return (x * 2,)
        return (x,)

    t = compile_task("compute7", "compute", task)
    x = torch.arange(4.0)
    with caplog.at_level(logging.WARNING, logger="holoflow.graph"):
        outs = [t(x)[0].clone() for _ in range(3)]
    for k, o in enumerate(outs, 1):
        torch.testing.assert_close(o, (torch.arange(4.0) + k) * 2, rtol=0, atol=0)
    torch.testing.assert_close(x, torch.arange(4.0) + 3, rtol=0, atol=0)   # three writes, not four
    assert t.state == "plain" and "compute7" in caplog.text and "Data" in t.reason
    assert sum("compute7" in r.getMessage() for r in caplog.records) == 1


def test_an_input_in_a_new_layout_compiles_for_it():
    """Inductor's code asserts its inputs' strides (what dynamo's guards checked): a transposed
    input is not read as if dense, it compiles once more, and the first layout keeps working."""
    def task(x, w):
        return (x @ w + 1, x.sum(0))
    t = compile_task("compute0", "compute", task)
    w = torch.randn(3, 5)
    dense = torch.randn(4, 3)
    strided = torch.randn(3, 4).t()
    for x in (dense, strided, dense, strided):
        got = t(x, w)
        torch.testing.assert_close(got[0], x @ w + 1)
        torch.testing.assert_close(got[1], x.sum(0))
    assert t.state == "compiled" and len(t._layouts) == 2


def test_compiled_state_is_read_live():
    """State reaches the compiled function as arguments read each call: a parameter replaced
    (``p.data = ...``) or loaded between calls is what the next step computes with."""
    flow.manual_seed(0)
    m = flow.nn.Linear(4, 3)
    x = flow.randn(2, 4)

    class Fwd(NNGraph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.config.enable_compile()

        def build(self, x):
            return self.m(x).relu().sum(1)
    g = Fwd()
    torch.testing.assert_close(g(x)._data, m(x).relu().sum(1)._data)
    m.weight.data = flow.randn(3, 4)
    torch.testing.assert_close(g(x)._data, m(x).relu().sum(1)._data)
    m.load_state_dict({"weight": flow.ones(3, 4), "bias": flow.zeros(3)})
    torch.testing.assert_close(g(x)._data, m(x).relu().sum(1)._data)
    compiled = next(iter(g._compiled.values())).lowered.compiled
    assert compiled and all(f.state == "compiled" for f in compiled.values())


def _global_dp(rank: int, compile_: bool):
    from holoflow.core.sbp import B, S
    P = flow.placement("cpu", ranks=[0, 1])
    m = flow.nn.Sequential(flow.nn.Linear(8, 16), flow.nn.GELU(), flow.nn.Linear(16, 4))
    init = np.random.default_rng(1)   # simulated ranks share torch's RNG: parameters from numpy
    m.load_state_dict({k: flow.tensor(init.standard_normal(tuple(v.shape)).astype(np.float32) * 0.3)
                       for k, v in m.state_dict().items()})
    m.to_global(placement=P, sbp=[B])
    opt = flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    x = flow.tensor(rng.standard_normal((8, 8)).astype(np.float32)).to_global(placement=P, sbp=[B]).to_global(sbp=[S(0)])
    y = flow.tensor(rng.standard_normal((8, 4)).astype(np.float32)).to_global(placement=P, sbp=[B]).to_global(sbp=[S(0)])

    class Train(NNGraph):
        def __init__(self):
            super().__init__()
            self.model = m
            self.add_optimizer(opt)
            self.config.enable_compile(compile_)

        def build(self, x, y):
            loss = (self.model(x) - y).square().mean()
            loss.backward()
            return loss
    g = Train()
    losses = [g(x, y).to_global(sbp=[B]).to_local().numpy().copy() for _ in range(3)]
    lowered = next(iter(g._compiled.values())).lowered
    fns = {s.name: lowered.compiled.get(s.name, s.fn) for s in lowered.plan.tasks}
    return losses, [p.detach().to_local().numpy().copy() for p in m.parameters()], fns


def test_a_global_graphs_compute_between_its_collectives_compiles():
    """Data parallel: the gradient all-reduces are issued and waited for in tasks of their own
    (plain, chained in program order), so the compute between them is compiled; the numbers equal
    the uncompiled global graph's."""
    from holoflow.distributed import world
    ref = world.simulate(2, lambda r: _global_dp(r, False), timeout=300)
    got = world.simulate(2, lambda r: _global_dp(r, True), timeout=300)
    for (ref_l, ref_p, _), (got_l, got_p, fns) in zip(ref, got):
        compiled = [f for f in fns.values() if isinstance(f, CompiledTask)]
        assert compiled and all(f.state == "compiled" for f in compiled), \
            {n: (getattr(f, "state", None), getattr(f, "reason", None)) for n, f in fns.items()}
        assert len(fns) > len(compiled) + 1          # the collectives' tasks (and the update) stay plain
        assert ref_l[0] != ref_l[-1]
        for a, b in zip(got_l + got_p, ref_l + ref_p):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
