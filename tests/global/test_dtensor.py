"""torch's DTensor API on simulated ranks: the mesh, placements as SBP, conversions against the
logical tensor, the gradient conventions, the styles' layouts, every refusal's class and words,
and what mock_torch resolves. (tests/dist/test_dtensor_api.py runs the same API on real Gloo
worlds against torch's own DTensor.)"""
import numpy as np
import pytest

import holoflow as flow
from holoflow import mock_torch
from holoflow.core.errors import UnsupportedError
from holoflow.distributed import world
from holoflow.dtensor import (DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor,
                              init_device_mesh)
from holoflow.dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def _sim(n, fn):
    return world.simulate(n, fn)


def test_mesh_is_the_placement_of_its_ranks_and_slices_by_name():
    def f(r):
        mesh = DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
        tp, dp = mesh["tp"], mesh["dp"]
        # a placement of its ranks under torch's conventions, so not OneFlow's placement of them
        # (an uneven split gives other shards); meshes of the same ranks are equal whatever their names
        same = DeviceMesh("cpu", [[0, 1], [2, 3]])
        assert isinstance(mesh, flow.placement) and mesh.hierarchy == (2, 2)
        assert mesh != flow.placement("cpu", ranks=[[0, 1], [2, 3]]) and mesh == same and hash(mesh) == hash(same)
        swapped = mesh["tp", "dp"]
        # whole values of a sub-mesh tensor come from its own ranks (each row holds another tensor)
        row = distribute_tensor(flow.arange(4.0) + 10 * mesh.get_local_rank("dp"), tp, [Shard(0)], src_data_rank=None)
        assert row.sum().item() == 6.0 + 40 * mesh.get_local_rank("dp") and row.tolist() == row.full_tensor().tolist()
        return (tp.flat_ranks, dp.flat_ranks, tp.get_local_rank(), mesh.get_local_rank("dp"), mesh.get_coordinate(),
                tuple(mesh.get_group("tp")), swapped.ranks.tolist(), swapped.mesh_dim_names, repr(tp))
    got = _sim(4, f)
    assert [g[0] for g in got] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [g[1] for g in got] == [(0, 2), (1, 3), (0, 2), (1, 3)]
    assert [g[2:5] for g in got] == [(0, 0, (0, 0)), (1, 0, (0, 1)), (0, 1, (1, 0)), (1, 1, (1, 1))]
    assert [g[5] for g in got] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert got[0][6] == [[0, 2], [1, 3]] and got[0][7] == ("tp", "dp")
    assert got[0][8] == "DeviceMesh((tp=2), 'cpu', stride=(1,))"


def test_placements_are_sbp_and_values_are_the_logical_tensor():
    full = np.arange(30.0, dtype=np.float32).reshape(5, 6)

    def f(r):
        mesh = DeviceMesh("cpu", [0, 1])
        t = flow.tensor(full)
        out = {}
        for p in (Shard(0), Shard(1), Shard(-1), Replicate(), Partial()):
            d = distribute_tensor(t, mesh, [p])
            out[repr(p)] = (d.placements, tuple(d.sbp), d.to_local().numpy(), d.full_tensor().numpy())
        return out
    for r, got in enumerate(_sim(2, f)):
        rows = [full[:3], full[3:]][r]   # the first n % p ranks one larger
        assert got["Shard(dim=0)"][0] == (Shard(0),) and got["Shard(dim=0)"][1] == (flow.sbp.split(0),)
        np.testing.assert_array_equal(got["Shard(dim=0)"][2], rows)
        np.testing.assert_array_equal(got["Shard(dim=1)"][2], full[:, 3 * r:3 * r + 3])
        assert got["Shard(dim=-1)"][0] == (Shard(1),)   # normalised, as torch
        np.testing.assert_array_equal(got["Replicate()"][2], full)
        np.testing.assert_array_equal(got["Partial(sum)"][2], full / 2)   # torch's share of a whole value
        assert got["Partial(sum)"][1] == (flow.sbp.partial_sum,)
        for k in got:
            np.testing.assert_array_equal(got[k][3], full)


def test_gradient_conventions_on_a_mesh_and_on_a_placement():
    """A DeviceMesh tensor's to_local gradient is laid out like the tensor (torch); a placement's
    is dual(sbp) (OneFlow: replicas' gradients summed); grad_placements says it explicitly."""
    def f(r):
        out = []
        for place in (DeviceMesh("cpu", [0, 1]), flow.placement("cpu", ranks=[0, 1])):
            x = flow.ones(3, placement=place, sbp=flow.sbp.broadcast).detach().requires_grad_()
            (x.to_local() * 2).sum().backward()
            y = flow.ones(3, placement=place, sbp=flow.sbp.broadcast).detach().requires_grad_()
            (y.to_local(grad_placements=[Partial()]) * 2).sum().backward()
            out.append((x.grad.to_local().tolist(), y.grad.to_local().tolist()))
        return out
    for mesh_grads, place_grads in _sim(2, f):
        assert mesh_grads == ([2.0] * 3, [4.0] * 3)
        assert place_grads == ([4.0] * 3, [4.0] * 3)


def test_from_local_trusts_replicas_unless_run_check():
    def f(r):
        mesh = DeviceMesh("cpu", [0, 1])
        mine = flow.full((2,), float(r))
        return (DTensor.from_local(mine, mesh, [Replicate()]).to_local().tolist(),
                DTensor.from_local(mine, mesh, [Replicate()], run_check=True).to_local().tolist())
    assert _sim(2, f) == [([0.0, 0.0], [0.0, 0.0]), ([1.0, 1.0], [0.0, 0.0])]


def _mlp_weights() -> dict:
    rng = np.random.default_rng(0)   # (simulated ranks share the process's generator: no draws inside)
    return {k: rng.standard_normal(s).astype(np.float32) * 0.5
            for k, s in (("0.weight", (8, 6)), ("0.bias", (8,)), ("2.weight", (3, 8)), ("2.bias", (3,)))}


def test_tensor_parallel_mlp_equals_one_process():
    """Colwise then rowwise Linear: forward, gradients, grad-norm clipping and SGD steps equal the
    unsharded model's."""
    weights = _mlp_weights()

    def run(r):
        m = flow.nn.Sequential(flow.nn.Linear(6, 8), flow.nn.Tanh(), flow.nn.Linear(8, 3))
        m.load_state_dict({k: flow.tensor(v) for k, v in weights.items()})
        if r is not None:
            parallelize_module(m, DeviceMesh("cpu", [0, 1]), {"0": ColwiseParallel(), "2": RowwiseParallel()})
        opt = flow.optim.SGD(m.parameters(), lr=0.2)
        x = flow.tensor(np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6))
        losses, norms = [], []
        for _ in range(3):
            opt.zero_grad()
            loss = (m(x) ** 2).mean()
            loss.backward()
            norm = flow.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
            opt.step()
            losses.append(loss.item())
            norms.append((norm.full_tensor() if norm.is_global else norm).item())
        ws = {k: (p.full_tensor() if p.is_global else p).detach().numpy() for k, p in m.named_parameters()}
        return losses, norms, ws, {k: p.placements for k, p in m.named_parameters() if p.is_global}
    want_l, want_n, want_w, _ = run(None)
    assert want_n[0] > 0.05   # (the clipping scales)
    for losses, norms, ws, layouts in _sim(2, run):
        np.testing.assert_allclose(losses, want_l, rtol=1e-6)
        np.testing.assert_allclose(norms, want_n, rtol=1e-6)
        for k in want_w:
            np.testing.assert_allclose(ws[k], want_w[k], rtol=1e-5, atol=1e-7)
        assert layouts == {"0.weight": (Shard(0),), "0.bias": (Shard(0),), "2.weight": (Shard(1),),
                           "2.bias": (Replicate(),)}


def test_distribute_module_replicates_the_rest_and_refuses_twice():
    def f(r):
        mesh = DeviceMesh("cpu", [0, 1])
        m = flow.nn.Sequential(flow.nn.Linear(2, 2), flow.nn.BatchNorm1d(2))
        distribute_module(m, mesh)
        layouts = {k: t.placements for k, t in [*m.named_parameters(), *m.named_buffers()]}
        with pytest.raises(RuntimeError, match="only be called once"):
            distribute_module(m, mesh)
        return layouts
    for layouts in _sim(2, f):
        assert set(layouts.values()) == {(Replicate(),)} and len(layouts) == 7


def test_refusals_name_what_is_legal():
    def f(r):
        mesh = DeviceMesh("cpu", [0, 1])
        d = distribute_tensor(flow.ones(4, 2), mesh, [Shard(0)])
        with pytest.raises(ValueError, match="needs 1 value"):
            distribute_tensor(flow.ones(4), mesh, [Shard(0), Replicate()])
        with pytest.raises(IndexError, match=r"Shard\(dim=2\) is out of range .* legal dims are -2..1"):
            distribute_tensor(flow.ones(4, 2), mesh, [Shard(2)])
        with pytest.raises(UnsupportedError, match=r"Partial\('max'\).*only Partial\('sum'\)"):
            distribute_tensor(flow.ones(4), mesh, [Partial("max")])
        with pytest.raises(RuntimeError, match="redistributing to Partial is for ops' own outputs"):
            d.redistribute(mesh, [Partial()])
        with pytest.raises(RuntimeError, match="already a DTensor"):
            DTensor.from_local(d, mesh, [Shard(0)])
        with pytest.raises(ValueError, match="different placements"):
            distribute_tensor(d, mesh, [Replicate()])
        with pytest.raises(AttributeError, match="placements"):
            getattr(flow.ones(2), "placements")  # noqa: B009
        with pytest.raises(AttributeError, match="local"):
            flow.ones(2).full_tensor()
        with pytest.raises(RuntimeError, match="no device_mesh given and none is current"):
            distribute_tensor(flow.ones(2))
        with mesh:   # the current mesh serves
            assert distribute_tensor(flow.ones(2)).placements == (Replicate(),)
        with pytest.raises(TypeError, match="DTensor.from_local"):
            DTensor(flow.ones(2))
        with pytest.raises(NotImplementedError, match="supports nn.Linear and nn.Embedding"):
            parallelize_module(flow.nn.ReLU(), mesh, ColwiseParallel())
        two_d = DeviceMesh("cpu", [[0, 1]], mesh_dim_names=("dp", "tp"))
        with pytest.raises(ValueError, match=r"1-D mesh; slice this 2-D one first \(mesh\['tp'\]\)"):
            parallelize_module(flow.nn.Linear(2, 2), two_d, ColwiseParallel())
        with pytest.raises(KeyError, match="no dimension named 'pp'"):
            two_d["pp"]
        with pytest.raises(RuntimeError, match="pass mesh_dim="):
            two_d.get_local_rank()
        with pytest.raises(KeyError, match="no mesh_dim_names"):
            mesh["tp"]
        return True
    assert _sim(2, f) == [True, True]


def test_init_device_mesh_refuses_a_shape_of_another_size():
    with pytest.raises(RuntimeError, match=r"mesh_shape \(2, 2\) holds 4 ranks, but the world has 1"):
        init_device_mesh("cpu", (2, 2))
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    assert mesh.flat_ranks == (0,) and repr(mesh) == "DeviceMesh((dp=1), 'cpu', stride=(1,))"
    t = distribute_tensor(flow.arange(4.0), mesh, [Shard(0)])
    assert t.to_local().tolist() == [0.0, 1.0, 2.0, 3.0] and isinstance(t, DTensor)


def test_mock_torch_resolves_the_dtensor_modules():
    with mock_torch.enable():
        import torch.distributed.tensor as dt
        from torch.distributed._tensor import Shard as OldShard
        from torch.distributed.device_mesh import DeviceMesh as Mesh
        from torch.distributed.tensor.parallel import ColwiseParallel as Col
        import torch
        assert dt.distribute_tensor is distribute_tensor and OldShard is Shard
        assert Mesh is DeviceMesh and Col is ColwiseParallel
        assert torch.distributed.tensor.DTensor is DTensor
        assert torch.distributed.tensor.parallel.parallelize_module is parallelize_module
        # (DCP's tutorial saves an app state through torch's Stateful protocol: it was missing)
        from torch.distributed.checkpoint.stateful import Stateful
        assert isinstance(flow.nn.Linear(2, 2), Stateful) and not isinstance(flow.ones(2), Stateful)


def _fsdp_run(r, mesh_ranks, weights, xs, mp=None, placement_fn=None, offload=None):
    """A 3-step AdamW run of the MLP: with ``r`` a simulated rank under fully_shard on
    ``mesh_ranks`` (its own batch ``xs[r]``), else the one-process data-parallel reference (the
    mean of every rank's loss)."""
    from holoflow.dtensor.fsdp import MixedPrecisionPolicy, fully_shard
    m = flow.nn.Sequential(flow.nn.Linear(6, 8), flow.nn.Tanh(), flow.nn.Linear(8, 3))
    m.load_state_dict({k: flow.tensor(v) for k, v in weights.items()})
    if r is not None:
        mesh = DeviceMesh("cpu", mesh_ranks)
        policy = mp or MixedPrecisionPolicy()
        more = {"offload_policy": offload} if offload is not None else {}
        fully_shard(m[0], mesh=mesh, mp_policy=policy, shard_placement_fn=placement_fn, **more)
        fully_shard(m, mesh=mesh, mp_policy=policy, shard_placement_fn=placement_fn, **more)
    opt = flow.optim.AdamW(m.parameters(), lr=0.05)
    for _ in range(3):
        opt.zero_grad()
        if r is None:
            loss = sum((m(flow.tensor(x)) ** 2).mean() for x in xs) / len(xs)
        else:
            out = m(flow.tensor(xs[r]))
            loss = (out.float() ** 2).mean()
        loss.backward()
        opt.step()
    return {k: (p.full_tensor() if p.is_global else p).detach().numpy() for k, p in m.named_parameters()}, \
        {k: p.placements for k, p in m.named_parameters() if p.is_global}


@pytest.mark.parametrize("mesh_ranks, dim, offload", [([0, 1, 2, 3], 0, False), ([[0, 1], [2, 3]], 0, False),
                                                       ([0, 1, 2, 3], 1, False), ([0, 1, 2, 3], 0, True)],
                         ids=["fsdp", "hsdp", "fsdp_columns", "cpu_offload"])
def test_fully_shard_equals_data_parallel(mesh_ranks, dim, offload):
    """FSDP, HSDP, FSDP with shard_placement_fn sharding matrices on their columns (Shard(-1);
    vectors on dim 0), and with CPUOffloadPolicy on a cpu mesh (where the shards are):
    three AdamW steps equal one process's data parallel ones."""
    from holoflow.dtensor.fsdp import CPUOffloadPolicy
    weights = _mlp_weights()
    xs = [np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6) * (1 + r / 2) for r in range(4)]
    want, _ = _fsdp_run(None, mesh_ranks, weights, xs)
    fn = (lambda p: Shard(-1) if p.dim() == 2 else None) if dim else None
    policy = CPUOffloadPolicy() if offload else None
    for got, layouts in _sim(4, lambda r: _fsdp_run(r, mesh_ranks, weights, xs, placement_fn=fn, offload=policy)):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
        lead = (Replicate(),) * (np.ndim(mesh_ranks) - 1)
        assert layouts == {k: lead + (Shard(dim if k.endswith("weight") else 0),) for k in want}


def test_fully_shard_mixed_precision_and_refusals():
    from holoflow.dtensor.fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard,
                                       register_fsdp_forward_method)

    def f(r):
        mesh = DeviceMesh("cpu", [0, 1])
        m = flow.nn.Linear(4, 2)
        seen = []
        m.register_forward_hook(lambda mod, i, o: seen.append((i[0].dtype, mod.weight.dtype, o.dtype)))
        fully_shard(m, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=flow.bfloat16,
                                                                 output_dtype=flow.float32))
        out = m(flow.ones(3, 4))
        out.sum().backward()
        assert m.weight.dtype == flow.float32 and m.weight.grad.dtype == flow.float32   # the shards' dtype
        assert m.weight.placements == (Shard(0),) and isinstance(m, FSDPModule) and type(m).__name__ == "FSDPLinear"
        m.probe = lambda: m.weight.is_global
        register_fsdp_forward_method(m, "probe")
        assert m.probe() is False and m.weight.is_global   # gathered for the call only
        with pytest.raises(RuntimeError, match="already sharded"):
            fully_shard(m, mesh=mesh)
        with pytest.raises(ValueError, match="reshard_after_forward should be a bool, got int"):
            m.set_reshard_after_forward(2)
        with pytest.raises(ValueError, match=r"gave Shard\(2\) for 'weight' of shape \(2, 2\); the dim must be in"):
            fully_shard(flow.nn.Linear(2, 2), mesh=mesh, shard_placement_fn=lambda p: Shard(2))
        with pytest.raises(NotImplementedError, match="may return a Shard\\(dim\\) or None"):
            fully_shard(flow.nn.Linear(2, 2), mesh=mesh, shard_placement_fn=lambda p: Replicate())
        with pytest.raises(TypeError, match="takes a Module or a non-empty list of Modules, got \\[\\]"):
            fully_shard([], mesh=mesh)
        with pytest.raises(TypeError, match="offload_policy must be an OffloadPolicy or a CPUOffloadPolicy, got str"):
            fully_shard(flow.nn.Linear(2, 2), mesh=mesh, offload_policy="cpu")
        with pytest.raises(NotImplementedError, match="CPUOffloadPolicy on a cuda mesh .* is not supported"):
            fully_shard(flow.nn.Linear(2, 2), mesh=DeviceMesh("cuda", [0, 1]), offload_policy=CPUOffloadPolicy())
        with pytest.raises(ValueError, match="1-D mesh .* or a 2-D one"):
            fully_shard(flow.nn.Linear(2, 2), mesh=DeviceMesh("cpu", [[[0, 1]]]))
        return seen, out.dtype
    for seen, dtype in _sim(2, f):
        assert seen == [(flow.bfloat16, flow.bfloat16, flow.bfloat16)] and dtype == flow.float32


def test_mock_torch_resolves_fsdp():
    from holoflow.dtensor import fsdp
    with mock_torch.enable():
        from torch.distributed._composable.fsdp import fully_shard as old
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
        assert fully_shard is fsdp.fully_shard and old is fsdp.fully_shard
        assert FSDPModule is fsdp.FSDPModule and MixedPrecisionPolicy is fsdp.MixedPrecisionPolicy


def test_uneven_shards_are_torch_chunks_on_a_mesh_and_balanced_on_a_placement():
    """n rows over 4 ranks: a DeviceMesh's shards are torch.chunk's pieces (5: 2,2,1,0; the last
    ones empty), a OneFlow placement's balanced (5: 2,1,1,1); each redistributes, moves to the
    other and takes torch.chunk's pieces in from_local; mixing the two in one op is refused by name."""
    import torch

    def chunk(t, p, r, dim=0):   # torch's own pieces, empty ones appended
        parts = torch.chunk(t, p, dim)
        return parts[r] if r < len(parts) else t.narrow(dim, 0, 0)

    def f(r):
        mesh, place = DeviceMesh("cpu", [0, 1, 2, 3]), flow.placement("cpu", ranks=[0, 1, 2, 3])
        out = {}
        for n in (1, 2, 3, 5, 6, 9, 10):
            full = flow.arange(float(3 * n)).reshape(n, 3)
            d = distribute_tensor(full, mesh, [Shard(0)])
            o = full.to_global(place, flow.sbp.broadcast).to_global(sbp=flow.sbp.split(0))
            out[n] = (d.to_local().tolist(), o.to_local().tolist(),
                      d.redistribute(mesh, [Shard(1)]).to_local().tolist(),
                      o.to_global(placement=mesh).to_local().tolist(), d.to_global(placement=place).to_local().tolist())
        mine = chunk(torch.arange(30.0).reshape(10, 3), 4, r)
        fl = DTensor.from_local(flow.tensor(mine.numpy()), mesh, [Shard(0)], shape=(10, 3), stride=(3, 1))
        out["from_local"] = (tuple(fl.shape), fl.full_tensor().tolist(), (fl * 2).sum(0).full_tensor().tolist())
        try:
            distribute_tensor(flow.ones(5, 3), mesh, [Shard(0)]) + flow.ones(5, 3).to_global(place, flow.sbp.broadcast)
        except Exception as e:   # noqa: BLE001 -- the message is checked below
            out["mixed"] = f"{type(e).__name__}: {e}"
        return out
    got = _sim(4, f)
    for r in range(4):
        for n in (1, 2, 3, 5, 6, 9, 10):
            full = torch.arange(float(3 * n)).reshape(n, 3)
            base, extra = divmod(n, 4)   # OneFlow's: the first n % 4 ranks one larger
            start = r * base + min(r, extra)
            balanced = full[start:start + base + (r < extra)]
            mesh_rows, place_rows, mesh_cols, moved_to_mesh, moved_to_place = got[r][n]
            assert mesh_rows == chunk(full, 4, r).tolist(), (n, r)
            assert place_rows == balanced.tolist(), (n, r)
            assert mesh_cols == chunk(full, 4, r, dim=1).tolist(), (n, r)
            assert moved_to_mesh == chunk(full, 4, r).tolist() and moved_to_place == balanced.tolist(), (n, r)
        shape, whole, col_sums = got[r]["from_local"]
        assert shape == (10, 3) and whole == torch.arange(30.0).reshape(10, 3).tolist()
        assert col_sums == (torch.arange(30.0).reshape(10, 3) * 2).sum(0).tolist()
        assert got[r]["mixed"].startswith("HoloflowError") and "OneFlow's and torch's conventions" in got[r]["mixed"]


def test_fully_shard_keeps_tied_weights_tied():
    """An embedding tied to the output head: one shard, gathered once, its gradient the sum of
    both uses (as the unsharded model's)."""
    from holoflow.dtensor.fsdp import fully_shard
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    ids = np.array([[1, 2, 5], [0, 3, 3]])

    def run(r):
        m = flow.nn.Sequential(flow.nn.Embedding(6, 4), flow.nn.Linear(4, 6, bias=False))
        m[1].weight = m[0].weight
        with flow.no_grad():
            m[0].weight.copy_(flow.tensor(w))
        if r is not None:
            fully_shard(m, mesh=DeviceMesh("cpu", [0, 1]))
        (m(flow.tensor(ids)) ** 2).sum().backward()
        g = m[0].weight.grad
        return m[0].weight is m[1].weight, (g.full_tensor() if g.is_global else g).numpy()
    tied, want = run(None)
    for same, got in _sim(2, run):
        assert same and tied
        np.testing.assert_allclose(got, want, rtol=1e-6)   # (every rank the same batch: their average)


def test_full_optimizer_state_dict_round_trip():
    """get_optimizer_state_dict(full) of an FSDP model, loaded with set_optimizer_state_dict(full)
    into another FSDP model's fresh optimizer (from rank 0's copy, broadcast): the same states and
    the same next step."""
    from holoflow.dtensor.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                        set_model_state_dict, set_optimizer_state_dict,
                                                        get_model_state_dict)
    from holoflow.dtensor.fsdp import fully_shard
    weights = _mlp_weights()
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)

    def make():
        m = flow.nn.Sequential(flow.nn.Linear(6, 8), flow.nn.Tanh(), flow.nn.Linear(8, 3))
        m.load_state_dict({k: flow.tensor(v) for k, v in weights.items()})
        fully_shard(m, mesh=DeviceMesh("cpu", [0, 1]))
        return m, flow.optim.AdamW(m.parameters(), lr=0.05)

    def step(m, opt):
        opt.zero_grad()
        (m(flow.tensor(x)) ** 2).mean().backward()
        opt.step()

    def f(r):
        m, opt = make()
        for _ in range(2):
            step(m, opt)
        full = StateDictOptions(full_state_dict=True)
        osd = get_optimizer_state_dict(m, opt, options=full)
        msd = get_model_state_dict(m, options=full)
        m2, opt2 = make()
        bcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(m2, msd if r == 0 else {}, options=bcast)
        set_optimizer_state_dict(m2, opt2, osd if r == 0 else {}, options=bcast)
        step(m, opt)
        step(m2, opt2)
        return ({k: p.full_tensor().detach().numpy() for k, p in m.named_parameters()},
                {k: p.full_tensor().detach().numpy() for k, p in m2.named_parameters()}, sorted(osd["state"]))
    for a, b, names in _sim(2, f):
        assert names == ["0.bias", "0.weight", "2.bias", "2.weight"]
        for k in a:
            np.testing.assert_array_equal(b[k], a[k])


def _blocks_weights() -> dict:
    rng = np.random.default_rng(2)
    return {f"{i}.weight": rng.standard_normal((6, 6)).astype(np.float32) * 0.4 for i in range(4)}


def _blocks_run(r, weights, xs, reshard=None, mp=None, unsynced=0):
    """Four Linear+Tanh blocks (the last directly under the root): with ``r`` a simulated rank
    under fully_shard per block and on the root (each rank its batches ``xs[r]``), else one
    process on every rank's batches. ``unsynced``: that many micro-batches backward without
    gradient sync before the synchronized one. Returns the parameters after one SGD step and
    the shards' gradients after the unsynced micro-batches."""
    from holoflow.dtensor.fsdp import MixedPrecisionPolicy, fully_shard
    layers = []
    for _ in range(4):
        layers += [flow.nn.Linear(6, 6, bias=False), flow.nn.Tanh()]
    m = flow.nn.Sequential(*layers)
    m.load_state_dict({f"{2 * int(k[0])}.weight": flow.tensor(v) for k, v in weights.items()})
    if r is not None:
        mesh = DeviceMesh("cpu", [0, 1])
        policy = mp or MixedPrecisionPolicy()
        for i in (0, 2, 4):
            fully_shard(m[i], mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(m, mesh=mesh, mp_policy=policy)
    opt = flow.optim.SGD(m.parameters(), lr=0.5)

    def loss_of(batch):
        return (m(flow.tensor(batch)).float() ** 2).mean()
    early = None
    if r is None:   # every rank's micro-batches: the mean over ranks of each rank's sum
        loss = sum(loss_of(b) for bs in xs for b in bs) / len(xs)
    else:
        if unsynced:
            m.set_requires_gradient_sync(False)
            for b in xs[r][:unsynced]:
                loss_of(b).backward()
            early = [p.grad for p in m.parameters()]
            m.set_requires_gradient_sync(True)
        loss = loss_of(xs[r][unsynced])
    loss.backward()
    opt.step()
    return {k: (p.full_tensor() if p.is_global else p).detach().numpy() for k, p in m.named_parameters()}, early


def _storage_sizes(r, weights, x, reshard):
    """The unsharded weights' storage bytes on rank ``r`` after forward and after backward."""
    from holoflow.dtensor.fsdp import fully_shard
    m = flow.nn.Sequential(*[flow.nn.Linear(6, 6, bias=False) for _ in range(4)])
    m.load_state_dict({k: flow.tensor(v) for k, v in weights.items()})
    seen = []
    for lin in m:
        lin.register_forward_hook(lambda mod, a, out: seen.append(mod.weight))
    mesh = DeviceMesh("cpu", [0, 1])
    for lin in m[:3]:
        fully_shard(lin, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(m, mesh=mesh)
    loss = (m(flow.tensor(x)) ** 2).sum()
    after_forward = [t._data.untyped_storage().nbytes() for t in seen]
    loss.backward()
    after_backward = [t._data.untyped_storage().nbytes() for t in seen]
    grads = {k: p.grad.full_tensor().numpy() for k, p in m.named_parameters()}
    return after_forward, after_backward, [t.is_global for t in seen], grads


def test_reshard_after_forward_frees_the_unsharded_weights_and_regathers_them_for_backward():
    """Blocks reshard after forward by default (the root keeps its own: torch's choice): their
    unsharded weights' storage is empty once the forward returned, gathered again when backward
    reaches the block, and every one is empty after backward; the gradients are those of keeping them
    (reshard_after_forward=False), which equal one process's."""
    weights = {f"{i}.weight": w for i, w in enumerate(_blocks_weights().values())}
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    m = flow.nn.Sequential(*[flow.nn.Linear(6, 6, bias=False) for _ in range(4)])
    m.load_state_dict({k: flow.tensor(v) for k, v in weights.items()})
    (m(flow.tensor(x)) ** 2).sum().backward()
    want = {k: p.grad.numpy() for k, p in m.named_parameters()}
    full = 6 * 6 * 4
    for reshard, forward_sizes in ((None, [0, 0, 0, full]), (True, [0, 0, 0, full]), (False, [full] * 4)):
        for fwd, bwd, is_global, grads in _sim(2, lambda r: _storage_sizes(r, weights, x, reshard)):
            assert fwd == forward_sizes and not any(is_global)
            assert bwd == [0, 0, 0, 0]   # (resharded after backward, the root's too: torch's default)
            for k in want:   # (both ranks the same batch: the average is one process's gradient)
                np.testing.assert_allclose(grads[k], want[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mp", [False, True], ids=["fp32", "bf16_params"])
def test_resharded_blocks_train_as_kept_ones(mp):
    """A step of the four-block model, blocks resharded after forward vs kept, each rank its own
    batch: the same parameters (bit for bit: the same values are gathered again), and equal to
    one process's data parallel step without mixed precision."""
    from holoflow.dtensor.fsdp import MixedPrecisionPolicy
    weights = _blocks_weights()
    xs = [[np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6) * (1 + r)] for r in range(2)]
    policy = MixedPrecisionPolicy(param_dtype=flow.bfloat16) if mp else None
    want, _ = _blocks_run(None, weights, xs)
    kept = _sim(2, lambda r: _blocks_run(r, weights, xs, reshard=False, mp=policy))
    freed = _sim(2, lambda r: _blocks_run(r, weights, xs, reshard=True, mp=policy))
    for (a, _), (b, _) in zip(kept, freed):
        for k in a:
            np.testing.assert_array_equal(b[k], a[k])
            np.testing.assert_allclose(b[k], want[k], rtol=3e-2 if mp else 1e-5, atol=3e-3 if mp else 1e-6)


def test_an_in_place_write_of_a_saved_activation_is_still_caught_in_a_resharded_block():
    """Resharding keeps autograd's saved tensors (it frees storage, it packs nothing): a block
    writing in place into what tanh saved fails backward as torch's does."""
    from holoflow.dtensor.fsdp import fully_shard

    class Bad(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = flow.nn.Linear(4, 4)

        def forward(self, x):
            y = flow.tanh(self.lin(x))
            y.mul_(2)
            return y

    def f(r):
        m = flow.nn.Sequential(Bad(), flow.nn.Linear(4, 1))
        fully_shard(m[0], mesh=DeviceMesh("cpu", [0, 1]))
        fully_shard(m, mesh=DeviceMesh("cpu", [0, 1]))
        out = m(flow.ones(2, 4)).sum()
        with pytest.raises(RuntimeError, match="modified by an in-place operation"):
            out.backward()
        return True
    assert _sim(2, f) == [True, True]


@pytest.mark.parametrize("reshard, mp", [(True, False), (False, False), (True, True)],
                         ids=["resharded", "kept", "resharded_bf16_params"])
def test_gradient_accumulation_without_sync(reshard, mp):
    """Two micro-batches with set_requires_gradient_sync(False) then one with True: no shard
    gets a gradient until the synchronized backward, which reduces all three; one SGD step equals
    one process's over every rank's three micro-batches."""
    from holoflow.dtensor.fsdp import MixedPrecisionPolicy
    weights = _blocks_weights()
    xs = [[np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6) * (1 + r + j / 3) for j in range(3)]
          for r in range(2)]
    want, _ = _blocks_run(None, weights, xs)
    policy = MixedPrecisionPolicy(param_dtype=flow.bfloat16) if mp else None
    for got, early in _sim(2, lambda r: _blocks_run(r, weights, xs, reshard=reshard, mp=policy, unsynced=2)):
        assert early == [None] * 4
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=3e-2 if mp else 1e-5, atol=3e-3 if mp else 1e-6)


def test_unshard_registers_the_unsharded_parameters_until_reshard():
    from holoflow.dtensor.fsdp import fully_shard

    def f(r):
        m = flow.nn.Linear(4, 2)
        fully_shard(m, mesh=DeviceMesh("cpu", [0, 1]))
        m.unshard()
        whole = m.weight
        out = m(flow.ones(1, 4))
        m.reshard()
        return whole.is_global, tuple(whole.shape), m.weight.is_global, tuple(m.weight.to_local().shape), \
            out.shape
    for unsharded, shape, sharded, local, out in _sim(2, f):
        assert not unsharded and shape == (2, 4) and sharded and local == (1, 4) and tuple(out) == (1, 2)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("reshard", [True, False], ids=["resharded", "kept"])
def test_activation_checkpointed_blocks_under_fully_shard(reshard, reentrant):
    """Blocks whose forward recomputes under activation checkpointing (torchtitan's order: wrap,
    then fully_shard the wrapper): the recomputation in backward reads the unsharded weights,
    registered again when backward reaches the block; the gradients equal one process's and the
    shards are registered back after backward."""
    from holoflow.dtensor.fsdp import fully_shard
    from holoflow.utils.checkpoint import checkpoint

    class Checkpointed(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = flow.nn.Sequential(flow.nn.Linear(6, 6, bias=False), flow.nn.Tanh())

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=reentrant)
    weights = list(_blocks_weights().values())[:3]

    def run(r):
        m = flow.nn.Sequential(*[Checkpointed() for _ in range(3)])
        m.load_state_dict({f"{i}.inner.0.weight": flow.tensor(w) for i, w in enumerate(weights)})
        if r is not None:
            for block in m:
                fully_shard(block, mesh=DeviceMesh("cpu", [0, 1]), reshard_after_forward=reshard)
            fully_shard(m, mesh=DeviceMesh("cpu", [0, 1]))
        x = flow.linspace(-1, 1, 12).reshape(2, 6).requires_grad_(reentrant)   # (reentrant: an input needs grad)
        (m(x) ** 2).sum().backward()
        return [(p.grad.full_tensor() if p.is_global else p.grad).numpy() for p in m.parameters()], \
            [p.is_global for p in m.parameters()]
    want, _ = run(None)
    for got, sharded in _sim(2, run):
        assert sharded == [True] * 3
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_local_map_runs_a_local_function_on_shards():
    """W (4x6, columns sharded) times X (6x2, rows sharded) locally is a partial sum: the mapped
    function's output as Partial equals W @ X, its gradients W's and X's; the decorator form,
    in_grad_placements, a call without DTensors, and the refusals with torch's classes."""
    from holoflow.dtensor.experimental import local_map
    w = np.arange(24, dtype=np.float32).reshape(4, 6) / 10
    x = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
    tw, tx = flow.tensor(w, requires_grad=True), flow.tensor(x, requires_grad=True)
    (flow.mm(tw, tx) ** 2).sum().backward()

    @local_map(out_placements=[Partial()], in_placements=([Shard(1)], [Shard(0)]))
    def mm(a, b):
        return flow.mm(a, b)

    def f(r):
        mesh = DeviceMesh("cpu", [0, 1])
        dw = distribute_tensor(flow.tensor(w), mesh, [Shard(1)]).requires_grad_()
        dx = distribute_tensor(flow.tensor(x), mesh, [Shard(0)]).requires_grad_()
        y = mm(dw, dx)
        (y.full_tensor() ** 2).sum().backward()
        rep = distribute_tensor(flow.tensor(x), mesh, [Replicate()]).requires_grad_()
        # a replica's local gradient is a partial sum when told so: the ranks' halves add up
        half = local_map(lambda a: a * (r + 1), out_placements=[Replicate()], in_placements=([Replicate()],),
                         in_grad_placements=([Partial()],))(rep)
        half.to_local().sum().backward()
        errors = []
        for call, cls in ((lambda: mm(dx, dx), ValueError),
                          (lambda: local_map(flow.mm, [Partial()], in_placements=([Shard(1)],))(dw, dx), AssertionError),
                          (lambda: local_map(lambda a: (a, a), [Shard(0)])(dx), AssertionError),
                          (lambda: local_map(lambda a, k: a, [Shard(0)], in_placements=([Shard(0)], [Shard(0)]))(dx, 2),
                           AssertionError),
                          (lambda: local_map(lambda a: dx, [Shard(0)])(dx), AssertionError)):
            with pytest.raises(cls) as info:
                call()
            errors.append(str(info.value))
        plain = mm(flow.ones(2, 3), flow.ones(3, 2))
        return (y.placements, y.full_tensor().detach().numpy(), dw.grad.full_tensor().numpy(), dx.grad.full_tensor().numpy(),
                rep.grad.full_tensor().numpy(), errors, plain.is_global)
    for placements, y, gw, gx, grep, errors, plain_global in _sim(2, f):
        assert placements == (Partial(),) and not plain_global
        np.testing.assert_allclose(y, w @ x, rtol=1e-6)
        np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=1e-5)
        np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-5)
        np.testing.assert_allclose(grep, np.full((6, 2), 3.0))   # 1 + 2: each rank's own factor
        assert "laid out as (Shard(dim=0),), the function takes (Shard(dim=1),)" in errors[0]
        assert "redistribute_inputs=True" in errors[0]
        assert "in_placements has 1 entries for 2" in errors[1]
        assert "out_placements has 1 entries, the function returned 2" in errors[2]
        assert "argument 1 is a int, not a tensor" in errors[3]
        assert "output 0 is a DTensor" in errors[4]


def _three_sgd_steps(m, x: np.ndarray, graph: bool) -> None:
    """Three SGD steps (lr 0.1) of ``m`` on the loss mean(m(x) ** 2): eager, or as an nn.Graph."""
    opt = flow.optim.SGD(m.parameters(), lr=0.1)

    def step(batch):
        loss = (m(batch) ** 2).mean()
        loss.backward()
        return loss
    if not graph:
        for _ in range(3):
            opt.zero_grad()
            step(flow.tensor(x))
            opt.step()
        return

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)

        def build(self, batch):
            return step(batch)
    train = Train()
    for _ in range(3):
        train(flow.tensor(x))


def test_tensor_parallel_styles_inside_nn_graph():
    """Colwise/Rowwise with use_local_output=False (layers pass DTensors) trace into nn.Graph: three
    SGD steps equal one process's eager ones. With use_local_output=True (a rank's local shard for
    the next layer) and under fully_shard (each rank's batch, local tensors) the trace stops with
    what to do instead."""
    weights = _mlp_weights()
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)

    def run(r, local_output=False, fsdp=False):
        from holoflow.dtensor.fsdp import fully_shard
        m = flow.nn.Sequential(flow.nn.Linear(6, 8), flow.nn.Tanh(), flow.nn.Linear(8, 3))
        m.load_state_dict({k: flow.tensor(v) for k, v in weights.items()})
        mesh = DeviceMesh("cpu", [0, 1])
        if fsdp:
            fully_shard(m, mesh=mesh)
        elif r is not None:
            parallelize_module(m, mesh, {"0": ColwiseParallel(use_local_output=local_output),
                                         "2": RowwiseParallel(use_local_output=local_output)})
        _three_sgd_steps(m, x, graph=r is not None)
        return {k: (p.full_tensor() if p.is_global else p).detach().numpy() for k, p in m.named_parameters()}

    def refused(r, **kw):
        with pytest.raises(Exception) as info:
            run(r, **kw)
        return str(info.value)
    want = run(None)
    for got in _sim(2, run):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    for msg in _sim(2, lambda r: refused(r, local_output=True)):
        assert "ColwiseParallel: use_local_output=True hands the next layer" in msg
        assert "use_local_output=False" in msg
    for msg in _sim(2, lambda r: refused(r, fsdp=True)):
        assert "fully_shard: FSDPSequential runs on each rank's own batch" in msg and "enable_zero(True, stage=3)" in msg


def test_uneven_tensor_parallel_layers_in_nn_graph_on_four_ranks():
    """A column-parallel layer of 5 outputs on 4 ranks (torch.chunk's 2,2,1,0: one rank holds no
    rows) after a column/row-parallel pair, trained 3 SGD steps in nn.Graph: every weight equals
    one process's eager training, and each rank's shard is torch's."""
    rng = np.random.default_rng(7)
    shapes = {"0.weight": (12, 6), "0.bias": (12,), "2.weight": (3, 12), "2.bias": (3,), "3.weight": (5, 3),
              "3.bias": (5,)}
    weights = {k: rng.standard_normal(s).astype(np.float32) * 0.5 for k, s in shapes.items()}
    x = np.linspace(-1, 1, 30, dtype=np.float32).reshape(5, 6)

    def run(r):
        m = flow.nn.Sequential(flow.nn.Linear(6, 12), flow.nn.Tanh(), flow.nn.Linear(12, 3), flow.nn.Linear(3, 5))
        m.load_state_dict({k: flow.tensor(v) for k, v in weights.items()})
        if r is not None:
            parallelize_module(m, DeviceMesh("cpu", [0, 1, 2, 3]),
                               {"0": ColwiseParallel(use_local_output=False), "2": RowwiseParallel(use_local_output=False),
                                "3": ColwiseParallel(use_local_output=False)})
        _three_sgd_steps(m, x, graph=r is not None)
        return {k: ((p.full_tensor() if p.is_global else p).detach().numpy(),
                    tuple(p.to_local().shape) if p.is_global else None) for k, p in m.named_parameters()}
    want = run(None)
    got = _sim(4, run)
    for r, ranks in enumerate(got):
        for k in want:
            np.testing.assert_allclose(ranks[k][0], want[k][0], rtol=1e-5, atol=1e-6, err_msg=f"rank {r} {k}")
        assert ranks["3.weight"][1] == ((2, 3), (2, 3), (1, 3), (0, 3))[r]
        assert ranks["0.weight"][1] == (3, 6) and ranks["2.weight"][1] == (3, 3)


@pytest.mark.parametrize("reshard", [True, False], ids=["resharded", "kept"])
def test_a_group_of_modules_is_gathered_from_its_first_forward_to_its_last(reshard):
    """fully_shard([embedding, head]) (torchtitan's group): gathered when the embedding runs,
    still unsharded while the block between runs, resharded after the head; one process's
    gradients; a pass that skips the head ends the group with the root's forward."""
    from holoflow.dtensor.fsdp import FSDPModule, fully_shard
    rng = np.random.default_rng(3)
    weights = {"0.weight": rng.standard_normal((10, 4)).astype(np.float32),
               "1.weight": rng.standard_normal((4, 4)).astype(np.float32) * 0.5,
               "2.weight": rng.standard_normal((10, 4)).astype(np.float32) * 0.5}
    ids = np.array([[1, 2, 9], [0, 3, 3]])

    class Net(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.mid = flow.nn.Embedding(10, 4), flow.nn.Linear(4, 4, bias=False)
            self.head = flow.nn.Linear(4, 10, bias=False)

        def forward(self, x, head=True):
            h = flow.tanh(self.mid(self.emb(x)))
            return self.head(h) if head else h

    def run(r):
        m = Net()
        m.load_state_dict({k.replace("0.", "emb.").replace("1.", "mid.").replace("2.", "head."): flow.tensor(v)
                           for k, v in weights.items()})
        seen = []
        m.mid.register_forward_pre_hook(lambda mod, a: seen.append((m.emb.weight.is_global, m.head.weight.is_global)))
        if r is not None:
            mesh = DeviceMesh("cpu", [0, 1])
            fully_shard([m.emb, m.head], mesh=mesh, reshard_after_forward=reshard)
            fully_shard(m.mid, mesh=mesh)
            fully_shard(m, mesh=mesh)
        (m(flow.tensor(ids)) ** 2).sum().backward()
        after = (m.emb.weight.is_global, m.head.weight.is_global)
        short = m(flow.tensor(ids), head=False)   # the head does not run: the root's forward ends the group
        ended = (m.emb.weight.is_global, m.head.weight.is_global)
        grads = {k: (p.grad.full_tensor() if p.is_global else p.grad).numpy() for k, p in m.named_parameters()}
        return seen, after, ended, grads, tuple(short.shape), isinstance(m.emb, FSDPModule) and isinstance(m.head,
                                                                                                             FSDPModule)
    _, _, _, want, _, _ = run(None)
    for seen, after, ended, grads, shape, mixed in _sim(2, run):
        assert seen == [(False, False), (False, False)]   # (unsharded while the block between runs)
        assert after == ended == (True, True) and shape == (2, 3, 4) and mixed
        for k in want:
            np.testing.assert_allclose(grads[k], want[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["fully_shard", "parallelize_module", "distribute_module"])
def test_an_optimizer_made_before_sharding_trains_the_shards(how):
    """fully_shard / parallelize_module / distribute_module lay out the parameter objects
    themselves (torch registers new ones: an optimizer built before would hold the old tensors
    and silently train nothing): the same objects before and after, three SGD steps equal one
    process's, and a weight tied between two modules stays one parameter."""
    from holoflow.dtensor.fsdp import fully_shard
    weights = _mlp_weights()
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)

    def run(r):
        m = flow.nn.Sequential(flow.nn.Linear(6, 8), flow.nn.Tanh(), flow.nn.Linear(8, 3))
        m.load_state_dict({k: flow.tensor(v) for k, v in weights.items()})
        tied = flow.nn.ModuleList([flow.nn.Linear(2, 2, bias=False), flow.nn.Linear(2, 2, bias=False)])
        tied[1].weight = tied[0].weight
        opt = flow.optim.SGD(m.parameters(), lr=0.1)
        before = [id(p) for p in m.parameters()]
        if r is not None:
            mesh = DeviceMesh("cpu", [0, 1])
            if how == "fully_shard":
                fully_shard(m, mesh=mesh)
                fully_shard(tied, mesh=mesh)
            elif how == "parallelize_module":
                parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
                parallelize_module(tied, mesh, {"0": ColwiseParallel(), "1": ColwiseParallel()})
            else:   # (replicated; the input made a replicated DTensor at the module's boundary)
                distribute_module(m, mesh, input_fn=lambda mod, inputs, mesh: tuple(
                    DTensor.from_local(t, mesh, [Replicate()]) for t in inputs))
                distribute_module(tied, mesh)
        for _ in range(3):
            opt.zero_grad()
            (m(flow.tensor(x)) ** 2).mean().backward()
            opt.step()
        return ([id(p) for p in m.parameters()] == before, tied[0].weight is tied[1].weight,
                {k: (p.full_tensor() if p.is_global else p).detach().numpy() for k, p in m.named_parameters()})
    _, _, want = run(None)
    for same, still_tied, got in _sim(2, run):
        assert same and still_tied
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


class _ViewedWeight(flow.nn.Module):
    """A weight read through views (a transpose, then a slice): matmul saves a view of the
    unsharded storage that resharding frees and backward gathers into again."""

    def __init__(self):
        super().__init__()
        self.w = flow.nn.Parameter(flow.tensor(np.arange(24, dtype=np.float32).reshape(4, 6) / 20))

    def forward(self, x):
        return flow.tanh(x[:, :5] @ self.w.t()[1:])


@pytest.mark.parametrize("reshard", [True, False], ids=["resharded", "kept"])
def test_views_of_unsharded_weights_and_an_eval_pass_between(reshard):
    """Views of an unsharded weight saved by autograd read the re-gathered storage (the input's
    gradient reads them); a no_grad forward between training steps (evaluation) leaves the next
    step's gradients as one process's."""
    from holoflow.dtensor.fsdp import fully_shard

    def run(r):
        m = flow.nn.Sequential(_ViewedWeight(), flow.nn.Linear(4, 2))
        with flow.no_grad():
            m[1].weight.copy_(flow.tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 10 - 0.3))
            m[1].bias.fill_(0.1)
        if r is not None:
            mesh = DeviceMesh("cpu", [0, 1])
            fully_shard(m[0], mesh=mesh, reshard_after_forward=reshard)
            fully_shard(m, mesh=mesh)
        x = flow.linspace(-1, 1, 18).reshape(3, 6).requires_grad_()   # (its gradient reads the weight)
        with flow.no_grad():
            evaluated = m(x).sum().item()
        loss = (m(x) ** 2).sum()
        junk = [flow.full((4, 6), float("nan")) for _ in range(16)]   # (freed blocks now hold NaN: a
        del junk                                                     # re-gather must write its values)
        loss.backward()
        grads = [(p.grad.full_tensor() if p.is_global else p.grad).numpy() for p in m.parameters()]
        return evaluated, grads + [x.grad.numpy()]
    want_eval, want = run(None)
    for evaluated, got in _sim(2, run):
        assert evaluated == pytest.approx(want_eval, rel=1e-6)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_loss_parallel_losses_are_replicas():
    """torch's loss is Replicate() inside loss_parallel(): each rank's to_local() is the whole
    loss (a training loop logs it), per-sample losses too; the gradients are the unsharded ones."""
    from holoflow.dtensor.parallel import loss_parallel
    x = np.linspace(-2, 2, 30, dtype=np.float32).reshape(5, 6)
    labels = [1, 5, 0, 3, 3]
    want = flow.tensor(x, requires_grad=True)
    whole = flow.nn.functional.cross_entropy(want, flow.tensor(labels))
    whole.backward()
    rows = flow.nn.functional.nll_loss(flow.tensor(x).log_softmax(1), flow.tensor(labels), reduction="none")

    def f(r):
        mesh = DeviceMesh("cpu", [0, 1])
        logits = distribute_tensor(flow.tensor(x), mesh, [Shard(1)]).requires_grad_()
        with loss_parallel():
            loss = flow.nn.functional.cross_entropy(logits, flow.tensor(labels))
            per_row = flow.nn.functional.nll_loss(logits.log_softmax(1), flow.tensor(labels), reduction="none")
            loss.backward()
        outside = (logits.detach() * 2).sum()   # (after the block, a sum over the split dim is partial again)
        return (loss.placements, loss.to_local().item(), per_row.placements, per_row.to_local().detach().numpy(),
                logits.grad.full_tensor().numpy(), outside.placements)
    for placements, local, row_placements, local_rows, grad, outside in _sim(2, f):
        assert placements == row_placements == (Replicate(),) and outside == (Partial(),)
        assert abs(local - whole.item()) < 1e-6
        np.testing.assert_allclose(local_rows, rows.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(grad, want.grad.numpy(), rtol=1e-5, atol=1e-7)


def _optimizer_classes():
    import inspect
    return sorted(n for n in dir(flow.optim) if inspect.isclass(getattr(flow.optim, n))
                  and issubclass(getattr(flow.optim, n), flow.optim.Optimizer)
                  and n not in ("Optimizer", "SparseAdam", "LBFGS"))   # (sparse gradients; a closure)


@pytest.mark.parametrize("name", _optimizer_classes())
def test_every_optimizer_steps_sharded_parameters_as_unsharded_ones(name):
    """Each optimizer on fully_shard's DTensor parameters, foreach left to choose, off, and on
    (torch accepts foreach=True for DTensors: the per-tensor path here), and fused where it has a
    fused kernel (run on each rank's shards): three steps equal the unsharded model's on every
    rank's batch."""
    from holoflow.dtensor.fsdp import fully_shard
    cls = getattr(flow.optim, name)
    rng = np.random.default_rng(2)
    weights = {"0.weight": rng.standard_normal((5, 6)).astype(np.float32),
               "2.weight": rng.standard_normal((3, 5)).astype(np.float32)}
    xs = [np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6) * (1 + r / 3) for r in range(2)]

    def net():   # (weights loaded, not drawn: the simulated ranks share one generator)
        m = flow.nn.Sequential(flow.nn.Linear(6, 5, bias=False), flow.nn.Tanh(), flow.nn.Linear(5, 3, bias=False))
        m.load_state_dict({k: flow.tensor(v) for k, v in weights.items()})
        return m

    def train(m, kw, batches):
        opt = cls(m.parameters(), lr=0.01, **kw)
        for _ in range(3):
            opt.zero_grad()
            (sum((m(flow.tensor(x)) ** 2).mean() for x in batches) / len(batches)).backward()
            opt.step()
        return {k: (v.full_tensor() if v.is_global else v).detach().numpy() for k, v in m.state_dict().items()}
    import inspect
    takes_foreach = "foreach" in inspect.signature(cls).parameters
    kws = [{}, {"foreach": False}, {"foreach": True}] if takes_foreach else [{}]
    if getattr(cls, "fused_update", None) is not None:   # torch's fused kernel on each rank's shards
        kws.append({"fused": True, **({"momentum": 0.9} if name == "SGD" else {})})
    for kw in kws:
        want = train(net(), kw, xs)

        def f(r):
            m = net()
            fully_shard(m, mesh=DeviceMesh("cpu", [0, 1]))
            return train(m, kw, [xs[r]])
        for got in _sim(2, f):
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"{name} {kw} {k}")


def test_a_fused_step_refuses_state_laid_out_unlike_its_parameter():
    def f(r):
        mesh = DeviceMesh("cpu", [0, 1])
        p = distribute_tensor(flow.ones(4, 2), mesh, [Shard(0)]).requires_grad_()
        opt = flow.optim.Adam([p], lr=0.1, fused=True)
        (p * p).sum().backward()
        opt.step()
        opt.state[p]["exp_avg"] = distribute_tensor(flow.zeros(4, 2), mesh, [Replicate()])
        (p * p).sum().backward()
        with pytest.raises(UnsupportedError, match=r"fused=True runs on each rank's shards, so the exp_avg of "
                                                   r"parameter 0 must be laid out as the parameter \(\(holoflow.sbp."
                                                   r"split\(dim=0\),\)\), got \(holoflow.sbp.broadcast,\)"):
            opt.step()
        return True
    assert _sim(2, f) == [True, True]


def test_a_rank_holding_an_empty_shard_decides_views_as_the_others():
    """6 columns over 4 ranks: rank 3 holds none. ``x.t() * 0.5`` is column-major in torch, so its
    reshape is a copy (a write to it stays there); ``x * 0.5`` is row-major, its reshape a view
    (a write reaches it). torch lays an empty result out row-major whatever its inputs: the rank
    holding nothing took the first reshape for a view, wrote back and issued a collective the
    others did not (a CommError; global fuzzer seed 14477)."""
    import torch
    full = torch.arange(24.0).reshape(4, 6)

    def f(r):
        mesh = DeviceMesh("cpu", [0, 1, 2, 3])
        x = distribute_tensor(flow.tensor(full.numpy()), mesh, [Shard(1)])
        out = []
        for y in (x.t() * 0.5, x * 0.5):
            z = y.reshape(-1)
            z.masked_fill_(z > 3, -1.0)
            out.append((y.full_tensor().tolist(), z.full_tensor().tolist()))
        return out, tuple(x.to_local().shape)
    want = []
    for y in (full.t() * 0.5, full * 0.5):
        z = y.reshape(-1)
        z.masked_fill_(z > 3, -1.0)
        want.append((y.tolist(), z.tolist()))
    for r, (got, local) in enumerate(_sim(4, f)):
        assert local == ((4, 2), (4, 2), (4, 2), (4, 0))[r]
        assert got == want, f"rank {r}"


def test_a_one_element_local_tensor_is_a_replica_among_dtensors():
    """torch's DTensor takes a local tensor of one element as every rank's replica: torchtitan's
    clipping scales the DTensor gradients by a coefficient from the total norm made whole
    (clip_grads_with_norm_), which was refused ('mixes a local tensor'). A larger local tensor is
    still refused, and on a OneFlow placement any."""
    def f(r):
        mesh = DeviceMesh("cpu", [0, 1])
        d = distribute_tensor(flow.arange(4.0), mesh, [Shard(0)])
        got = [(d * flow.tensor(0.5)).full_tensor().tolist(), (d + flow.tensor([1.0])).full_tensor().tolist()]
        w = distribute_tensor(flow.ones(4), mesh, [Shard(0)]).requires_grad_()
        (w * d).sum().backward()
        norm = flow.nn.utils.get_total_norm([w.grad]).full_tensor()
        flow.nn.utils.clip_grads_with_norm_([w], 1.0, norm)
        got.append(w.grad.full_tensor().tolist())
        for a, b in ((d, flow.ones(4)), (flow.arange(4.0).to_global(flow.placement("cpu", [0, 1]), flow.sbp.split(0)),
                                         flow.tensor(0.5))):
            with pytest.raises(Exception, match="mixes a local tensor"):
                a * b
        return got
    for got in _sim(2, f):
        assert got[:2] == [[0.0, 0.5, 1.0, 1.5], [1.0, 2.0, 3.0, 4.0]]
        np.testing.assert_allclose(got[2], np.arange(4.0) / np.sqrt(14.0), rtol=1e-5)
