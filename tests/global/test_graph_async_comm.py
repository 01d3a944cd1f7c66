"""Collectives issued now and waited for later (global_graph.issue_collectives): the issue owns a
copy of its payload (the memory plan may reuse the inputs' memory meanwhile) unless told it may
read them late, several (all-reduces, reduce-scatters, all-gathers) may be in flight and be
waited for in any order, on simulated ranks and on Gloo; a ZeRO-2 graph, whose
gradient reduce-scatters are issued this way, trains like one process on Gloo too."""
import math

import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.graph.global_graph import GLOBAL_BOX_ISSUE, GLOBAL_BOX_WAIT
from holoflow.sbp import B, P, S

SHAPE = (4, 3)


def _issue_twice(rank: int, comm=None) -> list:
    """An all-reduce and a reduce-scatter in flight at once, their inputs overwritten right after
    issuing, waited for in reverse order."""
    place = flow.placement("cpu", [0, 1])
    comm = comm if comm is not None else world.comm()
    issue, wait = GLOBAL_BOX_ISSUE.kernel, GLOBAL_BOX_WAIT.kernel
    a, b = torch.full(SHAPE, rank + 1.0), torch.arange(12.0).view(SHAPE) * (rank + 1)
    ha = issue(a, place=place, src=(P,), dst=(B,), rank=rank, comm=comm, shape=SHAPE)
    hb = issue(b, place=place, src=(P,), dst=(S(0),), rank=rank, comm=comm, shape=SHAPE)
    a.add_(100)
    b.zero_()
    return [wait(hb), wait(ha)]


def _issue_late(rank: int, comm=None) -> list:
    """A bucket issued to be read late (nothing writes its inputs before the wait): the
    communicator reads them as they are; results as views of one flat sum, inputs unchanged."""
    place = flow.placement("cpu", [0, 1])
    comm = comm if comm is not None else world.comm()
    issue, wait = GLOBAL_BOX_ISSUE.kernel, GLOBAL_BOX_WAIT.kernel
    a, b = torch.full(SHAPE, rank + 1.0), torch.arange(6.0).view(2, 3) * (rank + 1)
    h = issue(a, b.t(), place=place, src=(P,), dst=(B,), rank=rank, comm=comm, read_late=True)
    ra, rb = wait(h)
    return [ra, rb, a, b]


@pytest.mark.parametrize("where", ["simulated", "gloo"])
def test_a_bucket_read_late_sums_its_inputs_and_leaves_them(where, request):
    got = (world.simulate(2, _issue_late) if where == "simulated"
           else request.getfixturevalue("world2").run(_issue_late))
    for rank, (ra, rb, a, b) in enumerate(got):
        torch.testing.assert_close(ra, torch.full(SHAPE, 3.0), rtol=0, atol=0)
        torch.testing.assert_close(rb, torch.arange(6.0).view(2, 3).t() * 3, rtol=0, atol=0)
        torch.testing.assert_close(a, torch.full(SHAPE, rank + 1.0), rtol=0, atol=0)
        torch.testing.assert_close(b, torch.arange(6.0).view(2, 3) * (rank + 1), rtol=0, atol=0)


def _check(got: list) -> None:
    whole = torch.arange(12.0).view(SHAPE) * 3
    for rank, (rows, total) in enumerate(got):
        torch.testing.assert_close(total, torch.full(SHAPE, 3.0))
        torch.testing.assert_close(rows, whole[2 * rank:2 * rank + 2])


def test_issued_collectives_own_their_payload_on_simulated_ranks():
    _check(world.simulate(2, _issue_twice))


def test_issued_collectives_own_their_payload_on_gloo(world2):
    _check(world2.run(_issue_twice))


def _issue_gathers(rank: int, comm=None) -> list:
    """Two all-gathers in flight at once: even rows (the flat collective) and uneven ones (5 rows:
    3 + 2, the general path), their inputs overwritten right after issuing, waited for in reverse."""
    place = flow.placement("cpu", [0, 1])
    comm = comm if comm is not None else world.comm()
    issue, wait = GLOBAL_BOX_ISSUE.kernel, GLOBAL_BOX_WAIT.kernel
    even = torch.arange(6.0).view(2, 3) + 10 * rank
    uneven = torch.arange(9.0 - 3 * rank).view(-1, 3) + 100 * rank
    he = issue(even, place=place, src=(S(0),), dst=(B,), rank=rank, comm=comm, shape=SHAPE)
    hu = issue(uneven, place=place, src=(S(0),), dst=(B,), rank=rank, comm=comm, shape=(5, 3))
    even.fill_(-1)
    uneven.fill_(-1)
    return [wait(hu), wait(he)]


@pytest.mark.parametrize("where", ["simulated", "gloo"])
def test_issued_all_gathers_own_their_payload(where, request):
    got = (world.simulate(2, _issue_gathers) if where == "simulated"
           else request.getfixturevalue("world2").run(_issue_gathers))
    want_even = torch.cat([torch.arange(6.0).view(2, 3), torch.arange(6.0).view(2, 3) + 10])
    want_uneven = torch.cat([torch.arange(9.0).view(3, 3), torch.arange(6.0).view(2, 3) + 100])
    for uneven, even in got:
        torch.testing.assert_close(even, want_even, rtol=0, atol=0)
        torch.testing.assert_close(uneven, want_uneven, rtol=0, atol=0)


def _issue_columns(rank: int, comm=None) -> list:
    """Column shards in flight (dim 1: gathered and reduce-scattered as rows of the moved dim,
    joined by the wait), their inputs overwritten right after issuing, waited for in reverse."""
    place = flow.placement("cpu", [0, 1])
    comm = comm if comm is not None else world.comm()
    issue, wait = GLOBAL_BOX_ISSUE.kernel, GLOBAL_BOX_WAIT.kernel
    cols = torch.arange(8.0).view(4, 2) + 10 * rank             # S(1) of a (4, 4) tensor
    part = torch.arange(16.0).view(4, 4) * (rank + 1)            # P of a (4, 4) tensor
    hg = issue(cols, place=place, src=(S(1),), dst=(B,), rank=rank, comm=comm, shape=(4, 4))
    hr = issue(part, place=place, src=(P,), dst=(S(1),), rank=rank, comm=comm, shape=(4, 4))
    cols.fill_(-1)
    part.fill_(-1)
    return [wait(hr), wait(hg)]


@pytest.mark.parametrize("where", ["simulated", "gloo"])
def test_issued_column_collectives_own_their_payload(where, request):
    got = (world.simulate(2, _issue_columns) if where == "simulated"
           else request.getfixturevalue("world2").run(_issue_columns))
    gathered = torch.cat([torch.arange(8.0).view(4, 2), torch.arange(8.0).view(4, 2) + 10], dim=1)
    summed = torch.arange(16.0).view(4, 4) * 3
    for rank, (cols, whole) in enumerate(got):
        torch.testing.assert_close(whole, gathered, rtol=0, atol=0)
        torch.testing.assert_close(cols, summed[:, 2 * rank:2 * rank + 2], rtol=0, atol=0)
        assert cols.is_contiguous() and whole.is_contiguous()


def _issue_gather_bucket(rank: int, comm=None) -> list:
    """A bucket of all-gathers of even row shards (two inputs of different shapes) as one
    collective, inputs overwritten right after issuing: each result gathered whole."""
    place = flow.placement("cpu", [0, 1])
    comm = comm if comm is not None else world.comm()
    issue, wait = GLOBAL_BOX_ISSUE.kernel, GLOBAL_BOX_WAIT.kernel
    a = torch.arange(6.0).view(2, 3) + 10 * rank
    b = torch.arange(4.0).view(1, 2, 2) + 100 * rank
    h = issue(a, b, place=place, src=(S(0),), dst=(B,), rank=rank, comm=comm, shape=SHAPE)
    a.fill_(-1)
    b.fill_(-1)
    return list(wait(h))


@pytest.mark.parametrize("where", ["simulated", "gloo"])
def test_a_bucket_of_all_gathers_gathers_each_input(where, request):
    got = (world.simulate(2, _issue_gather_bucket) if where == "simulated"
           else request.getfixturevalue("world2").run(_issue_gather_bucket))
    for ra, rb in got:
        torch.testing.assert_close(ra, torch.cat([torch.arange(6.0).view(2, 3), torch.arange(6.0).view(2, 3) + 10]),
                                   rtol=0, atol=0)
        torch.testing.assert_close(rb, torch.cat([torch.arange(4.0).view(1, 2, 2),
                                                  torch.arange(4.0).view(1, 2, 2) + 100]), rtol=0, atol=0)


def _counted_issue(rank: int) -> dict:
    with flow.comm.count() as c:
        _issue_twice(rank)
    return dict(c.bytes)


def test_issued_collectives_are_counted_with_their_payload(world2):
    for got in world2.run(_counted_issue):
        assert got == {"all_reduce": 48, "reduce_scatter": 48}, got


def _zero2(rank: int, opt_kind: str):
    from test_global_graph import _zero_run
    return _zero_run(flow.placement("cpu", [0, 1]), 2, opt_kind)


@pytest.mark.parametrize("opt_kind", ["sgd"])
def test_zero2_graph_on_gloo_trains_like_single_process(world2, opt_kind):
    from test_global_graph import _zero_run
    want_losses, want_params, _, _ = _zero_run(None, 0, opt_kind)
    for losses, params, _, boxes in world2.run(_zero2, opt_kind):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-7)
        for got, want in zip(params, want_params):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert boxes.count(((P,), (S(0),))) == 3, boxes   # the gradients' reduce-scatters


def _rank_1_skips_an_issue(rank: int):
    """Planned async all-reduces (as a plan issues them): both ranks issue the first, only rank 0
    the second, and waits for it."""
    from holoflow.distributed import comm, comm_track, env
    env.set_comm_timeout(2.0)
    seq = comm_track._SEQ[(0, 1)]
    with comm_track.planned():
        comm.all_reduce(torch.ones(2), (0, 1), async_op=True).wait()
        if rank == 1:
            return seq, None
        h = comm.all_reduce(torch.ones(2), (0, 1), async_op=True)
        try:
            h.wait()
        except comm.CommError as e:
            return seq, str(e)
    return seq, "no error"


def test_an_issued_collective_that_a_peer_never_issues_times_out_naming_it(world2):
    (seq, msg), _ = world2.run(_rank_1_skips_an_issue)
    assert f"holoflow.comm.all_reduce (call #{seq + 2} on group [0, 1], seen from rank 0) timed out" in msg, msg
    # rank 1 wrote no arrival record (its call completed when it waited), yet rank 0 knows it entered #1
    assert f"Ranks that did not arrive: 1 (last entered call #{seq + 1}: all_reduce)" in msg, msg


def _local_to_global_unchecked(rank: int):
    """OneFlow's local_to_global example: [0., 1.] on each of 2 ranks as S(0), check_meta=False."""
    place = flow.placement("cpu", [0, 1])
    with flow.comm.count() as c:
        x = flow.tensor([0.0, 1.0]).to_global(place, S(0), check_meta=False)
    return tuple(x.shape), c.total, x.to_global(sbp=B).to_local().to_torch()


@pytest.mark.parametrize("where", ["simulated", "gloo"])
def test_to_global_without_meta_check_needs_no_communication(where, request):
    got = (world.simulate(2, _local_to_global_unchecked) if where == "simulated"
           else request.getfixturevalue("world2").run(_local_to_global_unchecked))
    for shape, n_collectives, whole in got:
        # the caller promises equal local shapes: the logical shape is known without asking the peers
        assert shape == (4,) and n_collectives == 0, (shape, n_collectives)
        torch.testing.assert_close(whole, torch.tensor([0.0, 1.0, 0.0, 1.0]))


def _uneven_rows(rank: int) -> list:
    """Uneven row shards (balanced: the first ranks one row more) all-gathered and reduce-scattered
    asynchronously by the real communicator, their inputs overwritten right after issuing, each
    against the synchronous general path; plus whether a big uneven issue returned while a late
    peer had not issued yet (padded to even rows, it is in flight, not run at once)."""
    import time
    from holoflow.distributed import comm_track
    from holoflow.distributed.torch_comm import TorchComm
    c, group = TorchComm(), tuple(range(flow.env.get_world_size()))
    p = len(group)
    out = []
    for shape, dtype in (((5, 3), torch.float32), ((7,), torch.float64), ((p + 1, 2, 2), torch.int64),
                         ((2 * p + 1, 4), torch.bfloat16)):
        full = (torch.arange(math.prod(shape)).view(shape) % 97).to(dtype)
        sizes = [shape[0] // p + (i < shape[0] % p) for i in range(p)]   # the first ranks one more
        mine = full.split(sizes)[rank].clone()
        scaled = full * (rank + 1)
        hg = c.all_gather_async(mine, group, 0, sizes)
        hr = c.reduce_scatter_async(scaled, group, 0, sizes)
        mine.fill_(-1)
        scaled.fill_(-1)
        got_r, got_g = hr.wait(), hg.wait()
        sync_g = c.all_gather(full.split(sizes)[rank].clone(), group, 0, sizes)
        sync_r = c.reduce_scatter(full * (rank + 1), group, 0, sizes)
        out.append((got_g, got_r, sync_g, sync_r, full, sizes))
    big = torch.ones(4097 if rank == 0 else 4096, 8)   # > 64 KiB: never run on the caller's thread
    if rank == p - 1:
        time.sleep(1.0)
    t0 = time.perf_counter()
    with comm_track.planned():   # as a plan issues it (eager calls check fingerprints with the peers first)
        h = c.all_gather_async(big, group, 0, [4097] + [4096] * (p - 1))
    issued_s = time.perf_counter() - t0
    return out, issued_s, tuple(h.wait().shape)


@pytest.mark.parametrize("world_n", ["world2", "world4"])
def test_uneven_row_collectives_run_in_flight_and_equal_the_general_path(world_n, request):
    results = request.getfixturevalue(world_n).run(_uneven_rows)
    p = len(results)
    for rank, (cases, issued_s, big_shape) in enumerate(results):
        for got_g, got_r, sync_g, sync_r, full, sizes in cases:
            torch.testing.assert_close(got_g, full, rtol=0, atol=0)
            torch.testing.assert_close(got_g, sync_g, rtol=0, atol=0)
            want_r = (full.double() * sum(range(1, p + 1))).to(full.dtype).split(sizes)[rank]
            torch.testing.assert_close(got_r, want_r, rtol=0, atol=0)
            torch.testing.assert_close(got_r, sync_r, rtol=0, atol=0)
        assert big_shape == (4097 + 4096 * (p - 1), 8)
        if rank < p - 1:
            assert issued_s < 0.5, f"rank {rank}: an uneven all-gather blocked {issued_s:.2f} s at issue"
