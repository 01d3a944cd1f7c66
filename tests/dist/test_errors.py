"""Collectives never hang: timeouts and dead peers raise CommError naming the collective, the
group and the ranks that did not arrive; the pool reports failing ranks and recovers."""
import os
import time

import pytest
import torch

from holoflow.distributed import comm, comm_track, env, groups
from pool import fresh_world, summed_world_size


def _timeouts(rank):
    """Three broken collectives at once, each on its own group so one world restart covers them:
    (0, 1): rank 1 skips an all-reduce; (2, 3): the same with tracking off; then (1, 2): rank 1
    all-reduces while rank 2 broadcasts."""
    env.set_comm_timeout(2.0)
    pair = (0, 1) if rank < 2 else (2, 3)
    out = {"seq": {k: comm_track._SEQ[k] for k in [pair, (1, 2)]}}  # calls made on these groups before
    if rank in (1, 2):  # created while everyone is healthy (creation is collective too), with Gloo's
        env.set_comm_timeout(8.0)  # own timeout long enough for rank 2, which comes 2 s late
        groups.group_for((1, 2))
        env.set_comm_timeout(2.0)
    comm_track.set_tracking(rank < 2)
    comm.all_reduce(torch.ones(2), pair)  # call #1 on the pair, made by both
    if rank in (0, 2):
        t0 = time.monotonic()
        try:
            comm.all_reduce(torch.ones(2), pair)  # the partner never comes
            out["skip"] = "no error"
        except comm.CommError as e:
            out["skip"] = (str(e), time.monotonic() - t0)
    comm_track.set_tracking(True)
    if rank in (1, 2):
        env.set_comm_timeout(8.0 if rank == 1 else 2.0)  # rank 2 comes late, from its own timeout
        try:
            if rank == 1:
                comm.all_reduce(torch.ones(2), (1, 2))
            else:
                comm.broadcast(torch.ones(2), 2, (1, 2))
            out["mismatch"] = "no error"
        except comm.CommError as e:
            out["mismatch"] = str(e)
    if rank == 0:  # rank 3 never creates the group (0, 3)
        env.set_comm_timeout(2.0)
        try:
            comm.all_reduce(torch.ones(1), (0, 3))
            out["create"] = "no error"
        except comm.CommError as e:
            out["create"] = str(e)
    return out


def test_timeouts_name_the_laggards():
    # a world of its own: the pooled one may already hold the group (0, 3) from an earlier test
    w = fresh_world(4, timeout=120)
    try:
        res = w.run(_timeouts)
        restarted = w.run(summed_world_size)
    finally:
        w.close()
    s01, s23, s12 = res[0]["seq"][(0, 1)], res[2]["seq"][(2, 3)], res[1]["seq"][(1, 2)]
    msg, waited = res[0]["skip"]
    assert 1.5 < waited < 10, waited
    assert f"holoflow.comm.all_reduce (call #{s01 + 2} on group [0, 1], seen from rank 0) timed out" in msg, msg
    assert f"Ranks that did not arrive: 1 (last entered call #{s01 + 1}: all_reduce)" in msg, msg
    msg, waited = res[2]["skip"]
    assert f"holoflow.comm.all_reduce (call #{s23 + 2} on group [2, 3], seen from rank 2) timed out" in msg, msg
    assert "HOLOFLOW_COMM_TRACK=0" in msg and "did not arrive" not in msg, msg
    msg = res[1]["mismatch"]
    # the fingerprints disagree: both ranks raise at once, naming both calls and lines
    assert f"mismatched collectives on group [1, 2] (call #{s12 + 1}, seen from rank 1)" in msg, msg
    assert "rank 1: all_reduce[sum](float32[2]) at dist/test_errors.py:" in msg, msg
    assert "rank 2: broadcast[src=2](float32[2]) at dist/test_errors.py:" in msg, msg
    assert res[2]["mismatch"].replace("seen from rank 2", "seen from rank 1") == msg, res[2]
    assert "creating the process group [0, 3] failed on rank 0 (timeout 2s)" in res[0]["create"], res[0]
    assert restarted == [4] * 4  # restarted, and works


def _die_in_collective(rank):
    env.set_comm_timeout(20.0)
    comm.barrier()
    if rank == 1:
        time.sleep(0.5)
        os._exit(7)
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(4))
    except comm.CommError as e:
        return str(e), time.monotonic() - t0
    return "no error", 0.0


def test_killed_rank_raises_on_the_others():
    w = fresh_world(2, timeout=60)
    try:
        replies = w.run_raw(_die_in_collective)
    finally:
        w.close()
    assert replies[1][0] == "dead" and replies[1][1] == 7, replies[1]
    status, (msg, waited), _ = replies[0]
    assert status == "ok"
    assert waited < 20, waited
    assert "holoflow.comm.all_reduce" in msg and "group [0, 1]" in msg, msg
    assert "Ranks whose process is gone: 1 (pid" in msg, msg


def _fails_on_rank_1(rank):
    assert rank != 1, "rank 1 is unhappy"
    return rank


def test_pool_reports_failing_rank_and_recovers(world2):
    world2.run(summed_world_size)
    starts = world2.starts
    with pytest.raises(AssertionError, match=r"(?s)rank 1:.*rank 1 is unhappy"):
        world2.run(_fails_on_rank_1)
    assert world2.run(summed_world_size) == [2, 2]
    assert world2.starts == starts + 1


def _hang(rank):
    if rank == 0:
        time.sleep(5)  # past the 3 s the call waits (the world's close then waits for it to end)
    return rank


def test_pool_call_timeout(world2):
    with pytest.raises(AssertionError, match="rank 0: no answer within 3"):
        world2.run(_hang, timeout=3)
    assert world2.run(summed_world_size) == [2, 2]
