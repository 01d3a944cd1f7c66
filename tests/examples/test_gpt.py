"""The GPT example: a tiny run trains and checkpoints; the same code under torch gives the same losses."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import holoflow as flow
import holoflow.nn  # noqa: F401
import holoflow.optim  # noqa: F401
from holoflow.examples import corpus, gpt

TINY = ["--steps", "30", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "16",
        "--batch-size", "8", "--lr", "1e-2", "--eval-interval", "15", "--sample-len", "20"]


@pytest.fixture(scope="module")
def data():
    return corpus.splits(60_000)


def test_corpus_is_deterministic_and_in_vocab():
    a, b = corpus.load_text(50_000), corpus.load_text(50_000)
    assert a == b and len(a) == 50_000
    ids = corpus.encode(a)
    assert ids.min() >= 0 and ids.max() < len(corpus.VOCAB)
    assert corpus.decode(ids[:200]) == a[:200]


def test_tiny_run_trains_and_checkpoint_reloads(tmp_path, capsys):
    res = gpt.main(TINY + ["--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "checkpoint:" in out and len(res["history"]) == 30
    assert res["first"] > 4.0                       # ~ln(96) at init
    assert res["train"] < res["first"] - 0.8, res   # clearly learning
    assert [s for s, _ in res["val_history"]] == [15, 30]
    ckpt = flow.load(os.path.join(tmp_path, "ckpt.pt"))
    cfg = gpt.Config(**ckpt["config"])
    model = gpt.make_model(flow, gpt.Config(**{**ckpt["config"], "seed": 999}))  # different init
    model.load_state_dict(ckpt["model"])
    opt = gpt.make_optimizer(flow, model, cfg)
    opt.load_state_dict(ckpt["optimizer"])
    assert len(opt.state) == len(list(model.parameters()))
    val = gpt.evaluate(flow, model, corpus.splits(cfg.corpus_chars)[1], cfg)
    assert val == pytest.approx(res["val"], rel=1e-6)


def _torch_twin(fmodel, cfg: gpt.Config):
    tmodel = gpt.build(torch)(cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.tie)
    state = {k: torch.from_numpy(np.array(v.detach().numpy())) for k, v in fmodel.state_dict().items()}
    tmodel.load_state_dict(state)
    return tmodel


@pytest.mark.parametrize("tie", [True, False])
def test_same_code_under_torch_gives_the_same_losses(data, tie):
    cfg = gpt.Config(steps=12, n_layer=2, n_embd=32, n_head=4, block_size=16, batch_size=4, lr=3e-3,
                     warmup=3, tie=tie, seed=7)
    fmodel = gpt.make_model(flow, cfg)
    tmodel = _torch_twin(fmodel, cfg)
    fl = gpt.train(flow, cfg, model=fmodel, data=data, evaluate_every=False)["train"]
    tl = gpt.train(torch, cfg, model=tmodel, data=data, evaluate_every=False)["train"]
    np.testing.assert_allclose(fl, tl, rtol=2e-3)
    assert tl[-1] < tl[0]


def test_bf16_autocast_run_trains(data):
    cfg = gpt.Config(steps=10, n_layer=1, n_embd=32, n_head=2, block_size=16, batch_size=8, lr=1e-2,
                     warmup=2, dtype="bf16")
    fl = gpt.train(flow, cfg, data=data, evaluate_every=False)["train"]
    tl = gpt.train(torch, cfg, model=_torch_twin(gpt.make_model(flow, cfg), cfg), data=data,
                   evaluate_every=False)["train"]
    assert fl[-1] < fl[0] - 0.3
    np.testing.assert_allclose(fl, tl, rtol=3e-2)  # bf16 matmuls on both sides
