"""The runtime as nn.Graph uses it: a lowered training plan on the caller's thread, on (fake) device
streams and behind a host-to-device copy stream computes the sequential executor's values bit for bit."""
import random

import numpy as np
import torch

import holoflow as flow
from holoflow.examples import gpt
from holoflow.graph import Graph
from holoflow.graph.cuda_streams import COPY_STREAM, tensors, with_h2d_copies
from holoflow.graph.lower import make_executor
from holoflow.runtime import CALLER, SOURCE_STREAM, Plan, Runtime, SequentialExecutor

from runtime.fake_device import FakeDevice


class Train(Graph):
    def __init__(self, m, opt):
        super().__init__()
        self.model = m
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = self.model(x, y)[1]
        loss.backward()
        return loss


def gpt_graph(executor: str):
    flow.manual_seed(0)
    m = gpt.build(flow)(17, 8, 1, 16, 2)
    g = Train(m, flow.optim.AdamW(m.parameters(), lr=1e-2))
    g.config.set_executor(executor)
    return m, g


def batches(n: int) -> list[tuple]:
    rng = np.random.default_rng(0)
    return [tuple(flow.tensor(rng.integers(0, 17, (4, 8))) for _ in range(2)) for _ in range(n)]


def test_a_gpt_training_graph_on_the_callers_thread_matches_the_sequential_executor():
    data = batches(5)
    runs = []
    for ex in ("actor", "sequential"):
        m, g = gpt_graph(ex)
        losses = [g(*data[0])._data, g(*data[1])._data] + [out._data for out in g.stream(data[2:])]
        runs.append((losses, [p._data.clone() for p in m.parameters()]))
        if ex == "actor":
            rt = next(iter(g._compiled.values())).executor
            assert isinstance(rt, Runtime)
            assert set(rt.threads.values()) == {CALLER}           # no thread: the caller runs the kernels
            assert [w for w in rt.workers.values() if w.thread is not None] == []
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        assert torch.equal(a, b)


def test_every_stream_runs_on_the_callers_thread_on_cpu():
    # collectives are issued from compute and waited for at their reader (graph/lower.py, e52728d):
    # no stream keeps a thread of its own, a comm stream included
    plan = Plan([], inputs=("x",), outputs=("x",))
    assert make_executor(plan, "sequential").__class__ is SequentialExecutor
    from holoflow.runtime import TaskSpec
    plan = Plan([TaskSpec("c", "compute", lambda x: (x,), ("x",), ("y",)),
                 TaskSpec("r", "comm", lambda y: (y,), ("y",), ("z",))], inputs=("x",), outputs=("z",))
    with make_executor(plan) as rt:
        assert rt.threads == {SOURCE_STREAM: CALLER, "compute": CALLER, "comm": CALLER}
        assert sorted(rt.workers) == [CALLER] and rt.caller.thread is None
        assert rt.run({"x": i} for i in range(3)) == [{"z": i} for i in range(3)]


def lowered_gpt_plan():
    m, g = gpt_graph("sequential")
    data = batches(4)
    g(*data[0])
    c = next(iter(g._compiled.values()))
    feeds = [c.feeds(list(b)) for b in data]
    return c.lowered.plan, feeds, g, m


def test_a_lowered_plan_on_device_streams_behind_an_h2d_copy_matches_the_sequential_executor():
    """The CUDA structure, run with fake streams on the CPU: an h2d task on the copy stream feeds
    compute; every stream is a device stream launched from the caller's thread."""
    plan, feeds, _, m_seq = lowered_gpt_plan()
    expected = SequentialExecutor(plan).run(feeds)
    plan, feeds, _, m = lowered_gpt_plan()          # a second model, same seed: same weights and optimizer
    specs, inputs = with_h2d_copies(list(plan.tasks), plan.inputs, torch.device("cpu"))
    copied = Plan(specs, inputs=inputs, outputs=plan.outputs, initial=plan.initial,
                  input_register_num=plan.input_register_num)
    assert copied.tasks[0].stream == COPY_STREAM and copied.tasks[0].produces == plan.inputs
    host_feeds = [{k + "@host": v for k, v in f.items()} for f in feeds]
    dev = FakeDevice()
    streams = (SOURCE_STREAM, *dict.fromkeys(t.stream for t in copied.tasks))
    with Runtime(copied, threads={s: CALLER for s in streams}, devices={s: dev.stream(s) for s in streams}) as rt:
        got = rt.run(host_feeds)
    dev.drain(random.Random(0))
    for p, q in zip(expected, got):
        assert len(p) == len(q) and all(torch.equal(a, b) for a, b in zip(p.values(), q.values()))
    assert all(torch.equal(p._data, q._data) for p, q in zip(m.parameters(), m_seq.parameters()))
    waits = {(s, of) for s, op, of in dev.log if op == "wait"}
    assert {of for s, of in waits if s == COPY_STREAM} == {SOURCE_STREAM}      # copies wait for feeds only:
    assert ("compute", COPY_STREAM) in waits                                   # batch i+1's copy overlaps compute i


def test_tensors_finds_every_tensor_of_a_regst_value():
    a, b, c = torch.ones(1), torch.zeros(2), torch.ones(3)
    assert [t is x for t, x in zip(tensors((a, [b, None, (c,)], 3)), (a, b, c))] == [True] * 3
    assert list(tensors(None)) == []
