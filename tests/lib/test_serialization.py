"""flow.save / flow.load: round trips, torch files, safety, atomicity."""
import json
import os
import pickle
import struct
from collections import OrderedDict

import pytest
import torch

import holoflow as flow
from holoflow import serialization as S


def _same(a, b):
    if isinstance(a, flow.Tensor):
        assert isinstance(b, flow.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.to_torch(), b.to_torch()) and a.requires_grad == b.requires_grad
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b and type(a) is type(b)


def test_nested_round_trip(tmp_path):
    w = flow.randn(3, 4)
    obj = {"model": OrderedDict(weight=w, bias=flow.zeros(4, dtype=flow.float64)),
           "optim": {"state": {0: {"step": flow.tensor(3.0), "exp_avg": flow.ones(2, 2, dtype=flow.bfloat16)}},
                     "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "foreach": None, "params": [0]}]},
           "tied": w, "ints": flow.arange(5), "mask": flow.tensor([True, False]),
           "empty": flow.zeros(0, 3), "scalar": flow.tensor(2.5),
           "meta": [1, 2.5, "x", True, None, float("inf")], (1, "a"): "tuple key",
           "param": flow.ones(2, requires_grad=True), "view": w._data[1:], "torch": torch.arange(3)}
    obj["view"] = flow.from_torch(obj["view"])
    path = tmp_path / "ckpt.hf"
    flow.save(obj, path)
    back = flow.load(str(path))
    expect = dict(obj, torch=flow.from_torch(torch.arange(3)))
    _same(expect, back)
    assert back["tied"] is back["model"]["weight"]          # one tensor object stays one object
    assert back["view"].tolist() == w.tolist()[1:]


def test_manifest_is_json_in_safetensors_metadata(tmp_path):
    import safetensors
    path = tmp_path / "a.hf"
    flow.save({"a": flow.ones(2)}, path)
    with safetensors.safe_open(str(path), "pt") as f:
        manifest = json.loads(f.metadata()["holoflow"])
        assert list(f.keys()) == ["0"]
    assert manifest["format"] == "holoflow" and manifest["root"]["t"] == "dict"


def test_map_location_and_file_objects(tmp_path):
    import io
    buf = io.BytesIO()
    flow.save([flow.ones(2)], buf)
    buf.seek(0)
    assert flow.load(buf, map_location="cpu")[0].tolist() == [1.0, 1.0]
    path = tmp_path / "m.hf"
    flow.save(flow.ones(1), path)
    assert flow.load(path, map_location=flow.device("cpu")).device == flow.device("cpu")
    assert flow.load(path, map_location={"cuda:0": "cpu"}).tolist() == [1.0]


def test_plain_safetensors_file(tmp_path):
    import safetensors.torch
    path = tmp_path / "plain.safetensors"
    safetensors.torch.save_file({"w": torch.ones(2)}, str(path))
    out = flow.load(path)
    assert list(out) == ["w"] and isinstance(out["w"], flow.Tensor)


def test_loads_torch_save_files(tmp_path):
    path = tmp_path / "t.pt"
    sd = OrderedDict(w=torch.randn(2, 3), n=torch.tensor(4), p=torch.nn.Parameter(torch.ones(2)))
    torch.save({"model": sd, "epoch": 3, "lrs": [0.1, 0.01]}, path)
    back = flow.load(path)
    assert back["epoch"] == 3 and back["lrs"] == [0.1, 0.01] and isinstance(back["model"], OrderedDict)
    assert isinstance(back["model"]["w"], flow.Tensor) and torch.equal(back["model"]["w"].to_torch(), sd["w"])
    assert back["model"]["p"].requires_grad
    w = torch.nn.Parameter(torch.ones(2))
    w.grad = torch.ones(2)
    opt = torch.optim.Adam([w])
    opt.step()
    torch.save(opt.state_dict(), path)
    assert isinstance(flow.load(path)["state"][0]["exp_avg"], flow.Tensor)
    legacy = tmp_path / "legacy.pt"
    torch.save({"a": torch.ones(1)}, legacy, _use_new_zipfile_serialization=False)
    assert flow.load(legacy)["a"].tolist() == [1.0]


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/holoflow_pwned",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_rejects_malicious_pickles(tmp_path):
    raw = tmp_path / "evil.pkl"
    raw.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(S.CheckpointError, match=r"evil\.pkl.*refused"):
        flow.load(raw)
    zipped = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, zipped)
    with pytest.raises(S.CheckpointError, match=r"evil\.pt.*refused"):
        flow.load(zipped)
    assert not os.path.exists("/tmp/holoflow_pwned")


def test_rejects_corrupt_files(tmp_path):
    good = tmp_path / "good.hf"
    flow.save({"a": flow.randn(64)}, good)
    data = good.read_bytes()
    bad = tmp_path / "truncated.hf"
    bad.write_bytes(data[: len(data) - 40])
    with pytest.raises(S.CheckpointError, match="truncated.hf"):
        flow.load(bad)
    (tmp_path / "empty.hf").write_bytes(b"")
    with pytest.raises(S.CheckpointError, match="empty"):
        flow.load(tmp_path / "empty.hf")
    (tmp_path / "junk.hf").write_bytes(b"hello world, not a checkpoint")
    with pytest.raises(S.CheckpointError, match="junk.hf.*not a valid checkpoint"):
        flow.load(tmp_path / "junk.hf")
    tz = tmp_path / "t.pt"
    torch.save({"a": torch.ones(100)}, tz)
    tz.write_bytes(tz.read_bytes()[:200])
    with pytest.raises(S.CheckpointError, match="t.pt"):
        flow.load(tz)


def _with_manifest(tmp_path, manifest_text):
    import safetensors.torch
    path = tmp_path / "m.hf"
    safetensors.torch.save_file({"0": torch.ones(1)}, str(path), metadata={"holoflow": manifest_text})
    return path


def test_rejects_bad_manifests(tmp_path):
    with pytest.raises(S.CheckpointError, match="m.hf.*not valid JSON"):
        flow.load(_with_manifest(tmp_path, "{not json"))
    with pytest.raises(S.CheckpointError, match="not a holoflow manifest"):
        flow.load(_with_manifest(tmp_path, json.dumps({"root": 1})))
    missing = {"format": "holoflow", "version": 1, "root": {"t": "tensor", "key": "9", "codec": "local"}}
    with pytest.raises(S.CheckpointError, match="'9' is referenced but not stored"):
        flow.load(_with_manifest(tmp_path, json.dumps(missing)))
    unknown = {"format": "holoflow", "version": 1, "root": {"t": "object", "cls": "os.system"}}
    with pytest.raises(S.CheckpointError, match="unknown node"):
        flow.load(_with_manifest(tmp_path, json.dumps(unknown)))
    newer = {"format": "holoflow", "version": 99, "root": {"t": "value", "v": 1}}
    with pytest.raises(S.CheckpointError, match="newer"):
        flow.load(_with_manifest(tmp_path, json.dumps(newer)))


def test_save_rejects_unsupported_objects(tmp_path):
    with pytest.raises(TypeError, match=r"obj\['f'\]"):
        flow.save({"f": object()}, tmp_path / "x.hf")
    assert not list(tmp_path.iterdir())


def test_atomic_save_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.hf"
    flow.save({"v": flow.ones(3)}, path)
    before = path.read_bytes()

    def crash(tensors, tmp, metadata):
        with open(tmp, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")
    monkeypatch.setattr(S, "_write", crash)
    with pytest.raises(OSError, match="disk full"):
        flow.save({"v": flow.zeros(3)}, path)
    assert path.read_bytes() == before and flow.load(path)["v"].tolist() == [1.0, 1.0, 1.0]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.hf"]    # no temp file left behind
    monkeypatch.undo()
    flow.save({"v": flow.zeros(3)}, path)
    assert flow.load(path)["v"].tolist() == [0.0, 0.0, 0.0]


def test_codec_extension_point(tmp_path):
    class Tagged:
        name = "tagged"

        def claims(self, t):
            return getattr(t, "tag", None) is not None

        def encode(self, t):
            return t._data, {"tag": t.tag}

        def decode(self, data, info):
            t = flow.from_torch(data)
            t.tag = info["tag"]
            return t
    codec = Tagged()
    S.register_codec(codec)
    try:
        t = flow.ones(2)
        t.tag = "shard-0"
        flow.save({"t": t}, tmp_path / "c.hf")
        assert flow.load(tmp_path / "c.hf")["t"].tag == "shard-0"
    finally:
        S.CODECS.remove(codec)
    with pytest.raises(S.CheckpointError, match="unknown tensor codec 'tagged'"):
        flow.load(tmp_path / "c.hf")


def test_header_struct_is_safetensors(tmp_path):
    path = tmp_path / "h.hf"
    flow.save(flow.ones(1), path)
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    assert "__metadata__" in json.loads(data[8:8 + n])
