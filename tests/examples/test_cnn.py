"""The digits ResNet example: a few epochs reach high test accuracy; same code under torch agrees."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn", reason="the digits dataset ships with scikit-learn (extra 'examples')")

import holoflow as flow  # noqa: E402
import holoflow.nn  # noqa: E402,F401
import holoflow.optim  # noqa: E402,F401
from holoflow.examples import cnn  # noqa: E402


def test_few_epochs_reach_high_accuracy(capsys):
    res = cnn.main(["--epochs", "3", "--width", "16"])
    assert res["test_acc"] > 0.95, res["acc_history"]
    assert np.mean(res["losses"][-5:]) < 0.5 * np.mean(res["losses"][:5])
    assert "final test accuracy" in capsys.readouterr().out


def test_same_code_under_torch_gives_the_same_losses():
    cfg = cnn.Config(epochs=1, width=8)
    xtr, ytr, xte, yte = cnn.load_digits()
    data = (xtr[:256], ytr[:256], xte, yte)
    fmodel = cnn.make_model(flow, cfg)
    tmodel = cnn.build(torch)(cfg.width)
    tmodel.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in fmodel.state_dict().items()})
    fl = cnn.train(flow, cfg, data=data, model=fmodel)["losses"]
    tl = cnn.train(torch, cfg, data=data, model=tmodel)["losses"]
    np.testing.assert_allclose(fl, tl, rtol=2e-3)
