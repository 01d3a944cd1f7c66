"""A 2 x 2 mesh (data parallel x Megatron tensor parallel) MLP trained in an nn.Graph with AdamW
(weight decay), gradient clipping and gradient accumulation, on a Gloo world of 4 ranks and on 4
simulated ranks, equals torch on one process: per micro-batch losses and the parameters after 3
steps, with the labels split like the batch or broadcast."""
import pytest
import torch

import micro_fns as F
from holoflow.distributed import world
from holoflow.sbp import B, S


def _check(results, m: int) -> None:
    want_losses, want_params = F.torch_megatron(m)
    for losses, params in results:
        for got, want in zip(losses, want_losses):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
        for a, b in zip(params, want_params):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("label", ["S0", "B"])
@pytest.mark.parametrize("m", [1, 2])
def test_megatron_2d_simulated(m, label):
    sbp = [S(0), B] if label == "S0" else [B, B]
    _check(world.simulate(4, lambda r: F.megatron_2d(r, m, sbp), timeout=180), m)


def test_megatron_2d_on_gloo(world4):
    _check(world4.run(F.megatron_2d, 2, [B, B], timeout=300), 2)
