"""holoflow.distributed.comm on worlds of 2 and 4 Gloo ranks: exact values, uneven sizes, counts."""
import pytest
import torch

from holoflow.distributed import comm, groups


@pytest.fixture(params=[2, 4], ids=["world2", "world4"])
def world(request):
    return request.getfixturevalue(f"world{request.param}")


def _all_reduce(rank):
    n = comm.env.get_world_size()
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (rank + 1)
    with comm.count() as c:
        y = comm.all_reduce(x)
    assert y is x
    tri = n * (n + 1) / 2
    assert torch.equal(x, torch.arange(6.).reshape(2, 3) * tri)
    assert dict(c.counts) == {"all_reduce": 1} and c.bytes["all_reduce"] == 24 and c.calls == [("all_reduce", 24, n)]
    m = torch.tensor([float(rank), -float(rank)])
    comm.all_reduce(m, op="max")
    assert m.tolist() == [n - 1, 0]
    a = torch.full((3,), float(rank))
    comm.all_reduce(a, op="avg")
    assert torch.allclose(a, torch.full((3,), (n - 1) / 2))
    nc = torch.ones(3, 4).t()  # not contiguous
    comm.all_reduce(nc)
    assert torch.equal(nc, torch.full((4, 3), float(n)))
    h = comm.all_reduce(torch.ones(2, dtype=torch.int64), async_op=True)
    assert h.wait().tolist() == [n, n]
    return True


def test_all_reduce(world):
    assert world.run(_all_reduce) == [True] * world.size


def _all_reduce_subgroups(rank):
    pair = (0, 2) if rank % 2 == 0 else (1, 3)
    x = torch.tensor([rank + 1.0])
    with comm.count() as c:
        comm.all_reduce(x, pair)
        comm.all_reduce(torch.zeros(1), (rank,))  # a one-rank group communicates nothing
    assert c.total == 1 and c.calls[0][2] == 2
    return x.item()


def test_all_reduce_subgroups(world4):
    assert world4.run(_all_reduce_subgroups) == [4.0, 6.0, 4.0, 6.0]


def _all_gather(rank, dim, uneven, give_sizes):
    n = comm.env.get_world_size()
    rows = (rank + 1) if uneven else 2
    shape = [3, 3]
    shape[dim] = rows
    x = torch.full(shape, float(rank)) + torch.arange(rows).reshape([-1, 1] if dim == 0 else [1, -1])
    sizes = [(r + 1) if uneven else 2 for r in range(n)] if give_sizes else None
    with comm.count() as c:
        got = comm.all_gather(x, None, dim, sizes)
    for r, g in enumerate(got):
        rr = (r + 1) if uneven else 2
        s = [3, 3]
        s[dim] = rr
        assert torch.equal(g, torch.full(s, float(r)) + torch.arange(rr).reshape([-1, 1] if dim == 0 else [1, -1]))
    assert c.counts["all_gather"] == 1 and c.counts["meta"] == (0 if give_sizes else 1)
    return [tuple(g.shape) for g in got]


@pytest.mark.parametrize("dim,uneven,give_sizes", [(0, False, True), (0, True, True), (1, True, False),
                                                   (0, False, False)])
def test_all_gather(world, dim, uneven, give_sizes):
    res = world.run(_all_gather, dim, uneven, give_sizes)
    assert res[0] == res[-1] and len(res[0]) == world.size


def _ordered(rank):
    order = (3, 1, 0, 2)
    got = comm.all_gather(torch.tensor([rank]), order)
    shard = comm.reduce_scatter(torch.arange(10.) * (rank + 1), order)
    a2a = comm.all_to_all([torch.tensor([rank * 10 + d]) for d in order], order)
    return [int(g) for g in got], shard.tolist(), [int(t) for t in a2a]


def test_caller_order(world4):
    """Lists and shards follow the order of ``ranks`` given by the caller, not the sorted one."""
    res = world4.run(_ordered)
    for rank, (got, shard, a2a) in enumerate(res):
        assert got == [3, 1, 0, 2]
        pos = (3, 1, 0, 2).index(rank)
        lo = [0, 3, 6, 8][pos]
        n = [3, 3, 2, 2][pos]
        assert shard == [10.0 * v for v in range(lo, lo + n)]
        assert a2a == [s * 10 + rank for s in (3, 1, 0, 2)]


def _reduce_scatter(rank, shape, dim):
    n = comm.env.get_world_size()
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape) * (rank + 1)
    full = torch.arange(float(torch.Size(shape).numel())).reshape(shape) * (n * (n + 1) / 2)
    with comm.count() as c:
        y = comm.reduce_scatter(x, None, dim)
    want = full.split(comm.balanced_sizes(shape[dim], n), dim)[rank]
    assert torch.equal(y, want), (y, want)
    assert dict(c.counts) == {"reduce_scatter": 1}
    return tuple(y.shape)


@pytest.mark.parametrize("shape,dim", [((8, 2), 0), ((5, 3), 0), ((2, 7), 1), ((3,), 0)])
def test_reduce_scatter(world, shape, dim):
    shapes = world.run(_reduce_scatter, shape, dim)
    assert sum(s[dim] for s in shapes) == shape[dim]


def _broadcast(rank):
    n = comm.env.get_world_size()
    x = torch.full((2, 2), float(rank))
    with comm.count() as c:
        comm.broadcast(x, n - 1)
    assert torch.equal(x, torch.full((2, 2), float(n - 1)))
    if n == 4 and rank in (1, 2):
        y = torch.tensor([rank])
        comm.broadcast(y, 2, (1, 2))
        assert y.item() == 2
    return c.counts["broadcast"]


def test_broadcast(world):
    assert world.run(_broadcast) == [1] * world.size


def _all_to_all(rank, give_shapes):
    n = comm.env.get_world_size()
    ins = [torch.full((rank + 1, dst + 1), float(rank * 10 + dst)) for dst in range(n)]
    shapes = [(src + 1, rank + 1) for src in range(n)] if give_shapes else None
    with comm.count() as c:
        outs = comm.all_to_all(ins, None, shapes)
    for src, o in enumerate(outs):
        assert torch.equal(o, torch.full((src + 1, rank + 1), float(src * 10 + rank)))
    assert c.counts["all_to_all"] == 1 and c.counts["meta"] == (0 if give_shapes else 1)
    return True


@pytest.mark.parametrize("give_shapes", [True, False])
def test_all_to_all_uneven(world, give_shapes):
    assert all(world.run(_all_to_all, give_shapes))


def _send_recv(rank):
    n = comm.env.get_world_size()
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    buf = torch.empty(3)
    with comm.count() as c:
        if rank % 2 == 0:
            comm.send(torch.full((3,), float(rank)), nxt)
            comm.recv(buf, prev)
        else:
            comm.recv(buf, prev)
            comm.send(torch.full((3,), float(rank)), nxt)
    assert torch.equal(buf, torch.full((3,), float(prev)))
    return dict(c.counts)


def test_send_recv_ring(world):
    assert world.run(_send_recv) == [{"send": 1, "recv": 1}] * world.size


def _barrier_and_objects(rank):
    with comm.count() as c:
        comm.barrier()
    objs = comm.all_gather_object({"rank": rank, "s": "x" * rank})
    return c.counts["barrier"], objs


def test_barrier_and_objects(world):
    for count, objs in world.run(_barrier_and_objects):
        assert count == 1
        assert objs == [{"rank": r, "s": "x" * r} for r in range(world.size)]


def _transfer(rank, dsts):
    t = torch.arange(6.).reshape(2, 3) + 100 if rank == 0 else None
    with comm.count() as c:
        got = comm.transfer(t, 0, dsts, shape=(2, 3), dtype=torch.float32)
    return None if got is None else got.tolist(), dict(c.counts)


@pytest.mark.parametrize("dsts,kinds", [((1,), {0: "send", 1: "recv"}),
                                         ((2, 3), {0: "broadcast", 2: "broadcast", 3: "broadcast"})])
def test_transfer(world4, dsts, kinds):
    want = (torch.arange(6.).reshape(2, 3) + 100).tolist()
    for rank, (got, counts) in enumerate(world4.run(_transfer, dsts)):
        if rank in kinds:
            assert got == want and counts == {kinds[rank]: 1}, (rank, got, counts)
        else:
            assert got is None and counts == {}


def _mesh(rank):
    subs = groups.groups_for_mesh([[0, 1], [2, 3]])
    row = subs[(1, (rank // 2,))]
    col = subs[(0, (rank % 2,))]
    x = torch.tensor([float(rank)])
    comm.all_reduce(x, row)
    y = torch.tensor([float(rank)])
    comm.all_reduce(y, col)
    return row, col, x.item(), y.item()


def test_groups_for_mesh(world4):
    res = world4.run(_mesh)
    assert [r[:2] for r in res] == [((0, 1), (0, 2)), ((0, 1), (1, 3)), ((2, 3), (0, 2)), ((2, 3), (1, 3))]
    assert [r[2:] for r in res] == [(1.0, 2.0), (1.0, 4.0), (5.0, 2.0), (5.0, 4.0)]


def test_mesh_subgroups_single_process():
    subs = groups.mesh_subgroups([[0, 1, 2], [3, 4, 5]])
    assert subs == {(0, (0,)): (0, 3), (0, (1,)): (1, 4), (0, (2,)): (2, 5),
                    (1, (0,)): (0, 1, 2), (1, (1,)): (3, 4, 5)}


def _not_member(rank):
    try:
        comm.all_reduce(torch.ones(1), (0,) if rank else (1,))  # a group of one that is not me
    except Exception as e:  # noqa: BLE001
        return str(e)
    return "no error"


def test_not_a_member_is_an_error(world2):
    msgs = world2.run(_not_member)
    assert all("not a member" in m for m in msgs), msgs


def _histories(rank):
    """Ranks create different groups before a shared one: names must still agree."""
    out = []
    for grp in [(0, 2, 3), (0, 1), (1, 2, 3), (0, 2), (2, 3)]:
        if rank in grp:
            x = torch.ones(1)
            comm.all_reduce(x, grp)
            out.append(x.item())
    return out


def test_groups_created_in_different_histories(world4):
    assert world4.run(_histories) == [[3.0, 2.0, 2.0], [2.0, 3.0], [3.0, 3.0, 2.0, 2.0], [3.0, 3.0, 2.0]]


def _oneflow_comm(rank: int) -> dict:
    """OneFlow's comm.reduce / all_gather_into_tensor / reduce_scatter_tensor (concatenated and
    stacked forms) and env.all_device_placement on this rank, with a wrong shape's refusal."""
    import holoflow as flow
    from holoflow.core.errors import HoloflowError
    n = flow.env.get_world_size()
    mine = flow.tensor([[1.0, 2.0], [3.0, 4.0]]) * (rank + 1)
    out = {"placement": repr(flow.env.all_device_placement("cpu"))}
    red = mine.clone()
    flow.comm.reduce(red, 1)
    out["reduce"] = red.tolist()
    cat_ = flow.zeros(2 * n, 2)
    flow.comm.all_gather_into_tensor(cat_, mine)
    stack_ = flow.zeros(n, 2, 2)
    flow.comm.all_gather_into_tensor(stack_, mine)
    out["gather"] = [cat_.tolist(), stack_.tolist()]
    big = flow.arange(4.0 * n).reshape(2 * n, 2) + rank
    rs_cat = flow.zeros(2, 2)
    flow.comm.reduce_scatter_tensor(rs_cat, big)
    rs_stack = flow.zeros(2, 2)
    flow.comm.reduce_scatter_tensor(rs_stack, big.reshape(n, 2, 2))
    out["scatter"] = [rs_cat.tolist(), rs_stack.tolist()]
    try:
        flow.comm.all_gather_into_tensor(flow.zeros(3, 2), mine)
        out["refused"] = None
    except HoloflowError as e:
        out["refused"] = str(e)
    return out


def test_oneflow_comm_reduce_and_tensor_collectives(world):
    """OneFlow's comm.reduce (only dst takes the sum), all_gather_into_tensor and
    reduce_scatter_tensor (concatenated or stacked), and env.all_device_placement: values from
    numpy; a wrong shape names both legal forms."""
    import numpy as np
    got = world.run(_oneflow_comm)
    ranks = len(got)
    mine = [np.array([[1.0, 2.0], [3.0, 4.0]]) * (r + 1) for r in range(ranks)]
    total = sum(mine)
    bigs = [np.arange(4.0 * ranks).reshape(2 * ranks, 2) + r for r in range(ranks)]
    for r, out in enumerate(got):
        assert out["placement"] == f'holoflow.placement(type="cpu", ranks={list(range(ranks))})'
        assert out["reduce"] == (total if r == 1 else mine[r]).tolist()
        assert out["gather"] == [np.concatenate(mine).tolist(), np.stack(mine).tolist()]
        want = sum(b[2 * r:2 * r + 2] for b in bigs).tolist()
        assert out["scatter"] == [want, want]
        assert out["refused"] == (f"holoflow.comm.all_gather_into_tensor: output_tensor has shape (3, 2); for {ranks} "
                                  f"ranks and pieces of shape (2, 2) it must be their stack ({ranks}, 2, 2) or "
                                  f"concatenation ({2 * ranks}, 2)")


def _avg_with_grad(rank: int):
    import holoflow as flow
    from holoflow.distributed_nn import functional as dnn
    x = (flow.arange(3.0) + 10 * rank).requires_grad_()
    y = dnn.all_reduce(x, op="avg")
    (y * (rank + 1)).sum().backward()
    try:
        dnn.all_reduce(x, op="max")
        refused = None
    except NotImplementedError as e:
        refused = str(e)
    return y.tolist(), x.grad.tolist(), refused


def test_differentiable_all_reduce_average(world):
    """distributed.nn.functional.all_reduce with AVG: the mean, and a gradient that is the mean of
    every rank's (torch's rule; Gloo's own all_reduce has no AVG, so torch cannot run this on CPU)."""
    got = world.run(_avg_with_grad)
    n = len(got)
    for y, grad, refused in got:
        assert y == [5.0 * (n - 1) + i for i in range(3)]
        assert grad == [sum(range(1, n + 1)) / n] * 3
        assert refused.startswith("holoflow.distributed.nn.functional.all_reduce: op max is not differentiable here")
