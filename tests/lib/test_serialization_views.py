"""flow.save / flow.load keep what torch.save / torch.load keep of tensors sharing a storage: the
sharing itself (a write through one loaded tensor shows in the others), strides, storage
offsets, contiguity, dtypes, requires_grad and Parameter-ness. Every case is built in both
libraries from the same code, round-tripped by each, and the two results compared, torch's
with weights_only=True and False."""
import io
import json
import os
import pickle

import pytest
import safetensors
import safetensors.torch
import torch

import holoflow as flow
from holoflow import serialization as S

DATA = os.path.join(os.path.dirname(__file__), "data")


# -- the cases: each builds the saved object with `lib` (torch or holoflow) --------------------
def _grid(lib, dtype=None):
    return lib.arange(24, dtype=dtype or lib.float32).reshape(4, 6)


def _views(lib):
    t = _grid(lib)
    return {"t": t, "slice": t[1:], "cols": t[:, 2:4], "T": t.T, "view": t.view(2, 12),
            "strided": t.as_strided((3, 3), (5, 1), 2), "select": t[2], "diag": t.diagonal(),
            "scalar": t[1, 2], "empty": t[2:2], "step": t[::2, ::3]}


def _views_alone(lib):   # the storage's owner is not saved: the whole storage still is (as torch)
    t = _grid(lib)
    return {"cols": t[:, 2:4], "T": t.T, "unsq": t[:, 1].unsqueeze(0)}


def _expand(lib):
    b = lib.arange(3, dtype=lib.float32)
    return {"b": b, "e": b.expand(4, 3), "alone": lib.arange(2, dtype=lib.float32).expand(2, 2)}


def _offsets(lib):   # two tensors of one storage at different offsets, not its owner
    s = lib.arange(20, dtype=lib.float64)
    return {"a": s[:5], "b": s[10:]}


def _dtypes(lib):
    out = {}
    for name, dt in [("f16", lib.float16), ("bf16", lib.bfloat16), ("f64", lib.float64), ("i64", lib.int64),
                     ("i8", lib.int8), ("u8", lib.uint8), ("i32", lib.int32)]:
        t = _grid(lib, dt)
        out[name], out[name + "_T"] = t, t.T[1:]
    return out


def _bool_complex(lib):
    b = lib.tensor([True, False, True, True, False])
    c = lib.tensor([1 + 2j, 3 + 4j, 5 + 6j, 7 - 8j], dtype=lib.complex64)
    c2 = lib.tensor([[1 + 1j, 2j], [3.0 + 0j, -4j]], dtype=lib.complex128)
    return {"b": b, "b_step": b[::2], "c": c, "c_tail": c[1:], "c2_T": c2.T}


def _zero_d_and_empty(lib):
    return {"s": lib.tensor(2.5), "s_alone": lib.arange(5, dtype=lib.float32)[3], "e": lib.zeros(0, 3),
            "e_i": lib.zeros(2, 0, dtype=lib.int64), "e_T": lib.zeros(0, 3).T}


def _grads(lib):
    x = lib.arange(6, dtype=lib.float32).requires_grad_(True)
    p = lib.nn.Parameter(lib.arange(12, dtype=lib.float32).reshape(3, 4))
    frozen = lib.nn.Parameter(lib.ones(4), requires_grad=False)
    return {"x": x, "x_tail": x[1:], "p": p, "pT": p.T, "p_data": p.detach()[1:], "p_row": lib.nn.Parameter(p.detach()[2]),
            "frozen": frozen, "frozen_view": frozen[1:], "tied": p}


def _nested(lib):
    t = _grid(lib)
    return [t, (t[1:], {"k": t[:, :1], "inner": [t.T, (t[3],)]}), t]


class _Tied:   # the same module in both libraries: tied weights, a buffer viewing a weight
    @staticmethod
    def make(lib):
        class Tied(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = lib.nn.Linear(3, 3, bias=False)
                self.b = lib.nn.Linear(3, 3, bias=False)
                self.b.weight = self.a.weight
                with lib.no_grad():
                    self.a.weight.copy_(lib.arange(9, dtype=lib.float32).reshape(3, 3))
                self.register_buffer("row", self.a.weight.detach()[1])
        return Tied()


def _state_dict(lib):
    return _Tied.make(lib).state_dict()


def _state_dict_vars(lib):
    return _Tied.make(lib).state_dict(keep_vars=True)


CASES = {"views": _views, "views_alone": _views_alone, "expand": _expand, "offsets": _offsets, "dtypes": _dtypes,
         "bool_complex": _bool_complex, "zero_d_and_empty": _zero_d_and_empty, "grads": _grads, "nested": _nested,
         "state_dict": _state_dict, "state_dict_vars": _state_dict_vars}


# -- round trips and comparison -------------------------------------------------------------
def _torch_rt(obj, weights_only, **kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=weights_only, **kw)


def _flow_rt(obj, tmp_path, **kw):
    path = tmp_path / "ckpt.hf"
    flow.save(obj, path)
    return flow.load(path, **kw)


def _leaves(obj, where="obj"):
    """(path, tensor) of every tensor in a nested tree, in order (repeats included)."""
    if isinstance(obj, (torch.Tensor, flow.Tensor)):
        return [(where, obj)]
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    return [leaf for k, v in items for leaf in _leaves(v, f"{where}[{k!r}]")]


def _torch_of(x):
    return x if isinstance(x, torch.Tensor) else x._data


def _layout(x):
    d = _torch_of(x)
    return (tuple(d.shape), d.stride(), d.storage_offset(), d.is_contiguous(), d.dtype, x.requires_grad,
            type(x).__name__ == "Parameter", d.untyped_storage().nbytes())


def _partition(leaves):
    """Which leaves share a storage and which are one object, as positions (library-free)."""
    ptrs, ids = [], []
    for _, x in leaves:
        st = _torch_of(x).untyped_storage()
        ptrs.append(st.data_ptr() if st.nbytes() else ("own", len(ptrs)))
        ids.append(id(x))
    return ([[j for j, q in enumerate(ptrs) if q == p] for p in ptrs],
            [[j for j, q in enumerate(ids) if q == i] for i in ids])


def _values(leaves):
    return [_torch_of(x).clone() for _, x in leaves]


def _poke(x, lib, value):
    """Writes one element of ``x`` in place (its first), through holoflow or torch."""
    if x.numel() == 0:
        return
    if x.dtype == lib.bool:
        value = not bool(x.reshape(-1)[0].item())
    with lib.no_grad():
        if x.dim() == 0:
            x.fill_(value)
        else:
            x[(0,) * x.dim()] = value


def _assert_same(ref, got):
    """``got`` (holoflow's load) matches ``ref`` (torch's load): values, layouts, sharing; then
    a write through each loaded tensor changes the same tensors in both."""
    rl, gl = _leaves(ref), _leaves(got)
    assert [p for p, _ in rl] == [p for p, _ in gl]
    for (where, r), (_, g) in zip(rl, gl):
        assert isinstance(g, flow.Tensor), where
        assert _layout(g) == _layout(r), where
        assert torch.equal(_torch_of(g), r), where
    assert _partition(gl) == _partition(rl)
    for i, ((where, r), (_, g)) in enumerate(zip(rl, gl)):
        _poke(r, torch, 100 + i)
        _poke(g, flow, 100 + i)
        for (w2, r2), (_, g2) in zip(rl, gl):
            assert torch.equal(_torch_of(g2), r2), f"after writing {where}: {w2}"


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_keeps_views_as_torch(case, weights_only, tmp_path):
    ref = _torch_rt(CASES[case](torch), weights_only)
    got = _flow_rt(CASES[case](flow), tmp_path)
    _assert_same(ref, got)


def test_views_actually_share_after_load(tmp_path):
    got = _flow_rt(_views(flow), tmp_path)
    with flow.no_grad():
        got["slice"][0, 0] = -1.0
        got["T"][5, 3] = -2.0
    assert got["t"][1, 0].item() == -1.0 and got["t"][3, 5].item() == -2.0 and got["view"][1, 11].item() == -2.0
    assert got["t"].is_contiguous() and not got["T"].is_contiguous() and got["slice"].storage_offset() == 6


def test_torch_tensors_given_to_flow_save(tmp_path):
    t = torch.arange(6.0)
    got = _flow_rt([t, t[2:], t], tmp_path)
    assert got[0] is got[2] and got[1].storage_offset() == 2
    with flow.no_grad():
        got[1][0] = 50.0
    assert got[0][2].item() == 50.0


def test_torch_save_file_loaded_by_flow_keeps_sharing_and_identity(tmp_path):
    p = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    path = tmp_path / "t.pt"
    torch.save({"p": p, "tied": p, "pT": p.T}, path)
    ref, got = torch.load(path, weights_only=True), flow.load(path)
    assert got["p"] is got["tied"] and ref["p"] is ref["tied"]
    _assert_same(ref, got)


@pytest.mark.parametrize("loc", ["cpu", "device", "dict", "callable", "meta"])
def test_map_location_keeps_views(loc, tmp_path):
    tloc = {"cpu": "cpu", "device": torch.device("cpu"), "dict": {"cpu": "cpu"},
            "callable": lambda storage, where: storage, "meta": "meta"}[loc]
    floc = flow.device("cpu") if loc == "device" else tloc
    ref = _torch_rt(_views(torch), True, map_location=tloc)
    got = _flow_rt(_views(flow), tmp_path, map_location=floc)
    for (where, r), (_, g) in zip(_leaves(ref), _leaves(got)):
        d = _torch_of(g)
        assert (d.device, d.shape, d.stride(), d.storage_offset()) == (r.device, r.shape, r.stride(),
                                                                       r.storage_offset()), where
    if loc != "meta":
        _assert_same(ref, got)


class Tied(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = flow.nn.Linear(3, 3, bias=False)
        self.b = flow.nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight
        self.register_buffer("row", self.a.weight.detach()[1])


class TorchTied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 3, bias=False)
        self.b = torch.nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight
        self.register_buffer("row", self.a.weight.detach()[1])


def test_whole_module_keeps_tied_weights_and_views(tmp_path):
    torch.manual_seed(0)
    tm = TorchTied()
    fm = Tied()
    fm.load_state_dict({k: flow.from_torch(v.clone()) for k, v in tm.state_dict().items()})
    with flow.no_grad():   # load_state_dict copied the row into the buffer's shared storage
        assert fm.row.tolist() == fm.a.weight[1].tolist()
    ref = _torch_rt(tm, weights_only=False)
    path = tmp_path / "m.hf"
    flow.save(fm, path)
    got = flow.load(path, weights_only=False)
    assert ref.a.weight is ref.b.weight and got.a.weight is got.b.weight
    assert isinstance(got.a.weight, flow.nn.Parameter) and got.a.weight.requires_grad
    _assert_same({"w": ref.a.weight, "row": ref.row}, {"w": got.a.weight, "row": got.row})


def test_two_dtypes_over_one_storage_are_refused_as_torch(tmp_path):
    for lib, run in [(torch, lambda o: torch.save(o, io.BytesIO())), (flow, lambda o: flow.save(o, tmp_path / "x"))]:
        t = lib.arange(4, dtype=lib.float32)
        with pytest.raises(RuntimeError, match="view the same data as different types"):
            run({"t": t, "i": t.view(lib.int32)})
    c = flow.tensor([1 + 2j], dtype=flow.complex64)
    with pytest.raises(RuntimeError, match="different types"):
        flow.save([c, flow.view_as_real(c)], tmp_path / "y")


# -- the file format: old files load, new files say what reads them -------------------------
def _manifest(path):
    with safetensors.safe_open(str(path), "pt") as f:
        return json.loads(f.metadata()["holoflow"]), list(f.keys())


def test_files_without_views_stay_version_1(tmp_path):
    t, p = flow.ones(2, 3), flow.nn.Parameter(flow.zeros(3))
    flow.save({"t": t, "again": t, "p": p}, tmp_path / "a.hf")
    manifest, keys = _manifest(tmp_path / "a.hf")
    assert manifest["version"] == 1 and keys == ["0", "1"] and "view" not in json.dumps(manifest)
    flow.save({"t": t, "row": t[1]}, tmp_path / "b.hf")
    manifest, keys = _manifest(tmp_path / "b.hf")
    assert manifest["version"] == 2 and keys == ["0"]


def test_file_written_by_version_1_code_loads():
    # views_v1.hf was written by the code before views were kept: each view was a dense copy
    got = flow.load(os.path.join(DATA, "views_v1.hf"))
    t = torch.arange(24.0).reshape(4, 6)
    assert torch.equal(got["t"].to_torch(), t) and torch.equal(got["row"].to_torch(), t[1:])
    assert torch.equal(got["tT"].to_torch(), t.T) and got["tT"].is_contiguous()
    assert got["tied"] is got["t"] and got["p_again"] is got["p"] and isinstance(got["p"], flow.nn.Parameter)
    assert got["p"].dtype == flow.float64 and got["p"].requires_grad and got["pT"].requires_grad
    assert got["mask"].tolist() == [True, False, True] and got["n"] == 3
    m = flow.load(os.path.join(DATA, "tied_module_v1.hf"), weights_only=False)
    assert m[0].weight is m[1].weight and m[0].weight.tolist() == torch.arange(9.0).reshape(3, 3).tolist()


def _patched(tmp_path, fn):
    """A file with views whose manifest ``fn`` rewrites (a damaged or hostile file)."""
    path = tmp_path / "v.hf"
    t = flow.arange(6.0)
    flow.save({"t": t, "v": t[1:]}, path)
    with safetensors.safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        manifest = json.loads(f.metadata()["holoflow"])
    view = manifest["root"]["items"][1][1]["view"]
    fn(view)
    safetensors.torch.save_file(tensors, str(path), metadata={"holoflow": json.dumps(manifest)})
    return path


@pytest.mark.parametrize("damage, message", [
    (lambda v: v.update(offset=4), "reaches element 9 of a storage of 6"),
    (lambda v: v.update(stride=[7]), "reaches element"),
    (lambda v: v.update(shape=[5, 1]), "shape .* and stride .* are not lists"),
    (lambda v: v.update(offset=-1), "non-negative ints"),
    (lambda v: v.update(stride=[True]), "are not lists"),
    (lambda v: v.update(id=0), "id >= 1"),
    (lambda v: v.pop("shape"), "are not lists"),
    (lambda v: v.update(shape=[2 ** 70], stride=[0]), "not a valid layout"),
])
def test_corrupt_views_are_refused(tmp_path, damage, message):
    with pytest.raises(S.CheckpointError, match=message):
        flow.load(_patched(tmp_path, damage))


def test_newer_version_is_refused(tmp_path):
    path = tmp_path / "m.hf"
    manifest = {"format": "holoflow", "version": 3, "root": {"t": "value", "v": 1}}
    safetensors.torch.save_file({"0": torch.ones(1)}, str(path), metadata={"holoflow": json.dumps(manifest)})
    with pytest.raises(S.CheckpointError, match="version 3 is newer"):
        flow.load(path)


def test_weights_only_still_never_unpickles_views(tmp_path):
    path = tmp_path / "m.hf"
    flow.save({"m": Tied(), "w": flow.ones(2)[1:]}, path)
    with pytest.raises(pickle.UnpicklingError, match="weights_only=False"):
        flow.load(path)


# -- global tensors: the sharded format is unchanged; views load into global layouts ---------
def test_views_load_into_global_layouts(tmp_path):
    from holoflow.distributed.world import simulate
    path = tmp_path / "v.hf"
    t = flow.arange(24.0).reshape(4, 6)
    flow.save({"T": t.T, "rows": t[1:3]}, path)
    want = torch.arange(24.0).reshape(4, 6)

    def fn(r):
        pl = flow.placement("cpu", [0, 1])
        like = {"T": flow.zeros(6, 4, placement=pl, sbp=flow.sbp.split(0)),
                "rows": flow.zeros(2, 6, placement=pl, sbp=flow.sbp.split(1))}
        got = flow.load(path, like=like)
        return got["T"].to_local().to_torch(), got["rows"].to_local().to_torch(), got["T"].sbp

    for r, (tt, rows, sbp) in enumerate(simulate(2, fn)):
        assert sbp == (flow.sbp.split(0),)
        assert torch.equal(tt, want.T[3 * r:3 * r + 3]) and torch.equal(rows, want[1:3, 3 * r:3 * r + 3])


def test_global_dst_rank_file_keeps_local_views(tmp_path):
    from holoflow.distributed.world import simulate
    path = tmp_path / "g.hf"

    def fn(r):
        pl = flow.placement("cpu", [0, 1])
        g = flow.arange(8.0, placement=pl, sbp=flow.sbp.split(0))
        loc = flow.arange(6.0)
        flow.save({"g": g, "loc": loc, "tail": loc[2:]}, path, global_dst_rank=0)

    simulate(2, fn)
    got = flow.load(path)
    ref = _torch_rt({"g": torch.arange(8.0), "loc": (x := torch.arange(6.0)), "tail": x[2:]}, True)
    _assert_same(ref, got)


def test_storage_with_a_partial_last_element(tmp_path):
    # 10 bytes viewed as 2 float32: torch.save writes it, torch.load refuses it ("record size");
    # holoflow keeps the 8 reachable bytes
    tu = torch.arange(10, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="record size"):
        _torch_rt({"f": tu[:8].view(torch.float32)}, True)
    u = flow.arange(10, dtype=flow.uint8)
    got = _flow_rt({"f": u[:8].view(flow.float32), "g": u[4:8].view(flow.float32)}, tmp_path)
    assert torch.equal(got["f"].to_torch(), tu[:8].view(torch.float32))
    assert got["g"].storage_offset() == 1 and got["g"]._data.untyped_storage().nbytes() == 8
    with flow.no_grad():
        got["g"][0] = 2.0
    assert got["f"][1].item() == 2.0


def test_corrupt_dtypes_map_is_refused(tmp_path):
    path = tmp_path / "c.hf"
    flow.save([flow.tensor([1 + 2j, 3j], dtype=flow.complex128)], path)
    with safetensors.safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        manifest = json.loads(f.metadata()["holoflow"])
    assert manifest["dtypes"] == {"0": "complex128"} and tensors["0"].dtype == torch.float64
    assert flow.load(path)[0].tolist() == [1 + 2j, 3j]
    for bad in [{"0": "float32"}, {"0": "os.system"}, {"9": "complex128"}, ["complex128"]]:
        safetensors.torch.save_file(tensors, str(path), metadata={"holoflow": json.dumps(dict(manifest, dtypes=bad))})
        with pytest.raises(S.CheckpointError, match="corrupt manifest"):
            flow.load(path)
