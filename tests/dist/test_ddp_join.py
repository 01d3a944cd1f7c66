"""DDP on uneven inputs under mock_torch: ``model.join()`` with rank 1 running two more iterations
than rank 0 (gradients averaged over the initial world size or over the ranks still training,
BatchNorm buffers broadcast, a parameter used twice in one iteration, no_sync accumulation inside
the block, throw_on_early_termination), unchanged, on 2 Gloo ranks under torch's launcher on torch
and under holoflow's: every rank's losses and final weights equal torch's."""
import pytest
from test_dtensor_api import _compare, _run

import holoflow as flow
from holoflow.distributed.algorithms.join import Join

BODY = '''
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))

gen = torch.Generator().manual_seed(10 + rank)
batches = [torch.randn(4, 6, generator=gen) for _ in range(3 + 2 * rank)]   # rank 1 has 2 more
for name, divide in (("initial", True), ("active", False)):
    model = DDP(make())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with model.join(divide_by_initial_world_size=divide):
        for x in batches:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(round(loss.item(), 5))
    OUT[name] = [losses, {k: r6(v) for k, v in model.module.state_dict().items()}]

# a parameter used twice in one iteration, and gradient accumulation without sync inside the block
class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))
torch.manual_seed(1)
model = DDP(Twice())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with model.join():
    for i, x in enumerate(batches):
        x = x[:, :4]
        if i % 2 == 0:
            with model.no_sync():
                model(x).sum().backward()
        else:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
OUT["twice"] = {k: r6(v) for k, v in model.module.state_dict().items()}

# throw_on_early_termination: every rank raises once one runs out
model = DDP(make())
raised = "no"
try:
    with model.join(throw_on_early_termination=True):
        for x in batches:
            model(x).sum().backward()
except RuntimeError:
    raised = "RuntimeError"
OUT["throw"] = raised
'''


def test_join_script_equals_torch(tmp_path):
    want = _run(tmp_path, "torch", "join", BODY, 2)
    got = _run(tmp_path, "holoflow", "join", BODY, 2)
    assert want[0]["throw"] == want[1]["throw"] == "RuntimeError"
    assert len(want[1]["initial"][0]) == 5 and want[0]["initial"][1] == want[1]["initial"][1]
    _compare(got, want)


def test_join_refuses_what_it_cannot_join():
    with pytest.raises(ValueError, match="the joinables list is empty"):
        Join([])
    with pytest.raises(TypeError, match="SGD is not Joinable"):
        Join([flow.optim.SGD([flow.zeros(1, requires_grad=True)], lr=0.1)])
