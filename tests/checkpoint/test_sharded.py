"""Sharded checkpoints of global tensors on simulated ranks (threads): every save layout x load
layout (other world sizes, 1-D <-> 2-D meshes, S/B/P, uneven), against the logical tensor; no
communication on load; atomic commit; OneFlow's global_dst_rank / global_src_rank; bad input."""
import json
import os

import pytest
import torch

import holoflow as flow
from holoflow.checkpoint import sharded
from holoflow.distributed.global_tensor import from_full
from holoflow.distributed.sharding import shard_of
from holoflow.distributed.world import simulate
from holoflow.sbp import B, P, S
from holoflow.serialization import CheckpointError

G = torch.Generator().manual_seed(3)
FULL = {"f32": torch.randn(5, 7, generator=G), "bf16": torch.randn(3, 9, generator=G).to(torch.bfloat16),
        "i64": torch.randint(-50, 50, (6, 2), generator=G), "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3)}
RANKS = {1: [0], 2: [0, 1], 3: [0, 1, 2], 4: [0, 1, 2, 3], "2x2": [[0, 1], [2, 3]], "sub": [1, 3]}
SAVES = [(2, "2", (S(0),)), (2, "2", (S(1),)), (2, "2", (B,)), (2, "2", (P,)), (4, "2x2", (S(1), S(0))),
         (4, "2x2", (P, S(1))), (3, "3", (S(0),))]
LOADS = [(4, "4", (S(0),)), (4, "4", (S(1),)), (4, "4", (P,)), (4, "2x2", (S(0), S(1))), (4, "2x2", (B, S(0))),
         (4, "sub", (S(1),)), (2, "2", (B,)), (3, "3", (S(1),)), (1, "1", (S(0),))]


def _place(key):
    return flow.placement("cpu", RANKS[int(key) if key.isdigit() else key])


def _fits(nd, t):
    return all(not (isinstance(s, S) and s.axis >= t.dim()) for s in nd)


def _nd_for(nd, t):
    return tuple(B if isinstance(s, S) and s.axis >= t.dim() else s for s in nd)


def _save(path, n, pkey, nd, extra=None):
    place = _place(pkey)

    def fn(r):
        tree = {k: from_full(v, place, _nd_for(nd, v)) for k, v in FULL.items()}
        tree["w"] = tree["f32"]                      # the same tensor twice: stored once
        tree.update(extra or {})
        flow.save(tree, path)
    simulate(n, fn)


def _load(path, n, pkey, nd):
    place = _place(pkey)

    def fn(r):
        like = {k: from_full(torch.zeros_like(v), place, _nd_for(nd, v)) for k, v in FULL.items()}
        got = flow.load(path, like=like)
        assert got["w"] is got["f32"]
        return {k: (t.placement, tuple(t.sbp), t.shape, t.to_local().to_torch() if place.coords(r) is not None
                    else None) for k, t in got.items() if isinstance(t, flow.Tensor)}
    out = simulate(n, fn)
    assert simulate.last_comm.calls == [], "loading communicated (it must read shards, not gather)"
    return place, out


def test_every_save_layout_loads_into_every_target_layout(tmp_path):
    for i, (n, pkey, nd) in enumerate(SAVES):
        path = str(tmp_path / f"ck{i}")
        _save(path, n, pkey, nd, {"step": 7})
        assert flow.load(path)["step"] == 7
        for m, lkey, lnd in LOADS:
            place, per_rank = _load(path, m, lkey, lnd)
            for r, got in enumerate(per_rank):
                for k, full in FULL.items():
                    nd_k = _nd_for(lnd, full)
                    pl, sbp, shape, local = got[k]
                    assert (pl, sbp, tuple(shape)) == (place, nd_k, tuple(full.shape)), (k, nd, lnd)
                    if local is not None:
                        want = shard_of(full, nd_k, place, r)
                        assert local.dtype == full.dtype and torch.equal(local, want), \
                            f"saved {nd} on {pkey}, loaded {lnd} on {lkey}: {k} on rank {r}"


def test_broadcast_copies_are_written_once_and_partial_sums_reduced(tmp_path):
    path = str(tmp_path / "ck")
    _save(path, 2, "2", (B,))
    files = sorted(os.listdir(path))
    assert files == ["manifest.json", "rank-00000.safetensors"]      # rank 1 holds only copies
    path = str(tmp_path / "p")
    _save(path, 4, "2x2", (P, S(1)))
    man = json.load(open(os.path.join(path, "manifest.json")))
    t = next(v for k, v in man["root"]["items"] if k["v"] == "f32")
    assert t["sbp"] == ["P", "S(1)"] and [s["file"] for s in t["shards"]] == ["rank-00000.safetensors",
                                                                              "rank-00001.safetensors"]
    got = flow.load(path)            # a world of one process: whole local tensors
    assert got["f32"].is_local and torch.equal(got["f32"].to_torch(), FULL["f32"])


def test_same_layout_and_world_by_default_and_whole_in_one_process(tmp_path):
    path = str(tmp_path / "ck")
    _save(path, 2, "2", (S(0),), {"meta": [1, "x", None]})

    def fn(r):
        got = flow.load(path)
        return got["f32"].placement, tuple(got["f32"].sbp), got["f32"].to_local().to_torch(), got["meta"]
    for r, (pl, sbp, local, meta) in enumerate(simulate(2, fn)):
        assert pl == _place("2") and sbp == (S(0),) and meta == [1, "x", None]
        assert torch.equal(local, shard_of(FULL["f32"], (S(0),), _place("2"), r))
    got = flow.load(path)
    assert all(got[k].is_local and torch.equal(got[k].to_torch(), v) for k, v in FULL.items())


def test_smaller_world_without_like_says_what_to_do(tmp_path):
    path = str(tmp_path / "ck")
    _save(path, 4, "2x2", (S(0), B))
    with pytest.raises(RuntimeError, match=r"saved on .*ranks=\[\[0, 1\], \[2, 3\]\].*world has 2 ranks; pass like="):
        simulate(2, lambda r: flow.load(path))


def test_model_and_optimizer_state_into_another_layout(tmp_path):
    path = str(tmp_path / "ck")

    def model(place, layout):
        flow.manual_seed(0)
        m = flow.nn.Sequential(flow.nn.Linear(6, 8), flow.nn.ReLU(), flow.nn.Linear(8, 4))
        return m.to_global(place, layout)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))

    def train(r):
        m = model(_place("2"), lambda name, t: S(0))
        opt = flow.optim.AdamW(m.parameters(), lr=0.01)
        m(from_full(x, _place("2"), B)).sum().backward()
        opt.step()
        flow.save({"model": m.state_dict(), "optim": opt.state_dict()}, path)
        return {k: v.to_global(sbp=B).to_local().to_torch() for k, v in m.state_dict().items()}, \
            {k: v.to_global(sbp=B).to_local().to_torch() for k, v in opt.state[m[0].weight].items()
             if v.is_global}
    want_model, want_state = simulate(2, train)[0]

    def resume(r):
        m = model(_place("2x2"), lambda name, t: (B, S(t.dim() - 1)))
        opt = flow.optim.AdamW(m.parameters(), lr=0.01)
        ck = flow.load(path, like={"model": m, "optim": opt})
        m.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optim"])
        st = opt.state[m[0].weight]
        assert st["exp_avg"].sbp == m[0].weight.sbp and st["exp_avg"].placement == m[0].weight.placement
        return {k: v.to_global(sbp=(B, B)).to_local().to_torch() for k, v in m.state_dict().items()}, \
            {k: v.to_global(sbp=(B, B)).to_local().to_torch() for k, v in st.items() if v.is_global}, \
            float(st["step"])
    for got_model, got_state, step in simulate(4, resume):
        assert step == 1.0 and set(got_state) == set(want_state) and set(got_model) == set(want_model)
        for k in want_model:
            assert torch.equal(got_model[k], want_model[k]), k
        for k in want_state:
            assert torch.equal(got_state[k], want_state[k]), k


def test_failed_rank_aborts_the_whole_save_and_keeps_the_previous(tmp_path, monkeypatch):
    path = str(tmp_path / "ck")
    _save(path, 2, "2", (S(0),), {"v": 1})
    real = sharded._write_synced

    def flaky(directory, name, content):
        if name == sharded.rank_file(1):
            raise OSError("disk full")
        real(directory, name, content)
    monkeypatch.setattr(sharded, "_write_synced", flaky)
    with pytest.raises(RuntimeError, match=r"rank 1: OSError: disk full"):
        _save(path, 2, "2", (S(0),), {"v": 2})
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["ck"]               # no temp directory left
    assert flow.load(path)["v"] == 1
    stale = tmp_path / "ck.holoflow-tmp-999999999"               # a killed save's directory (dead pid)
    stale.mkdir()
    (stale / "rank-00000.safetensors").write_bytes(b"partial")
    _save(path, 2, "2", (S(0),), {"v": 3})
    assert sorted(os.listdir(tmp_path)) == ["ck"] and flow.load(path)["v"] == 3


def test_oneflow_global_dst_rank_and_global_src_rank(tmp_path):
    path = str(tmp_path / "whole.hf")
    _save_dst = lambda r: flow.save({"f32": from_full(FULL["f32"], _place("2"), S(1)), "n": 4}, path,  # noqa: E731
                                    global_dst_rank=1)
    simulate(2, _save_dst)
    plain = flow.load(path)                     # an ordinary file with whole tensors
    assert plain["n"] == 4 and plain["f32"].is_local and torch.equal(plain["f32"].to_torch(), FULL["f32"])

    def src(r):
        got = flow.load(path, global_src_rank=0)
        t = got["f32"]
        assert t.placement == flow.placement("cpu", [0]) and t.sbp == (B,) and t.shape == (5, 7)
        like = {"f32": from_full(torch.zeros(5, 7), _place("4"), S(0))}
        moved = flow.load(path, global_src_rank=0, like=like)["f32"]
        return moved.sbp, moved.to_local().to_torch()
    for r, (sbp, local) in enumerate(simulate(4, src)):
        assert sbp == (S(0),) and torch.equal(local, shard_of(FULL["f32"], (S(0),), _place("4"), r))


def test_file_checkpoint_loads_into_global_layout(tmp_path):
    path = str(tmp_path / "local.hf")
    flow.save({"f32": flow.from_torch(FULL["f32"])}, path)

    def fn(r):
        got = flow.load(path, like={"f32": from_full(torch.zeros(5, 7), _place("2x2"), (S(1), S(0)))})
        return got["f32"].sbp, got["f32"].to_local().to_torch()
    for r, (sbp, local) in enumerate(simulate(4, fn)):
        assert sbp == (S(1), S(0)) and torch.equal(local, shard_of(FULL["f32"], (S(1), S(0)), _place("2x2"), r))


def test_corrupt_sharded_checkpoints_raise_naming_the_problem(tmp_path):
    path = str(tmp_path / "ck")
    _save(path, 2, "2", (S(0),))
    man_path = os.path.join(path, "manifest.json")
    good = open(man_path).read()

    def with_manifest(text):
        with open(man_path, "w") as f:
            f.write(text)
    with_manifest("{not json")
    with pytest.raises(CheckpointError, match=r"manifest.json is not valid JSON"):
        flow.load(path)
    with_manifest(good.replace('"rank-00001.safetensors"', '"../evil.safetensors"'))
    with pytest.raises(CheckpointError, match=r"bad shard file name '\.\./evil\.safetensors'"):
        flow.load(path)
    with_manifest(good.replace('"S(0)"', '"Q(9)"'))
    with pytest.raises(CheckpointError, match=r"bad SBP 'Q\(9\)'"):
        flow.load(path)
    with_manifest(json.dumps(dict(json.loads(good), version=99)))
    with pytest.raises(CheckpointError, match=r"version 99"):
        flow.load(path)
    with_manifest(good)
    os.unlink(os.path.join(path, "rank-00001.safetensors"))
    with pytest.raises(CheckpointError, match=r"rank-00001.safetensors is missing or unreadable"):
        flow.load(path)
    with pytest.raises(RuntimeError, match=r"not to a file object"):
        simulate(1, lambda r: flow.save({"x": from_full(torch.ones(2), _place("1"), B)}, __import__("io").BytesIO()))


@pytest.mark.parametrize("root,message", [
    ('{"t": "list", "items": [' * 300 + '{"t": "value", "v": 1}' + "]}" * 300, "nested more than 200"),
    ('{"t": "dict", "items": [[{"t": "list", "items": []}, {"t": "value", "v": 1}]]}', "a dict key holds a list"),
    ('{"t": "value", "v": [1]}', "a value node holds list"),
    ('{"t": "tensor", "codec": "sharded"}', "a tensor node without a key"),
])
def test_a_sharded_manifest_tree_is_checked_as_a_file_manifest(tmp_path, root, message):
    """The directory's tree is read by the file decoder's walk (reshard._Tree is a Decoder)."""
    path = str(tmp_path / "ck")
    _save(path, 2, "2", (S(0),))
    man_path = os.path.join(path, "manifest.json")
    man = json.load(open(man_path))
    with open(man_path, "w") as f:
        f.write(json.dumps(dict(man, root="ROOT")).replace('"ROOT"', root))
    with pytest.raises(CheckpointError, match=r"corrupt manifest: " + message):
        flow.load(path)


def test_each_rank_opens_only_the_files_overlapping_its_shard(tmp_path, monkeypatch):
    from holoflow.checkpoint.reader import ShardReader
    path = str(tmp_path / "ck")
    _save(path, 2, "2", (S(0),))
    opened = {}
    real = ShardReader.file

    def spy(self, fname):
        opened.setdefault(__import__("holoflow").distributed.world.rank(), set()).add(fname)
        return real(self, fname)
    monkeypatch.setattr(ShardReader, "file", spy)
    place = _place("4")
    simulate(4, lambda r: flow.load(path, like={"i64": from_full(torch.zeros(6, 2, dtype=torch.int64), place,
                                                                 S(0))}))
    # the other tensors keep the saved layout (S(0) on ranks 0, 1; a 0-d one is B there), i64's 6
    # rows go 2, 2, 1, 1 over 4 ranks; the saved files hold rows 0-2 (rank 0) and 3-5 (rank 1)
    want = {0: {"rank-00000.safetensors"}, 1: {"rank-00000.safetensors", "rank-00001.safetensors"},
            2: {"rank-00001.safetensors"}, 3: {"rank-00001.safetensors"}}
    assert opened == want


def test_sharded_manifest_with_lying_shapes_is_refused_before_allocating(tmp_path):
    path = str(tmp_path / "ck")
    _save(path, 2, "2", (S(0),))
    man_path = os.path.join(path, "manifest.json")
    man = json.load(open(man_path))
    node = next(v for k, v in man["root"]["items"] if k["v"] == "f32")
    node["shape"] = [10 ** 12, 7]
    json.dump(man, open(man_path, "w"))
    with pytest.raises(CheckpointError, match=r"cover .* of the 7000000000000 elements|bad offset/size"):
        flow.load(path)
    node["shape"] = [5, 7]
    node["shards"][0]["size"] = [2, 7]
    json.dump(man, open(man_path, "w"))
    with pytest.raises(CheckpointError, match=r"has shape \[3, 7\], the manifest says \[2, 7\]"):
        flow.load(path)
    node["shards"][0]["size"] = [3, 7]
    node["requires_grad"] = True
    inode = next(v for k, v in man["root"]["items"] if k["v"] == "i64")
    inode["requires_grad"] = True
    json.dump(man, open(man_path, "w"))
    with pytest.raises(CheckpointError, match=r"int64 is marked requires_grad"):
        flow.load(path)
