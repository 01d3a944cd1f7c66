"""Global tensors sharing a local storage (a global tensor and global views of it, tied tensors: a
state dict's detached entries of one Parameter) saved to a sharded directory by 2 Gloo ranks load
sharing it again, as ``torch.save``/``torch.load`` keep views and tied tensors: a write through
one shows in the others, with the saved strides and offsets. In another layout (``like=``) each
loads apart, its values right."""
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
