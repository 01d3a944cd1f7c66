"""Boxing and global dispatch on simulated ranks (threads of one process, in-memory collectives).
The same code runs on Gloo in tests/dist; here every pair is cheap enough to check exhaustively."""
import itertools

import pytest
import torch

import holoflow as flow
from dist_fns import partial_of
from holoflow.distributed import world
from holoflow.distributed.boxing import plan
from holoflow.distributed.global_tensor import from_full
from holoflow.distributed.sharding import shard_of
from holoflow.sbp import B, P, S

ONE_D = [S(0), S(1), B, P]


def _box_roundtrip(place, src, dst, full):
    def fn(r):
        x = from_full(full, place, src) if P not in src else partial_of(full, place, src, r)
        y = x.to_global(sbp=dst)
        z = y.to_global(sbp=(B,) * place.ndim)
        return y.to_local().to_torch(), z.to_local().to_torch(), tuple(y.sbp)
    return world.simulate(place.size, fn)


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("src,dst", list(itertools.product(ONE_D, ONE_D)))
def test_boxing_1d_every_pair(p, src, dst):
    place = flow.placement("cpu", list(range(p)))
    full = torch.randn(5, 7, dtype=torch.float64)
    out = _box_roundtrip(place, (src,), (dst,), full)
    for r, (local, whole, sbp) in enumerate(out):
        assert sbp == (dst,)
        torch.testing.assert_close(whole, full)
        if dst != P:
            torch.testing.assert_close(local, shard_of(full, (dst,), place, r))
    if dst == P:
        torch.testing.assert_close(sum(o[0] for o in out), full)


@pytest.mark.parametrize("src,dst", list(itertools.product(itertools.product(ONE_D, ONE_D), repeat=2)))
def test_boxing_2d_every_pair(src, dst):
    place = flow.placement("cpu", [[0, 1], [2, 3]])
    full = torch.randn(5, 6, dtype=torch.float64)
    out = _box_roundtrip(place, src, dst, full)
    for r, (local, whole, sbp) in enumerate(out):
        assert sbp == dst
        torch.testing.assert_close(whole, full)
        if P not in dst:
            torch.testing.assert_close(local, shard_of(full, dst, place, r))


def test_plan_uses_one_collective_per_axis():
    assert [s.kind for s in plan((S(0),), (B,), (2,))] == ["all_gather"]
    assert [s.kind for s in plan((P,), (B,), (2,))] == ["all_reduce"]
    assert [s.kind for s in plan((P,), (S(1),), (2,))] == ["reduce_scatter"]
    assert [s.kind for s in plan((S(0),), (S(1),), (2,))] == ["all_to_all"]
    assert [s.kind for s in plan((B,), (S(0),), (2,))] == ["slice"]
    assert [s.kind for s in plan((B,), (P,), (2,))] == ["zero"]
    assert [s.kind for s in plan((S(1),), (P,), (2,))] == ["pad"]   # no communication, as OneFlow's
    assert [s.kind for s in plan((S(0), P), (S(0), B), (2, 2))] == ["all_reduce"]
    assert [s.collective for s in plan((S(0), S(1)), (P, P), (2, 2))] == [False, False]


def test_split_to_partial_sums_to_the_whole_with_no_communication():
    place = flow.placement("cpu", [0, 1, 2])
    full = torch.arange(35.0).view(5, 7)

    def run(rank):
        x = flow.from_torch(full).to_global(place, B).to_global(sbp=S(1))
        with flow.comm.count() as c:
            y = x.to_global(sbp=P)
        return y.to_local().to_torch(), c.total
    got = world.simulate(3, run)
    assert [n for _, n in got] == [0, 0, 0]
    torch.testing.assert_close(sum(t for t, _ in got), full, rtol=0, atol=0)
    for (t, _), (a, b) in zip(got, [(0, 3), (3, 5), (5, 7)]):   # each rank's columns, zeros elsewhere
        want = torch.zeros_like(full)
        want[:, a:b] = full[:, a:b]
        torch.testing.assert_close(t, want, rtol=0, atol=0)


def test_counts_p_to_b_is_one_all_reduce():
    place = flow.placement("cpu", [0, 1])
    full = torch.randn(4, 3)

    def fn(r):
        x = from_full(full, place, P)
        return x.to_global(sbp=B).to_local().to_torch()
    outs = world.simulate(2, fn)
    kinds = [c[0] for c in world.simulate.last_comm.calls]
    assert kinds == ["all_reduce"], kinds
    for o in outs:
        torch.testing.assert_close(o, full)


def test_elementwise_split_times_broadcast_communicates_nothing():
    place = flow.placement("cpu", [0, 1])
    a, b = torch.randn(5, 3), torch.randn(3)

    def fn(r):
        x = from_full(a, place, S(0))
        w = from_full(b, place, B)
        y = (x * w + 1).exp()
        return tuple(y.sbp), y.to_global(sbp=B).to_local().to_torch()
    outs = world.simulate(2, fn)
    kinds = [c[0] for c in world.simulate.last_comm.calls]
    assert kinds == ["all_gather"], kinds  # only the final check's S -> B
    for sbp, full in outs:
        assert sbp == (S(0),)
        torch.testing.assert_close(full, (a * b + 1).exp())


def test_grad_of_broadcast_weight_is_partial_then_allreduced():
    place = flow.placement("cpu", [0, 1])
    a, b = torch.randn(5, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    ta, tb = a.clone().requires_grad_(), b.clone().requires_grad_()
    ((ta * tb).exp()).backward(torch.ones(5, 3, dtype=torch.float64))

    def fn(r):
        x = from_full(a, place, S(0))
        w = from_full(b, place, B).requires_grad_()
        x.requires_grad_()
        y = (x * w).exp()
        y.backward(flow.ones(5, 3, dtype=flow.float64, placement=place, sbp=B))
        return tuple(w.grad.sbp), w.grad.to_local().to_torch(), x.grad.to_global(sbp=B).to_local().to_torch()
    for sbp, wg, xg in world.simulate(2, fn):
        assert sbp == (B,)
        torch.testing.assert_close(wg, tb.grad)
        torch.testing.assert_close(xg, ta.grad)


@pytest.mark.parametrize("src,dst,keeps", [(torch.float32, torch.bfloat16, False), (torch.float64, torch.float32, False),
                                           (torch.float32, torch.int32, False), (torch.bfloat16, torch.float32, True),
                                           (torch.float32, torch.float64, True), (torch.int64, torch.int32, True),
                                           (torch.int16, torch.float32, True), (torch.int64, torch.float64, False)])
def test_a_cast_keeps_partial_sums_only_where_it_keeps_their_values(src, dst, keeps):
    """Pieces that cancel: 1000 and -999.9 (float32) sum to 0.1; cast to bfloat16 each is
    +-1000 and the sum 0. A narrowing cast of a partial sum reduces first (in the source dtype;
    a reduce-scatter where the output may be split); a widening one keeps it partial."""
    pieces = {torch.float32: [1000.0, -999.9], torch.float64: [1.0, 1e-12 - 1.0], torch.bfloat16: [1000.0, -992.0],
              torch.int64: [2 ** 40 + 3, -(2 ** 40)], torch.int16: [300, -290]}[src]
    pieces = [torch.tensor([v, 2 * v], dtype=src) for v in pieces]
    want = (pieces[0] + pieces[1]).to(dst)

    def run(r):
        place = flow.placement("cpu", ranks=[0, 1])
        x = flow.from_torch(pieces[r].clone()).to_global(place, P)
        y = x.to(dst)
        return tuple(y.sbp), y.to_global(sbp=B).to_local().to_torch()

    for sbp, got in world.simulate(2, run):
        assert (sbp == (P,)) == keeps, sbp
        assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("sbp", [S(0), S(1), B])
def test_a_dtype_cast_of_a_split_tensor_communicates_nothing(sbp):
    """Eager ``.half()``/``.double()``/``.to(dtype)`` keep a split: the shape rule of ``to`` ran on
    meta tensors with the real device in its attrs, failed, and the output was taken as
    data-dependent, so every cast all-gathered to broadcast."""
    full = torch.randn(4, 6)

    def run(r):
        place = flow.placement("cpu", ranks=[0, 1])
        x = from_full(full, place, (sbp,))
        outs = [x.half(), x.double(), x.bfloat16(), x.to(torch.int32), x.to("cpu", torch.float64), x.float()]
        return [(tuple(y.sbp), y.to_global(sbp=B).to_local().to_torch()) for y in outs]

    want = [full.half(), full.double(), full.bfloat16(), full.to(torch.int32), full.double(), full]
    for got in world.simulate(2, run):
        for (s, value), w in zip(got, want):
            assert s == (sbp,)
            assert torch.equal(value, w)


_SHARD_CASES = {   # (op, sbp of a, sbp of c): before, each output was a whole-size partial sum
    "add": (lambda a, c: a + c, S(0), S(1)), "mul": (lambda a, c: a * c, S(1), S(0)),
    "where": (lambda a, c: flow.where(a > 0, a, c), S(0), S(1)),
    "cat_rows": (lambda a, c: flow.cat([a, c], 0), S(0), S(0)), "cat_cols": (lambda a, c: flow.cat([a, c], 1), S(1), B),
    "rows": (lambda a, c: a[1:3], S(0), B), "cols": (lambda a, c: a[:, 2:5], S(1), B),
    "cumsum": (lambda a, c: a.cumsum(1), S(1), B), "flat": (lambda a, c: a.reshape(-1), S(1), B),
}


@pytest.mark.parametrize("case", sorted(_SHARD_CASES))
def test_a_split_input_is_not_made_a_partial_sum(case):
    """S -> P is free (a shard padded with zeros), so an op could take it to run without
    communication, leaving a whole-size partial sum on every rank that the next reader pays to
    reduce, and a DTensor whose to_local() is a piece of a sum where torch gives a shard. The
    choice ranks such signatures last (as OneFlow's SBP inference rules S -> P out): the values
    are the same, the output is split or broadcast."""
    fn, sa, sc = _SHARD_CASES[case]
    a, c = torch.randn(4, 6), torch.randn(4, 6)
    want = fn(flow.from_torch(a), flow.from_torch(c)).to_torch()

    def run(r):
        place = flow.placement("cpu", ranks=[0, 1])
        y = fn(from_full(a, place, (sa,)), from_full(c, place, (sc,)))
        return tuple(y.sbp), y.to_global(sbp=B).to_local().to_torch()
    for sbp, got in world.simulate(2, run):
        assert P not in sbp, (case, sbp)
        torch.testing.assert_close(got, want)
