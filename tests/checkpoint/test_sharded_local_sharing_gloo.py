"""A local tensor sharing storage with a global one (``g.to_local()``, a slice of it, saved beside
``g``) in a sharded checkpoint of 2 Gloo ranks loads sharing it again, as ``torch.save``/``torch.load``
give back tensors saved together over one storage. The local tensors of a sharded checkpoint are
rank 0's, so on rank 0 (where they were views of its part of ``g``) they load as views of ``g``'s
part; on rank 1 they load with rank 0's values, apart. Another layout (``like=``) or a partial sum
(reduced when saved, its local part not) loads them apart, values right. One storage seen as two
dtypes (a global tensor and ``g.view(int32)``, or its local part so viewed) is refused on every
rank, as ``torch.save`` refuses it (RuntimeError), and nothing is written."""
import io
import os

import pytest
import torch

import holoflow as flow
from holoflow.distributed.global_tensor import from_full
from holoflow.distributed.sharding import shard_of
from holoflow.sbp import P, S

FULL = torch.arange(12.0).reshape(4, 3)


def _ptr(t) -> int:
    return t._data.untyped_storage().data_ptr()


def _layout(t) -> tuple:
    return tuple(t._data.shape), t._data.stride(), t._data.storage_offset()


def save_and_load(rank: int, path: str) -> dict:
    place = flow.placement("cpu", [0, 1])
    g = from_full(FULL, place, S(0))
    local = g.to_local()
    saved = {"g": g, "local": local, "row": local[1], "col": local[:, 2], "gT": g.t()}
    flow.save(saved, path)
    got = flow.load(path)
    out = {"ptrs": {k: _ptr(v) for k, v in got.items()},
           "layouts": {k: _layout(v) for k, v in got.items()},
           "want_layouts": {k: _layout(v) for k, v in saved.items()},
           "kinds": {k: v.is_global for k, v in got.items()},
           "values": {k: (v.to_local() if v.is_global else v).to_torch().clone() for k, v in got.items()}}
    got["local"]._data.add_(100)   # a write through the local tensor shows in g's part where they share
    out["written"] = {k: (v.to_local() if v.is_global else v).to_torch().clone() for k, v in got.items()}
    moved = flow.load(path, like={"g": from_full(torch.zeros(4, 3), place, S(1))})   # another layout: apart
    out["moved"] = (_ptr(moved["g"]) != _ptr(moved["local"]), moved["g"].to_local().to_torch(),
                    moved["local"].to_torch())
    return out


def test_a_local_view_of_a_global_tensors_part_loads_sharing_it_on_rank_0_as_torch(world2, tmp_path):
    ref = torch.arange(6.0).reshape(2, 3)   # torch: tensors saved together over one storage load sharing it
    buf = io.BytesIO()
    torch.save({"local": ref, "row": ref[1], "col": ref[:, 2]}, buf)
    tload = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    assert tload["local"].untyped_storage().data_ptr() == tload["row"].untyped_storage().data_ptr() \
        == tload["col"].untyped_storage().data_ptr()

    place = flow.placement("cpu", [0, 1])
    zero = shard_of(FULL, (S(0),), place, 0)
    out0, out1 = world2.run(save_and_load, str(tmp_path / "ck"))
    for r, out in enumerate((out0, out1)):
        mine = shard_of(FULL, (S(0),), place, r)
        assert out["kinds"] == {"g": True, "local": False, "row": False, "col": False, "gT": True}, r
        assert torch.equal(out["values"]["g"], mine) and torch.equal(out["values"]["gT"], mine.t()), r
        for k, v in {"local": zero, "row": zero[1], "col": zero[:, 2]}.items():   # rank 0's local tensors
            assert torch.equal(out["values"][k], v), (r, k)
        apart, moved_g, moved_local = out["moved"]
        assert apart and torch.equal(moved_g, shard_of(FULL, (S(1),), place, r)) and torch.equal(moved_local, zero)
    # rank 0: one storage, as saved (strides and offsets too), as torch.load gives its views back
    assert len(set(out0["ptrs"].values())) == 1, out0["ptrs"]
    assert out0["layouts"] == out0["want_layouts"]
    for k in ("g", "local"):
        assert torch.equal(out0["written"][k], zero + 100), k
    assert torch.equal(out0["written"]["row"], zero[1] + 100) and torch.equal(out0["written"]["gT"], zero.t() + 100)
    # rank 1: its local tensors are rank 0's values, not its part of g: apart
    assert out1["ptrs"]["local"] == out1["ptrs"]["row"] != out1["ptrs"]["g"] == out1["ptrs"]["gT"]
    assert torch.equal(out1["written"]["g"], shard_of(FULL, (S(0),), place, 1))


def save_partial(rank: int, path: str) -> tuple:
    place = flow.placement("cpu", [0, 1])
    g = from_full(FULL, place, S(0)).to_global(sbp=P)   # (each rank's part: not the value saved)
    flow.save({"g": g, "local": g.to_local()}, path)
    got = flow.load(path)
    return _ptr(got["g"]) != _ptr(got["local"]), got["g"].to_local().to_torch(), got["local"].to_torch()


def test_a_local_part_of_a_partial_sum_loads_apart_its_values_right(world2, tmp_path):
    results = world2.run(save_partial, str(tmp_path / "ck"))
    saved_local0 = None
    for r, (apart, g, local) in enumerate(results):
        assert apart, r
        assert torch.equal(g, FULL if r == 0 else torch.zeros_like(FULL)), r   # (P loads with the sum on rank 0)
        saved_local0 = local if saved_local0 is None else saved_local0
        assert torch.equal(local, saved_local0), r
    assert not torch.equal(saved_local0, FULL)   # rank 0's partial part, not the sum


def save_two_dtypes(rank: int, path: str, which: str, dst: int | None) -> str | None:
    place = flow.placement("cpu", [0, 1])
    g = from_full(FULL, place, S(0))
    other = g.view(flow.int32) if which == "global" else g.to_local().view(flow.int32)
    try:
        flow.save({"g": g, "i": other}, path, global_dst_rank=dst)
    except RuntimeError as e:
        return f"{type(e).__name__}: {e}"
    return None


@pytest.mark.parametrize("dst", [None, 0], ids=["sharded", "global_dst_rank"])
@pytest.mark.parametrize("which", ["global", "local"])
def test_one_storage_as_two_dtypes_is_refused_on_every_rank_as_torch(world2, tmp_path, which, dst):
    t = torch.arange(4.0)
    with pytest.raises(RuntimeError, match="view the same data as different types"):
        torch.save({"t": t, "i": t.view(torch.int32)}, io.BytesIO())
    path = str(tmp_path / "ck")
    errors = world2.run(save_two_dtypes, path, which, dst)
    assert all(e is not None and e.startswith("RuntimeError") and "view the same data as different types" in e
               and "obj['i']" in e and ".clone()" in e for e in errors), errors
    assert not os.path.exists(path) and os.listdir(tmp_path) == []
