"""Device streams: acts on accelerator streams are ordered by events, never by the host waiting.

Tested with the fake device of fake_device.py (kernels queued per stream, run later in random
interleavings that honour only the events): whatever the interleaving, every output equals the
sequential executor's; without the runtime's event waits the same harness fails.
"""
import random

import pytest
import torch

from holoflow.runtime import CALLER, SOURCE_STREAM, DeviceStream, Plan, Runtime, SequentialExecutor, TaskSpec

from runtime.fake_device import Buffer, FakeDevice, OrderError
from runtime.plans import random_feeds, random_plan


def lazy_plan(plan: Plan, dev: FakeDevice) -> Plan:
    """The same plan with every task a kernel launch on the fake device; initial state in buffers."""
    tasks = [TaskSpec(t.name, t.stream, dev.lazy(t.fn, len(t.produces)), t.consumes, t.produces,
                      register_num=t.register_num, source=t.source) for t in plan.tasks]
    initial = {k: Buffer(None, v, written=True) for k, v in plan.initial.items()}
    return Plan(tasks, inputs=plan.inputs, outputs=plan.outputs, initial=initial,
                input_register_num=plan.input_register_num)


def run_on_fake(plan: Plan, feeds: list[dict], seed: int, threads=None, ignore_waits=()):
    """Runs ``plan`` with fake device streams; returns the outputs and state read on the caller's
    stream after the device drained in a random order."""
    dev = FakeDevice()
    lp = lazy_plan(plan, dev)
    streams = {SOURCE_STREAM, *(t.stream for t in plan.tasks)}
    devices = {s: dev.stream(s, ignore_waits=s in ignore_waits) for s in streams}
    caller = devices[SOURCE_STREAM]
    fed = [{k: Buffer(caller, v, written=True) for k, v in f.items()} for f in feeds]
    with Runtime(lp, timeout=30, threads=threads, devices=devices) as rt:
        outs = rt.run(fed)
        state = rt.state
    got = []

    def read_all():       # a kernel on the caller's stream: what the user's next op would see
        got.extend([{k: b.read(caller) for k, b in o.items()} for o in outs])
        got.append({k: b.read(caller) for k, b in state.items()})
    caller._push(("kernel", read_all))
    dev.drain(random.Random(seed))
    return got[:-1], got[-1], dev


def test_fake_device_streams_are_device_streams():
    assert isinstance(FakeDevice().stream("s"), DeviceStream)


@pytest.mark.parametrize("threads", [None, "caller"])
@pytest.mark.parametrize("seed", range(10))
def test_any_device_interleaving_gives_the_sequential_executors_values(seed, threads):
    plan = random_plan(seed)
    feeds = random_feeds(plan, 6, seed)
    ex = SequentialExecutor(plan)
    expected = ex.run(feeds)
    mapping = {s: CALLER for s in (SOURCE_STREAM, *(t.stream for t in plan.tasks))} if threads else None
    for order in range(3):
        outs, state, _ = run_on_fake(plan, feeds, 100 * seed + order, threads=mapping)
        for i, (p, q) in enumerate(zip(expected, outs)):
            assert p.keys() == q.keys()
            for k in p:
                assert torch.equal(p[k], q[k]), f"iteration {i}, regst {k!r}"
        for k in ex.state:
            assert torch.equal(state[k], ex.state[k])


def test_without_the_event_waits_the_harness_catches_the_race():
    """Teeth: the same runs with the consumers' waits dropped fail in some interleaving."""
    caught = 0
    for seed in range(10):
        plan = random_plan(seed)
        feeds = random_feeds(plan, 4, seed)
        streams = {SOURCE_STREAM, *(t.stream for t in plan.tasks)}
        try:
            run_on_fake(plan, feeds, seed, ignore_waits=streams)
        except OrderError:
            caught += 1
    assert caught >= 5


def test_the_host_never_waits_for_the_device():
    """Every act is enqueued before any kernel runs (the fake runs nothing until drained)."""
    plan = random_plan(2)
    dev = FakeDevice()
    lp = lazy_plan(plan, dev)
    devices = {s: dev.stream(s) for s in {SOURCE_STREAM, *(t.stream for t in plan.tasks)}}
    feeds = [{k: Buffer(devices[SOURCE_STREAM], v, written=True) for k, v in f.items()}
             for f in random_feeds(plan, 5, 2)]
    with Runtime(lp, devices=devices, threads={s: CALLER for s in devices}) as rt:
        outs = rt.run(feeds)
    assert len(outs) == 5
    assert sum(op == "kernel" for _, op, _ in dev.log) == 5 * len(plan.tasks)
    assert all(not b.written for o in outs for b in o.values() if b.made_on is not devices[SOURCE_STREAM])


def test_a_device_plan_needs_a_device_stream_for_every_stream():
    plan = Plan([TaskSpec("a", "compute", lambda x: (x,), ("x",), ("y",))], inputs=("x",), outputs=("y",))
    with pytest.raises(ValueError, match=r"every stream needs a device stream.*missing \['source'\]"):
        Runtime(plan, devices={"compute": FakeDevice().stream("compute")})


def test_an_act_records_its_event_after_its_kernels_and_waits_only_across_streams():
    dev = FakeDevice()
    plan = Plan([TaskSpec("a", "compute", dev.lazy(lambda x: (x + 1,), 1), ("x",), ("y",)),
                 TaskSpec("b", "compute", dev.lazy(lambda y: (y * 2,), 1), ("y",), ("z",)),
                 TaskSpec("c", "comm", dev.lazy(lambda z: (z - 1,), 1), ("z",), ("w",))],
                inputs=("x",), outputs=("w",))
    devices = {s: dev.stream(s) for s in (SOURCE_STREAM, "compute", "comm")}
    caller = devices[SOURCE_STREAM]
    with Runtime(plan, devices=devices, threads={s: CALLER for s in devices}) as rt:
        out = rt({"x": Buffer(caller, 3, written=True)})
    ops = {s: [op for name, op, _ in dev.log if name == s] for s in devices}
    assert ops["compute"] == ["wait", "kernel", "record", "kernel", "record"]   # b reads a's y: no wait
    assert ops["comm"] == ["wait", "kernel", "record"]
    assert ops[SOURCE_STREAM] == ["record", "wait", "record"]     # feeds; the sink waits for w
    got = []
    caller._push(("kernel", lambda: got.append(out["w"].read(caller))))
    dev.drain(random.Random(0))
    assert got == [7]
