"""Sharded directories written by older holoflow still load. ``data/sharded_v1`` (format version
1) was written by the code of commit 0feeaab, before local views were kept (each local tensor was
a dense copy) and before dtypes safetensors lacks were taken, by

    simulate(2, lambda r: flow.save(_tree(flow.placement("cpu", [0, 1])), "sharded_v1"))
"""
import os

import torch

import holoflow as flow
from holoflow.distributed.global_tensor import from_full
from holoflow.distributed.sharding import shard_of
from holoflow.distributed.world import simulate
from holoflow.sbp import B, S

V1 = os.path.join(os.path.dirname(__file__), "data", "sharded_v1")
PLACE = flow.placement("cpu", [0, 1])


def _tree(place):
    base = flow.from_torch(torch.arange(12.0).reshape(3, 4))
    w = from_full(torch.arange(10.0).reshape(5, 2) / 4, place, S(0))
    return {"step": 7, "w": w, "again": w, "h": from_full(torch.arange(6).to(torch.bfloat16), place, B),
            "base": base, "rows": base[1:], "T": base.T, "i": flow.from_torch(torch.tensor([3, -4, 5])),
            "nested": [flow.from_torch(torch.tensor(2.5)), {"k": base}],
            "p": flow.from_torch(torch.ones(2)).requires_grad_(True)}


def _want():
    base = torch.arange(12.0).reshape(3, 4)
    return {"w": torch.arange(10.0).reshape(5, 2) / 4, "h": torch.arange(6).to(torch.bfloat16), "base": base,
            "rows": base[1:], "T": base.T, "i": torch.tensor([3, -4, 5]), "p": torch.ones(2)}


def test_a_version_1_directory_loads_whole_in_one_process():
    got, want = flow.load(V1), _want()
    assert got["step"] == 7 and got["again"] is got["w"] and got["nested"][1]["k"] is got["base"]
    assert got["nested"][0].item() == 2.5 and got["p"].requires_grad and not got["base"].requires_grad
    for k, v in want.items():
        t = got[k].to_torch()
        assert got[k].is_local and t.dtype == v.dtype and torch.equal(t, v), k


def test_a_version_1_directory_loads_into_its_layout_and_into_another():
    want = _want()

    def fn(r):
        got = flow.load(V1)
        moved = flow.load(V1, like={"w": from_full(torch.zeros(5, 2), PLACE, S(1)), "base": from_full(
            torch.zeros(3, 4), PLACE, S(0))})
        return ((got["w"].sbp, got["w"].to_local().to_torch(), got["rows"].to_torch()),
                (moved["w"].sbp, moved["w"].to_local().to_torch(), moved["base"].to_local().to_torch()))
    for r, ((sbp, w, rows), (msbp, mw, mbase)) in enumerate(simulate(2, fn)):
        assert sbp == (S(0),) and torch.equal(w, shard_of(want["w"], (S(0),), PLACE, r))
        assert torch.equal(rows, want["rows"])
        assert msbp == (S(1),) and torch.equal(mw, shard_of(want["w"], (S(1),), PLACE, r))
        assert torch.equal(mbase, shard_of(want["base"], (S(0),), PLACE, r))


def test_a_tree_without_local_views_is_still_written_as_version_1(tmp_path):
    """so older holoflow reads it: only views and dtypes stored as their parts need version 2."""
    import json
    path = str(tmp_path / "ck")

    def fn(r):
        tree = _tree(PLACE)
        for k in ("rows", "T"):
            del tree[k]
        flow.save(tree, path)
    simulate(2, fn)
    with open(os.path.join(path, "manifest.json")) as f:
        assert json.load(f)["version"] == 1
