"""Simulated ranks check their collectives as real ranks do: a call that differs across ranks
(kind, dtype, shape) raises on every rank, naming each rank's call, instead of silently
combining mismatched tensors (an all_reduce of shapes [3] and [1] used to broadcast)."""
import pytest
import torch

from holoflow.distributed import world
from holoflow.distributed.comm_track import CommError


def _raises_on_every_rank(fn, match):
    errors = []

    def run(rank):
        with pytest.raises(CommError, match=match) as e:
            fn(rank, world.comm())
        errors.append(str(e.value))
    world.simulate(2, run)
    assert len(errors) == 2


def test_all_reduce_shapes_differ():
    _raises_on_every_rank(lambda r, c: c.all_reduce(torch.ones(3 if r == 0 else 1), (0, 1)),
                          r"collective #0 over ranks \[0, 1\] does not match .*rank 0: all_reduce float32\[3\]; "
                          r"rank 1: all_reduce float32\[1\]")


def test_kinds_differ():
    def call(r, c):
        x = torch.ones(4)
        return c.all_reduce(x, (0, 1)) if r == 0 else c.broadcast(x, 0, (0, 1))
    _raises_on_every_rank(call, r"rank 0: all_reduce float32\[4\]; rank 1: broadcast float32\[4\]")


def test_dtypes_differ_in_all_gather():
    _raises_on_every_rank(lambda r, c: c.all_gather(torch.ones(2, dtype=torch.float32 if r else torch.float64),
                                                    (0, 1), 0, [2, 2]),
                          r"rank 0: all_gather float64; rank 1: all_gather float32")


def test_uneven_all_gather_and_matching_calls_pass():
    def run(rank):
        c = world.comm()
        got = c.all_gather(torch.full((rank + 1,), float(rank)), (0, 1), 0, [1, 2])
        total = c.all_reduce(torch.full((2,), float(rank + 1)), (0, 1))
        return got.tolist(), total.tolist()
    for got, total in world.simulate(2, run):
        assert got == [0.0, 1.0, 1.0] and total == [3.0, 3.0]


def test_comm_count_sees_a_simulated_ranks_collectives_as_gloo_ranks_see_theirs(world2):
    """flow.comm.count() opened inside a simulated rank records that rank's collectives (kinds
    and bytes) exactly as on real Gloo ranks, and nothing of the other simulated ranks'."""
    import dist_fns
    simulated = world.simulate(2, dist_fns.counted_conversions)
    real = world2.run(dist_fns.counted_conversions)
    assert simulated == real
    counts = [c for c, _ in simulated[0]]
    assert counts[:5] == [{"all_gather": 1}, {}, {"all_to_all": 1}, {"all_reduce": 1}, {"reduce_scatter": 1}], counts
    assert counts[-1] == {"all_reduce": 1}, counts   # the weight's gradient, P -> B


def test_a_rank_may_overwrite_its_input_once_its_call_returned():
    """A deposit is a copy, as a wire takes one: a rank that writes into its tensor right after a
    collective returned must not change what a slower peer reads (the peer's view of the call is
    checked after both wrote)."""
    def run(rank):
        c = world.comm()
        mine = torch.full((4,), float(rank + 1))
        parts = [torch.full((2,), 10.0 * (rank + 1)), torch.full((2,), 20.0 * (rank + 1))]
        got = c._exchange("all_gather", (0, 1), mine)
        chunks = c._exchange("all_to_all", (0, 1), parts)
        mine.fill_(-1)
        for p in parts:
            p.fill_(-1)
        c.all_reduce(torch.ones(1), (0, 1))   # both have written by now
        peer = 1 - rank
        return got[peer].tolist(), chunks[peer][rank].tolist()
    for rank, (gathered, chunk) in enumerate(world.simulate(2, run)):
        peer = 1 - rank
        assert gathered == [float(peer + 1)] * 4
        assert chunk == [(10.0 if rank == 0 else 20.0) * (peer + 1)] * 2


def test_a_failing_rank_stops_its_peers_waits_at_once_and_is_the_one_reported():
    """A rank whose program raised never arrives at the next collective: its peers raise at once
    naming it (not after the timeout), and ``simulate`` reports the rank whose own program failed."""
    import time

    import holoflow as flow
    from holoflow.distributed.global_tensor import from_full
    from holoflow.sbp import B, S

    def run(r):
        x = from_full(torch.ones(4, 4), flow.placement("cpu", [0, 1]), S(0))
        if r == 1:
            raise ValueError("rank 1's own bug")
        return x.to_global(sbp=B).to_local()
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="simulated rank 1 failed: rank 1's own bug"):
        world.simulate(2, run, timeout=30)
    assert time.perf_counter() - t0 < 10

    seen = []

    def peer(r):
        if r == 0:
            raise KeyError("gone")
        try:
            return world.comm().all_reduce(torch.ones(2), (0, 1))
        except world.PeerFailed as e:
            seen.append(str(e))
            raise
    with pytest.raises(RuntimeError) as info:
        world.simulate(2, peer, timeout=30)
    assert "simulated rank 0 failed" in str(info.value)
    assert len(seen) == 1 and "rank(s) [0] failed before arriving (KeyError" in seen[0]
