"""CheckpointManager in one process and on simulated ranks: every / keep / the latest pointer,
temp files of killed saves, bad pointers."""
import json
import os

import pytest
import torch

import holoflow as flow
from holoflow.checkpoint import CheckpointManager
from holoflow.distributed.global_tensor import from_full
from holoflow.distributed.world import simulate
from holoflow.sbp import S
from holoflow.serialization import CheckpointError


def test_every_keep_and_latest_in_one_process(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", every=3, keep=2)
    assert mgr.load() is None and mgr.latest() is None
    saved = [s for s in range(1, 13) if mgr.save(s, {"w": flow.full((2,), float(s)), "step": s})]
    assert saved == [3, 6, 9, 12] and mgr.steps() == [9, 12]
    step, ck = mgr.load()
    assert step == 12 and ck["step"] == 12 and ck["w"].tolist() == [12.0, 12.0]
    assert json.load(open(tmp_path / "ck" / "latest")) == {"step": 12, "path": "step-00000012.hf"}
    assert mgr.save(13, {"x": 1}, force=True).endswith("step-00000013.hf") and mgr.latest()[0] == 13


def test_killed_saves_leave_nothing_behind_and_latest_stays_complete(tmp_path):
    d = tmp_path / "ck"
    mgr = CheckpointManager(d, every=1, keep=3)
    mgr.save(1, {"v": 1})
    (d / "step-00000002.hf.holoflow-tmp-999999999").write_bytes(b"partial")   # killed mid-save
    (d / "latest.holoflow-tmp-999999998").write_text("{")                       # killed mid-pointer
    assert mgr.load()[1]["v"] == 1
    mgr.save(2, {"v": 2})
    assert sorted(os.listdir(d)) == ["latest", "step-00000001.hf", "step-00000002.hf"]


def test_bad_pointers_and_arguments(tmp_path):
    d = tmp_path / "ck"
    mgr = CheckpointManager(d)
    mgr.save(1, {"v": 1})
    (d / "latest").write_text('{"step": 1, "path": "../../etc/passwd"}')
    with pytest.raises(CheckpointError, match="not a checkpoint pointer"):
        mgr.load()
    (d / "latest").write_text('{"step": 5, "path": "step-00000005.hf"}')
    with pytest.raises(CheckpointError, match="step-00000005.hf, which is missing"):
        mgr.load()
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        CheckpointManager(d, every=0)
    with pytest.raises(ValueError, match="keep must be an int >= 1"):
        CheckpointManager(d, keep=0)


def test_global_trees_on_simulated_ranks(tmp_path):
    d = tmp_path / "ck"
    place = flow.placement("cpu", [0, 1])
    full = torch.arange(10.0).reshape(5, 2)

    def fn(r):
        mgr = CheckpointManager(d, every=2, keep=1)
        for s in range(1, 5):
            mgr.save(s, {"w": from_full(full * s, place, S(0))})
        step, ck = mgr.load(like={"w": from_full(torch.zeros(5, 2), place, S(1))})
        return step, ck["w"].sbp, ck["w"].to_local().to_torch()
    for r, (step, sbp, local) in enumerate(simulate(2, fn)):
        assert step == 4 and sbp == (S(1),) and torch.equal(local, (full * 4)[:, r:r + 1])
    assert sorted(os.listdir(d)) == ["latest", "step-00000004"]
