"""Mismatched collectives raise CommError on every rank, naming each call and its user line, before
any payload moves: never wrong data, a Gloo abort or a hang (fingerprints, distributed/comm_check.py)."""
import os

import torch

import holoflow as flow
from holoflow.core.sbp import B, S
from holoflow.distributed import comm, env
from holoflow.distributed.global_tensor import make_global

HERE = os.path.basename(os.path.dirname(__file__)) + "/" + os.path.basename(__file__)


def _line(tag: str) -> str:
    """``"dist/test_mismatch.py:N"`` for the line carrying the comment ``# <tag>``."""
    with open(__file__) as f:
        for i, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# <{tag}>"):
                return f"{HERE}:{i}"
    raise AssertionError(tag)


def _expect_error(fn) -> str:
    try:
        fn()
    except comm.CommError as e:
        return str(e)
    return "no error"


def _case_extra_same_size(rank):
    x = torch.ones(4)

    def go():
        if rank == 0:
            comm.all_reduce(x)  # <extra>
        comm.all_reduce(x)  # <final>
    return _expect_error(go), x.clone()


def _case_sizes(rank):
    x = torch.ones(4 if rank == 0 else 1000)
    return _expect_error(lambda: comm.all_reduce(x)), x.clone()  # <sizes>


def _case_kinds(rank):
    x = torch.full((6,), float(rank + 1))

    def go():
        if rank == 0:
            comm.all_reduce(x)  # <kind-a>
        else:
            comm.all_gather(x)  # <kind-b>
    return _expect_error(go), x.clone()


def _case_dtype(rank):
    x = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)
    return _expect_error(lambda: comm.broadcast(x, 0)), x.clone()  # <dtype>


def _case_op(rank):
    x = torch.ones(3)
    return _expect_error(lambda: comm.all_reduce(x, op="sum" if rank == 0 else "max")), x.clone()  # <op>


def _case_all_to_all(rank):
    """Rank 1 expects 3 elements from rank 0, which sends 2."""
    chunks = [torch.ones(2), torch.ones(2)]
    shapes = [(2,), (2,)] if rank == 0 else [(3,), (2,)]
    return _expect_error(lambda: comm.all_to_all(chunks, None, shapes)), None  # <a2a>


def _case_p2p(rank):
    """Both ranks send (no recv), then a send of 4 meets a recv of 5."""
    first = _expect_error(lambda: comm.send(torch.ones(2), 1 - rank))  # <p2p-send>

    def second():
        if rank == 0:
            comm.send(torch.ones(4), 1)  # <p2p-a>
        else:
            comm.recv(torch.empty(5), 0)  # <p2p-b>
    return first, _expect_error(second)


def _case_boxing(rank):
    """Boxing's collectives carry fingerprints too: rank 0 gathers to B while rank 1 moves to S(1)."""
    place = flow.placement("cpu", [0, 1])
    g = make_global(flow.from_torch(torch.ones(2, 4)), place, (S(0),), (4, 4))
    return _expect_error(lambda: g.to_global(sbp=B if rank == 0 else S(1))), None  # <boxing>


def _case_call_site(rank):
    """Different lines named alike by call_site pair up, with the right data."""
    x = torch.full((3,), float(rank + 1))
    if rank == 0:
        with comm.call_site("sum-x"):
            comm.all_reduce(x)
    else:
        with comm.call_site("sum-x"):
            comm.all_reduce(x)
    return "no error", x.clone()


def _all_cases_2(rank):
    env.set_comm_timeout(10.0)
    out = {}
    for name in ("extra_same_size", "sizes", "kinds", "dtype", "op", "all_to_all", "p2p", "boxing", "call_site"):
        out[name] = globals()[f"_case_{name}"](rank)
    # nothing was sent by the failed calls: the group is still in step and computes right
    y = torch.full((2,), float(rank + 1))
    comm.all_reduce(y)
    out["after"] = y
    return out


def _both(res, name, *needles):
    msgs = [r[name][0] for r in res]
    for r, m in enumerate(msgs):
        assert "mismatched collectives on group [0, 1]" in m and f"seen from rank {r}" in m, (name, r, m)
        for n in needles:
            assert n in m, (name, r, n, m)
    # every rank raises the same error, naming both calls
    assert msgs[0].replace("seen from rank 0", "seen from rank 1") == msgs[1], msgs
    return msgs[0]


def test_mismatches_raise_on_every_rank_world2(world2):
    res = world2.run(_all_cases_2)
    m = _both(res, "extra_same_size", f"rank 0: all_reduce[sum](float32[4]) at {_line('extra')}",
              f"rank 1: all_reduce[sum](float32[4]) at {_line('final')}", "different source lines")
    assert all(torch.equal(r["extra_same_size"][1], torch.ones(4)) for r in res), "data moved"
    _both(res, "sizes", f"rank 0: all_reduce[sum](float32[4]) at {_line('sizes')}",
          f"rank 1: all_reduce[sum](float32[1000]) at {_line('sizes')}", "different shapes")
    assert torch.equal(res[1]["sizes"][1], torch.ones(1000))
    _both(res, "kinds", f"rank 0: all_reduce[sum](float32[6]) at {_line('kind-a')}",
          f"rank 1: meta[all_gather](int64[9]) at {_line('kind-b')}", "different kinds")
    assert torch.equal(res[0]["kinds"][1], torch.full((6,), 1.0))
    _both(res, "dtype", "rank 0: broadcast[src=0](float32[4])", "rank 1: broadcast[src=0](float64[4])",
          _line("dtype"), "different dtypes")
    _both(res, "op", "rank 0: all_reduce[sum](float32[3])", "rank 1: all_reduce[max](float32[3])", _line("op"))
    _both(res, "all_to_all", "does not match what its peers expect", _line("a2a"))
    _both(res, "boxing", _line("boxing"), "rank 0: all_gather", "rank 1: all_to_all")
    for r in res:
        first, second = r["p2p"]
        assert "a send must meet a recv" in first and \
            f"ranks 0, 1: send(float32[2]) at {_line('p2p-send')}" in first, first
        assert f"send(float32[4]) at {_line('p2p-a')}" in second and \
            f"recv(float32[5]) at {_line('p2p-b')}" in second, second
    assert [r["call_site"] for r in res][0][0] == "no error"
    assert all(torch.equal(r["call_site"][1], torch.full((3,), 3.0)) for r in res)
    assert all(torch.equal(r["after"], torch.full((2,), 3.0)) for r in res)
    assert "call_site" in m  # the message says how to pair different lines on purpose


def _extra_world4(rank):
    """Rank 2 makes an extra same-size all-reduce on the world, then a 3-rank group sees different sizes."""
    env.set_comm_timeout(10.0)
    x = torch.ones(8)

    def extra():
        if rank == 2:
            comm.all_reduce(x)  # <w4-extra>
        comm.all_reduce(x)  # <w4-final>

    def sizes():
        if rank != 3:
            comm.all_reduce(torch.ones(2 if rank == 1 else 3), (0, 1, 2))  # <w4-sizes>
    return _expect_error(extra), x.clone(), _expect_error(sizes) if rank != 3 else None


def test_mismatches_raise_on_every_rank_world4(world4):
    res = world4.run(_extra_world4)
    for r, (msg, x, msg2) in enumerate(res):
        assert "mismatched collectives on group [0, 1, 2, 3]" in msg and f"seen from rank {r}" in msg, msg
        assert f"rank 2: all_reduce[sum](float32[8]) at {_line('w4-extra')}" in msg, msg
        assert f"ranks 0, 1, 3: all_reduce[sum](float32[8]) at {_line('w4-final')}" in msg, msg
        assert torch.equal(x, torch.ones(8)), x
        if r != 3:  # a sub-group: different sizes are caught before the payload (no Gloo abort)
            assert "mismatched collectives on group [0, 1, 2]" in msg2 and "different shapes" in msg2, msg2
            assert f"ranks 0, 2: all_reduce[sum](float32[3]) at {_line('w4-sizes')}" in msg2, msg2
            assert f"rank 1: all_reduce[sum](float32[2]) at {_line('w4-sizes')}" in msg2, msg2
    assert world4.run(_sum_world) == [4.0] * 4


def _sum_world(rank):
    x = torch.ones(1)
    comm.all_reduce(x)
    return float(x.item())


def _gloo_fallback(rank):
    """Groups over WIRE_MAX_GROUP ranks exchange fingerprints by a Gloo all-gather instead of the
    socket side channel: the same errors, and the group stays in step."""
    from holoflow.distributed import comm_track
    env.set_comm_timeout(10.0)
    old = comm_track.WIRE_MAX_GROUP
    comm_track.WIRE_MAX_GROUP, saved = 1, dict(comm_track._ROUTES)
    comm_track._ROUTES.clear()
    try:
        sizes = _expect_error(lambda: comm.all_reduce(torch.ones(4 if rank == 0 else 1000)))  # <fb-sizes>
        y = torch.full((2,), float(rank + 1))
        comm.all_reduce(y)
        return sizes, y
    finally:
        comm_track.WIRE_MAX_GROUP = old
        comm_track._ROUTES.clear()
        comm_track._ROUTES.update(saved)


def test_large_groups_fall_back_to_gloo_fingerprints(world2):
    for msg, y in world2.run(_gloo_fallback):
        assert "mismatched collectives on group [0, 1]" in msg and "different shapes" in msg, msg
        assert f"rank 0: all_reduce[sum](float32[4]) at {_line('fb-sizes')}" in msg, msg
        assert f"rank 1: all_reduce[sum](float32[1000]) at {_line('fb-sizes')}" in msg, msg
        assert torch.equal(y, torch.full((2,), 3.0))
