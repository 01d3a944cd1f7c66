"""torch's ZeroRedundancyOptimizer under mock_torch: DDP with AdamW sharded over 2 Gloo ranks
(two parameter groups, an LR scheduler), the state consolidated on rank 0 and resumed into a fresh
optimizer, unchanged under torch's launcher on torch and under holoflow's: every rank's losses,
weights, partition, consolidated state dict and resumed training equal torch's."""
import pytest
from test_dtensor_api import _compare, _run

import holoflow as flow

BODY = '''
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()

def make(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))

gen = torch.Generator().manual_seed(10 + rank)
batches = [torch.randn(4, 6, generator=gen) for _ in range(6)]
model = DDP(make(0))
decay = [p for n, p in model.module.named_parameters() if n.endswith("weight")]
rest = [p for n, p in model.module.named_parameters() if not n.endswith("weight")]
opt = ZeroRedundancyOptimizer([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                              optimizer_class=torch.optim.AdamW, lr=0.05)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
losses = []
for x in batches[:4]:
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    sched.step()
    losses.append(round(loss.item(), 5))
OUT["losses"] = losses
OUT["weights"] = {k: r6(v) for k, v in model.module.state_dict().items()}
OUT["lrs"] = [g["lr"] for g in opt.param_groups]
OUT["owned"] = sorted(p.numel() for g in opt.optim.param_groups for p in g["params"])
opt.consolidate_state_dict(to=0)
if rank == 0:
    sd = opt.state_dict()
    OUT["state"] = {str(i): {k: (r6(v) if v.dim() else round(v.item(), 5)) for k, v in s.items()}
                    for i, s in sd["state"].items()}
    OUT["groups"] = [{k: v for k, v in g.items() if k in ("params", "lr", "weight_decay", "betas")} for g in sd["param_groups"]]
    saved = [sd]
else:
    try:
        opt.state_dict()
        OUT["not_consolidated"] = "no error"
    except RuntimeError:
        OUT["not_consolidated"] = "RuntimeError"
    saved = [None]
dist.broadcast_object_list(saved, src=0)

# resume on a fresh model: the same steps as the original
fresh = DDP(make(5))
fresh.module.load_state_dict(model.module.state_dict())
fopt = ZeroRedundancyOptimizer([{"params": [p for n, p in fresh.module.named_parameters() if n.endswith("weight")],
                                 "weight_decay": 0.1},
                                {"params": [p for n, p in fresh.module.named_parameters() if not n.endswith("weight")],
                                 "weight_decay": 0.0}], optimizer_class=torch.optim.AdamW, lr=0.05)
import copy
fopt.load_state_dict(copy.deepcopy(saved[0]))   # (a checkpoint: torch's state_dict() holds the live state tensors)
for m, o in ((model, opt), (fresh, fopt)):
    for x in batches[4:]:
        o.zero_grad()
        m(x).pow(2).mean().backward()
        o.step()
OUT["resumed"] = {k: r6(v) for k, v in fresh.module.state_dict().items()}
OUT["continued"] = {k: r6(v) for k, v in model.module.state_dict().items()}
'''


def test_zero_redundancy_optimizer_script_equals_torch(tmp_path):
    want = _run(tmp_path, "torch", "zero", BODY, 2)
    got = _run(tmp_path, "holoflow", "zero", BODY, 2)
    assert want[1]["not_consolidated"] == "RuntimeError" and want[0]["resumed"] == want[0]["continued"]
    assert want[0]["owned"] == [3, 8, 128] and want[1]["owned"] == [16, 24, 96]
    _compare(got, want)


def test_zero_redundancy_optimizer_refusals():
    from holoflow.distributed_optim import ZeroRedundancyOptimizer
    p = flow.zeros(2, requires_grad=True)
    with pytest.raises(TypeError, match="optimizer_class must be an optimizer class"):
        ZeroRedundancyOptimizer([p], optimizer_class="adam", process_group=[0])
    with pytest.raises(NotImplementedError, match="overlap_with_ddp=True .* is not supported"):
        ZeroRedundancyOptimizer([p], optimizer_class=flow.optim.SGD, overlap_with_ddp=True, lr=0.1)
