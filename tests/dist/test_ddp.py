"""DistributedDataParallel on 2 and 4 ranks == single-process training on the whole batch."""
import pytest

import holoflow as flow
from holoflow.nn.parallel import DistributedDataParallel as DDP


def _mlp(seed):
    flow.manual_seed(seed)
    return flow.nn.Sequential(flow.nn.Linear(5, 16), flow.nn.Tanh(), flow.nn.Linear(16, 16), flow.nn.Tanh(),
                              flow.nn.Linear(16, 3))


def _close(a, b):
    return (a - b).abs().max().item() < 1e-5


def _train(rank, bucket_cap_mb, steps):
    n = flow.env.get_world_size()
    model = DDP(_mlp(100 + rank), bucket_cap_mb=bucket_cap_mb)  # different inits: rank 0's must win
    ref = _mlp(0)
    ref.load_state_dict(model.module.state_dict())
    opt = flow.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = flow.optim.SGD(ref.parameters(), lr=0.1)
    flow.manual_seed(7)
    n_buckets = len(model.reducer.buckets)
    for _ in range(steps):
        x, y = flow.randn(4 * n, 5), flow.randn(4 * n, 3)
        mine = slice(4 * rank, 4 * rank + 4)
        opt.zero_grad()
        with flow.comm.count() as c:
            ((model(x[mine]) - y[mine]) ** 2).mean().backward()
        ref_opt.zero_grad()
        ((ref(x) - y) ** 2).mean().backward()
        assert c.counts["all_reduce"] == n_buckets and c.total == n_buckets, dict(c.counts)
        for p, q in zip(model.module.parameters(), ref.parameters()):
            assert _close(p.grad, q.grad), (p.grad, q.grad)
        opt.step()
        ref_opt.step()
    for p, q in zip(model.module.parameters(), ref.parameters()):
        assert _close(p, q)
    return n_buckets


@pytest.mark.parametrize("bucket_cap_mb", [25.0, 0.0005])
def test_ddp_matches_single_process(world2, bucket_cap_mb):
    buckets = world2.run(_train, bucket_cap_mb, 3)
    assert buckets == [1, 1] if bucket_cap_mb == 25.0 else buckets[0] > 2


def test_ddp_world4(world4):
    assert world4.run(_train, 0.0005, 2)[0] > 2


def _no_sync(rank):
    n = flow.env.get_world_size()
    model = DDP(_mlp(3 + rank), bucket_cap_mb=0.0005)
    ref = _mlp(0)
    ref.load_state_dict(model.module.state_dict())
    flow.manual_seed(11)
    x = flow.randn(4 * n, 5)
    halves = [x[:2 * n], x[2 * n:]]
    with flow.comm.count() as c:
        with model.no_sync():
            model(halves[0][2 * rank:2 * rank + 2]).sum().backward()
        assert c.total == 0
        model(halves[1][2 * rank:2 * rank + 2]).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(model.module.parameters(), ref.parameters()):
        assert _close(p.grad * n, q.grad)  # sums of per-rank sums, averaged over n ranks
    return c.counts["all_reduce"]


def test_ddp_no_sync(world2):
    counts = world2.run(_no_sync)
    assert counts[0] == counts[1] > 2


def _shared_weight(rank, hook=None):
    lin = flow.nn.Linear(4, 4)
    model = DDP(lin)
    if hook is not None:
        model.register_comm_hook(None, hook)
    x = flow.ones(2, 4) * (rank + 1)
    model(model(x)).sum().backward()  # the same parameters used twice in one backward
    ref = flow.nn.Linear(4, 4)
    ref.load_state_dict(lin.state_dict())
    g = 0
    for r in range(flow.env.get_world_size()):
        ref.zero_grad()
        ref(ref(flow.ones(2, 4) * (r + 1))).sum().backward()
        g = g + ref.weight.grad
    assert _close(lin.weight.grad, g / flow.env.get_world_size())
    return True


def _shared_weight_hooked(rank):
    from holoflow.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    return _shared_weight(rank, allreduce_hook)


def test_ddp_parameter_used_twice(world2):
    assert world2.run(_shared_weight) == [True, True]
    assert world2.run(_shared_weight_hooked) == [True, True]   # (the hook reduces the bucket again)


def _hooks_vs_plain(rank):
    """bf16/fp16 compression (and the wrappers) train as plain DDP up to their rounding; a hook's
    own async collective overlaps; a bad hook is named."""
    from holoflow.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    n = flow.env.get_world_size()
    results = {}
    for name, hook, tol in (("plain", None, 0), ("bf16", dh.bf16_compress_hook, 2e-2),
                            ("fp16", dh.fp16_compress_hook, 2e-3),
                            ("bf16_wrapped", dh.bf16_compress_wrapper(dh.allreduce_hook), 2e-2),
                            ("fp16_wrapped", dh.fp16_compress_wrapper(dh.allreduce_hook), 2e-3)):
        model = DDP(_mlp(0), bucket_cap_mb=0.0002)
        if hook is not None:
            model.register_comm_hook(None, hook)
        flow.manual_seed(3)
        x = flow.randn(4 * n, 5)
        model(x[4 * rank:4 * rank + 4]).pow(2).mean().backward()
        results[name] = [p.grad.clone() for p in model.parameters()]
        if hook is not None:
            for g, want in zip(results[name], results["plain"]):
                assert (g - want).abs().max().item() <= tol * max(want.abs().max().item(), 1e-3), name
                assert g.dtype == want.dtype
    errors = []
    for bad in (lambda state, bucket: bucket.buffer(),
                lambda state, bucket: flow.futures.Future._completed(flow.ones(1))):
        model = DDP(_mlp(0))
        model.register_comm_hook(None, bad)
        try:
            model(flow.ones(2, 5)).sum().backward()
            errors.append("no error")
        except (TypeError, RuntimeError) as e:
            errors.append(f"{type(e).__name__}: {e}")
    return errors


def test_ddp_comm_hooks_compress_and_refuse_bad_hooks(world2):
    for errors in world2.run(_hooks_vs_plain):
        assert errors[0].startswith("TypeError: holoflow DistributedDataParallel: the communication hook")
        assert "must return a torch.futures.Future of the bucket's reduced tensor, got Tensor" in errors[0]
        assert errors[1].startswith("RuntimeError: holoflow DistributedDataParallel: the communication hook's "
                                    "future must hold a tensor of the bucket's")


def test_ddp_single_process():
    """A world of one: no communication, plain gradients."""
    model = DDP(_mlp(0))
    with flow.comm.count() as c:
        model(flow.randn(2, 5)).sum().backward()
    assert c.total == 0 and all(p.grad is not None for p in model.parameters())


def _ddp_different_models(rank):
    """Rank 1's hidden layer is wider; then rank 1 has an extra layer: both fail at construction."""
    out = []
    for width, extra in ((16, False), (16, True)):
        flow.manual_seed(0)
        w = width if rank == 0 else width * 2 if not extra else width
        layers = [flow.nn.Linear(5, w), flow.nn.Tanh(), flow.nn.Linear(w, 3)]
        if extra and rank == 1:
            layers.append(flow.nn.Linear(3, 3))
        try:
            DDP(flow.nn.Sequential(*layers))
            out.append("no error")
        except RuntimeError as e:  # torch raises RuntimeError too
            out.append(f"{type(e).__name__}: {e}")
    return out


def test_ddp_different_shapes_fail_at_construction(world2):
    for r, (shapes, count) in enumerate(world2.run(_ddp_different_models)):
        assert "HoloflowError: holoflow.nn.parallel.DistributedDataParallel: every rank must hold the same " \
               "model, but '0.weight' is float32[16, 5] on rank 0 and '0.weight' is float32[32, 5] on rank 1" \
               in shapes, (r, shapes)
        assert "rank 0 has 4 parameters/buffers and rank 1 has 6" in count and "'3.weight'" in count, (r, count)


def _init_sync_off(rank):
    """init_sync=False keeps each rank's own initial weights (torch's); refusals name the argument."""
    model = DDP(_mlp(100 + rank), init_sync=False, find_unused_parameters=True, static_graph=True)
    first = model.module[0].weight.detach().clone()
    errors = []
    for kwargs in ({"mixed_precision": object()}, {"skip_all_reduce_unused_params": True}, {"bucket_size": 3}):
        try:
            DDP(_mlp(0), **kwargs)
            errors.append("no error")
        except (NotImplementedError, TypeError) as e:
            errors.append(f"{type(e).__name__}: {e}")
    return first.sum().item(), errors


def test_ddp_init_sync_off_and_refusals(world2):
    (a, errors), (b, _) = world2.run(_init_sync_off)
    assert a != b   # (the ranks' own inits: nothing broadcast)
    assert "NotImplementedError: holoflow.nn.parallel.DistributedDataParallel: mixed_precision=" in errors[0]
    assert "skip_all_reduce_unused_params=True is not supported" in errors[1]
    assert errors[2] == "TypeError: holoflow.nn.parallel.DistributedDataParallel: unexpected keyword argument " \
                        "'bucket_size'"
