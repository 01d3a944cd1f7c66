"""The shared-memory collectives of ranks on one host (distributed/shm_comm.py) on Gloo worlds of 2
and 4 ranks: the same values as Gloo's all-reduce, all-gather and reduce-scatter, counted alike,
chunked, asynchronous, ranks that agree to fall back, timeouts and dead peers named, and no segment
file left in /dev/shm."""
import glob
import os
import time

import pytest
import torch
import torch.distributed as dist

from holoflow.core.errors import HoloflowError
from holoflow.distributed import comm, comm_track, env, shm_comm
from pool import fresh_world, summed_world_size

SEGMENTS = os.path.join("/dev/shm", shm_comm._PREFIX + "*")
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}


@pytest.fixture(params=[2, 4], ids=["world2", "world4"])
def world(request):
    return request.getfixturevalue(f"world{request.param}")


def _uses_shm(key) -> bool:
    got = shm_comm._TRANSPORTS.get(tuple(key))
    return got is not None and got[1] is not None


def _values(rank, n, dtype, numel, op):
    g = torch.Generator().manual_seed(100 + rank)
    if n == 2 and op == "sum":   # one addition per element: any order gives the same bits
        return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype)
    if op == "prod":
        return torch.randint(1, 3, (numel,), generator=g).to(dtype)
    # small integers: exact in every dtype and any summation order
    return torch.randint(-8, 9, (numel,), generator=g).to(dtype)


def _same_as_gloo(rank, cases):
    n = env.get_world_size()
    out = []
    for dtype_name, numel, op in cases:
        dtype = getattr(torch, dtype_name)
        x = _values(rank, n, dtype, numel, op)
        ref = x.clone()
        dist.all_reduce(ref, OPS.get(op, dist.ReduceOp.SUM))   # Gloo itself
        if op == "avg":
            ref = ref / n
        with comm.count() as c:
            got = comm.all_reduce(x.clone(), op=op)
        assert c.calls == [("all_reduce", numel * x.element_size(), n)], c.calls
        if not torch.equal(got, ref):
            out.append((dtype_name, numel, op, (got.double() - ref.double()).abs().max().item()))
    return out, _uses_shm(range(n)), glob.glob(SEGMENTS)


CASES = [(d, k, op) for d in ("float32", "bfloat16", "float16", "float64") for k in (1, 3, 1001)
         for op in ("sum", "avg")] + [("float32", 1001, op) for op in ("max", "min", "prod")] + \
        [("float32", 0, "sum"), ("bfloat16", 300_000, "sum")]


def test_equal_to_gloo(world):
    for diffs, used, files in world.run(_same_as_gloo, CASES):
        assert used, "the shared-memory transport was not used"
        assert diffs == [], diffs
        assert files == [], files


def _same_as_gloo_scattered(rank, cases):
    """The reduce-scatter protocol of groups larger than READ_ALL_MAX, forced on this group."""
    shm_comm.close_all()
    saved, shm_comm.READ_ALL_MAX = shm_comm.READ_ALL_MAX, 1
    try:
        return _same_as_gloo(rank, cases)
    finally:
        shm_comm.READ_ALL_MAX = saved
        shm_comm.close_all()


def test_equal_to_gloo_reduce_scatter_protocol(world):
    for diffs, used, files in world.run(_same_as_gloo_scattered, CASES):
        assert used and diffs == [] and files == [], (used, diffs, files)


def _rows_same_as_gloo(rank, slot_mb):
    """all_gather_rows and reduce_scatter_rows through shared memory against Gloo's all-gather and
    all-reduce of the same values (every dtype, 1 to 1001 rows of 3, counted as Gloo's are; with a
    small slot the large ones go in chunks)."""
    n = env.get_world_size()
    group = tuple(range(n))
    shm_comm.close_all()
    if slot_mb:
        os.environ["HOLOFLOW_SHM_SLOT_MB"] = str(slot_mb)
    try:
        bad = []
        for dtype_name in ("float32", "bfloat16", "float16", "float64"):
            dtype = getattr(torch, dtype_name)
            for rows in (1, 3, 1001):
                x = _values(rank, n, dtype, rows * 3, "sum").view(rows, 3)
                ref = [torch.empty_like(x) for _ in range(n)]
                dist.all_gather(ref, x)
                with comm.count() as c:
                    got = comm.all_gather_rows(x, group)
                if not torch.equal(got, torch.cat(ref)) or c.calls != [("all_gather", x.numel() * x.element_size(), n)]:
                    bad.append(("all_gather", dtype_name, rows, c.calls))
                y = _values(rank, n, dtype, n * rows * 3, "sum").view(n * rows, 3)
                total = y.clone()
                dist.all_reduce(total)
                with comm.count() as c:
                    got = comm.reduce_scatter_rows(y, group)
                if not torch.equal(got, total[rank * rows:(rank + 1) * rows]) or \
                        c.calls != [("reduce_scatter", y.numel() * y.element_size(), n)]:
                    bad.append(("reduce_scatter", dtype_name, rows, (got.double() - total[rank * rows:(rank + 1) * rows]
                                                                    .double()).abs().max().item(), c.calls))
        tr = shm_comm._TRANSPORTS[group][1]
        return bad, tr is not None, tr.step if tr is not None else 0, glob.glob(SEGMENTS)
    finally:
        os.environ.pop("HOLOFLOW_SHM_SLOT_MB", None)
        shm_comm.close_all()


@pytest.mark.parametrize("slot_mb", [None, 0.002])
def test_all_gather_and_reduce_scatter_equal_gloo(world, slot_mb):
    for bad, used, chunks, files in world.run(_rows_same_as_gloo, slot_mb):
        assert used and bad == [] and files == [], (used, bad, files)
        # 8 dtype x rows cases of each kind; a 2 KB slot splits the 1001-row ones into several chunks
        assert chunks > 24 if slot_mb else chunks == 24, chunks


def _chunked(rank, slot_mb):
    """A slot smaller than the tensor: it goes through in chunks (a new handshake, a new segment)."""
    n = env.get_world_size()
    shm_comm.close_all()
    os.environ["HOLOFLOW_SHM_SLOT_MB"] = str(slot_mb)
    try:
        x = torch.arange(10_001, dtype=torch.float32) * (rank + 1)
        comm.all_reduce(x)
        tr = shm_comm._TRANSPORTS[tuple(range(n))][1]
        chunks = tr.step
    finally:
        del os.environ["HOLOFLOW_SHM_SLOT_MB"]
        shm_comm.close_all()
    assert torch.equal(x, torch.arange(10_001, dtype=torch.float32) * (n * (n + 1) // 2))
    return chunks, tr.slot


def test_chunks(world):
    for chunks, slot in world.run(_chunked, 0.01):
        assert slot == 0.01 * 2 ** 20 // 64 * 64
        assert chunks == -(-10_001 * 4 // slot)


def _async_in_any_order(rank):
    n = env.get_world_size()
    xs = [torch.full((1000 * (i + 1),), float(rank + i)) for i in range(4)]
    hs = [comm.all_reduce(x, op="avg" if i % 2 else "sum", async_op=True) for i, x in enumerate(xs)]
    for i in (3, 0, 2, 1):
        hs[i].wait()
    tri = n * (n - 1) / 2
    for i, x in enumerate(xs):
        want = (tri + n * i) / (n if i % 2 else 1)
        assert torch.equal(x, torch.full_like(x, want)), (i, x[:3], want)
    # sub-groups of a world of 4 decide each for itself
    if n == 4:
        pair = (0, 2) if rank % 2 == 0 else (1, 3)
        y = torch.tensor([rank + 1.0])
        comm.all_reduce(y, pair)
        assert y.item() == (4.0 if rank % 2 == 0 else 6.0)
        assert _uses_shm(pair)
    return True


def test_async_out_of_order(world):
    assert world.run(_async_in_any_order) == [True] * world.size


def _one_rank_disabled(rank):
    """One rank turns the transport off: every rank agrees on Gloo for a group decided now."""
    n = env.get_world_size()
    shm_comm.close_all()
    if rank == n - 1:
        os.environ["HOLOFLOW_SHM_ALLREDUCE"] = "0"
    try:
        x = torch.full((5,), rank + 1.0)
        comm.all_reduce(x)
        used = _uses_shm(range(n))
    finally:
        os.environ.pop("HOLOFLOW_SHM_ALLREDUCE", None)
        shm_comm.close_all()
    return used, x.tolist()


def test_disabled_on_one_rank_means_gloo_everywhere(world):
    n = world.size
    assert world.run(_one_rank_disabled) == [(False, [n * (n + 1) / 2] * 5)] * n


def _skip_one(rank):
    """Rank 1 skips an all-reduce; the others time out naming it."""
    env.set_comm_timeout(2.0)
    comm.all_reduce(torch.ones(3))
    assert _uses_shm(range(env.get_world_size()))
    if rank == 1:
        time.sleep(4)
        return None
    t0 = time.monotonic()
    try:
        with comm_track.planned():   # no fingerprint exchange, which would notice first
            comm.all_reduce(torch.ones(3))
    except comm.CommError as e:
        return str(e), time.monotonic() - t0
    return "no error", 0.0


def test_timeout_names_the_rank(world):
    res = world.run_raw(_skip_one)
    for r, reply in enumerate(res):
        if r == 1:
            continue
        status, (msg, waited), _ = reply
        assert status == "ok" and 1.5 < waited < 8, (r, reply)
        assert "timed out" in msg and "ranks [1] did not arrive" in msg, msg
    assert world.run(summed_world_size) == [world.size] * world.size


def _die_after_one(rank):
    env.set_comm_timeout(30.0)
    comm.all_reduce(torch.ones(1000))   # the handshake: the segment exists only in the mappings now
    assert _uses_shm((0, 1))
    files = glob.glob(SEGMENTS)
    comm.barrier()
    if rank == 1:
        os._exit(7)
    time.sleep(0.5)
    t0 = time.monotonic()
    h = comm.all_reduce(torch.ones(1000), async_op=True)   # no fingerprint exchange: the transport sees it
    try:
        h.wait()
    except comm.CommError as e:
        return str(e), time.monotonic() - t0, files
    return "no error", 0.0, files


def test_dead_peer_named_and_nothing_left():
    before = set(glob.glob(SEGMENTS))
    w = fresh_world(2, timeout=60)
    try:
        with_plan = w.run_raw(_die_after_one_planned)
    finally:
        w.close()
    assert with_plan[1][0] == "dead" and with_plan[1][1] == 7, with_plan[1]
    status, (msg, waited, files), _ = with_plan[0]
    assert status == "ok" and waited < 10, with_plan[0]
    assert files == [], files
    assert "ranks [1] are gone" in msg and "Ranks whose process is gone: 1 (pid" in msg, msg
    assert set(glob.glob(SEGMENTS)) <= before


def _die_after_one_planned(rank):
    with comm_track.planned():   # as a compiled graph's collectives: no per-call fingerprint
        return _die_after_one(rank)


def _shutdown_and_again(rank):
    x = torch.ones(4)
    comm.all_reduce(x)
    tr = shm_comm._TRANSPORTS[(0, 1)][1]
    env.shutdown()   # destroys the world: the transport's thread stops, its mapping goes
    gone = not tr._thread.is_alive() and tr.raw is None and not shm_comm._TRANSPORTS
    y = torch.ones(4)
    comm.all_reduce(y)   # a new world decides again
    return gone, x.tolist(), y.tolist(), _uses_shm((0, 1)), glob.glob(SEGMENTS)


def test_shutdown_closes_and_world_restarts(world2):
    for gone, x, y, used, files in world2.run(_shutdown_and_again):
        assert gone and x == y == [2.0] * 4 and used and files == []


def _many(rank, slot_mb, shm_on):
    """all_reduce_many: the concatenation's sum in a new flat tensor, inputs untouched, one call
    counted; parts straddling chunk boundaries (a slot of a few hundred elements)."""
    n = env.get_world_size()
    shm_comm.close_all()
    os.environ["HOLOFLOW_SHM_SLOT_MB"] = str(slot_mb)
    if not shm_on:
        os.environ["HOLOFLOW_SHM_ALLREDUCE"] = "0"
    try:
        g = torch.Generator().manual_seed(7 + rank)
        parts = [torch.randint(-8, 9, s, generator=g).float() for s in ((3, 5), (700,), (1,), (2, 2, 90), (0,))]
        before = [p.clone() for p in parts]
        ref = torch.cat([p.reshape(-1) for p in parts])
        dist.all_reduce(ref)
        with comm.count() as c:
            h = comm.all_reduce_many(parts, async_op=True)
            got = h.wait()
        used = _uses_shm(range(n))
        chunks = shm_comm._TRANSPORTS[tuple(range(n))][1].step if used else 0
    finally:
        os.environ.pop("HOLOFLOW_SHM_SLOT_MB", None)
        os.environ.pop("HOLOFLOW_SHM_ALLREDUCE", None)
        shm_comm.close_all()
    assert c.calls == [("all_reduce", ref.numel() * 4, n)], c.calls
    assert all(torch.equal(p, b) for p, b in zip(parts, before))
    return torch.equal(got, ref), used, chunks


@pytest.mark.parametrize("shm_on", [True, False], ids=["shm", "gloo"])
def test_all_reduce_many(world, shm_on):
    slot = 0.001   # 1024 bytes: 256 floats per chunk, so parts straddle chunks
    for equal, used, chunks in world.run(_many, slot, shm_on):
        assert equal and used == shm_on
        if shm_on:
            assert chunks == -(-(15 + 700 + 1 + 360) * 4 // (slot * 2 ** 20 // 64 * 64))


def _mixed(rank):
    with pytest.raises(HoloflowError, match="one dtype and device"):
        comm.all_reduce_many([torch.ones(2), torch.ones(2, dtype=torch.float64)])
    return True


def test_all_reduce_many_rejects_mixed_dtypes(world2):
    assert world2.run(_mixed) == [True, True]


def _small_ones_on_the_caller(rank):
    """Small all-reduces issued while nothing is in flight run on their caller's thread; one
    issued before an earlier one is waited for is finished by the group's thread first; polling
    is_completed() finishes one too; values equal Gloo's throughout."""
    n = env.get_world_size()
    comm.all_reduce(torch.ones(3))            # decides the transport if this world has not yet
    tr = shm_comm._TRANSPORTS[tuple(range(n))][1]
    before = tr.inline
    got = [comm.all_reduce(torch.full((5,), rank + 1.0)) for _ in range(3)]
    inline_sync = tr.inline - before
    small = comm.all_reduce(torch.full((2,), float(rank)), async_op=True)    # started here, left open
    big = comm.all_reduce(torch.full((200_000,), 1.0), async_op=True)        # queued behind it
    got_big = big.wait()
    got_small = small.wait()
    polled = comm.all_reduce(torch.full((1,), 2.0), async_op=True)
    deadline = time.monotonic() + 30
    while not polled.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    tri = n * (n + 1) / 2
    return (inline_sync, [g.tolist() for g in got] == [[tri] * 5] * 3, got_big.eq(n).all().item(),
            got_small.tolist() == [tri - n] * 2, polled.is_completed() and polled.wait().item() == 2.0 * n)


def test_small_all_reduces_run_on_their_callers_thread(world):
    for inline_sync, *ok in world.run(_small_ones_on_the_caller):
        assert inline_sync == 3 and all(ok), (inline_sync, ok)


def _random_op(rng, rank: int, n: int, i: int, async_op: bool):
    """One random collective of a random program: (its handle or result, what it must give)."""
    numel = rng.choice([1, 7, 1000, 20_000, 40_000])
    kind = rng.choice(["all_reduce", "all_reduce", "all_gather", "reduce_scatter"])
    total = float(sum(r + 1 + i for r in range(n)))
    if kind == "all_gather":
        want = torch.cat([torch.full((numel,), float(r + 1 + i)) for r in range(n)])
        return comm.all_gather_rows(torch.full((numel,), float(rank + 1 + i)), tuple(range(n)), async_op), want
    if kind == "reduce_scatter":
        x = torch.cat([torch.full((numel,), float(rank + 1 + i + 10 * b)) for b in range(n)])
        want = torch.full((numel,), total + 10 * n * rank)
        return comm.reduce_scatter_rows(x, tuple(range(n)), async_op), want
    x = torch.full((numel,), float(rank + 1 + i))
    h = comm.all_reduce(x, async_op=async_op)
    return (h if async_op else x), torch.full((numel,), total)


def _random_program(rank, seed):
    """A seeded random program every rank runs alike: small and large all-reduces, all-gathers and
    reduce-scatters (inline and on the group's thread, chunked), sync and async, waited for in a
    random order, some polled, the rest left to the next call; every result what Gloo would give."""
    import random
    n = env.get_world_size()
    rng = random.Random(seed)
    shm_comm.close_all()
    os.environ["HOLOFLOW_SHM_SLOT_MB"] = "0.05"   # 13,107 floats: the large ones go in chunks
    try:
        pending, bad = [], []
        for i in range(60):
            if rng.random() < 0.4:
                got, want = _random_op(rng, rank, n, i, False)
                if not torch.equal(got, want):
                    bad.append(("sync", i, want.numel()))
            else:
                pending.append((*_random_op(rng, rank, n, i, True), i))
            if pending and rng.random() < 0.5:
                h, want, j = pending.pop(rng.randrange(len(pending)))
                if rng.random() < 0.3:
                    deadline = time.monotonic() + 30
                    while not h.is_completed() and time.monotonic() < deadline:
                        time.sleep(0.0005)
                if not torch.equal(h.wait(), want):
                    bad.append(("async", j, want.numel()))
        for h, want, j in pending:
            if not torch.equal(h.wait(), want):
                bad.append(("async", j, want.numel()))
        tr = shm_comm._TRANSPORTS[tuple(range(n))][1]
        inline = tr.inline if tr is not None else -1
    finally:
        os.environ.pop("HOLOFLOW_SHM_SLOT_MB", None)
        shm_comm.close_all()
    return bad, inline


@pytest.mark.parametrize("seed", [1, 2])
def test_random_programs_of_sync_and_async_collectives(world, seed):
    for bad, inline in world.run(_random_program, seed):
        assert bad == [] and inline > 0, (bad, inline)
