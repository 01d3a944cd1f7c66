"""An asynchronous collective sends its fingerprint when issued and compares its peers' when
waited for (2 Gloo ranks): issuing one never waits for a late peer, its peers' fingerprints are
read in issue order however issues and waits interleave with synchronous calls, and a mismatch
still raises CommError on every rank, at the wait, before the result is handed out."""
import time

import torch

from holoflow.distributed import comm, env


def _issue_while_the_peer_is_late(rank):
    env.set_comm_timeout(20.0)
    x = torch.full((6,), float(rank + 1))
    rows = torch.full((2, 3), float(rank))
    comm.all_reduce(torch.ones(1))   # (the group, its transport and the fingerprint channel set up)
    comm.all_gather_rows(torch.ones(1, 1), (0, 1))
    if rank == 1:
        time.sleep(1.5)
    t0 = time.monotonic()
    h = comm.all_reduce(x, async_op=True)
    g = comm.all_gather_rows(rows, (0, 1), async_op=True)
    issued = time.monotonic() - t0
    return issued, h.wait().clone(), g.wait().clone()


def test_issuing_does_not_wait_for_a_late_peer(world2):
    (issued, total, gathered), _ = world2.run(_issue_while_the_peer_is_late)
    assert issued < 0.5, f"rank 0 waited {issued:.2f}s to issue (its peer came 1.5s late)"
    assert torch.equal(total, torch.full((6,), 3.0))
    assert torch.equal(gathered, torch.cat([torch.zeros(2, 3), torch.ones(2, 3)]))


def _interleaved(rank):
    env.set_comm_timeout(20.0)
    a = torch.full((4,), float(rank + 1))
    b = torch.full((3,), 10.0 * (rank + 1))
    c = torch.full((1, 5), float(rank))
    h1 = comm.all_reduce(a, async_op=True)
    comm.all_reduce(b)                               # a synchronous call reads h1's fingerprints first
    h2 = comm.all_gather_rows(c, (0, 1), async_op=True)
    h3 = comm.all_reduce(torch.ones(2), async_op=True)
    got3, got2, got1 = h3.wait().clone(), h2.wait().clone(), h1.wait().clone()   # (waited out of order)
    return got1, b.clone(), got2, got3


def test_fingerprints_are_read_in_issue_order_whatever_the_waits(world2):
    for got1, b, got2, got3 in world2.run(_interleaved):
        assert torch.equal(got1, torch.full((4,), 3.0)) and torch.equal(b, torch.full((3,), 30.0))
        assert torch.equal(got2, torch.tensor([[0.0] * 5, [1.0] * 5])) and torch.equal(got3, torch.full((2,), 2.0))


def _mismatch(rank):
    env.set_comm_timeout(10.0)
    x = torch.ones(4 if rank == 0 else 1000)
    h = comm.all_reduce(x, async_op=True)  # <async-sizes>
    try:
        h.wait()
    except comm.CommError as e:
        return str(e)
    return "no error"


def test_a_mismatched_asynchronous_collective_raises_at_its_wait_on_every_rank(world2):
    for rank, msg in enumerate(world2.run(_mismatch)):
        assert "mismatched collectives on group [0, 1]" in msg and f"seen from rank {rank}" in msg, msg
        assert "rank 0: all_reduce[sum](float32[4])" in msg and "rank 1: all_reduce[sum](float32[1000])" in msg, msg
