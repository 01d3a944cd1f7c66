"""A sharded checkpoint directory (``flow.save`` of a tree holding global tensors, every rank at
once) keeps what ``torch.save`` keeps of the tree's local tensors: storage sharing (views, tied
tensors), strides, offsets, Parameter-ness; and it takes every dtype torch.save takes, for local
and global tensors alike. torch's own round trip of the same objects is the reference; ranks are
simulated (threads)."""
import io

import pytest
import torch

import holoflow as flow
from holoflow.distributed.global_tensor import from_full
from holoflow.distributed.sharding import shard_of
from holoflow.distributed.world import simulate
from holoflow.sbp import S

from .test_serialization_views import CASES, _assert_same, _layout, _leaves, _partition, _torch_rt, _views

PLACE = flow.placement("cpu", [0, 1])


def _save_sharded(path, make_obj):
    """Every simulated rank saves ``{"obj": make_obj(), "g": <a global tensor>}`` to ``path``."""
    def fn(r):
        flow.save({"obj": make_obj(), "g": from_full(torch.arange(6.0), PLACE, S(0))}, path)
    simulate(2, fn)


@pytest.mark.parametrize("case", list(CASES))
def test_local_tensors_of_a_sharded_directory_keep_sharing_as_torch(case, tmp_path):
    ref = _torch_rt(CASES[case](torch), weights_only=True)
    path = str(tmp_path / "ck")
    _save_sharded(path, lambda: CASES[case](flow))
    got = flow.load(path)   # (a world of one process: the global tensor loads whole, local)
    assert torch.equal(got["g"].to_torch(), torch.arange(6.0))
    _assert_same(ref, got["obj"])


def test_every_rank_loads_the_local_views_sharing_and_like_can_make_one_global(tmp_path):
    ref = _torch_rt(_views(torch), weights_only=True)
    want = ([_layout(x) for _, x in _leaves(ref)], _partition(_leaves(ref)))
    path = str(tmp_path / "ck")
    _save_sharded(path, lambda: _views(flow))

    def fn(r):
        got = flow.load(path)["obj"]
        layouts = ([_layout(x) for _, x in _leaves(got)], _partition(_leaves(got)))
        like = {"obj": {"slice": from_full(torch.zeros(3, 6), PLACE, S(0))}}
        moved = flow.load(path, like=like)["obj"]
        return layouts, moved["slice"].sbp, moved["slice"].to_local().to_torch(), moved["T"].is_local
    for r, (layouts, sbp, local, t_local) in enumerate(simulate(2, fn)):
        assert layouts == want
        assert sbp == (S(0),) and t_local and torch.equal(local, shard_of(ref["slice"], (S(0),), PLACE, r))


def test_a_global_parameter_loads_as_a_parameter(tmp_path):
    path = str(tmp_path / "ck")
    ref = _torch_rt({"p": torch.nn.Parameter(torch.ones(4)), "f": torch.nn.Parameter(torch.ones(2), False)}, True)

    def fn(r):
        p = flow.nn.Parameter(from_full(torch.ones(4), PLACE, S(0)))
        f = flow.nn.Parameter(from_full(torch.ones(2), PLACE, S(0)), requires_grad=False)
        flow.save({"p": p, "f": f}, path)
    simulate(2, fn)
    got = flow.load(path)
    for k in ref:
        assert (type(got[k]).__name__, got[k].requires_grad) == (type(ref[k]).__name__, ref[k].requires_grad), k


# -- dtypes ------------------------------------------------------------------------------------
def _sample(dt: torch.dtype) -> torch.Tensor:
    """A 5x3 tensor of ``dt`` with distinct elements (bytes for the dtypes without arithmetic)."""
    n = 15
    if dt == torch.bool:
        return (torch.arange(n) % 3 == 0).reshape(5, 3)
    if dt.is_complex:
        x = torch.arange(n, dtype=torch.float64) / 4 - 1
        return torch.complex(x, -x).to(dt).reshape(5, 3)
    if dt.is_floating_point and dt.itemsize >= 2 or dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        return (torch.arange(n, dtype=torch.float64) / 4 - 1).to(dt).reshape(5, 3)
    if not dt.is_floating_point and dt in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                           torch.uint16, torch.uint32, torch.uint64):
        return torch.arange(n).to(dt).reshape(5, 3)
    return torch.arange(n * dt.itemsize, dtype=torch.uint8).view(dt).reshape(5, 3)   # bits*, e8m0, fp4x2


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _dtypes():
    names = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16",
             "bfloat16", "float32", "float64", "complex32", "complex64", "complex128", "float8_e4m3fn",
             "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn_x2", "bits8", "bits16"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_every_dtype_torch_saves_round_trips_through_a_sharded_directory(tmp_path):
    fulls = {str(dt): _sample(dt) for dt in _dtypes()}
    buf = io.BytesIO()
    torch.save(fulls, buf)
    buf.seek(0)
    ref = torch.load(buf, weights_only=True)   # what torch.save keeps: every one of them
    path = str(tmp_path / "ck")

    def save(r):
        tree = {k: from_full(v, PLACE, S(0)) for k, v in fulls.items()}
        tree.update({"local " + k: flow.from_torch(v.clone()) for k, v in fulls.items()})
        tree["local view complex128"] = tree["local torch.complex128"][1:, ::2]
        flow.save(tree, path)
    simulate(2, save)
    whole = flow.load(path)
    for k, want in ref.items():
        for got in (whole[k].to_torch(), whole["local " + k].to_torch()):
            assert got.dtype == want.dtype and got.shape == want.shape, k
            assert torch.equal(_bytes(got), _bytes(want)), k
    assert torch.equal(whole["local view complex128"].to_torch(), ref["torch.complex128"][1:, ::2])

    def load(r):
        like = {k: from_full(v, PLACE, S(1)) for k, v in fulls.items()}
        got = flow.load(path, like=like)
        return {k: got[k].to_local().to_torch() for k in fulls}
    for r, locals_ in enumerate(simulate(2, load)):
        for k, want in ref.items():
            want_r = shard_of(want, (S(1),), PLACE, r)
            assert locals_[k].dtype == want.dtype and torch.equal(_bytes(locals_[k]), _bytes(want_r)), (k, r)


def test_a_complex128_tensor_read_from_a_file_is_aligned_as_torch_loads_it(tmp_path):
    # safetensors aligns an entry for the dtype it stores (float64 pairs: 8 bytes); a complex128
    # needs 16, and torch's vectorized kernels fault on one at a mere 8-byte boundary
    x = torch.tensor([1 + 2j, 3 - 1j, 2j, 5.0], dtype=torch.complex128)
    torch.save(x, tmp_path / "t.pt")
    ref = torch.load(tmp_path / "t.pt", weights_only=True)
    for pad in range(16):   # the padding moves the entry across 8-byte boundaries of the file
        path = tmp_path / f"c{pad}.hf"
        flow.save({"b": flow.ones(pad, dtype=flow.bool), "c": flow.from_torch(x), "n" * pad: 1}, path)
        got = flow.load(path)["c"]
        assert got._data.data_ptr() % 16 == ref.data_ptr() % 16 == 0, pad
    with flow.no_grad():
        got[1] = 7 + 7j
    ref[1] = 7 + 7j
    assert torch.equal(got.to_torch(), ref)


def test_two_dtypes_over_one_local_storage_are_refused_on_every_rank_as_torch(tmp_path):
    t = torch.arange(4, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="view the same data as different types"):
        torch.save({"t": t, "i": t.view(torch.int32)}, io.BytesIO())

    def fn(r):
        x = flow.arange(4, dtype=flow.float32)
        try:
            flow.save({"t": x, "i": x.view(flow.int32), "g": from_full(torch.ones(2), PLACE, S(0))},
                      str(tmp_path / "ck"))
        except RuntimeError as e:
            return str(e)
        return None
    errors = simulate(2, fn)
    assert all(e is not None and "view the same data as different types" in e for e in errors), errors
    assert not (tmp_path / "ck").exists()


def test_global_views_keep_sharing_in_their_saved_layout_given_by_like_and_a_bad_shared_list_is_refused(tmp_path):
    """(the Gloo twin: tests/checkpoint/test_sharded_sharing_gloo.py)"""
    import json
    import os
    path = str(tmp_path / "ck")
    simulate(2, lambda r: flow.save({"w": (w := from_full(torch.arange(12.0).reshape(3, 4), PLACE, S(0))),
                                     "wT": w.t()}, path))

    def fn(r):
        got = flow.load(path, like={"w": from_full(torch.zeros(3, 4), PLACE, S(0))})   # (the saved layout)
        got["w"]._data.add_(1)
        return got["wT"].to_local().to_torch(), got["w"].to_local().to_torch()
    for r, (wt, w) in enumerate(simulate(2, fn)):
        assert torch.equal(wt, w.t()) and torch.equal(w, shard_of(torch.arange(12.0).reshape(3, 4) + 1, (S(0),),
                                                                   PLACE, r))
    man_path = os.path.join(path, "manifest.json")
    with open(man_path) as f:
        man = json.load(f)
    man["shared"]["1"][0][0][2] = "x"
    with open(man_path, "w") as f:
        json.dump(man, f)
    with pytest.raises(RuntimeError, match=r"corrupt manifest: \"shared\" of rank 1"):
        simulate(2, lambda r: flow.load(path))
