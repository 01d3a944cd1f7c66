"""A checkpoint records where each storage was saved and loads it back there, as torch.save /
torch.load do: a CUDA checkpoint loads on CUDA, and on a machine without CUDA raises torch's
RuntimeError saying to pass map_location, which moves it (a device, a dict of locations, a
function of (storage, location)). No GPU is needed: the files are written with torch's own record
of a storage's device (``torch.serialization.location_tag``) patched, for torch.save and
flow.save alike, and CUDA is reported missing. The "meta" device stands in for a device that
exists here: storages saved there come back there."""
import json
import os

import pytest
import torch

import holoflow as flow
from holoflow.distributed.global_tensor import from_full
from holoflow.distributed.world import simulate
from holoflow.sbp import B, S

from .test_serialization_views import _assert_same, _layout, _leaves, _torch_of, _views

PLACE = flow.placement("cpu", [0, 1])


def _files_saved_on(location, tmp_path, monkeypatch):
    """(torch.save file, flow.save file, sharded directory) of the same views, each storage
    recorded as saved on ``location``."""
    tpath, fpath, dpath = tmp_path / "t.pt", tmp_path / "f.hf", str(tmp_path / "ck")
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: location)
        torch.save(_views(torch), tpath)
        flow.save(_views(flow), fpath)
        simulate(2, lambda r: flow.save({"obj": _views(flow), "g": from_full(torch.ones(2), PLACE, S(0))}, dpath))
    return tpath, fpath, dpath


def _load_obj(path, **kw):
    got = flow.load(path, **kw)
    return got["obj"] if isinstance(got, dict) and "obj" in got else got


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_a_cuda_checkpoint_on_a_machine_without_cuda_raises_torchs_error(tmp_path, monkeypatch, no_cuda):
    tpath, fpath, dpath = _files_saved_on("cuda:0", tmp_path, monkeypatch)
    with pytest.raises(RuntimeError) as want:
        torch.load(tpath, weights_only=True)
    assert "map_location" in str(want.value)
    for path in (tpath, fpath, dpath):
        with pytest.raises(RuntimeError) as got:
            flow.load(path)
        assert type(got.value) is type(want.value), path
        assert "torch.cuda.is_available() is False" in str(got.value) and "map_location" in str(got.value), path
    with pytest.raises(RuntimeError) as want:   # a dict that moves another device moves nothing
        torch.load(tpath, weights_only=True, map_location={"cuda:1": "cpu"})
    for path in (tpath, fpath, dpath):
        with pytest.raises(type(want.value), match="map_location"):
            flow.load(path, map_location={"cuda:1": "cpu"})


@pytest.mark.parametrize("kind", ["str", "device", "dict", "function", "function_none"])
def test_map_location_moves_a_cuda_checkpoint_as_torch(kind, tmp_path, monkeypatch, no_cuda):
    tpath, fpath, dpath = _files_saved_on("cuda:0", tmp_path, monkeypatch)
    seen = {"torch": [], "flow": []}

    def mover(who):
        def fn(storage, location):
            seen[who].append((location, storage.device.type))
            return storage if kind == "function" else None
        return fn
    loc = {"str": lambda who: "cpu", "device": lambda who: torch.device("cpu"),
           "dict": lambda who: {"cuda:0": "cpu"}, "function": mover, "function_none": mover}[kind]
    if kind == "function_none":   # returning None: torch's default restore, which needs CUDA
        with pytest.raises(RuntimeError) as want:
            torch.load(tpath, weights_only=True, map_location=loc("torch"))
        for path in (fpath, dpath):
            with pytest.raises(type(want.value), match="map_location"):
                flow.load(path, map_location=loc("flow"))
        assert set(seen["flow"]) == set(seen["torch"]) == {("cuda:0", "cpu")}
        return
    extras = {fpath: set(), dpath: {("cpu", "cpu")} if kind == "function" else set()}   # (dpath's global tensor)
    for path, extra in extras.items():
        for calls in seen.values():
            calls.clear()
        ref = torch.load(tpath, weights_only=True, map_location=loc("torch"))   # (afresh: _assert_same writes)
        _assert_same(ref, _load_obj(path, map_location=loc("flow")))
        assert set(seen["flow"]) == set(seen["torch"]) | extra   # the function sees the saved location


def test_storages_come_back_on_the_device_they_were_saved_on(tmp_path, monkeypatch):
    tpath, fpath, dpath = _files_saved_on("meta", tmp_path, monkeypatch)
    ref = torch.load(tpath, weights_only=True)   # no map_location: where they were saved
    for path in (fpath, dpath):
        got = _load_obj(path)
        for (where, r), (_, g) in zip(_leaves(ref), _leaves(got)):
            assert _torch_of(g).device == r.device == torch.device("meta"), (path, where)
            assert _layout(g) == _layout(r), (path, where)
    for path in (fpath, dpath):
        _assert_same(torch.load(tpath, weights_only=True, map_location="cpu"), _load_obj(path, map_location="cpu"))


# -- global tensors loaded into a global layout ----------------------------------------------------
def _global_dir_saved_on_cuda(tmp_path):
    """A directory of global tensors saved on ``placement("cuda", [0, 1])``: written from the CPU
    placement, then its manifest's placements made "cuda" (what a GPU run records)."""
    path = str(tmp_path / "gk")
    simulate(2, lambda r: flow.save({"g": from_full(torch.arange(6.0), PLACE, S(0)),
                                     "b": from_full(torch.ones(2, 3), PLACE, B)}, path))
    man_path = os.path.join(path, "manifest.json")
    with open(man_path) as f:
        man = json.load(f)
    for _, node in man["root"]["items"]:
        node["placement"]["type"] = "cuda"
    with open(man_path, "w") as f:
        json.dump(man, f)
    return path


def _load_global(path, **kw):
    """Every simulated rank's (placement, sbp, local part) per tensor, or its RuntimeError."""
    def fn(r):
        try:
            got = flow.load(path, **kw)
        except RuntimeError as e:
            return e
        return {k: (t.placement, tuple(t.sbp), t.to_local().to_torch()) for k, t in got.items()}
    return simulate(2, fn)


def test_a_global_tensor_saved_on_cuda_raises_torchs_error_or_moves_by_map_location(tmp_path, no_cuda):
    path = _global_dir_saved_on_cuda(tmp_path)
    for kw in ({}, {"map_location": {"cuda:7": "cpu"}}, {"map_location": lambda storage, location: None}):
        for got in _load_global(path, **kw):   # (torch's deep "not compiled with CUDA" before)
            assert type(got) is RuntimeError, kw
            assert "torch.cuda.is_available() is False" in str(got) and "map_location" in str(got), kw
    seen = []

    def mover(storage, location):
        seen.append(location)
        return storage
    everywhere = {f"cuda:{i}": "cpu" for i in range(max(torch.cuda.device_count(), 2))}
    for loc in ("cpu", torch.device("cpu"), everywhere, mover):
        for r, got in enumerate(_load_global(path, map_location=loc)):
            assert not isinstance(got, Exception), (loc, got)
            assert got["g"][:2] == (PLACE, (S(0),)) and torch.equal(got["g"][2], torch.arange(6.0)[3 * r:3 * r + 3])
            assert got["b"][:2] == (PLACE, (B,)) and torch.equal(got["b"][2], torch.ones(2, 3))
    assert seen and all(loc.startswith("cuda:") for loc in seen)   # the function sees the saved device

    def into_cpu_layout(r):   # like= gives the layout and the devices, as torch's DCP loads in place
        got = flow.load(path, like={"g": from_full(torch.zeros(6), PLACE, S(0)),
                                    "b": from_full(torch.zeros(2, 3), PLACE, B)})
        return got["g"].placement, got["g"].to_local().to_torch()
    for r, (place, local) in enumerate(simulate(2, into_cpu_layout)):
        assert place == PLACE and torch.equal(local, torch.arange(6.0)[3 * r:3 * r + 3])
