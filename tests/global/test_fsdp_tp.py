"""FSDP2 composed with tensor parallelism (torch's "FSDP + TP" recipe) on 4 simulated ranks, a
(dp, tp) mesh: parallelize_module on mesh["tp"], then fully_shard on mesh["dp"] (HSDP + TP: a
(rep, shard, tp) mesh of 8, fully_shard on mesh["rep", "shard"]). Each parameter
is sharded once more over "dp" (each rank its dp piece of its tp piece, as torch's
_StridedShard), its gradients averaged over "dp"; training equals one process's on the "dp"
rows' batches together. (tests/dist/test_parallel_programs.py runs a Llama this way on Gloo
against torch.)"""
import numpy as np
import pytest

import holoflow as flow
from holoflow.distributed import world
from holoflow.dtensor import DeviceMesh, Replicate, Shard
from holoflow.dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def _weights():
    rng = np.random.default_rng(0)   # 6 hidden features: 3 per tp rank, then 2/1 over dp
    return {"0.weight": rng.standard_normal((6, 6)).astype(np.float32) / 2,
            "0.bias": rng.standard_normal(6).astype(np.float32) / 2,
            "2.weight": rng.standard_normal((3, 6)).astype(np.float32) / 2,
            "2.bias": rng.standard_normal(3).astype(np.float32) / 2}


def _xs(n: int):
    return [np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6) * (1 + d) for d in range(n)]


# (mesh shape, its dims' names, FSDP's dims): FSDP + TP on 4 ranks; HSDP + TP on 8
_MESHES = {"fsdp": ((2, 2), ("dp", "tp"), ("dp",)), "hsdp": ((2, 2, 2), ("rep", "shard", "tp"), ("rep", "shard"))}


def _train(r, reshard: bool, kind: str):
    """Three AdamW steps: ``r`` a simulated rank of the FSDP + TP model (its data-parallel
    index's batch), or None: one process on every data-parallel batch (the mean of their
    losses)."""
    from holoflow.dtensor.fsdp import fully_shard
    shape, names, fsdp_dims = _MESHES[kind]
    m = flow.nn.Sequential(flow.nn.Linear(6, 6), flow.nn.Tanh(), flow.nn.Linear(6, 3))
    m.load_state_dict({k: flow.tensor(v) for k, v in _weights().items()})
    batches = _xs(int(np.prod(shape[:-1])))
    mesh = None
    if r is not None:
        mesh = DeviceMesh("cpu", np.arange(np.prod(shape)).reshape(shape), mesh_dim_names=names)
        parallelize_module(m, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(m[0], mesh=mesh[fsdp_dims], reshard_after_forward=reshard)
        fully_shard(m, mesh=mesh[fsdp_dims])
    layout = {k: (p.to_local().detach().numpy().copy(), list(p.device_mesh.mesh_dim_names), p.placements)
              for k, p in m.named_parameters() if p.is_global}
    opt = flow.optim.AdamW(m.parameters(), lr=0.05)
    for _ in range(3):
        opt.zero_grad()
        if r is None:
            loss = sum((m(flow.tensor(x)) ** 2).mean() for x in batches) / len(batches)
        else:
            dp_index = np.ravel_multi_index(mesh.get_coordinate()[:-1], shape[:-1])
            out = m(flow.tensor(batches[dp_index]))
            loss = (out ** 2).mean()
        loss.backward()
        opt.step()
    return layout, {k: (p.full_tensor() if p.is_global else p).detach().numpy() for k, p in m.named_parameters()}


@pytest.mark.parametrize("reshard, kind", [(True, "fsdp"), (False, "fsdp"), (True, "hsdp")],
                         ids=["reshard", "keep", "hsdp"])
def test_fsdp_over_tensor_parallel_shards_each_tp_piece_over_dp_and_averages_over_dp(reshard, kind):
    """Each rank keeps its dp piece (torch.chunk) of its tp piece; HSDP (replicate, shard) + TP
    replicates it over "rep"; the weights are one process's."""
    _, want = _train(None, reshard, kind)
    w = _weights()
    shape, _, fsdp_dims = _MESHES[kind]
    for r, (layout, got) in enumerate(world.simulate(int(np.prod(shape)), lambda r: _train(r, reshard, kind))):
        d, t = divmod(r, 2)
        d %= 2   # (the dp piece: the coordinate along the last FSDP dim)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"rank {r} {k}")
        # torch's pieces: the tp piece (torch.chunk), then its dp piece along FSDP's dim 0
        tp_piece = {"0.weight": np.split(w["0.weight"], [3])[t], "0.bias": np.split(w["0.bias"], [3])[t],
                    "2.weight": np.split(w["2.weight"], [3], axis=1)[t], "2.bias": w["2.bias"]}
        for k, whole in tp_piece.items():
            cut = -(-whole.shape[0] // 2)
            np.testing.assert_array_equal(layout[k][0], whole[:cut] if d == 0 else whole[cut:], err_msg=f"{r} {k}")
        lead = (Replicate(),) * (len(fsdp_dims) - 1)
        names = ["tp", *fsdp_dims]
        assert layout["0.weight"][1:] == (names, (Shard(0), *lead, Shard(0)))
        assert layout["2.weight"][1:] == (names, (Shard(1), *lead, Shard(0)))
        assert layout["2.bias"][1:] == (names, (Replicate(), *lead, Shard(0)))


def test_fsdp_refuses_a_dtensor_parameter_it_cannot_compose_with():
    """A parameter laid out on a mesh not sliced from FSDP's root mesh (or on FSDP's own) was
    skipped silently: never sharded, its gradients never averaged over the data-parallel ranks."""
    from holoflow.dtensor.fsdp import fully_shard

    def run(r):
        mesh = DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
        other = DeviceMesh("cpu", [[0, 2], [1, 3]], mesh_dim_names=("dp", "tp"))
        errors = []
        for tp, dp in ((other["tp"], mesh["dp"]), (mesh["dp"], mesh["dp"])):
            m = flow.nn.Linear(4, 4)
            parallelize_module(m, tp, ColwiseParallel())
            try:
                fully_shard(m, mesh=dp)
            except NotImplementedError as e:
                errors.append(str(e))
        return errors
    for errors in world.simulate(4, run):
        assert len(errors) == 2 and all("sliced by name from the same mesh" in e for e in errors)
