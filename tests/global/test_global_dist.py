"""The global view on real multi-process Gloo worlds (2 and 4 ranks, started once per session)."""
import torch

from holoflow.distributed.sharding import shard_of
import holoflow as flow
from holoflow.sbp import B, P, S

import dist_fns

ONE_D = [(S(0),), (S(1),), (B,), (P,)]
EXPECTED = {("S", "B"): {"all_gather": 1}, ("P", "B"): {"all_reduce": 1}, ("P", "S"): {"reduce_scatter": 1},
            ("S", "S"): {"all_to_all": 1}, ("B", "S"): {}, ("B", "P"): {}, ("S", "P"): {}}   # S -> P: the shard in place in zeros


def _kind(s):
    return "S" if isinstance(s, S) else ("B" if s == B else "P")


def _check_pairs(results, ranks, shape, nd):
    place = flow.placement("cpu", ranks)
    full = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for rank, per_rank in enumerate(results):
        for src, dst, local, whole, counts in per_rank:
            torch.testing.assert_close(whole, full, msg=lambda m: f"{src}->{dst}: {m}")
            if P not in dst:
                torch.testing.assert_close(local, shard_of(full, dst, place, rank))
            if nd == 1:
                want = {} if src == dst else EXPECTED[(_kind(src[0]), _kind(dst[0]))]
                assert counts == want, f"{src}->{dst}: collectives {counts}, expected {want}"
    if nd == 1:
        for i, (_src, dst, *_rest) in enumerate(results[0]):
            if dst == (P,):
                torch.testing.assert_close(sum(r[i][2] for r in results), full)


def test_boxing_every_1d_pair_on_2_ranks_uneven(world2):
    _check_pairs(world2.run(dist_fns.box_pairs, [0, 1], (5, 3), ONE_D), [0, 1], (5, 3), 1)


def test_boxing_every_1d_pair_on_4_ranks_uneven(world4):
    _check_pairs(world4.run(dist_fns.box_pairs, [0, 1, 2, 3], (6, 7), ONE_D), [0, 1, 2, 3], (6, 7), 1)


def test_boxing_every_2d_pair_on_a_2x2_mesh(world4):
    import itertools
    nds = list(itertools.product([S(0), S(1), B, P], repeat=2))
    _check_pairs(world4.run(dist_fns.box_pairs, [[0, 1], [2, 3]], (5, 6), nds, timeout=300), [[0, 1], [2, 3]], (5, 6), 2)


def _data(steps=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(steps, 8, 6, generator=g)
    return xs, torch.randn(steps, 8, 6, generator=g), torch.randn(6, 10, generator=g) * 0.3, \
        torch.randn(10, 6, generator=g) * 0.3


def test_data_tensor_and_2d_parallel_training_match_single_process(world2, world4):
    data = _data()
    losses, w1, w2 = dist_fns.mlp_step(0, "single", 4, data)
    for world, mode in ((world2, "dp"), (world2, "tp"), (world4, "2d")):
        for got_losses, g1, g2 in world.run(dist_fns.mlp_step, mode, 4, data):
            torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(losses), rtol=1e-5, atol=1e-6,
                                       msg=lambda m, mode=mode: f"{mode}: {m}")
            torch.testing.assert_close(g1, w1, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(g2, w2, rtol=1e-5, atol=1e-6)
