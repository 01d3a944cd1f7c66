"""An nn.Graph step counts as one eager ``opt.step()``: ``opt._step_count`` (what LR schedulers'
order check and step hooks read) and each parameter's ``state['step']`` go up once per graph call,
and a scheduler attached with ``add_optimizer(opt, lr_sch=...)`` steps once per call, its
``get_last_lr()`` equal to eager's after N steps: with parameter groups, gradient accumulation
(once per call, not per micro-batch), ZeRO, a fused update, a GradScaler (a step it skips counts
none, as torch's skipped ``opt.step()``), on local and global graphs and on pipeline stages (each
stage's rank counts once, whatever placements and groups its share holds). The count used to go
up once per parameter group and placement of each step."""
import pytest
import torch

import micro_fns as F
from holoflow.distributed import world

MODES = ["plain", "acc", "fuse", "scaler", "overflow"]
GLOBAL_MODES = MODES + ["eager", "zero1", "zero2", "zero3"]


def _check(got, want) -> None:
    (log, params), (want_log, want_params) = got, want
    assert len(log) == len(want_log)
    for (count, steps, lrs, epoch), (w_count, w_steps, w_lrs, w_epoch) in zip(log, want_log):
        assert (count, steps, epoch) == (w_count, w_steps, w_epoch)
        assert lrs == pytest.approx(w_lrs)
    for a, b in zip(params, want_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES + ["eager"])
def test_a_local_graph_step_counts_once(mode):
    _check(F.counted_steps(None, mode), F.counted_steps(None, mode, lib=torch))


@pytest.mark.parametrize("mode", GLOBAL_MODES)
def test_a_global_graph_step_counts_once_simulated(mode):
    want = F.counted_steps(None, mode, lib=torch)
    for got in world.simulate(2, lambda r: F.counted_steps(r, mode), timeout=120):
        _check(got, want)


def test_a_global_graph_step_counts_once_on_gloo(world2):
    for mode in ("acc", "zero2"):
        want = F.counted_steps(None, mode, lib=torch)
        for got in world2.run(F.counted_steps, mode):
            _check(got, want)


@pytest.mark.parametrize("m,scaler", [(1, False), (2, False), (2, True)], ids=["m1", "m2", "m2-scaler"])
def test_each_pipeline_stage_counts_once(m, scaler):
    want_log, want_params = F.torch_counted_stages(m)
    mine = [(0, 1), (2,)]   # the parameters of each stage: w0, b0 on rank 0; w1 on rank 1
    for rank, (log, params) in enumerate(world.simulate(2, lambda r: F.counted_stages(r, m, scaler), timeout=120)):
        for (count, steps, lrs), (w_count, w_steps, w_lrs) in zip(log, want_log, strict=True):
            assert count == w_count
            assert [steps[i] for i in mine[rank]] == [w_steps[i] for i in mine[rank]]
            assert lrs == pytest.approx(w_lrs)
        for a, b in zip(params, want_params):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
