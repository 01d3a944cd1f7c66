"""torch.distributed's process-group API under mock_torch: one DDP training script, unchanged,
run by torch's launcher on torch and by holoflow's on holoflow (2 Gloo ranks each); every
rank's weights, collective results (tensors and objects, point-to-point in flight,
all_to_all_single) and group answers must be torch's."""
import os
import subprocess
import sys
import textwrap

from plain_env import plain_env
from test_dtensor_api import _script_outputs

SCRIPT = textwrap.dedent('''
    import json, sys
    if sys.argv[1] == "holoflow":
        import holoflow.mock_torch
        holoflow.mock_torch.enable()
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    assert dist.is_available() and not dist.is_initialized()
    dist.init_process_group("gloo")
    assert dist.is_initialized() and dist.get_backend() == "gloo"
    rank, ws = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 2), device_ids=None, output_device=None, find_unused_parameters=True,
                gradient_as_bucket_view=True, static_graph=False, bucket_cap_mb=25, init_sync=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(32.0).reshape(8, 4) / 10 + rank
    y = torch.ones(8, 2) * (rank - 0.5)
    for _ in range(3):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    biggest = torch.tensor([float(rank + 1)])
    dist.all_reduce(biggest, op=dist.ReduceOp.MAX)
    t = torch.arange(4.0) + 10 * rank
    together = torch.empty(8)
    dist.all_gather_into_tensor(together, t)
    pieces = [torch.empty(4) for _ in range(ws)]
    dist.all_gather(pieces, t)
    mine = torch.empty(2)
    dist.reduce_scatter_tensor(mine, torch.arange(4.0) * (rank + 1))
    b = torch.full((2,), float(rank))
    dist.broadcast(b, src=1)
    if rank == 0:
        dist.send(torch.tensor([5.0, 6.0]), dst=1)
        got = [5.0, 6.0]
    else:
        r = torch.zeros(2)
        sender = dist.recv(r, src=0)
        got = r.tolist() + [sender]
    g = dist.new_group([1, 0])
    in_group = [dist.get_rank(g), dist.get_world_size(g), dist.get_global_rank(g, 0)]
    dist.barrier()
    # objects, point-to-point in flight, all_to_all_single
    objs = [None] * ws
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    cfg = [{"lr": 0.1}, "a"] if rank == 0 else [None, None]
    dist.broadcast_object_list(cfg, src=0)
    gathered = [None] * ws if rank == 0 else None
    dist.gather_object(rank * 10, gathered, dst=0)
    scattered = [None]
    dist.scatter_object_list(scattered, [f"to{i}" for i in range(ws)] if rank == 1 else None, src=1)
    dist.monitored_barrier()
    peer = 1 - rank
    sent, came = torch.full((3,), float(rank)), torch.zeros(3)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, peer), dist.P2POp(dist.irecv, came, peer)]):
        w.wait()
    late = torch.zeros(2)
    works = [dist.isend(torch.tensor([7.0, 8.0]) + rank, peer), dist.irecv(late, peer)]
    for w in works:
        w.wait()
    a2a = torch.empty(4)
    dist.all_to_all_single(a2a, torch.arange(4.0) + 10 * rank)
    uneven = torch.empty(3 if rank == 0 else 7)   # rank 0 sends 2 and 3 rows, rank 1 sends 1 and 4
    dist.all_to_all_single(uneven, torch.arange(5.0) + 10 * rank, output_split_sizes=[2, 1] if rank == 0 else [3, 4],
                           input_split_sizes=[2, 3] if rank == 0 else [1, 4])
    more = {"objs": objs, "cfg": cfg, "gathered": gathered, "scattered": scattered, "came": came.tolist(),
            "late": late.tolist(), "a2a": a2a.tolist(), "uneven": uneven.tolist(),
            "node_local": dist.get_node_local_rank()}
    with open(f"{sys.argv[2]}/rank{rank}.json", "w") as f:
        json.dump({
        "weight": [round(v, 6) for v in model.module.weight.detach().reshape(-1).tolist()],
        "bias": [round(v, 6) for v in model.module.bias.detach().tolist()],
        "loss": round(total.item(), 6), "max": biggest.item(), "together": together.tolist(),
        "pieces": [p.tolist() for p in pieces], "mine": mine.tolist(), "b": b.tolist(), "got": got,
        "group": in_group, **more}, f)
    dist.destroy_process_group()
''')


def _run(tmp_path, lib: str, code: str = SCRIPT, name: str = "ddp_script") -> dict:
    """Both ranks' answers to ``code``, holoflow's or torch's (test_dtensor_api's launcher)."""
    return _script_outputs(tmp_path, lib, name, code, 2)


def test_a_torch_ddp_script_runs_unchanged_under_mock_torch(tmp_path):
    ours, theirs = _run(tmp_path, "holoflow"), _run(tmp_path, "torch")
    assert ours == theirs
    assert ours[0]["together"] == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]
    assert ours[1]["got"] == [5.0, 6.0, 0] and ours[0]["group"] == [0, 2, 0]
    assert ours[0]["objs"] == [{"rank": 0, "s": ""}, {"rank": 1, "s": "x"}] and ours[1]["cfg"] == [{"lr": 0.1}, "a"]
    assert ours[0]["gathered"] == [0, 10] and ours[1]["gathered"] is None and ours[1]["scattered"] == ["to1"]
    assert ours[0]["came"] == [1.0] * 3 and ours[0]["late"] == [8.0, 9.0] and ours[1]["late"] == [7.0, 8.0]
    assert ours[1]["a2a"] == [2.0, 3.0, 12.0, 13.0] and ours[1]["uneven"] == [2.0, 3.0, 4.0, 11.0, 12.0, 13.0, 14.0]


def test_the_process_group_api_in_one_process():
    """A world of one, no launcher: what a single-process torch script asks of torch.distributed."""
    code = textwrap.dedent('''
        import holoflow.mock_torch
        holoflow.mock_torch.enable()
        import torch, torch.distributed as dist
        dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
        try:
            dist.init_process_group("gloo", rank=0, world_size=1)
            raise SystemExit("a second init_process_group did not raise")
        except RuntimeError as e:
            assert "already initialized" in str(e)
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0] and dist.get_rank() == 0 and dist.get_world_size() == 1
        for work in (dist.all_reduce(t, async_op=True), dist.broadcast(t, 0, async_op=True),
                     dist.barrier(async_op=True), dist.all_gather([torch.empty(3)], t, async_op=True)):
            work.wait()
            assert work.is_completed()
        assert dist.broadcast(t, 0) is None and isinstance(dist.new_group(), dist.ProcessGroup)
        g = dist.new_group([0])
        assert dist.get_rank(g) == 0 and dist.get_process_group_ranks(g) == [0]
        try:
            dist.new_group([0, 3])
            raise SystemExit("a rank outside the world was accepted")
        except ValueError as e:
            assert "outside the world" in str(e)
        dist.destroy_process_group()
        assert not dist.is_initialized()
        print("ok")
    ''') % (29600 + os.getpid() % 300)
    out = subprocess.run([sys.executable, "-c", code], env=plain_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-3000:]


COLLECTIVES_WITH_GRAD = textwrap.dedent('''
    import json, sys
    if sys.argv[1] == "holoflow":
        import holoflow.mock_torch
        holoflow.mock_torch.enable()
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn

    dist.init_process_group("gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    out = {}

    def leaf(*shape):
        return (torch.arange(float(torch.Size(shape).numel())).reshape(shape) / 7 + rank).requires_grad_()

    def weights(t):
        return torch.linspace(-1.0, 2.0, t.numel()).reshape(t.shape) * (rank + 1)

    # a contrastive loss over every rank's embeddings
    x = leaf(3, 4)
    every = torch.cat(dnn.all_gather(x))
    logits = x @ every.t()
    torch.nn.functional.cross_entropy(logits, torch.arange(3) + 3 * rank).backward()
    out["all_gather"] = [every.tolist(), [round(v, 5) for v in x.grad.reshape(-1).tolist()]]
    for name, fn in (("all_reduce", lambda t: dnn.all_reduce(t)), ("broadcast", lambda t: dnn.broadcast(t, 1)),
                     ("reduce", lambda t: dnn.reduce(t, 0))):
        t = leaf(2, 3)
        y = fn(t)
        (y * weights(y)).sum().backward()
        out[name] = [y.tolist() if name != "reduce" or rank == 0 else None, [round(v, 5) for v in t.grad.reshape(-1).tolist()]]
    ins = [leaf(2), leaf(2)]
    y = dnn.reduce_scatter(torch.empty(2), ins)
    (y * weights(y)).sum().backward()
    out["reduce_scatter"] = [y.tolist(), [[round(v, 5) for v in t.grad.tolist()] for t in ins]]
    ins = [leaf(2, 2), leaf(2, 2)]
    got = dnn.all_to_all([torch.empty(2, 2), torch.empty(2, 2)], ins)
    sum((g * weights(g)).sum() for g in got).backward()
    out["all_to_all"] = [[g.tolist() for g in got], [[round(v, 5) for v in t.grad.reshape(-1).tolist()] for t in ins]]
    t = leaf(4, 2)
    y = dnn.all_to_all_single(torch.empty(4, 2), t)
    (y * weights(y)).sum().backward()
    out["all_to_all_single"] = [y.tolist(), [round(v, 5) for v in t.grad.reshape(-1).tolist()]]
    with open(f"{sys.argv[2]}/rank{rank}.json", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
''')


def test_differentiable_collectives_equal_torchs(tmp_path):
    """torch.distributed.nn.functional under mock_torch (a contrastive loss over all_gather, and
    all_reduce, broadcast, reduce, reduce_scatter, all_to_all, all_to_all_single with a backward):
    every rank's values and input gradients are torch's."""
    ours = _run(tmp_path, "holoflow", COLLECTIVES_WITH_GRAD, "collectives_with_grad")
    theirs = _run(tmp_path, "torch", COLLECTIVES_WITH_GRAD, "collectives_with_grad")
    assert ours == theirs
    import numpy as np   # rank 1 took rank 1's tensor; rank 1 (the source) gets both ranks' gradients
    np.testing.assert_allclose(ours[0]["broadcast"][0], 1.0 + np.arange(6.0).reshape(2, 3) / 7, rtol=1e-6)
    np.testing.assert_allclose(ours[1]["broadcast"][1], np.linspace(-1.0, 2.0, 6) * 3, rtol=1e-4)
    np.testing.assert_allclose(ours[0]["broadcast"][1], np.zeros(6))
