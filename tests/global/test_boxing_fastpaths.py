"""TorchComm's fast paths (even splits over a group in rank order) on real Gloo ranks: every 1-D
boxing pair on even shapes, in rank order and reversed (which takes the general path)."""
import dist_fns
from test_global_dist import ONE_D, _check_pairs


def test_even_boxing_pairs_in_rank_order_and_reversed(world2):
    for ranks in ([0, 1], [1, 0]):
        _check_pairs(world2.run(dist_fns.box_pairs, ranks, (4, 6), ONE_D), ranks, (4, 6), 1)


def test_even_boxing_pairs_on_a_2x2_mesh(world4):
    import itertools

    from holoflow.sbp import B, P, S
    nds = [nd for nd in itertools.product([S(0), S(1), B, P], repeat=2) if P not in nd or nd.count(P) == 1]
    _check_pairs(world4.run(dist_fns.box_pairs, [[0, 1], [2, 3]], (4, 8), nds, timeout=300),
                 [[0, 1], [2, 3]], (4, 8), 2)
