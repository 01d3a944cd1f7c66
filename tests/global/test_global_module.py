"""nn.Module.to_global and holoflow.utils.global_view on simulated ranks (threads)."""
import copy
import warnings

import pytest
import torch

import holoflow as flow
from holoflow.core.errors import HoloflowError
from holoflow.distributed.comm_track import count
from holoflow.distributed.world import simulate
from holoflow.sbp import B, P, S
from holoflow.utils import global_view as gv


def _mlp():
    flow.manual_seed(0)
    return flow.nn.Sequential(flow.nn.Linear(6, 8), flow.nn.ReLU(), flow.nn.Linear(8, 4))


def _megatron(name, t):
    return {"0.weight": S(0), "0.bias": S(0), "2.weight": S(1)}.get(name, B)


def _full(t):
    return t.to_global(sbp=(B,) * t.placement.ndim).to_local().to_torch()


def test_module_to_global_shards_in_place_and_matches_single_process():
    ref = _mlp()
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    want = ref(flow.from_torch(x))
    want.sum().backward()
    models = [copy.deepcopy(ref) for _ in range(2)]
    for m in models:
        m.zero_grad(set_to_none=True)

    def fn(r):
        m = models[r]
        w = m[0].weight
        place = flow.placement("cpu", [0, 1])
        with count() as c:
            assert m.to_global(place, _megatron) is m
        # the first rank's values, one broadcast per tensor (as OneFlow's to_global of a local tensor)
        assert dict(c.counts) == {"broadcast": 4} and c.bytes["broadcast"] == 4 * (8 * 6 + 8 + 4 * 8 + 4), c
        assert m[0].weight is w and w.requires_grad and w.grad is None
        assert w.sbp == (S(0),) and tuple(w.to_local().shape) == (4, 6)
        assert m[2].weight.sbp == (S(1),) and m[2].bias.sbp == (B,)
        y = m(flow.from_torch(x).to_global(place, B))
        y.sum().backward()
        return _full(y), _full(m[0].weight.grad), _full(m[2].weight.grad), m[0].weight.grad.sbp
    for y, g0, g2, gsbp in simulate(2, fn):
        torch.testing.assert_close(y, want.to_torch())
        torch.testing.assert_close(g0, ref[0].weight.grad.to_torch())
        torch.testing.assert_close(g2, ref[2].weight.grad.to_torch())
        assert gsbp == (S(0),)


def test_module_to_global_broadcast_copies_rank0_values():
    models = [_mlp() for _ in range(2)]
    with torch.no_grad():
        models[1][0].weight._data.add_(1.0)  # rank 1 holds different values
    want = models[0][0].weight.to_torch().clone()

    def fn(r):
        m = models[r].to_global(flow.placement("cpu", [0, 1]), B, broadcast=True)
        return m[0].weight.to_local().to_torch()
    for got in simulate(2, fn):
        torch.testing.assert_close(got, want)


def test_module_to_global_2d_mesh_tied_weights_and_back_to_local():
    flow.manual_seed(0)
    emb = flow.nn.Embedding(10, 4)
    head = flow.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    ref = flow.nn.ModuleDict({"emb": emb, "head": head})
    want = ref["emb"].weight.to_torch().clone()
    models = [copy.deepcopy(ref) for _ in range(4)]

    def fn(r):
        m = models[r]
        place = flow.placement("cpu", [[0, 1], [2, 3]])
        seen = []
        m.to_global(place, lambda n, t: seen.append(n) or (B, S(0)))
        assert seen == ["emb.weight"] and m["head"].weight is m["emb"].weight
        local = m["emb"].weight.to_local().shape
        m.to_local()  # OneFlow's Module.to_local: each rank keeps its shard
        return tuple(local), m["head"].weight.to_torch(), m["emb"].weight.is_global
    for r, (local, shard, is_global) in enumerate(simulate(4, fn)):
        assert local == (5, 4) and not is_global
        torch.testing.assert_close(shard, want[5 * (r % 2):5 * (r % 2) + 5])


def test_module_to_global_errors_name_the_tensor():
    m = _mlp()
    with pytest.raises(HoloflowError, match="placement= is required"):
        m.to_global(sbp=B)
    with pytest.raises(HoloflowError, match="sbp= is required"):
        m.to_global(flow.placement("cpu", [0]))

    def fn(r):
        _mlp().to_global(flow.placement("cpu", [0, 1]), lambda n, t: S(1) if n == "0.bias" else B)
    with pytest.raises(RuntimeError, match="out of range.*'0.bias'"):
        simulate(2, fn)


def test_global_view_to_global_and_to_local_walk_containers():
    full = torch.arange(12.0).reshape(4, 3)

    def fn(r):
        place = flow.placement("cpu", [0, 1])
        tree = {"a": flow.from_torch(full), "b": [flow.from_torch(full[:, :2]), (3, None)]}
        g = gv.to_global(tree, place, lambda t: S(1) if t.shape[1] == 2 else B,
                         warn_on_non_tensor_leaf=False)
        assert g["a"].sbp == (B,) and g["b"][0].sbp == (S(1),) and g["b"][1] == (3, None)
        assert g["a"].shape == (4, 3) and g["b"][0].shape == (4, 4)  # S(1) from local shards
        s = gv.to_global(g, sbp=S(0), warn_on_non_tensor_leaf=False)
        loc = gv.to_local(s)
        assert not loc["a"].is_global and isinstance(loc["b"], list)
        return loc["a"].to_torch(), loc["b"][0].to_torch()
    (a0, b0), (a1, b1) = simulate(2, fn)
    torch.testing.assert_close(torch.cat([a0, a1]), full)
    torch.testing.assert_close(torch.cat([b0, b1]), torch.cat([full[:, :2], full[:, :2]], 1))


def test_global_view_warns_on_non_tensor_leaves():
    with pytest.warns(UserWarning, match="leaf of type str"):
        out = gv.to_global({"x": flow.ones(2), "tag": "a"}, flow.placement("cpu", [0]), B)
    assert out["x"].is_global and out["tag"] == "a"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gv.to_local(out)["tag"] == "a"


def test_global_mode_supplies_defaults():
    assert not gv.current_global_mode().is_enabled
    with pytest.raises(HoloflowError, match="both placement= and sbp="):
        with gv.global_mode(True, sbp=B):
            pass

    def fn(r):
        place = flow.placement("cpu", [0, 1])
        local = flow.ones(2, 3) * (r + 1)   # (inside the scope, creation ops make global tensors)
        with gv.global_mode(True, placement=place, sbp=S(0)) as mode:
            assert gv.current_global_mode() is mode and mode.sbp == (S(0),)
            x = gv.to_global([local])[0]
            m = _mlp().to_global()  # built global in the scope's placement and split(0)
            with gv.global_mode(False):
                assert not gv.current_global_mode().is_enabled
                with pytest.raises(HoloflowError, match="needs both"):
                    gv.to_global(flow.ones(1))
        return x.shape, _full(x).sum().item(), m[0].weight.sbp, m[0].weight.to_local().shape
    for shape, total, sbp, local in simulate(2, fn):
        assert shape == (4, 3) and total == 6 + 12 and sbp == (S(0),) and tuple(local) == (4, 6)


def test_partial_sum_is_accepted_for_buffers():
    def fn(r):
        bn = flow.nn.BatchNorm1d(4)
        bn.to_global(flow.placement("cpu", [0, 1]), lambda n, t: P if n == "running_mean" else B)
        return bn.running_mean.sbp, _full(bn.running_var)
    for sbp, var in simulate(2, fn):
        assert sbp == (P,)
        torch.testing.assert_close(var, torch.ones(4))


def test_a_model_built_inside_global_mode_starts_from_the_single_process_weights():
    import threading
    flow.manual_seed(3)
    want = [p.detach().to_torch().clone() for p in _mlp().parameters()]
    lock = threading.Lock()   # simulated ranks share torch's generator: draw one rank at a time

    def fn(r):
        with lock, gv.global_mode(True, placement=flow.placement("cpu", [0, 1]), sbp=S(0)):
            flow.manual_seed(3)
            m = _mlp()
        return [(p.sbp, _full(p)) for p in m.parameters()]
    for got in simulate(2, fn):
        for (sbp, full), w in zip(got, want):
            assert sbp == (S(0),)
            torch.testing.assert_close(full, w)
