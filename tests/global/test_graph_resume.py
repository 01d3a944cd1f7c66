"""Saving and resuming a global graph-trained model (``graph.state_dict()``, ``flow.save`` /
``flow.load``, ``graph.load_state_dict``) equals uninterrupted single-process torch training, for
data parallelism with every ZeRO stage and Megatron column/row SBPs. ZeRO stages 1 and 2 used
to keep each rank's rows of the optimizer state as local tensors: a checkpoint file held one
rank's rows for every rank (the resumed run diverged, silently), eager steps after the graph
were refused, and a graph without ZeRO could not take that state."""
import os

import pytest
import torch

import micro_fns as F
from holoflow.distributed import world


def _check(results) -> None:
    want = F.torch_resumed_mlp()
    for got in results:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tp", [False, True], ids=["dp", "tp"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_save_load_resume_simulated(tmp_path, stage, tp):
    path = os.fspath(tmp_path / "ckpt")
    _check(world.simulate(2, lambda r: F.resumed_mlp(r, stage, tp, path), timeout=120))


@pytest.mark.parametrize("stage", [1, 2])
def test_save_load_resume_on_gloo(world2, tmp_path, stage):
    _check(world2.run(F.resumed_mlp, stage, False, os.fspath(tmp_path / "ckpt")))


@pytest.mark.parametrize("then", ["eager", "zero0", "zero2"])
def test_zero1_state_continues_eagerly_or_in_another_graph(then):
    """ZeRO-1 rows of the state, stepped eagerly after the graph, or loaded into a graph without
    ZeRO or with stage 2."""
    if then == "eager":
        res = world.simulate(2, lambda r: F.resumed_mlp(r, 1, False, None, "eager"), timeout=120)
    else:
        res = world.simulate(2, lambda r: F.resumed_mlp(r, 1, False, None, "same", int(then[-1])), timeout=120)
    _check(res)


def test_collectives_of_a_program_pair_up_when_ranks_compiled_different_numbers_of_plans(world2):
    """Generated programs are numbered per process; the collective checker identified a call by
    that number, so a ZeRO update's all-gather after rank 0 alone had compiled another graph
    raised a false "mismatched collectives" CommError."""
    want = F.torch_square_loss_steps(1)
    for got in world2.run(F.after_uneven_compiles):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
