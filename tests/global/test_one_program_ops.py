"""The op tables on a rank outside the placement: every case runs on placement [1] of a
2-rank simulated world, and rank 0 (outside) must see what rank 1 sees — the same logical
shapes, dtypes, placements and SBPs of outputs and input gradients, empty local tensors — or
fail exactly when rank 1 fails. No op-specific branch: the engine skips kernels generically."""
import pytest

import dist_fns
import one_program_fns as fns
from holoflow.distributed import world

MODULES = ["ops.test_elementwise", "ops.test_reduction", "ops.test_linalg", "ops.test_shape",
           "ops.test_indexing", "ops.test_nn_ops", "ops.test_loss", "ops.test_nn_extra",
           "ops.test_decomp", "ops.test_sampling"]


@pytest.mark.parametrize("module", MODULES)
def test_ops_on_a_rank_outside_the_placement(module):
    names = dist_fns.op_case_names(module, 1)
    inside, outside = None, None
    out = world.simulate(2, lambda r: fns.outside_op_cases(r, module, names), timeout=60)
    outside, inside = out
    bad = []
    for name in names:
        o, i = outside[name], inside[name]
        if isinstance(i, str):      # fails inside: outside may skip the kernel that failed
            continue
        if isinstance(o, str):
            bad.append(f"{name}: raised outside the placement: {o}")
            continue
        for k, (a, b) in enumerate(zip(o, i)):
            if isinstance(b, list):  # input gradients: same shape and SBP, empty outside
                for ga, gb in zip(a, b):
                    if (ga is None) != (gb is None) or (ga is not None and (ga[:2] != gb[:2] or ga[2])):
                        bad.append(f"{name}: input gradient {ga} outside vs {gb} inside")
            elif a[:4] != b[:4] or a[4]:
                bad.append(f"{name}: output {k} {a} outside vs {b} inside")
        if len(o) != len(i):
            bad.append(f"{name}: {len(o)} results outside vs {len(i)} inside")
    assert not bad, f"{module}: {len(bad)} cases differ:\n" + "\n".join(bad[:40])
