"""One program written with global tensors, run as eager global steps, as an nn.Graph (with and
without gradient accumulation) on 2 simulated ranks and on a Gloo world of 2, equals torch on
one process: ``to_global`` re-layouts inside ``build()`` (``S(0) -> S(1)``, a partial sum to
``S(1)``, ``S(1) -> S(0)``), an in-place write through a view of a global value, and BatchNorm
on an ``S(0)`` batch (statistics and running buffers of the whole batch, as holoflow's global
BatchNorm is; m momentum updates per step under gradient accumulation, as eager's m forwards)."""
import pytest
import torch

import micro_fns as F
from holoflow.distributed import world


def _check(results, m: int) -> None:
    want_losses, want_state = F.torch_relayouts(m)
    for losses, state in results:
        for got, want in zip(losses, want_losses):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
        for a, b in zip(state, want_state):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode,m", [("eager", 1), ("graph", 1), ("graph", 2)])
def test_relayouts_views_and_batchnorm_simulated(mode, m):
    _check(world.simulate(2, lambda r: F.relayouts(r, m, mode), timeout=120), m)


def test_relayouts_views_and_batchnorm_on_gloo(world2):
    _check(world2.run(F.relayouts, 2, "graph"), 2)
