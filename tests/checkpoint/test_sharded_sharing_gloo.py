"""Global tensors sharing a local storage (a global tensor and global views of it, tied tensors: a
state dict's detached entries of one Parameter) saved to a sharded directory by 2 Gloo ranks load
sharing it again, as ``torch.save``/``torch.load`` keep views and tied tensors: a write through
one shows in the others, with the saved strides and offsets. In another layout (``like=``) each
loads apart, its values right."""
import io

import pytest
import torch

import holoflow as flow
from holoflow.distributed.global_tensor import from_full
from holoflow.distributed.sharding import shard_of
from holoflow.sbp import B, S

FULL_W, FULL_P = torch.arange(12.0).reshape(3, 4), torch.arange(8.0).reshape(4, 2) / 4


def _tree(place):
    w = from_full(FULL_W, place, S(1))
    p = flow.nn.Parameter(from_full(FULL_P, place, B))
    return {"w": w, "wT": w.t(), "rows": w[1:], "emb.weight": p.detach(), "head.weight": p.detach(), "p": p,
            "alone": from_full(torch.ones(2, 2), place, S(0))}


def _fulls():
    return {"w": FULL_W, "wT": FULL_W.t(), "rows": FULL_W[1:], "emb.weight": FULL_P, "head.weight": FULL_P,
            "p": FULL_P, "alone": torch.ones(2, 2)}


def _storage(t) -> int:
    return t._data.untyped_storage().data_ptr()


def save_and_load(rank: int, path: str) -> dict:
    """On every rank: save the tree, load it back in its layout and in another; what each rank sees."""
    place = flow.placement("cpu", [0, 1])
    saved = _tree(place)
    flow.save(saved, path)
    got = flow.load(path)
    out = {"layouts": {k: (tuple(got[k].sbp), got[k]._data.stride(), got[k]._data.storage_offset())
                       for k in got},
           "want_layouts": {k: (tuple(saved[k].sbp), saved[k]._data.stride()) for k in saved},
           "values": {k: got[k].to_local().to_torch().clone() for k in got},
           "views": _storage(got["w"]) == _storage(got["wT"]) == _storage(got["rows"]),
           "tied": _storage(got["emb.weight"]) == _storage(got["head.weight"]) == _storage(got["p"]),
           "alone": _storage(got["alone"]) not in (_storage(got["w"]), _storage(got["p"])),
           "param": (type(got["p"]).__name__, got["p"].requires_grad)}
    got["w"]._data.add_(100)   # a write through one shows in the others, as in torch.load's
    got["emb.weight"]._data.mul_(-1)
    out["written"] = {k: got[k].to_local().to_torch().clone() for k in ("w", "wT", "rows", "head.weight", "p")}
    moved = flow.load(path, like={"w": from_full(torch.zeros(3, 4), place, S(0))})
    out["moved"] = (tuple(moved["w"].sbp), moved["w"].to_local().to_torch(), moved["wT"].to_local().to_torch(),
                    _storage(moved["w"]) != _storage(moved["wT"]))
    return out


def test_global_views_and_tied_tensors_load_sharing_their_storage_on_2_gloo_ranks(world2, tmp_path):
    place = flow.placement("cpu", [0, 1])
    path = str(tmp_path / "ck")
    fulls = _fulls()
    for r, out in enumerate(world2.run(save_and_load, path)):
        for k, (sbp, stride, _) in out["layouts"].items():
            assert (sbp, stride) == out["want_layouts"][k], (r, k)
            want = shard_of(fulls[k], sbp, place, r)
            assert torch.equal(out["values"][k], want), (r, k)
        assert out["views"] and out["tied"] and out["alone"], r
        assert out["param"] == ("Parameter", True), r
        w = shard_of(FULL_W, (S(1),), place, r) + 100
        assert torch.equal(out["written"]["w"], w), r
        assert torch.equal(out["written"]["wT"], w.t()) and torch.equal(out["written"]["rows"], w[1:]), r
        for k in ("head.weight", "p"):
            assert torch.equal(out["written"][k], -FULL_P), (r, k)
        sbp, w_moved, wt, apart = out["moved"]
        assert sbp == (S(0),) and torch.equal(w_moved, shard_of(FULL_W, (S(0),), place, r)), r
        assert torch.equal(wt, shard_of(FULL_W.t(), (S(0),), place, r)) and apart, r
    whole = flow.load(path)   # this process, a world of one: whole local tensors, values right
    for k, v in fulls.items():
        assert whole[k].is_local and torch.equal(whole[k].to_torch(), v), k


def save_to_one_rank(rank: int, path: str, dst: int) -> None:
    place = flow.placement("cpu", [0, 1])
    tree = _tree(place)
    p1 = flow.nn.Parameter(from_full(torch.ones(1, 4), place, S(0)))   # (rank 1's shard is empty)
    tree.update({"small.a": p1.detach(), "small.b": p1.detach(), "small": p1,
                 "other": from_full(torch.zeros(1, 4), place, S(0))})   # (empty on rank 1 too, not tied)
    flow.save(tree, path, global_dst_rank=dst)


def load_from_one_rank(rank: int, path: str) -> dict:
    """OneFlow's load(path, global_src_rank=0), as saved and into other layouts (like=); and the
    file read by every rank into those layouts."""
    place = flow.placement("cpu", [0, 1])
    got = flow.load(path, global_src_rank=0)
    like = {"w": from_full(torch.zeros(3, 4), place, S(0)), "p": from_full(torch.zeros(4, 2), place, S(1)),
            "emb.weight": from_full(torch.zeros(4, 2), place, S(0))}
    moved = flow.load(path, global_src_rank=0, like=like)
    each = flow.load(path, like=like)   # (every rank reads the file, keeps its slice)
    return {"src": {k: (type(v).__name__, v.requires_grad, tuple(v.sbp), v.to_local().to_torch().clone())
                    for k, v in got.items()},
            "moved": [{k: (type(m[k]).__name__, m[k].requires_grad, tuple(m[k].sbp), m[k].to_local().to_torch().clone())
                       for k in like} for m in (moved, each)]}


@pytest.mark.parametrize("dst", [0, 1])
def test_a_global_dst_rank_file_keeps_parameters_and_tied_tensors_as_torch_save(world2, tmp_path, dst):
    """``save(obj, path, global_dst_rank=dst)`` on 2 Gloo ranks writes whole tensors as
    ``torch.save`` writes the logical tree: a Parameter stays a Parameter (it became a plain
    tensor requiring grad) and a state dict's detached entries of one Parameter share one storage
    (each was gathered and written apart: twice the bytes, untied on load). Loaded by one process,
    against torch.save/torch.load of the whole tensors; on 2 ranks with global_src_rank=0, as saved
    and into other SBPs (like=), Parameters stay Parameters there too. Global views (``w.t()``)
    load apart, their values right."""
    path = str(tmp_path / "whole.hf")
    world2.run(save_to_one_rank, path, dst)
    fulls = {**_fulls(), "small.a": torch.ones(1, 4), "small.b": torch.ones(1, 4), "small": torch.ones(1, 4),
             "other": torch.zeros(1, 4)}
    tp, tsmall = torch.nn.Parameter(FULL_P.clone()), torch.nn.Parameter(torch.ones(1, 4))
    ref = {**{k: v.clone() for k, v in fulls.items()}, "emb.weight": tp.detach(), "head.weight": tp.detach(),
           "p": tp, "small.a": tsmall.detach(), "small.b": tsmall.detach(), "small": tsmall}
    buf = io.BytesIO()
    torch.save(ref, buf)
    buf.seek(0)
    want = torch.load(buf)
    got = flow.load(path)
    ptr = lambda t: t.untyped_storage().data_ptr()   # noqa: E731
    for k, v in fulls.items():
        assert got[k].is_local and torch.equal(got[k].to_torch(), v), k
        assert (type(got[k]).__name__, got[k].requires_grad) == (type(want[k]).__name__, want[k].requires_grad), k
    for a, b in [("emb.weight", "head.weight"), ("emb.weight", "p"), ("small.a", "small.b"), ("small", "small.a"),
                 ("small", "other"), ("w", "alone")]:
        assert (_storage(got[a]) == _storage(got[b])) == (ptr(want[a]) == ptr(want[b])), (a, b)
    for r, out in enumerate(world2.run(load_from_one_rank, path)):
        for k, (kind, rg, sbp, local) in out["src"].items():
            assert (kind, rg, sbp) == (type(want[k]).__name__, want[k].requires_grad, (B,)), (r, k)
            assert torch.equal(local, fulls[k] if r == 0 else torch.empty(0)), (r, k)
        for k, (kind, rg, sbp, local) in [kv for m in out["moved"] for kv in m.items()]:
            assert (kind, rg) == (type(want[k]).__name__, want[k].requires_grad), (r, k)
            assert sbp != (B,) and torch.equal(local, shard_of(fulls[k], sbp, flow.placement("cpu", [0, 1]), r)), (r, k)
