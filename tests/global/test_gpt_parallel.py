"""examples/gpt_parallel.py: data x tensor parallel GPT training equals single-process training."""
from dataclasses import asdict

import pytest
import torch

import holoflow as flow
from holoflow.core.sbp import B, P, S
from holoflow.examples import gpt, gpt_parallel

import gpt_parallel_fns

CFG = gpt.Config(steps=3, batch_size=4, block_size=8, n_layer=1, n_embd=16, n_head=4, warmup=1,
                 corpus_chars=20_000)


def test_param_sbp_is_megatron_column_then_row():
    model = gpt.make_model(flow, CFG)
    got = {n: gpt_parallel.param_sbp(n, p) for n, p in model.named_parameters()}
    assert got["blocks.0.attn.qkv.weight"] == (B, S(0)) and got["blocks.0.mlp.fc.bias"] == (B, S(0))
    assert got["blocks.0.attn.proj.weight"] == (B, S(1)) and got["blocks.0.mlp.proj.weight"] == (B, S(1))
    assert got["blocks.0.attn.proj.bias"] == (B, B) and got["tok.weight"] == (B, B)
    with pytest.raises(ValueError, match="does not divide"):
        gpt_parallel.mesh(4, 3)


def test_2x2_data_and_tensor_parallel_matches_single_process(world4):
    want = gpt.train(flow, CFG, evaluate_every=False)["train"]
    results = world4.run(gpt_parallel_fns.train_losses, asdict(CFG), 2, timeout=240)
    for losses, comms in results:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), rtol=1e-4, atol=0)
        # the row-parallel sums and the data-parallel gradient reductions really happen
        assert comms.get("all_reduce", 0) > 0


@pytest.mark.parametrize("tp,zero", [(2, 0), (1, 2), (1, 3)])
def test_graph_of_global_tensors_matches_single_process(world4, tp, zero):
    """--graph: the step as an nn.Graph (2x2 DP x TP mesh, or 4-way DP with ZeRO-2 or 3) gives the
    single-process losses; every boxing node names a line of the model or the training step."""
    want = gpt.train(flow, CFG, evaluate_every=False)["train"]
    for losses, boxing in world4.run(gpt_parallel_fns.graph_losses, asdict(CFG), tp, zero, timeout=240):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), rtol=1e-4, atol=0)
        assert boxing and all(src and (line.startswith("gpt.py:") or line.startswith("gpt_parallel.py:"))
                              for src, _, line in boxing), boxing
        if zero >= 2:
            assert any(src[0] == P and dst[0] == S(0) for src, dst, _ in boxing)   # reduce-scattered grads
        if zero == 3:   # parameters gathered from their shards
            assert any(src[0] == S(0) and dst[0] == B for src, dst, _ in boxing)


def test_auto_parallel_graph_matches_single_process(world4):
    """--graph --auto: the GPT placed broadcast on the 2x2 mesh, its layout chosen by the cost
    model (graph/auto_parallel.py), trains as one process does."""
    want = gpt.train(flow, CFG, evaluate_every=False)["train"]
    for losses, _ in world4.run(gpt_parallel_fns.graph_losses, asdict(CFG), 2, 0, True, timeout=400):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), rtol=1e-4, atol=0)
