"""One program on every rank (docs/architecture.md, "Ranks outside a placement"): global ops,
conversions, creation, to_local and numpy() on ranks outside a placement hold no data and
raise nothing; moves between placements are differentiable; converted leaves get their
gradients; Module.to_global keeps replicas identical. Simulated ranks and real Gloo worlds,
single-process torch as the oracle."""
import pytest
import torch

import one_program_fns as fns
import holoflow as flow
from holoflow.core.errors import HoloflowError
from holoflow.distributed import world
from holoflow.distributed.global_tensor import from_full
from holoflow.sbp import B, P, S

QUICK = 20.0


def test_ops_creation_to_local_numpy_outside_the_placement():
    place = flow.placement("cpu", [1, 3])
    flow.manual_seed(3)
    want_x = torch.randn(5, 7)

    def fn(r):
        with fns.SEED_LOCK:
            flow.manual_seed(3)
            x = flow.randn(5, 7, placement=place, sbp=S(0), requires_grad=True)
            lin = flow.nn.Linear(7, 2)
        y = (x * 2).sum(1)
        lin.to_global(place, B)
        z = lin(x)
        vals, idx = x.detach().max(dim=1)
        assert tuple(y.shape) == (5,) and y.placement == place and tuple(y.sbp) == (S(0),)
        assert tuple(z.shape) == (5, 2) and idx.dtype == flow.int64 and tuple(vals.shape) == (5,)
        y.sum().backward()
        return (x.to_local().to_torch().detach(), y.detach().numpy(), x._data.numel(),
                None if x.grad is None else x.grad.detach().numpy())
    outs = world.simulate(4, fn, timeout=QUICK)
    for r in (0, 2):  # outside: no data (empty local tensors)
        local, _, numel, _ = outs[r]
        assert tuple(local.shape) == (0,) and numel == 0
    for r, rows in ((1, slice(0, 3)), (3, slice(3, 5))):
        torch.testing.assert_close(outs[r][0], want_x[rows])
    for r in range(4):  # numpy() is OneFlow's: the whole value on every rank
        torch.testing.assert_close(torch.from_numpy(outs[r][1]), want_x.sum(1) * 2)
        torch.testing.assert_close(torch.from_numpy(outs[r][3]), torch.full((5, 7), 2.0))


MOVES = [  # (src ranks, src sbp, dst ranks, dst sbp)
    ([0], (B,), [1], (B,)),
    ([0], (B,), [1], (S(0),)),
    ([0, 1], (S(0),), [2, 3], (S(1),)),
    ([0, 1], (P,), [2, 3], (B,)),
    ([0, 1], (S(1),), [1, 2, 3], (P,)),
    ([0, 1, 2, 3], (S(0),), [[0, 1], [2, 3]], (S(1), B)),
    ([[0, 1], [2, 3]], (B, S(0)), [0, 1, 2, 3], (S(1),)),
    ([[0, 1], [2, 3]], (P, S(1)), [1, 3], (S(0),)),
    ([0, 1], (S(0),), [2, 3], (S(0),)),                     # same mesh and SBP: shard to shard
    ([0, 1], (P,), [1, 2], (P,)),                           # ... with overlapping placements
    ([[0, 1], [2, 3]], (S(0), B), [[3, 2], [1, 0]], (S(0), B)),
]


def _check_moves(full, w, outs_per_rank):
    for r, per_rank in enumerate(outs_per_rank):
        for (src_ranks, src, dst_ranks, dst), (grad, gsbp, moved, gn, yn) in zip(MOVES, per_rank):
            sp, dp = flow.placement("cpu", src_ranks), flow.placement("cpu", dst_ranks)
            # d/dx sum(move(x) * w) = w, in x's own SBP (numpy() shows it on every rank)
            torch.testing.assert_close(grad, w, msg=lambda m: f"{src_ranks}{src}->{dst_ranks}{dst}: {m}")
            torch.testing.assert_close(moved, full)
            assert gsbp == src
            assert (gn == 0) == (sp.coords(r) is None) and (yn == 0) == (dp.coords(r) is None), (r, gn, yn)


def test_moves_are_differentiable_simulated():
    results = world.simulate(4, lambda r: fns.moves_with_grads(r, MOVES, (5, 6)), timeout=QUICK)
    _check_moves(results[0][0], results[0][1], [out for _, _, out in results])


def test_a_stage_boundary_moves_each_shard_once():
    """[0, 1] -> [2, 3] with S(0) on both sides: two point-to-point transfers of half the tensor
    each (forward), the same back for the gradient; no gather."""
    full = torch.randn(6, 4, dtype=torch.float64)
    sp, dp = flow.placement("cpu", [0, 1]), flow.placement("cpu", [2, 3])

    def fn(r):
        x = from_full(full, sp, S(0)).requires_grad_()
        y = x.to_global(placement=dp, sbp=S(0))
        (y * 3).sum().backward()
        return _np(y), _np(x.grad)
    outs = world.simulate(4, fn, timeout=QUICK)
    calls = world.simulate.last_comm.calls
    moves = [(k, g, n) for k, g, n in calls if k == "broadcast" and len(g) == 2]
    assert sorted(g for _, g, _ in moves) == [(0, 2), (0, 2), (1, 3), (1, 3)], calls
    assert all(n == 3 * 4 * 8 for _, _, n in moves), moves            # half the tensor each time
    for r in (2, 3):
        torch.testing.assert_close(outs[r][0], full)
    for r in (0, 1):
        torch.testing.assert_close(outs[r][1], torch.full_like(full, 3.0))


def _np(t):
    a = t.detach().numpy()
    return torch.from_numpy(a) if a.size else None


def test_moves_are_differentiable_on_gloo(world4):
    results = world4.run(fns.moves_with_grads, MOVES, (5, 6))
    _check_moves(results[0][0], results[0][1], [out for _, _, out in results])


def _check_leaves(n, outs):
    g = torch.Generator().manual_seed(0)
    locals_ = torch.randn(n, 3, 4, generator=g, dtype=torch.float64)
    w = torch.randn(n * 3, 4, generator=g, dtype=torch.float64)
    c = torch.randn(n, n * 3, 4, generator=g, dtype=torch.float64)
    for r, got in enumerate(outs):
        # torch: the logical tensor built from the locals, loss = sum(logical * w)
        a = locals_.clone().requires_grad_()
        (torch.cat(list(a)) * w).sum().backward()          # split(0): concatenated shards
        torch.testing.assert_close(got["S0"], a.grad[r])
        a = locals_.clone().requires_grad_()
        (a.sum(0) * w[:3]).sum().backward()                 # partial_sum: the sum of the locals
        torch.testing.assert_close(got["P"], a.grad[r])
        torch.testing.assert_close(got["B"], w[:3])         # broadcast: every replica gets the whole
        torch.testing.assert_close(got["nonleaf_B"], 2 * w[:3])
        assert got["copy_local"]
        for name, want_sbp in (("grad_sbp", (B,)), ("copy", (S(0),)), ("grad_sbp_box", (P,))):
            grad, sbp = got[name]
            torch.testing.assert_close(grad, w)
            assert sbp == want_sbp, (name, sbp)
        x = w.clone().requires_grad_()                      # every rank's local loss, summed
        sum((x[3 * k:3 * k + 3] * c[k][:3]).sum() for k in range(n)).backward()
        torch.testing.assert_close(got["to_local_S0"][0], x.grad)
        assert got["to_local_S0"][1] == (S(0),)
        x = w.clone().requires_grad_()
        sum((x * c[k]).sum() for k in range(n)).backward()
        torch.testing.assert_close(got["to_local_B"][0], x.grad)
        assert got["to_local_B"][1] == (B,)


def test_converted_leaves_receive_their_gradients_simulated():
    _check_leaves(2, world.simulate(2, lambda r: fns.local_leaves(r, 2), timeout=QUICK))


def test_converted_leaves_receive_their_gradients_on_gloo(world2, world4):
    _check_leaves(2, world2.run(fns.local_leaves, 2))
    _check_leaves(4, world4.run(fns.local_leaves, 4))


def _check_pipeline(results, steps):
    data = fns.pipeline_data(steps)
    want_losses, want_params = fns.two_stage_pipeline(0, data, steps, single=True)
    assert want_losses[-1].item() < want_losses[0].item()
    for losses, params in results:                          # numpy(): every rank sees the values
        for got, want in zip(losses, want_losses):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        for got, want in zip(params, want_params):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_two_stage_pipeline_eager_simulated():
    steps = 3
    data = fns.pipeline_data(steps)
    _check_pipeline(world.simulate(2, lambda r: fns.two_stage_pipeline(r, data, steps), timeout=QUICK), steps)


def test_two_stage_pipeline_eager_on_gloo(world2):
    steps = 3
    _check_pipeline(world2.run(fns.two_stage_pipeline, fns.pipeline_data(steps), steps), steps)


def test_module_to_global_makes_replicas_identical_and_to_local_gives_shards():
    models = [flow.nn.Linear(4, 6) for _ in range(2)]      # unseeded: the ranks differ
    want = models[0].weight.to_torch().clone()
    place = flow.placement("cpu", [0, 1])

    def fn(r):
        m = models[r].to_global(place, B)
        got = m.weight.to_local().to_torch().clone()
        m.to_global(sbp=S(0))
        m.to_local()
        return got, m.weight.to_torch().clone(), m.weight.is_global
    for r, (got, shard, is_global) in enumerate(world.simulate(2, fn, timeout=QUICK)):
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(shard, want[3 * r:3 * r + 3])
        assert not is_global

    def differ(r):
        flow.manual_seed(r)   # seeded apart: each rank's own generator, as each process's
        return flow.nn.Linear(4, 6).to_global(place, B, broadcast=False)
    with pytest.raises(RuntimeError, match=r"broadcast=False.*ranks \[1\] differ"):
        world.simulate(2, differ, timeout=QUICK)


def test_module_to_global_on_a_rank_outside_the_placement():
    place = flow.placement("cpu", [1])

    def fn(r):
        with fns.SEED_LOCK:
            flow.manual_seed(0)
            m = flow.nn.Linear(3, 2)
        m.to_global(place, B)
        x = flow.ones(4, 3, placement=place, sbp=B, requires_grad=True)
        out = m(x)
        gx, = flow.autograd.grad(out.sum(), [x])              # absent here, known shape and SBP
        opt = flow.optim.Adam(m.parameters(), lr=0.1)
        m(x).pow(2).sum().backward()
        g = m.weight.grad
        opt.step()
        sd = m.state_dict()
        m2 = flow.nn.Linear(3, 2).to_global(place, B)
        m2.load_state_dict(sd)
        return (m.weight._data.numel(), tuple(m.weight.shape), tuple(out.shape), out._data.numel(),
                tuple(gx.shape), gx._data.numel(), tuple(g.shape), g.placement == place, tuple(g.sbp),
                m2.weight.detach().numpy())
    outs = world.simulate(2, fn, timeout=QUICK)
    assert outs[0][:9] == (0, (2, 3), (4, 2), 0, (4, 3), 0, (2, 3), True, (B,))
    assert outs[1][:9] == (6, (2, 3), (4, 2), 8, (4, 3), 12, (2, 3), True, (B,))
    flow.manual_seed(0)                                       # rank 1 trained as one process would
    ref = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(ref.parameters(), lr=0.1)
    ref(torch.ones(4, 3)).pow(2).sum().backward()
    opt.step()
    for r in (0, 1):  # numpy() of the loaded copy: the whole value on both ranks
        torch.testing.assert_close(torch.from_numpy(outs[r][9]), ref.weight.detach())


def test_stage_boundary_without_a_move_names_both_placements_and_the_line():
    p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])

    def fn(r):
        a, b = from_full(torch.ones(2), p0, B), from_full(torch.ones(2), p1, B)
        try:
            a + b
        except HoloflowError as e:
            return str(e)
    for msg in world.simulate(2, fn, timeout=QUICK):
        assert msg is not None and str(p0) in msg and str(p1) in msg, msg
        assert "test_one_program.py:" in msg, msg


def _check_oneflow_pipeline(results, stages, steps):
    want_losses, want_params, _ = fns.oneflow_pipeline(0, None, steps)
    assert want_losses[-1].item() < want_losses[0].item()   # it trains
    for r, (losses, params, numels) in enumerate(results):
        for got, want in zip(losses, want_losses):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for i, (got, want, n) in enumerate(zip(params, want_params, numels)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            assert (n > 0) == (r in stages[0 if i < 2 else 1])  # linear0's weight and bias: stage 0


def test_oneflow_pipeline_example_simulated_2_stages_and_pp2_dp2():
    steps = 3
    for n, stages, sbp in ((2, ([0], [1]), B), (4, ([0, 1], [2, 3]), S(0))):
        results = world.simulate(n, lambda r: fns.oneflow_pipeline(r, stages, steps, sbp), timeout=QUICK)
        _check_oneflow_pipeline(results, stages, steps)


def test_oneflow_pipeline_example_on_gloo(world2, world4):
    steps = 3
    _check_oneflow_pipeline(world2.run(fns.oneflow_pipeline, ([0], [1]), steps), ([0], [1]), steps)
    stages = ([0, 1], [2, 3])
    _check_oneflow_pipeline(world4.run(fns.oneflow_pipeline, stages, steps, S(0)), stages, steps)


def test_clip_grad_norm_across_pipeline_stages():
    want_total, want_params = fns.clipped_pipeline(0, True)
    assert want_total.item() > 1.0                          # the clip is active
    for total, params in world.simulate(2, lambda r: fns.clipped_pipeline(r, False), timeout=QUICK):
        torch.testing.assert_close(total, want_total, rtol=1e-5, atol=1e-6)
        for got, want in zip(params, want_params):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_module_moves_between_placements_keeping_its_sbp():
    """Module.to_global(placement=...) alone moves a global module (SBPs kept, as OneFlow's
    Tensor.to_global); its forward and gradients follow it."""
    p01, p23 = flow.placement("cpu", [0, 1]), flow.placement("cpu", [2, 3])

    def fn(r):
        with fns.SEED_LOCK:
            flow.manual_seed(0)
            m = flow.nn.Linear(4, 6)
        m.to_global(p01, lambda name, t: S(0) if name == "weight" else B)
        m.to_global(placement=p23)
        assert m.weight.placement == p23 and tuple(m.weight.sbp) == (S(0),) and tuple(m.bias.sbp) == (B,)
        x = flow.ones(3, 4, placement=p23, sbp=B)
        m(x).sum().backward()
        return fns._whole(m.weight), fns._whole(m.weight.grad), m.weight._data.numel()
    flow.manual_seed(0)
    ref = torch.nn.Linear(4, 6)
    ref(torch.ones(3, 4)).sum().backward()
    for r, (w, g, n) in enumerate(world.simulate(4, fn, timeout=QUICK)):
        torch.testing.assert_close(w, ref.weight.detach())
        torch.testing.assert_close(g, ref.weight.grad)
        assert n == (12 if r >= 2 else 0)
