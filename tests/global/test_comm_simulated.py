"""holoflow.comm on simulated ranks (world.simulate) gives what it gives on Gloo ranks: the same
collectives, run once per rank in threads and once per rank in processes, return the same
values (it returned each rank's own tensor unreduced before: a world of one per thread)."""
import pytest

import holoflow as flow
from holoflow.core.errors import HoloflowError
from holoflow.distributed import world


def _collectives(rank: int, n: int) -> dict:
    """Every holoflow.comm collective on rank ``rank`` of ``n`` (values differ per rank)."""
    ops = flow.comm.ReduceOp
    x = flow.tensor([1.0, -2.0, 3.0]) * (rank + 1)
    out = {}
    for name, op in (("sum", ops.SUM), ("avg", ops.AVG), ("max", ops.MAX), ("min", ops.MIN), ("prod", ops.PRODUCT)):
        y = x.clone()
        flow.comm.all_reduce(y, op=op)
        out[name] = y.tolist()
    y = x.clone()
    flow.comm.all_reduce(y, async_op=True).wait()
    out["async"] = y.tolist()
    parts = [flow.zeros(r + 1) for r in range(n)]   # (uneven: rank r sends r + 1 values)
    flow.comm.all_gather(parts, flow.ones(rank + 1) * rank)
    out["all_gather"] = [p.tolist() for p in parts]
    rs = flow.zeros(2)
    flow.comm.reduce_scatter(rs, [flow.ones(2) * (i + 10 * rank) for i in range(n)])
    out["reduce_scatter"] = rs.tolist()
    b = x.clone()
    flow.comm.broadcast(b, n - 1)
    out["broadcast"] = b.tolist()
    got = [flow.zeros(d + 1) for d in range(n)]
    flow.comm.all_to_all(got, [flow.full((rank + 1,), float(10 * rank + d)) for d in range(n)])
    out["all_to_all"] = [g.tolist() for g in got]
    red = x.clone()
    flow.comm.reduce(red, 1)
    out["reduce"] = red.tolist()
    gl = [flow.zeros(1) for _ in range(n)] if rank == 0 else None
    flow.comm.gather(flow.tensor([float(rank)]), gl, dst=0)
    out["gather"] = None if gl is None else [g.tolist() for g in gl]
    sc = flow.zeros(2)
    flow.comm.scatter(sc, [flow.ones(2) * i for i in range(n)] if rank == 0 else None, src=0)
    out["scatter"] = sc.tolist()
    cat = flow.zeros(3 * n)
    flow.comm.all_gather_into_tensor(cat, x)
    out["into_tensor"] = cat.tolist()
    big = flow.arange(4.0 * n).reshape(2 * n, 2) + rank
    rst = flow.zeros(2, 2)
    flow.comm.reduce_scatter_tensor(rst, big)
    out["rs_tensor"] = rst.tolist()
    if n > 2:   # a subgroup, in the caller's order
        sub = x.clone()
        if rank in (1, 2):
            flow.comm.all_reduce(sub, group=[2, 1])
        out["subgroup"] = sub.tolist()
    flow.comm.barrier()
    return out


def _on_gloo(rank: int, n: int) -> dict:
    return _collectives(rank, n)


@pytest.mark.parametrize("n", [2, 4])
def test_simulated_ranks_collect_as_gloo_ranks(n, world2, world4):
    real = (world2 if n == 2 else world4).run(_on_gloo, n)
    simulated = world.simulate(n, lambda r: _collectives(r, n))
    assert simulated == real
    assert simulated[0]["sum"] == [float(n * (n + 1) // 2 * v) for v in (1, -2, 3)]   # (not each rank's own)


def test_point_to_point_between_simulated_ranks_is_refused():
    def f(r):
        with pytest.raises(HoloflowError, match="point-to-point between simulated ranks .* is not supported"):
            flow.comm.send(flow.ones(2), 1 - r)
        return True
    assert world.simulate(2, f) == [True, True]
