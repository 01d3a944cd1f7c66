"""Every op family under random SBP assignments of its inputs on real Gloo ranks, against the
single-process result: values and input gradients (tests/ops case tables drive it). The sampling
table (grid_sample, unfold/fold, 3-d pooling, bicubic interpolate, embedding_bag, ctc_loss) runs a
few cases of each op: all of it cost ~70 s here."""
import pytest

import dist_fns

MODULES = ["ops.test_elementwise", "ops.test_reduction", "ops.test_linalg", "ops.test_shape",
           "ops.test_indexing", "ops.test_nn_ops", "ops.test_loss"]


def _run(world, ranks, module, step, combos, per_op=None):
    names = dist_fns.op_case_names(module, step) if per_op is None else dist_fns.op_case_names_per_op(module, per_op)
    assert names, f"{module}: no cases selected"
    results = world.run(dist_fns.run_op_cases, ranks, module, names, combos, timeout=600)
    checked, failures, local_only = results[0]
    assert not failures, f"{module}: {len(failures)} failures:\n" + "\n".join(failures[:30])
    assert checked >= len(names) - len(local_only), (checked, len(names), local_only)
    assert len(local_only) <= len(names) // 3, f"too many cases could not be globalized: {local_only}"
    return checked


@pytest.mark.parametrize("module", MODULES)
def test_ops_under_sbp_on_2_ranks(world2, module):
    _run(world2, [0, 1], module, 4, 2)


@pytest.mark.parametrize("module", MODULES)
def test_ops_under_nd_sbp_on_a_2x2_mesh(world4, module):
    _run(world4, [[0, 1], [2, 3]], module, 12, 1)


def test_sampling_ops_under_sbp_on_2_ranks(world2):
    _run(world2, [0, 1], "ops.test_sampling", None, 2, per_op=2)


def test_sampling_ops_under_nd_sbp_on_a_2x2_mesh(world4):
    _run(world4, [[0, 1], [2, 3]], "ops.test_sampling", None, 1, per_op=1)
