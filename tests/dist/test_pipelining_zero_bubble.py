"""torch's zero-bubble pipeline schedules under mock_torch: ScheduleInterleavedZeroBubble (stages
looped over the ranks), ScheduleZBVZeroBubble and ScheduleDualPipeV (two stages per rank in a V:
rank r holds stages r and 2p-1-r), on 2 and 4 Gloo ranks, fewer micro-batches than the pipeline
needs and more, unchanged under torch's launcher on torch and under holoflow's: every rank's
outputs, per-micro-batch losses, gradients and weights after two SGD steps equal torch's; a V
schedule given one stage per rank raises torch's ValueError. In one process: each rank's order of
F / I / W / B acts is torch's (its own order functions, for 1-5 ranks, 1-12 micro-batches, 1-3
local stages), and replaying all ranks' orders with blocking receives runs every act of every
micro-batch (no deadlock)."""
from types import SimpleNamespace

import pytest
from test_dtensor_api import _compare, _run
from torch.distributed.pipelining import schedules as torch_schedules

import holoflow as flow
from holoflow.distributed_pipelining import (PipelineStage, ScheduleDualPipeV, ScheduleInterleavedZeroBubble,
                                             ScheduleZBVZeroBubble)
from holoflow.distributed_pipelining.schedules import (dual_pipe_v_order, interleaved_zero_bubble_order,
                                                       v_stage_rank, zbv_order)

BODY = '''
from torch.distributed.pipelining import (PipelineStage, ScheduleDualPipeV, ScheduleInterleavedZeroBubble,
                                          ScheduleZBVZeroBubble)
dist.init_process_group("gloo")
rank = dist.get_rank()
p = dist.get_world_size()
x = torch.randn(48, 6, generator=torch.Generator().manual_seed(1))   # (every count here divides 48: torch's
y = torch.randn(48, 3, generator=torch.Generator().manual_seed(2))   # runtime wants micro-batches of one shape)

class Block(nn.Module):   # (a parameter used twice: its gradient sums two paths)
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.scale = nn.Parameter(torch.tensor(0.5))
    def forward(self, a):
        return torch.tanh(self.lin(a)) * self.scale + a * self.scale

def parts():
    torch.manual_seed(0)
    return [Block() for _ in range(2 * p - 1)] + [nn.Linear(6, 3)]

CASES = [("zb_interleaved_%d" % m, ScheduleInterleavedZeroBubble, m, "loop") for m in (2 * p, p // 2 or 1, 3 * p)]
CASES += [("zbv_%d" % m, ScheduleZBVZeroBubble, m, "v") for m in (2 * p, 2 * p - 2, 4 * p)]
CASES += [("dualpipev_%d" % m, ScheduleDualPipeV, m, "v") for m in (2 * p, 4 * p)]
for name, cls, mbs, style in CASES:
    mods = parts()
    ids = (rank, rank + p) if style == "loop" else (rank, 2 * p - 1 - rank)
    mine = [mods[i] for i in ids]
    stages = [PipelineStage(m, i, 2 * p, torch.device("cpu")) for m, i in zip(mine, ids)]
    sched = cls(stages, n_microbatches=mbs, loss_fn=lambda out, t: ((out - t) ** 2).mean())
    opt = torch.optim.SGD([q for m in mine for q in m.parameters()], lr=0.1)
    res = []
    for step in range(2):
        opt.zero_grad()
        losses = []
        out = sched.step(x, target=y, losses=losses) if rank == 0 else sched.step(target=y, losses=losses)
        res.append([None if out is None else r6(out), [round(l.item(), 5) for l in losses],
                    [r6(q.grad) for m in mine for q in m.parameters()]])
        opt.step()
    OUT[name] = [res, [{k: r6(v) for k, v in m.state_dict().items()} for m in mine]]

# a V schedule given one stage per rank
lone = PipelineStage(parts()[rank], rank, p, torch.device("cpu"))
for cls in (ScheduleZBVZeroBubble, ScheduleDualPipeV):
    try:
        cls([lone], n_microbatches=2 * p, loss_fn=lambda out, t: ((out - t) ** 2).mean())
        OUT["one_stage_" + cls.__name__] = "accepted"
    except Exception as e:
        OUT["one_stage_" + cls.__name__] = type(e).__name__
'''


@pytest.mark.parametrize("ranks", [2, 4])
def test_zero_bubble_schedules_equal_torch(tmp_path, ranks):
    want = _run(tmp_path, "torch", "zero_bubble", BODY, ranks)
    got = _run(tmp_path, "holoflow", "zero_bubble", BODY, ranks)
    assert want[0]["one_stage_ScheduleZBVZeroBubble"] == "ValueError"
    assert want[0]["zbv_%d" % (2 * ranks)][0][0][1]   # (the V's last stage is on rank 0: its losses)
    _compare(got, want)


# -- the orders, in one process ---------------------------------------------------------------------
_KIND = {"FORWARD": "F", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W", "FULL_BACKWARD": "B"}


def _torch_acts(actions: list) -> list:
    """torch's actions as (kind, stage, micro-batch), an overlapped pair as its two acts in turn."""
    return [(_KIND[a.computation_type.name], a.stage_index, a.microbatch_index)
            for action in actions if action is not None for a in (action.sub_actions or (action,))]


def _cases():
    for ranks in range(1, 6):
        for n in range(1, 13):
            rounds = max(1, n // ranks)
            for local in (1, 2, 3):
                if n % rounds == 0:
                    yield "interleaved", ranks, n, local
            yield "zbv", ranks, n, 2
            if n >= 2 * ranks:
                yield "dualpipev", ranks, n, 2


def _orders(kind: str, ranks: int, n: int, local: int) -> tuple[list, list]:
    """Every rank's order, holoflow's and torch's."""
    ours, theirs = [], []
    for r in range(ranks):
        if kind == "interleaved":
            per = n // max(1, n // ranks)
            ours.append(interleaved_zero_bubble_order(r, ranks, local, n, per))
            self = SimpleNamespace(n_local_stages=local, microbatches_per_round=per, pp_group_size=ranks,
                                   _n_microbatches=n)
            theirs.append(torch_schedules.ScheduleInterleavedZeroBubble._calculate_single_rank_operations(self, r))
        elif kind == "zbv":
            ours.append(zbv_order(r, ranks, n))
            self = SimpleNamespace(pp_group_size=ranks, num_stages=2 * ranks, _n_microbatches=n)
            theirs.append(torch_schedules.ScheduleZBVZeroBubble._calculate_single_rank_operations(self, r))
        else:
            ours.append(dual_pipe_v_order(r, ranks, n))
            self = SimpleNamespace(pp_group_size=ranks, _n_microbatches=n)
            theirs.append(torch_schedules.ScheduleDualPipeV._calculate_single_rank_operations(self, r))
    return ours, [_torch_acts(t) for t in theirs]


def _replay(orders: list, stages: int, n: int) -> None:
    """Runs every rank's order as the schedules do: an act waits (blocking) for its input from
    the act that sends it; sends never wait. Fails on a deadlock, an act run twice, or one missing."""
    done: set = set()

    def ready(kind: str, s: int, mb: int) -> bool:
        if kind == "F":
            return s == 0 or ("F", s - 1, mb) in done
        if kind == "W":
            return ("I", s, mb) in done
        own = ("F", s, mb) in done
        return own and (s == stages - 1 or ("I", s + 1, mb) in done or ("B", s + 1, mb) in done)
    heads = [0] * len(orders)
    while any(h < len(o) for h, o in zip(heads, orders)):
        moved = False
        for r, order in enumerate(orders):
            while heads[r] < len(order) and ready(*order[heads[r]]):
                act = order[heads[r]]
                assert act not in done, f"rank {r} runs {act} twice"
                done.add(act)
                heads[r] += 1
                moved = True
        assert moved, f"deadlock: each rank waits at {[o[h] if h < len(o) else None for h, o in zip(heads, orders)]}"
    for s in range(stages):
        for mb in range(n):
            assert ("F", s, mb) in done and (("B", s, mb) in done) != (("I", s, mb) in done and ("W", s, mb) in done)


@pytest.mark.parametrize("kind, ranks, n, local", list(_cases()))
def test_zero_bubble_orders_are_torchs_and_run_through(kind, ranks, n, local):
    ours, theirs = _orders(kind, ranks, n, local)
    assert ours == theirs
    for r, order in enumerate(ours):   # (each rank names only its own stages)
        placed = (lambda s: s % ranks) if kind == "interleaved" else (lambda s: v_stage_rank(s, ranks))
        assert {placed(s) for _, s, _ in order} <= {r}
    _replay(ours, local * ranks, n)


def test_zero_bubble_refusals():
    def stage(i: int, total: int = 4):
        return PipelineStage(flow.nn.Linear(2, 2), i, total, "cpu", group=[0, 1])
    for cls in (ScheduleZBVZeroBubble, ScheduleDualPipeV):
        with pytest.raises(ValueError, match=r"requires exactly 2 stages per rank \(rank r holds stages r and "
                                             r"2 \* ranks - 1 - r of a V\), but got 1"):
            cls([stage(0)], 4)
        with pytest.raises(ValueError, match=r"stages \[0, 2\] are not one rank's V: .* \(rank 0: stages \[0, 3\]\)"):
            cls([stage(0), stage(2)], 4)
        with pytest.raises(ValueError, match="a V puts 2 stages on each rank, so num_stages must be 4"):
            cls([stage(0, 6), stage(5, 6)], 4)
    with pytest.raises(ValueError, match=r"at least as many micro-batches as stages, but got 3 micro-batches and 4"):
        ScheduleDualPipeV([stage(0), stage(3)], 3)
    with pytest.raises(ValueError, match=r"multiple of the number of rounds \(2\)"):
        ScheduleInterleavedZeroBubble([stage(0), stage(2)], 5)
    with pytest.raises(ValueError, match=r"stages \[0, 1\] are not one rank's: .* \(rank 0: stages \[0, 2\]\)"):
        ScheduleInterleavedZeroBubble([stage(0), stage(1)], 4)
    sched = ScheduleZBVZeroBubble([stage(1), stage(2)], 4)
    assert [s.stage_index_to_group_rank for s in sched._stages][0] == {0: 0, 1: 1, 2: 1, 3: 0}


def _two_stages():
    flow.manual_seed(0)
    first, last = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.Tanh()), flow.nn.Linear(4, 2)
    stages = [PipelineStage(m, i, 2, "cpu", group=[0]) for i, m in enumerate((first, last))]
    return first, last, stages


def test_input_part_defers_weight_gradients_to_weight_part():
    """One rank holding both stages of a V (handed over in the mailbox, no process group): the
    input part sends the input gradients and leaves every parameter's .grad alone; the weight
    part accumulates what one whole backward gives."""
    first, last, (s0, s1) = _two_stages()
    ScheduleZBVZeroBubble([s0, s1], 2)   # (which gives the two stages one mailbox)
    x = flow.randn(4, 3, generator=flow.Generator().manual_seed(1))
    s0.forward_one(0, (x,), {})
    loss = (s1.forward_one(0, (), {}) ** 2).mean()
    s1.backward_input_one(0, loss)
    s0.backward_input_one(0, None)
    assert all(p.grad is None for p in [*first.parameters(), *last.parameters()])
    with pytest.raises(RuntimeError, match="weight gradients of micro-batch 1 before its input gradients"):
        s1.backward_weight_one(1)
    s1.backward_weight_one(0)
    assert all(p.grad is None for p in first.parameters()) and all(p.grad is not None for p in last.parameters())
    s0.backward_weight_one(0)
    got = [p.grad.clone() for p in [*first.parameters(), *last.parameters()]]
    for p in [*first.parameters(), *last.parameters()]:
        p.grad = None
    (last(first(x)) ** 2).mean().backward()
    for g, p in zip(got, [*first.parameters(), *last.parameters()]):
        assert flow.equal(g, p.grad)


class _Counted(flow.autograd.Function):
    """The identity, counting its backward's calls."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _Counted.calls += 1
        return g


class _Rich(flow.nn.Module):
    """A stage whose paths to its parameters leave the paths to its input in several ways: a
    Linear used twice (tied), a parameter added after a node on the input path, a branch reading a
    parameter alone; a doubling hook on an activation, and a counted node on the input path."""

    def __init__(self):
        super().__init__()
        self.a, self.b = flow.nn.Linear(4, 4), flow.nn.Linear(4, 4)
        self.side = flow.nn.Parameter(flow.linspace(-1, 1, 4))
        self.hooked = 0

    def forward(self, x):
        h = _Counted.apply(flow.tanh(self.a(x)))

        def double(g):
            self.hooked += 1
            return g * 2
        h.register_hook(double)
        h = self.b(h)
        h.register_hook(double)   # (on a node the weight part resumes from: its hooks ran already)
        h = self.a(h + self.side)
        return h * (self.side ** 2).sum()


def test_the_weight_part_resumes_where_the_input_part_left_the_parameters_paths():
    """I then W on a stage with tied weights, parameters off the input path and a doubling hook:
    every node's rule runs once over both parts (the counted node on the input path, which the
    weight part used to run again, once) and each hook once; the input's gradient (sent back)
    and the parameters' equal one whole backward's."""
    flow.manual_seed(0)
    first, last = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.Tanh()), _Rich()
    s0, s1 = [PipelineStage(m, i, 2, "cpu", group=[0]) for i, m in enumerate((first, last))]
    ScheduleZBVZeroBubble([s0, s1], 2)   # (the mailbox between the two stages of one rank)
    x = flow.randn(5, 3, generator=flow.Generator().manual_seed(1))
    s0.forward_one(0, (x,), {})
    loss = (s1.forward_one(0, (), {}) ** 2).mean()
    _Counted.calls = 0
    s1.backward_input_one(0, loss)
    assert (_Counted.calls, last.hooked) == (1, 2) and all(p.grad is None for p in last.parameters())
    s0.backward_input_one(0, None)
    s1.backward_weight_one(0)
    s0.backward_weight_one(0)
    assert (_Counted.calls, last.hooked) == (1, 2)
    params = [*first.parameters(), *last.parameters()]
    got = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    (last(first(x)) ** 2).mean().backward()
    for g, p in zip(got, params):
        assert flow.allclose(g, p.grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cls", [ScheduleZBVZeroBubble, ScheduleDualPipeV])
def test_v_schedule_on_one_rank_equals_full_batch(cls):
    first, last, stages = _two_stages()
    x = flow.randn(8, 3, generator=flow.Generator().manual_seed(1))
    y = flow.randn(8, 2, generator=flow.Generator().manual_seed(2))
    losses: list = []
    out = cls(stages, 4, loss_fn=lambda o, t: ((o - t) ** 2).mean()).step(x, target=y, losses=losses)
    got = [p.grad.clone() for p in [*first.parameters(), *last.parameters()]]
    for p in [*first.parameters(), *last.parameters()]:
        p.grad = None
    full = last(first(x))
    ((full - y) ** 2).mean().backward()
    assert flow.allclose(out, full) and len(losses) == 4
    for g, p in zip(got, [*first.parameters(), *last.parameters()]):
        assert flow.allclose(g, p.grad, atol=1e-6)
