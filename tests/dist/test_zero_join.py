"""torch's ZeroRedundancyOptimizer as a Joinable under mock_torch: ``Join([ddp_model, zero_opt])``
with rank 0 running 3 iterations and rank 1 running 5 (and the reverse, with
``divide_by_initial_world_size=False``), AdamW and SGD with momentum sharded over 2 Gloo ranks,
unchanged under torch's launcher on torch and under holoflow's: every rank's losses, final
parameters, partition and consolidated optimizer state (the joined rank's partition stepped by
the join hook: its step counts) equal torch's."""
from test_dtensor_api import _compare, _run

import holoflow as flow
from holoflow.distributed.algorithms.join import Join, Joinable

BODY = '''
from torch.distributed.algorithms.join import Join, Joinable
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))

gen = torch.Generator().manual_seed(10 + rank)
batches = [torch.randn(4, 6, generator=gen) for _ in range(6)]
for name, opt_class, iters, kwargs in (
        ("adamw", torch.optim.AdamW, (3, 5), {"lr": 0.05}),
        ("sgd_local_mean", torch.optim.SGD, (5, 2), {"lr": 0.1, "momentum": 0.9})):
    model = DDP(make())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=opt_class, **kwargs)
    losses = []
    join_kwargs = {} if name == "adamw" else {"divide_by_initial_world_size": False}
    with Join([model, opt], **join_kwargs):
        for x in batches[:iters[rank]]:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(round(loss.item(), 5))
    opt.consolidate_state_dict(to=0)
    OUT[name] = {"joinable": isinstance(opt, Joinable), "group": opt.join_process_group is None,
                 "device": str(opt.join_device), "losses": losses,
                 "weights": {k: r6(v) for k, v in model.module.state_dict().items()},
                 "owned": sorted(p.numel() for g in opt.optim.param_groups for p in g["params"])}
    if rank == 0:
        state = opt.state_dict()["state"]
        OUT[name]["state"] = {str(i): {k: (r6(v) if v.dim() else round(v.item(), 5)) for k, v in s.items()}
                              for i, s in state.items()}
'''


def test_zero_join_uneven_inputs_equal_torch(tmp_path):
    want = _run(tmp_path, "torch", "zero_join", BODY, 2)
    got = _run(tmp_path, "holoflow", "zero_join", BODY, 2)
    adamw = want[0]["adamw"]
    # (the joined rank 0 steps its partition 5 times: 3 in its loop, 2 from the join hook)
    assert {s["step"] for s in adamw["state"].values()} == {5.0}
    assert want[0]["adamw"]["weights"] == want[1]["adamw"]["weights"]
    _compare(got, want)


def test_zero_is_joinable():
    from holoflow.distributed_optim import ZeroRedundancyOptimizer
    p = flow.zeros(2, requires_grad=True)
    opt = ZeroRedundancyOptimizer([p], optimizer_class=flow.optim.SGD, process_group=[0], lr=0.1)
    assert isinstance(opt, Joinable)
    assert opt.join_process_group == (0,) and str(opt.join_device) == "cpu"
    join = Join([opt])   # (accepted: the check that refused it before)
    assert join.ranks == (0,)
