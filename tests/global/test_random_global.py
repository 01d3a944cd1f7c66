"""Random ops on global tensors: equal values on ranks holding the same shard (broadcast axes),
different draws on different shards (split axes), whatever each rank's generator holds — eager and
nn.Graph, simulated ranks and Gloo worlds (distributed/rng.py, OneFlow's rule)."""
import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.core.errors import HoloflowError
from holoflow.distributed import rng, world
from holoflow.graph.ir import Node, uncompilable
from holoflow.sbp import B, P, S

import random_fns

ONE_D = [(B,), (S(0),), (S(1),)]
TWO_D = [(S(0), B), (B, S(0)), (S(0), S(1)), (B, B)]
MESH = [[0, 1], [2, 3]]


def _coords(rank: int, ndim: int) -> tuple:
    return (rank,) if ndim == 1 else (rank // 2, rank % 2)


def _same_shard(r1: int, r2: int, nd) -> bool:
    """Whether two ranks hold the same shard: their mesh coordinates agree on every split axis."""
    c1, c2 = _coords(r1, len(nd)), _coords(r2, len(nd))
    return all(a == b for a, b, s in zip(c1, c2, nd) if isinstance(s, S))


def _check(results: list, nds) -> None:
    """Same shard: equal arrays; another shard: different draws; dropout keeps about half, each
    kept value scaled to exactly 2, and its gradient is the mask it drew."""
    keys = [k for k in results[0] if k[1] in nds]
    assert {k[0] for k in keys} >= set(random_fns.DRAWS) | {"dropout_grad"}
    for name, nd in keys:
        for r1 in range(len(results)):
            for r2 in range(r1 + 1, len(results)):
                a, b = results[r1][(name, nd)], results[r2][(name, nd)]
                a, b = (a[0], b[0]) if name == "dropout_grad" else (a, b)
                if _same_shard(r1, r2, nd):
                    assert np.array_equal(a, b), f"{name} {nd}: ranks {r1} and {r2} hold one shard but differ"
                else:
                    assert not np.array_equal(a, b), f"{name} {nd}: ranks {r1} and {r2} drew the same numbers"
        for r, res in enumerate(results):
            if name == "dropout":
                y = res[(name, nd)]
                assert set(np.unique(y)) <= {0.0, 2.0} and 0.4 < (y == 0).mean() < 0.6, (nd, r)
            if name == "dropout_grad":
                y, grad = res[(name, nd)]
                assert np.array_equal(grad, y), f"dropout's gradient on rank {r} is not its mask ({nd})"


def test_eager_draws_on_2_simulated_ranks_seeded_apart():
    _check(world.simulate(2, lambda r: random_fns.eager_draws(r, [0, 1], ONE_D)), ONE_D)


def test_eager_draws_on_a_simulated_2x2_mesh():
    _check(world.simulate(4, lambda r: random_fns.eager_draws(r, MESH, TWO_D)), TWO_D)


def test_eager_draws_on_gloo_ranks_seeded_apart_and_alike(world2):
    _check(world2.run(random_fns.eager_draws, [0, 1], ONE_D), ONE_D)
    # seeded alike (the usual set-up): split shards still draw apart, and a rerun repeats them
    first = world2.run(random_fns.eager_draws, [0, 1], ONE_D, 7)
    _check(first, ONE_D)
    again = world2.run(random_fns.eager_draws, [0, 1], ONE_D, 7)
    for r in range(2):
        for k, v in first[r].items():
            assert all(np.array_equal(x, y) for x, y in zip(v, again[r][k])) if isinstance(v, tuple) \
                else np.array_equal(v, again[r][k]), k


def test_eager_draws_on_a_gloo_2x2_mesh(world4):
    _check(world4.run(random_fns.eager_draws, MESH, TWO_D, timeout=300), TWO_D)


def test_rand_like_of_a_partial_sum_is_broadcast():
    (sbp0, a), (sbp1, b) = world.simulate(2, lambda r: random_fns.partial_input(r, [0, 1]))
    assert sbp0 == sbp1 == str((B,)) and np.array_equal(a, b)


def test_one_eager_draw_costs_one_broadcast_of_its_seed():
    def run(rank):
        place = flow.placement("cpu", [0, 1])
        x = flow.ones(8, 4, placement=place, sbp=S(0))
        with flow.comm.count() as c:
            flow.nn.functional.dropout(x, 0.5)
        return dict(c.counts)
    assert world.simulate(2, run) == [{"broadcast": 1}] * 2


@pytest.mark.parametrize("nd", [(B,), (S(0),)], ids=["B", "S0"])
def test_graph_draws_fresh_each_step_equal_on_one_shard(nd):
    results = world.simulate(2, lambda r: random_fns.graph_draws(r, [0, 1], nd))
    _check_graph(results, nd)


def test_graph_draws_on_gloo_ranks_seeded_apart(world2):
    for nd in ((B,), (S(1),)):
        _check_graph(world2.run(random_fns.graph_draws, [0, 1], nd), nd)


def _check_graph(results: list, nd) -> None:
    for step in range(len(results[0])):
        for i in range(2):   # dropout, rand_like
            a, b = results[0][step][i], results[1][step][i]
            assert np.array_equal(a, b) == _same_shard(0, 1, nd), (nd, step, i)
    for r in range(2):
        drops = [out[0] for out in results[r]]
        assert not np.array_equal(drops[0], drops[1]), f"rank {r}: the graph drew the same mask twice"
        assert all(set(np.unique(d)) <= {0.0, 4.0} and 0.4 < (d == 0).mean() < 0.6 for d in drops)


def test_shard_index_numbers_ranks_along_split_axes_only():
    place = flow.placement("cpu", [[0, 1, 2], [3, 4, 5]])
    idx = {nd: [rng.shard_index(place, nd, r) for r in range(6)]
           for nd in [(S(0), S(1)), (S(0), B), (B, S(1)), (B, B), (S(1), S(0))]}
    assert idx[(S(0), S(1))] == [0, 1, 2, 3, 4, 5] == idx[(S(1), S(0))]   # the tensor axis does not matter
    assert idx[(S(0), B)] == [0, 0, 0, 1, 1, 1]
    assert idx[(B, S(1))] == [0, 1, 2, 0, 1, 2]
    assert idx[(B, B)] == [0] * 6


def test_a_partial_random_output_is_refused():
    place = flow.placement("cpu", [0, 1])
    with pytest.raises(HoloflowError, match=r"holoflow\.dropout: a random output can be broadcast or split.*partial"):
        rng.rank_seed(5, place, (P,), 0, "dropout")


def test_mixed_seeds_are_distinct_and_in_range():
    seeds = {rng.mix(12345, i) for i in range(4096)}
    assert len(seeds) == 4096 and all(0 <= s < 2 ** 63 for s in seeds)
    assert rng.mix(1, 0) != rng.mix(2, 0)


def test_a_node_with_its_own_generator_is_not_compiled():
    gen = torch.Generator().manual_seed(0)
    assert uncompilable(Node("dropout", (), {"p": 0.5, "generator": gen}, ()))
    assert not uncompilable(Node("dropout", (), {"p": 0.5}, ()))


def test_pipeline_stages_draw_alike_on_a_stages_broadcast_ranks():
    import pipeline_fns
    init = pipeline_fns.init_state()
    losses = world.simulate(4, lambda r: random_fns.pipeline_losses(r, init))
    assert losses[0] == losses[1] == [] and len(losses[2]) == 2
    for a, b in zip(losses[2], losses[3]):
        assert np.array_equal(a, b), "stage 1's broadcast ranks drew different dropout masks"
    assert not np.array_equal(losses[2][0], losses[2][1])
