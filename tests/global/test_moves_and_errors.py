"""Moves between placements (subset, superset, disjoint, 1-D <-> N-D) and the global view's
errors. Every error must be a HoloflowError on every rank that names what is wrong: never a
hang (simulated collectives time out quickly here) and never a bare torch/numpy traceback."""
import itertools

import numpy as np
import pytest
import torch

import dist_fns
import holoflow as flow
from holoflow.core.errors import HoloflowError
from holoflow.distributed import world
from holoflow.distributed.global_tensor import from_full, make_global
from holoflow.distributed.sharding import local_ranges, shard_of
from holoflow.sbp import B, P, S

QUICK = 10.0  # simulated collective timeout: a hang fails fast instead of stalling the suite

ONE_D = [(S(0),), (S(1),), (B,), (P,)]
TWO_D = [(S(0), S(1)), (B, P), (S(1), B), (P, S(0))]
MOVES = {  # name: (source ranks, destination ranks)
    "subset": ([0, 1, 2, 3], [1, 2]),
    "superset": ([0, 1], [0, 1, 2, 3]),
    "disjoint": ([0, 1], [2, 3]),
    "1d_to_2d": ([0, 1, 2, 3], [[0, 1], [2, 3]]),
    "2d_to_1d": ([[0, 1], [2, 3]], [0, 1, 2, 3]),
}


def _cases():
    for name, (src_ranks, dst_ranks) in MOVES.items():
        srcs = TWO_D if isinstance(src_ranks[0], list) else ONE_D
        dsts = TWO_D if isinstance(dst_ranks[0], list) else ONE_D
        for src, dst in itertools.product(srcs, dsts):
            yield pytest.param(src_ranks, src, dst_ranks, dst, id=f"{name}-{src}-{dst}")


def _source(full, place, nd, r):
    """The source tensor on rank ``r``: P shards differ but sum to ``full``; ranks outside the
    placement hold an empty shard, as creation ops give them."""
    if place.coords(r) is None:
        return make_global(flow.from_torch(full.new_empty((0,))), place, nd, full.shape)
    return dist_fns.partial_of(full, place, nd, r)


def _every_rank_raises(n, fn, exc=HoloflowError):
    """Runs ``fn(rank)`` on ``n`` simulated ranks; returns each rank's message of ``exc``
    (asserting every rank raised it)."""
    def run(r):
        try:
            fn(r)
        except exc as e:
            return str(e)
        return None
    msgs = world.simulate(n, run, timeout=QUICK)
    missing = [r for r, m in enumerate(msgs) if m is None]
    assert not missing, f"ranks {missing} did not raise {exc.__name__}"
    return msgs


# -- moves between placements -----------------------------------------------------------------

@pytest.mark.parametrize("src_ranks,src,dst_ranks,dst", list(_cases()))
def test_move_keeps_the_logical_value(src_ranks, src, dst_ranks, dst):
    sp, dp = flow.placement("cpu", src_ranks), flow.placement("cpu", dst_ranks)
    full = torch.randn(5, 7, dtype=torch.float64)

    def fn(r):
        y = _source(full, sp, src, r).to_global(placement=dp, sbp=dst)
        got = {"placement": y.placement, "sbp": tuple(y.sbp), "shape": tuple(y.shape),
               "numel": y._data.numel()}
        if dp.coords(r) is not None:
            got["local"] = y.to_local().to_torch()
            got["whole"] = y.to_global(sbp=(B,) * dp.ndim).to_local().to_torch()
        else:  # one program on every rank: outside the placement, an empty local tensor
            got["outside_local"] = tuple(y.to_local().shape)
        return got
    outs = world.simulate(4, fn, timeout=QUICK)
    _check_move(full, dp, dst, outs)


def _check_move(full, dp, dst, outs):
    partial_sum = torch.zeros_like(full)
    for r, got in enumerate(outs):
        assert got["placement"] == dp and got["sbp"] == dst and got["shape"] == tuple(full.shape)
        if dp.coords(r) is None:  # outside the destination: meta only, an empty local tensor
            assert got["numel"] == 0 and got["outside_local"] == (0,)
            continue
        torch.testing.assert_close(got["whole"], full)
        if P in dst:
            partial_sum += _lift(got["local"], full, dst, dp, r)
        else:
            torch.testing.assert_close(got["local"], shard_of(full, dst, dp, r))
    if P in dst:
        torch.testing.assert_close(partial_sum, full)


def _lift(local, full, nd, place, r):
    """A P shard placed back into the logical tensor's frame, counted once per partial group:
    split dims go to their slice; broadcast mesh axes contribute only from coordinate 0."""
    coords = place.coords(r)
    if any(s == B and coords[a] != 0 for a, s in enumerate(nd)):
        return torch.zeros_like(full)
    out = torch.zeros_like(full)
    view = out
    for dim, (start, size) in enumerate(local_ranges(full.shape, nd, place, coords)):
        view = view.narrow(dim, start, size)
    view += local
    return out


def test_move_on_a_rank_outside_both_placements_is_absent():
    """One program on every rank: a rank in neither placement takes no part in the move and
    holds an empty local tensor that knows the logical shape, placement and SBP."""
    full = torch.randn(5, 7)
    sp, dp = flow.placement("cpu", [0]), flow.placement("cpu", [1])

    def fn(r):
        x = from_full(full, sp, B)
        y = x.to_global(placement=dp, sbp=S(0))
        assert y.placement == dp and tuple(y.sbp) == (S(0),) and tuple(y.shape) == (5, 7)
        return y.to_local().to_torch() if r == 1 else y._data.numel()
    outs = world.simulate(4, fn, timeout=QUICK)
    torch.testing.assert_close(outs[1], full)
    assert outs[0] == outs[2] == outs[3] == 0


def test_move_requiring_grad_is_differentiable_and_no_grad_detaches():
    """A move is differentiable (its gradient moves back: tests/global/test_one_program.py);
    under no_grad or after detach() it records nothing."""
    full = torch.randn(5, 7, dtype=torch.float64)
    sp, dp = flow.placement("cpu", [0, 1, 2, 3]), flow.placement("cpu", [1, 2])

    def ok(r):
        x = from_full(full, sp, S(0)).requires_grad_()
        with flow.no_grad():
            y = x.to_global(placement=dp, sbp=B)
        z = x.detach().to_global(placement=dp, sbp=B)
        rg = (x.requires_grad, y.requires_grad, z.requires_grad)
        vals = (y.to_local().to_torch(), z.to_local().to_torch()) if r in (1, 2) else None
        return rg, vals
    for r, (rg, vals) in enumerate(world.simulate(4, ok, timeout=QUICK)):
        assert rg == (True, False, False)
        assert (vals is not None) == (r in (1, 2))
        if vals is not None:
            torch.testing.assert_close(vals[0], full)
            torch.testing.assert_close(vals[1], full)


def test_move_on_gloo_world4(world4):
    cases = [([0, 1], (P,), [2, 3], (S(0),)),                        # disjoint, P -> S
             ([0, 1, 2, 3], (S(1),), [[0, 1], [2, 3]], (S(0), B)),   # 1-D -> 2-D
             ([0, 1, 2, 3], (S(0),), [1, 2], (P,))]                  # subset, S -> P
    results = world4.run(dist_fns.move_pairs, cases, (5, 7))
    full = results[0][0]
    for i, (_, _, dst_ranks, dst) in enumerate(cases):
        outs = [res[1][i] for res in results]
        _check_move(full, flow.placement("cpu", dst_ranks), dst, outs)


# -- clear errors -----------------------------------------------------------------------------

def test_split_axis_out_of_range():
    full = torch.randn(5, 7)
    p2, p22 = flow.placement("cpu", [0, 1]), flow.placement("cpu", [[0, 1], [2, 3]])
    cases = [
        (2, lambda r: flow.from_torch(full).to_global(p2, S(2)), "split(dim=2)"),
        (2, lambda r: from_full(full, p2, S(5)), "split(dim=5)"),
        (2, lambda r: from_full(full, p2, S(0)).to_global(sbp=S(3)), "split(dim=3)"),
        (4, lambda r: from_full(full, p22, (B, S(2))), "split(dim=2)"),
        (4, lambda r: from_full(full, flow.placement("cpu", [0, 1, 2, 3]), B)
         .to_global(placement=p22, sbp=(S(0), S(2))), "split(dim=2)"),
    ]
    for n, fn, needle in cases:
        for msg in _every_rank_raises(n, fn):
            assert needle in msg and "out of range" in msg and "2 dimension(s)" in msg, msg
            assert "legal split dims are 0..1" in msg, msg
    # a 0-dim tensor has no dim to split (was a bare IndexError from the layout math)
    for fn in (lambda r: from_full(torch.tensor(1.0), p2, S(0)),
               lambda r: flow.from_torch(torch.tensor(1.0)).to_global(p2, S(0))):
        for msg in _every_rank_raises(2, fn):
            assert "split(dim=0)" in msg and "0 dimension(s)" in msg and "0-dim" in msg, msg
    with pytest.raises(ValueError, match="axis must be an int >= 0"):
        S(-1)


@pytest.mark.parametrize("a_ranks,b_ranks", [([0, 1], [2, 3]), ([0, 1], [0, 1, 2, 3]),
                                              ([0, 1, 2, 3], [[0, 1], [2, 3]])])
def test_operands_on_different_placements(a_ranks, b_ranks):
    full = torch.randn(5, 7)
    pa, pb = flow.placement("cpu", a_ranks), flow.placement("cpu", b_ranks)
    sb = (B,) * pb.ndim
    for fn in (lambda r: from_full(full, pa, B) + from_full(full, pb, sb),
               lambda r: from_full(full, pa, S(0)) * from_full(full, pb, sb)):
        for msg in _every_rank_raises(4, fn):
            assert "different placements" in msg and str(pa) in msg and str(pb) in msg, msg


def test_to_local_on_a_rank_outside_the_placement():
    full = torch.randn(5, 7)
    place = flow.placement("cpu", [1, 3])

    def fn(r):
        x = from_full(full, place, S(0))
        return x.to_local().to_torch()
    outs = world.simulate(4, fn, timeout=QUICK)
    for r in (0, 2):  # one program on every rank: an empty local tensor, no error
        assert tuple(outs[r].shape) == (0,) and outs[r].dtype == full.dtype
    torch.testing.assert_close(outs[1], full[:3])
    torch.testing.assert_close(outs[3], full[3:])


LOCALS = {  # name: (rank 0's local tensor, rank 1's, sbp, what the message must name)
    "unbalanced_split": (torch.zeros(2, 7), torch.zeros(3, 7), S(0), ["rank 0", "(2, 7)", "(3, 7)"]),
    "other_dim_differs": (torch.zeros(3, 6), torch.zeros(3, 7), S(0), ["rank 1", "(3, 7)", "(3, 6)"]),
    "broadcast_shapes_differ": (torch.zeros(2, 7), torch.zeros(3, 7), B, ["rank 1", "(3, 7)", "(2, 7)"]),
    "ndim_differs": (torch.zeros(3, 7), torch.zeros(7), S(0), ["disagree", "(3, 7)", "(7,)"]),
    "dtype_differs": (torch.zeros(3, 7), torch.zeros(2, 7, dtype=torch.float64), S(0),
                      ["disagree", "torch.float32", "torch.float64"]),
    "dtype_differs_broadcast": (torch.zeros(3), torch.zeros(3, dtype=torch.int64), B,
                                ["disagree", "torch.float32", "torch.int64"]),
}


@pytest.mark.parametrize("name", list(LOCALS))
def test_check_meta_mismatch_across_ranks(name):
    a, b, sbp, needles = LOCALS[name]
    place = flow.placement("cpu", [0, 1])
    locs = [a, b]
    for msg in _every_rank_raises(2, lambda r: flow.from_torch(locs[r]).to_global(place, sbp, check_meta=True)):
        assert "to_global" in msg
        for n in needles:
            assert n in msg, (n, msg)


def test_check_meta_mismatch_on_gloo(world4):
    for msg in world4.run(dist_fns.check_meta_mismatch, [0, 1, 2, 3]):
        assert msg is not None and "disagree" in msg and "torch.float64" in msg, msg


@pytest.mark.parametrize("ranks,needle", [
    ([[0, 1], [2]], "not a rectangular mesh"),
    ([[0, 1], 2], "not a rectangular mesh"),
    ([[0, 1, 2], [3]], "not a rectangular mesh"),
    ([0, 1, 1], "distinct"),
    ([[0, 1], [1, 2]], "distinct"),
    ([0, -1], "non-negative"),
    ([[0, 1], [2, -3]], "non-negative"),
    ([], "non-empty"),
    ([0, 1.5], "ints"),
])
def test_bad_mesh_shapes(ranks, needle):
    with pytest.raises(HoloflowError) as ei:
        flow.placement("cpu", ranks)
    assert needle in str(ei.value) and repr(ranks) in str(ei.value)


def test_nd_sbp_length_must_match_the_mesh():
    full = torch.randn(5, 7)
    p2, p22 = flow.placement("cpu", [0, 1]), flow.placement("cpu", [[0, 1], [2, 3]])
    cases = [
        (2, lambda r: from_full(full, p2, (S(0), B)), "1-D mesh (2,)", "got 2"),
        (2, lambda r: flow.from_torch(full).to_global(p2, [B, B]), "1-D mesh (2,)", "got 2"),
        (4, lambda r: from_full(full, p22, S(0)), "2-D mesh (2, 2)", "got 1"),
        (4, lambda r: from_full(full, p22, (S(0), B)).to_global(sbp=(B,)), "2-D mesh (2, 2)", "got 1"),
        (4, lambda r: from_full(full, p22, (B, B, B)), "2-D mesh (2, 2)", "got 3"),
        (4, lambda r: from_full(full, flow.placement("cpu", [0, 1, 2, 3]), S(0))
         .to_global(placement=p22, sbp=B), "2-D mesh (2, 2)", "got 1"),
    ]
    for n, fn, mesh, got in cases:
        for msg in _every_rank_raises(n, fn):
            assert mesh in msg and got in msg, msg
    # moving 1-D -> 2-D without sbp= used to keep the 1-entry nd-SBP on the 2-D mesh silently
    for msg in _every_rank_raises(4, lambda r: from_full(full, flow.placement("cpu", [0, 1, 2, 3]), S(0))
                                  .to_global(placement=p22)):
        assert "needs sbp= with 2 value(s)" in msg and str(p22) in msg, msg


def test_a_model_creating_a_local_tensor_is_told_of_global_mode_and_trains_inside_it():
    """A PyTorch model that creates a tensor in forward (GPT's ``torch.arange(T, device=idx.device)``)
    fails on global inputs with an error naming the op, the user's line and both ways out; run
    inside ``global_view.global_mode`` (creation ops make global tensors there) the same model
    gives the one-process loss and gradients."""
    from holoflow.examples import gpt
    from holoflow.utils.global_view import global_mode
    flow.manual_seed(0)
    local = gpt.build(flow)(17, 8, 1, 16, 2)
    state = {k: v.detach().clone() for k, v in local.state_dict().items()}
    idx = flow.tensor(np.random.default_rng(0).integers(0, 17, (4, 8)))
    want = local(idx, idx)[1]
    want.backward()
    place = flow.placement("cpu", [0, 1])

    def model(rank):
        m = gpt.build(flow)(17, 8, 1, 16, 2)
        m.load_state_dict(state)
        return m.to_global(placement=place, sbp=B), idx.to_global(placement=place, sbp=B).to_global(sbp=S(0))

    def plain(rank):
        m, x = model(rank)
        m(x, x)
    for msg in _every_rank_raises(2, plain):
        assert "holoflow.embedding at global/test_moves_and_errors.py:" in msg and "mixes a local tensor of shape (8,)" in msg
        assert ".to_global(placement, sbp)" in msg and "global_view.global_mode(True" in msg, msg

    def inside(rank):
        m, x = model(rank)
        with global_mode(True, placement=place, sbp=B):
            loss = m(x, x)[1]
        loss.backward()
        return loss.to_global(sbp=B).to_local().item(), m.blocks[0].mlp.fc.weight.grad.to_local().numpy()
    for loss, grad in world.simulate(2, inside, timeout=60):
        np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
        np.testing.assert_allclose(grad, local.blocks[0].mlp.fc.weight.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_mixing_local_and_global_in_an_op():
    full = torch.randn(5, 7)
    place = flow.placement("cpu", [0, 1])
    cases = [("add", lambda r: from_full(full, place, S(0)) + flow.from_torch(full)),
             ("mul", lambda r: flow.from_torch(full) * from_full(full, place, B)),
             ("matmul", lambda r: from_full(full, place, B) @ flow.from_torch(full.T.contiguous()))]
    for op, fn in cases:
        for msg in _every_rank_raises(2, fn):
            assert f"holoflow.{op}" in msg and "mixes a local tensor of shape" in msg, msg
            assert ".to_global(" in msg
    # Python scalars are not local tensors
    outs = world.simulate(2, lambda r: (from_full(full, place, S(0)) * 2 + 1).to_global(sbp=B)
                          .to_local().to_torch(), timeout=QUICK)
    for o in outs:
        torch.testing.assert_close(o, full * 2 + 1)
