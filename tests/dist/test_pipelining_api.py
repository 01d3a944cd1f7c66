"""torch's ``torch.distributed.pipelining`` under mock_torch: manual PipelineStages run by GPipe
and 1F1B on 2 and 4 Gloo ranks (stages passing a tuple of tensors on; 1F1B's refusal of fewer
micro-batches than stages) and by ScheduleLoopedBFS and ScheduleInterleaved1F1B (4, 6 and 3
micro-batches: one round and several) with two stages per rank, unchanged under
torch's launcher on torch and under holoflow's: every rank's outputs, per-micro-batch losses,
gradients and weights after two SGD steps equal torch's."""
import pytest
from test_dtensor_api import _compare, _run

import holoflow as flow
from holoflow.distributed_pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, pipeline

TWO_STAGES = '''
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, Schedule1F1B
dist.init_process_group("gloo")
rank = dist.get_rank()
n = dist.get_world_size()
torch.manual_seed(0)
full = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
parts = [full[:2], full[2:]]
mine = parts[rank]
x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
y = torch.randn(8, 3, generator=torch.Generator().manual_seed(2))
def loss_fn(out, target):
    return ((out - target) ** 2).mean()
for name, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
    torch.manual_seed(0)
    full = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    mine = [full[:2], full[2:]][rank]
    stage = PipelineStage(mine, rank, n, torch.device("cpu"))
    sched = cls(stage, n_microbatches=4, loss_fn=loss_fn)
    opt = torch.optim.SGD(mine.parameters(), lr=0.1)
    res = []
    for step in range(2):
        opt.zero_grad()
        if rank == 0:
            out = sched.step(x)
            res.append(out is None)
        else:
            losses = []
            out = sched.step(target=y, losses=losses)
            res.append([r6(out), [round(l.item(), 5) for l in losses]])
        opt.step()
    OUT[name] = [res, {k: r6(v) for k, v in mine.state_dict().items()},
                 {k: r6(p.grad) for k, p in mine.named_parameters()}]
'''

FOUR_STAGES = '''
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, Schedule1F1B
dist.init_process_group("gloo")
rank = dist.get_rank()
n = dist.get_world_size()

class Pair(nn.Module):   # a stage passing two tensors on
    def __init__(self, first):
        super().__init__()
        self.first = first
        self.lin = nn.Linear(6, 6)
    def forward(self, a, b=None):
        if self.first:
            return torch.tanh(self.lin(a)), a * 2
        return torch.tanh(self.lin(a) + b), b

def model():
    torch.manual_seed(0)
    return [Pair(True), Pair(False), nn.Sequential(), nn.Linear(6, 3)]

class Join2(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
    def forward(self, a, b):
        return self.lin(a * b)

def stages():
    parts = model()
    parts[2] = Join2()
    return parts

x = torch.randn(12, 6, generator=torch.Generator().manual_seed(1))
y = torch.randn(12, 3, generator=torch.Generator().manual_seed(2))
loss_fn = lambda out, t: ((out - t) ** 2).mean()
for name, cls, mbs in (("gpipe", ScheduleGPipe, 4), ("1f1b", Schedule1F1B, 6), ("1f1b_few", Schedule1F1B, 2)):
    torch.manual_seed(0)
    mine = stages()[rank]
    stage = PipelineStage(mine, rank, n, torch.device("cpu"))
    try:
        sched = cls(stage, n_microbatches=mbs, loss_fn=loss_fn)
    except ValueError:
        OUT[name] = "ValueError"
        continue
    opt = torch.optim.SGD(mine.parameters(), lr=0.1)
    res = []
    for step in range(2):
        opt.zero_grad()
        if rank == 0:
            res.append(sched.step(x) is None)
        elif rank == n - 1:
            losses = []
            out = sched.step(target=y, losses=losses)
            res.append([r6(out), [round(l.item(), 5) for l in losses]])
        else:
            res.append(sched.step() is None)
        opt.step()
    OUT[name] = [res, {k: r6(v) for k, v in mine.state_dict().items()}]
'''

MULTI = '''
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B, ScheduleLoopedBFS
dist.init_process_group("gloo")
rank = dist.get_rank()
n = dist.get_world_size()
x = torch.randn(12, 6, generator=torch.Generator().manual_seed(1))
y = torch.randn(12, 3, generator=torch.Generator().manual_seed(2))
for name, cls, mbs in (("looped", ScheduleLoopedBFS, 4), ("interleaved_4", ScheduleInterleaved1F1B, 4),
                       ("interleaved_6", ScheduleInterleaved1F1B, 6), ("interleaved_3", ScheduleInterleaved1F1B, 3)):
    torch.manual_seed(0)
    parts = [nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(2 * n - 1)] + [nn.Linear(6, 3)]
    mine = [parts[rank], parts[rank + n]]   # (two stages per rank: rank, rank + n)
    stages = [PipelineStage(m, i, 2 * n, torch.device("cpu")) for m, i in zip(mine, (rank, rank + n))]
    sched = cls(stages, n_microbatches=mbs, loss_fn=lambda out, t: ((out - t) ** 2).mean())
    opt = torch.optim.SGD([p for m in mine for p in m.parameters()], lr=0.1)
    res = []
    for step in range(2):
        opt.zero_grad()
        losses = []
        out = sched.step(x, target=y, losses=losses) if rank == 0 else sched.step(target=y, losses=losses)
        res.append([None if out is None else r6(out), [round(l.item(), 5) for l in losses]])
        opt.step()
    OUT[name] = [res, [{k: r6(v) for k, v in m.state_dict().items()} for m in mine]]
'''


@pytest.mark.parametrize("name, body, ranks", [("two", TWO_STAGES, 2), ("four", FOUR_STAGES, 4),
                                               ("multi", MULTI, 2)], ids=["2_ranks", "4_ranks", "2_stages_per_rank"])
def test_pipelining_script_equals_torch(tmp_path, name, body, ranks):
    want = _run(tmp_path, "torch", name, body, ranks)
    got = _run(tmp_path, "holoflow", name, body, ranks)
    if name == "four":
        assert want[0]["1f1b_few"] == "ValueError" and want[3]["gpipe"][0][0][1][0] > 0
    _compare(got, want)


def test_pipelining_refusals():
    lin = flow.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="Cannot specify both `split_spec` and `split_policy`"):
        pipeline(lin, mb_args=(flow.ones(2, 2),), split_spec={}, split_policy=lambda g: g)
    with pytest.raises(ValueError, match=r"stage_index 2 is not in \[0, 2\)"):
        PipelineStage(lin, 2, 2, "cpu", group=[0, 1])
    stage = PipelineStage(lin, 0, 2, "cpu", group=[0, 1])
    with pytest.raises(ValueError, match="n_microbatches must be a positive int, got 0"):
        ScheduleGPipe(stage, 0)
    with pytest.raises(ValueError, match=r"number of micro-batches \(1\) must be at least the number of stages"):
        Schedule1F1B(stage, 1)
    with pytest.raises(TypeError, match="takes one PipelineStage, got list"):
        ScheduleGPipe([stage], 2)
    with pytest.raises(NotImplementedError, match="args_chunk_spec is not supported"):
        ScheduleGPipe(stage, 2, args_chunk_spec=(0,))
    with pytest.raises(ValueError, match="this rank runs the first stage; pass the batch"):
        ScheduleGPipe(stage, 2).step()
