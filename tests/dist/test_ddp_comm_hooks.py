"""DDP communication hooks under mock_torch: torch's default hooks (all-reduce, fp16 compression,
the fp16 wrapper) and a user's hook with its own async all-reduce and future chain, unchanged, on
2 Gloo ranks under torch's launcher on torch and under holoflow's: every rank's weights equal
torch's; each backward hands the hook buckets 0..n-1, the last one last, every gradient once.
(bf16 compression, which torch refuses without NCCL, is checked against plain DDP in
tests/dist/test_ddp.py.) DDP of a torch.compile'd model trains as torch's too."""
from test_dtensor_api import _compare, _run

BODY = '''
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()

def noisy_hook(state, bucket):
    # a user's hook: counts calls and buckets, averages by hand
    state["calls"].append([bucket.index(), bucket.is_last(), len(bucket.parameters()), [list(g.shape) for g in bucket.gradients()]])
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0] / dist.get_world_size())

gen = torch.Generator().manual_seed(10 + rank)
xs = [torch.randn(4, 6, generator=gen) for _ in range(3)]
for name, hook, state in (("allreduce", default_hooks.allreduce_hook, None),
                          ("fp16", default_hooks.fp16_compress_hook, None),
                          ("wrapped", default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook), None),
                          ("user", noisy_hook, {"calls": []}),
                          ("none", None, None),
                          ("compiled", None, None)):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 40), nn.Tanh(), nn.Linear(40, 3))
    if name == "compiled":   # DDP of a compiled model: its buckets fill from the compiled backward
        net = torch.compile(net, backend="eager")   # (torch's DDP optimizer asserts on tiny buckets)
    model = DDP(net) if name == "compiled" else DDP(net, bucket_cap_mb=0.0005)
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in xs:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if state:   # each backward: buckets 0..n-1, the last one last, every gradient once
            calls = state.pop("calls")
            state["calls"] = []
            state.setdefault("seen", []).append([[c[0] for c in calls] == list(range(len(calls))),
                                                 [c[1] for c in calls] == [False] * (len(calls) - 1) + [True],
                                                 sorted(s for c in calls for s in c[3])])
    OUT[name] = {k: r6(v) for k, v in model.module.state_dict().items()}
    if state:
        OUT[name + "_buckets"] = state["seen"]
try:
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    model.register_comm_hook(None, default_hooks.allreduce_hook)
except RuntimeError:
    OUT["twice"] = "refused"
w = dist.all_reduce(torch.ones(2) * (rank + 1), async_op=True)
OUT["future"] = r6(w.get_future().wait()[0])
'''


def test_comm_hook_script_equals_torch(tmp_path):
    want = _run(tmp_path, "torch", "hooks", BODY, 2)
    got = _run(tmp_path, "holoflow", "hooks", BODY, 2)
    assert want[0]["twice"] == "refused" and want[0]["user_buckets"][0][:2] == [True, True]
    _compare(got, want)
