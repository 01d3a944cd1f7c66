"""A module saved whole (``flow.save(model)``, not its state dict) and global tensors, on simulated
ranks (threads). A sharded checkpoint holds state dicts, as torch's distributed checkpoint (DCP)
does and as OneFlow saves global models (``flow.save(model.state_dict(), ...)``): a module holding
a global tensor, or any module beside global tensors, is refused when SAVED, on every rank, with a
TypeError (torch's class for an object it can't save) naming the module, where it is, the global
tensor and what to save instead (older holoflow accepted it and failed at load with "unknown node").
The state dict route saves and loads; a module of local tensors alone still goes to one file."""
import json
import os
import pickle

import pytest
import torch

import holoflow as flow
from holoflow.distributed.global_tensor import from_full
from holoflow.distributed.sharding import shard_of
from holoflow.distributed.world import simulate
from holoflow.sbp import B, S
from holoflow.serialization import CheckpointError

PLACE = flow.placement("cpu", [0, 1])
W = torch.arange(6.0).reshape(3, 2)


def _model(sbp=S(0)):
    m = flow.nn.Sequential(flow.nn.Linear(2, 3))
    m[0].weight = flow.nn.Parameter(from_full(W, PLACE, sbp))
    m[0].bias = flow.nn.Parameter(from_full(torch.ones(3), PLACE, B))
    return m


def _errors(fn) -> list:
    def run(r):
        try:
            fn(r)
        except Exception as e:  # noqa: BLE001 - the test looks at the class
            return e
        return None
    return simulate(2, run)


@pytest.mark.parametrize("case", ["module", "in_dict", "global_dst_rank", "tensor_attribute"])
def test_a_module_holding_global_tensors_is_refused_when_saved_on_every_rank(tmp_path, case):
    path = str(tmp_path / "ck")

    def save(r):
        m = _model()
        if case == "module":
            flow.save(m, path)
        elif case == "in_dict":
            flow.save({"model": m, "step": 3, "g": m[0].weight}, path)
        elif case == "global_dst_rank":
            flow.save([m], path, global_dst_rank=0)
        else:
            local = flow.nn.Linear(2, 2)
            local.cache = from_full(W, PLACE, S(0))   # (not a parameter or buffer: pickled with the module)
            flow.save({"m": local}, path, global_dst_rank=0)
    errors = _errors(save)
    where = {"module": "obj", "in_dict": "obj['model']", "global_dst_rank": "obj[0]", "tensor_attribute": "obj['m']"}
    name = "a tensor attribute" if case == "tensor_attribute" else "'0.weight'"
    for r, e in enumerate(errors):
        assert isinstance(e, TypeError), (r, repr(e))
        text = str(e)
        assert f"at {where[case]} holds the global tensor {name}" in text and "state_dict()" in text, (r, text)
        assert "placement" in text and "split" in text, (r, text)
    assert not os.path.exists(path) and os.listdir(tmp_path) == []


def test_a_local_module_beside_global_tensors_is_refused_when_saved_and_alone_it_saves_to_a_file(tmp_path):
    path = str(tmp_path / "ck")
    errors = _errors(lambda r: flow.save({"model": flow.nn.Linear(2, 2), "g": from_full(W, PLACE, S(0))}, path))
    for r, e in enumerate(errors):
        assert isinstance(e, TypeError), (r, repr(e))
        assert "Linear at obj['model'] is saved whole beside global tensors" in str(e)
        assert "state_dict()" in str(e), r
    assert os.listdir(tmp_path) == []
    alone = flow.nn.Linear(2, 2)   # (a local module alone: one file, rebuilt with weights_only=False as torch)
    flow.save(alone, str(tmp_path / "m.hf"))
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        flow.load(str(tmp_path / "m.hf"))
    back = flow.load(str(tmp_path / "m.hf"), weights_only=False)
    assert torch.equal(back.weight.to_torch(), alone.weight.to_torch())


def test_the_state_dict_of_a_global_model_saves_and_loads_into_its_layout(tmp_path):
    path = str(tmp_path / "ck")
    simulate(2, lambda r: flow.save(_model().state_dict(), path))

    def load(r):
        m = _model(S(1))   # another layout: like=m reshards
        m[0].weight.data = from_full(torch.zeros(3, 2), PLACE, S(1))
        m.load_state_dict(flow.load(path, like=m))
        return tuple(m[0].weight.sbp), m[0].weight.to_local().to_torch()
    for r, (sbp, w) in enumerate(simulate(2, load)):
        assert sbp == (S(1),) and torch.equal(w, shard_of(W, (S(1),), PLACE, r)), r


def test_a_module_node_in_a_sharded_directory_written_by_older_holoflow_is_refused_clearly(tmp_path):
    path = str(tmp_path / "ck")
    simulate(2, lambda r: flow.save({"g": from_full(W, PLACE, S(0))}, path))
    man_path = os.path.join(path, "manifest.json")
    with open(man_path) as f:
        man = json.load(f)
    man["root"] = {"t": "dict", "items": [[{"t": "value", "v": "m"}, {"t": "module", "class": "my.Net",
                                                                        "pickle": ""}]]}
    with open(man_path, "w") as f:
        json.dump(man, f)
    for weights_only in (True, False):   # (weights_only=False reads the directory too, not as a file)
        with pytest.raises(CheckpointError, match=r"a whole module \(my\.Net\).*state_dict\(\).*like=model"):
            flow.load(path, weights_only=weights_only)


def test_weights_only_false_loads_a_sharded_directory_as_the_default_does(tmp_path):
    path = str(tmp_path / "ck")
    simulate(2, lambda r: flow.save({"g": from_full(W, PLACE, S(0)), "n": 4}, path))
    got = flow.load(path, weights_only=False)   # (a world of one: whole local tensors)
    assert got["n"] == 4 and got["g"].is_local and torch.equal(got["g"].to_torch(), W)
