"""BatchNorm under micro-batches (pipeline stages): each micro-batch's forward is a momentum
update of the running statistics, as in eager training with gradient accumulation (OneFlow's
semantics of set_gradient_accumulation_steps): m updates per step, not the last micro-batch's."""
import numpy as np
import pytest

from holoflow.distributed import world

import pipeline_fns as F
from test_pipeline_stages import _rel

INIT = F.bn_init()


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_running_stats_take_one_update_per_micro_batch(schedule):
    want = F.bn_reference(INIT, steps=2, m=4)
    assert int(want["s0.1.num_batches_tracked"]) == 8
    res = world.simulate(2, lambda r: F.bn_pipelined(r, INIT, 2, 4, schedule))
    stage0 = res[0]
    assert int(stage0["s0.1.num_batches_tracked"]) == 8
    for out in res:
        assert _rel(out, want) < 1e-5
    # one update per step (the last micro-batch's) would be far off
    assert np.abs(stage0["s0.1.running_mean"] - INIT["s0.1.running_mean"]).max() > 1e-3


def test_running_stats_on_gloo(world2):
    want = F.bn_reference(INIT, steps=2, m=4)
    for out in world2.run(F.bn_pipelined, INIT, 2, 4, "zb-h1", timeout=240):
        assert _rel(out, want) < 1e-5
