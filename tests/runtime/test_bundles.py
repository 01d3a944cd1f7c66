"""Bundled regsts: a task's values with the same consumers travel as one piece per act (one
announce and one return per consumer edge), with the sequential executor's values bit for bit,
on any worker mapping and on device streams, loop-carried bundles included."""
import random

import pytest
import torch

from holoflow.runtime import CALLER, SOURCE_STREAM, Plan, Runtime, SequentialExecutor, TaskSpec
from holoflow.runtime.actor import Actor

from runtime.plans import STREAMS, _mix_fn, random_feeds
from runtime.test_device_streams import run_on_fake
from runtime.test_equivalence import assert_same

D = 4


def wide_plan(seed: int) -> Plan:
    """Tasks making 2-5 values each; a consumer reads all or some of an earlier task's values (so
    several share their readers); two or three state regsts made by one task (a loop-carried bundle)."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    state = [f"s{i}" for i in range(rng.randint(2, 3))]
    made: list[list[str]] = [["x"], list(state)]
    specs = []
    for k in range(rng.randint(3, 6)):
        cons: list[str] = []
        for vals in rng.sample(made, min(len(made), rng.randint(1, 2))):
            cons += vals if rng.random() < 0.6 else rng.sample(vals, rng.randint(1, len(vals)))
        prods = [f"t{k}_{j}" for j in range(rng.randint(2, 5))]
        specs.append([f"task{k}", rng.choice(STREAMS), cons, prods, rng.randint(1, 3)])
        made.append(prods)
    owner = rng.choice(specs)
    owner[3] += state
    owner[4] = max(owner[4], 2)
    tasks = [TaskSpec(name, stream, _mix_fn([[torch.randn(D, D, generator=g) / 3 for _ in prods]
                                             for _ in range(len(cons) + 1)], len(prods)),
                      tuple(cons), tuple(prods), register_num=rn) for name, stream, cons, prods, rn in specs]
    last = specs[-1][3]
    return Plan(tasks, inputs=("x",), outputs=(last[0], last[-1], state[0]),
                initial={s: torch.randn(D, D, generator=g) for s in state}, input_register_num=2)


PLANS = [wide_plan(s) for s in range(8)]


MAPPINGS = {"caller": {s: CALLER for s in (SOURCE_STREAM, *STREAMS)}, "thread per stream": None,
            "one thread": {s: "w" for s in (SOURCE_STREAM, *STREAMS)}}


def workers(plan: Plan, mapping: str) -> dict | None:
    used = {SOURCE_STREAM, *(t.stream for t in plan.tasks)}
    threads = MAPPINGS[mapping]
    return threads and {s: w for s, w in threads.items() if s in used}


def test_wide_plans_bundle_values_and_state():
    sizes = []
    for plan in PLANS:
        with Runtime(plan, threads=workers(plan, "caller")) as rt:
            sizes += [(len(r.names), r.keep) for a in rt.actors for r in a.regsts]
    assert any(n >= 2 and not keep for n, keep in sizes)
    assert any(n >= 2 and keep for n, keep in sizes)


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("seed", range(len(PLANS)))
def test_bundled_plans_match_the_sequential_executor(seed, mapping):
    plan = PLANS[seed]
    feeds = random_feeds(plan, 6, seed)
    ex = SequentialExecutor(plan)
    expected = ex.run(feeds)
    with Runtime(plan, timeout=30, threads=workers(plan, mapping)) as rt:
        got = rt.run(feeds[:4]) + [rt(f) for f in feeds[4:]]
        state = rt.state
    assert_same(expected, got)
    assert state.keys() == ex.state.keys()
    for k in ex.state:
        assert torch.equal(state[k], ex.state[k])


@pytest.mark.parametrize("seed", range(4))
def test_bundled_plans_on_device_streams_match_the_sequential_executor(seed):
    plan = PLANS[seed]
    feeds = random_feeds(plan, 5, seed)
    ex = SequentialExecutor(plan)
    expected = ex.run(feeds)
    outs, state, _ = run_on_fake(plan, feeds, seed)
    for p, q in zip(expected, outs):
        assert p.keys() == q.keys() and all(torch.equal(p[k], q[k]) for k in p)
    for k in ex.state:
        assert torch.equal(state[k], ex.state[k])


def test_a_task_sends_one_piece_per_consumer_per_act():
    n = 20
    plan = Plan([TaskSpec("fwd", "compute", lambda x: tuple(x + i for i in range(n)), ("x",),
                          tuple(f"g{i}" for i in range(n)), register_num=2),
                 TaskSpec("upd", "compute", lambda *g: (sum(g[:-1]), g[-1]), tuple(f"g{i}" for i in range(n)),
                          ("total", "w"), register_num=2),
                 TaskSpec("use", "compute", lambda g0, w: (g0 * w,), ("g0", "w"), ("y",))],
                inputs=("x",), outputs=("total", "y"), initial={"w": 1})
    with Runtime(plan, threads={SOURCE_STREAM: CALLER, "compute": CALLER}) as rt:
        fwd, upd, use = (a for a in rt.actors if a.name in ("fwd", "upd", "use"))
        assert [r.names for r in fwd.regsts] == [("g0",), tuple(f"g{i}" for i in range(1, n))]
        assert [r.names for r in upd.regsts] == [("total",), ("w",)] and upd.regsts[1].keep
        assert len(upd.inboxes) == 2 and len(use.inboxes) == 2
        sent = []
        for w in rt.workers.values():        # count the messages actors post to each other
            w.local = _Counting(w.local, sent)
        got = rt.run({"x": i} for i in range(5))
        assert rt.state == {"w": 19 + 4}
    assert got == SequentialExecutor(plan).run({"x": i} for i in range(5))
    # per iteration, pieces: the feed, source 1, fwd 3 (g0 to upd and use, g1.. to upd), upd 2, use 1;
    # returns (or wake-ups, on one worker): source 0, fwd 1, upd 2, use 2, sink 2 (one message per
    # value would make fwd alone send 21 pieces and upd 20 returns)
    pieces = [m for m in sent if getattr(m[0], "__func__", None) is Actor.on_ready]
    assert len(pieces) == 5 * 8 and len(sent) - len(pieces) <= 5 * 7


class _Counting:
    """A worker's local deque that records every message appended."""

    def __init__(self, inner, log):
        self._inner, self._log = inner, log

    def append(self, msg):
        self._log.append(msg)
        self._inner.append(msg)

    def popleft(self):
        return self._inner.popleft()

    def clear(self):
        self._inner.clear()

    def __bool__(self):
        return bool(self._inner)

    def __len__(self):
        return len(self._inner)
