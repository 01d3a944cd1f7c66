"""FSDP1's ``FullyShardedDataParallel`` on simulated ranks: each sharding strategy's layout and its
training equal to one process's data parallelism, the options torch's own FSDP1 refuses on CPU
(sync_module_states, CPU offload), mixed precision, custom per-module arguments, the state dicts
through torch.distributed.checkpoint, and every refusal's class and words.
(tests/dist/test_fsdp1_api.py runs a torch FSDP1 script unchanged on Gloo against torch's own.)"""
import numpy as np
import pytest

import holoflow as flow
from holoflow import mock_torch
from holoflow.distributed import world
from holoflow.dtensor import DeviceMesh, Replicate, Shard
from holoflow.dtensor.fsdp import (CPUOffload, FullyShardedDataParallel as FSDP, FullStateDictConfig,
                                   MixedPrecision, ShardedStateDictConfig, ShardingStrategy, StateDictType)
from holoflow.dtensor.fsdp.wrap import CustomPolicy, ModuleWrapPolicy

nn = flow.nn
RNG = np.random.default_rng(0)
W = {"0.weight": RNG.standard_normal((8, 6)).astype(np.float32), "0.bias": RNG.standard_normal(8).astype(np.float32),
     "2.weight": RNG.standard_normal((3, 8)).astype(np.float32), "2.bias": RNG.standard_normal(3).astype(np.float32)}
XS = [np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6) * (1 + r / 3) for r in range(4)]


def _net():
    m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    m.load_state_dict({k: flow.tensor(v) for k, v in W.items()})
    return m


def _train(m, batches, steps=3):
    opt = flow.optim.AdamW(m.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum((m(flow.tensor(x)) ** 2).mean() for x in batches) / len(batches)
        loss.backward()
        opt.step()
    return m


def _reference(n):
    """The unsharded model trained in one process on the mean of ``n`` ranks' losses."""
    return {k: v.numpy() for k, v in _train(_net(), XS[:n]).state_dict().items()}


@pytest.mark.parametrize("strategy, n, mesh, layout", [
    (ShardingStrategy.FULL_SHARD, 2, None, (Shard(0),)),
    (ShardingStrategy.SHARD_GRAD_OP, 2, None, (Shard(0),)),
    (ShardingStrategy.NO_SHARD, 2, None, (Replicate(), Shard(0))),
    (ShardingStrategy.HYBRID_SHARD, 4, [[0, 1], [2, 3]], (Replicate(), Shard(0))),
    (ShardingStrategy._HYBRID_SHARD_ZERO2, 4, [[0, 1], [2, 3]], (Replicate(), Shard(0)))],
    ids=["full_shard", "shard_grad_op", "no_shard", "hybrid", "hybrid_zero2"])
def test_each_strategy_trains_as_data_parallel(strategy, n, mesh, layout):
    want = _reference(n)

    def f(r):
        kw = {"device_mesh": DeviceMesh("cpu", mesh)} if mesh else {}
        m = FSDP(_net(), sharding_strategy=strategy, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), **kw)
        mesh_shape = tuple(m.module[0].weight.device_mesh.shape)
        _train(m, [XS[r]])
        return {k: v.numpy() for k, v in m.state_dict().items()}, {p.placements for p in m.parameters()}, mesh_shape
    for got, placements, mesh_shape in world.simulate(n, f):
        assert placements == {layout}
        assert mesh_shape == {ShardingStrategy.NO_SHARD: (n, 1)}.get(strategy, (2, 2) if mesh else (n,))
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_hybrid_shard_without_a_mesh_shards_within_the_node():
    def f(r):
        m = FSDP(_net(), sharding_strategy=ShardingStrategy.HYBRID_SHARD)
        return tuple(m.module[0].weight.device_mesh.shape), m.module[0].weight.placements
    assert world.simulate(2, f) == [((1, 2), (Replicate(), Shard(0)))] * 2


def test_sync_module_states_and_cpu_offload():
    """torch's FSDP1 refuses both on CPU; here every rank starts from rank 0's parameters and
    buffers (which differed), and CPU offload (the shards are on the CPU) trains the same."""
    want = _reference(2)

    def f(r):
        flow.manual_seed(r)
        m = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4))
        with flow.no_grad():
            m[1].running_mean.fill_(float(r + 1))
        first = m[0].weight.detach().clone()
        synced = FSDP(m, sync_module_states=True)
        state = {k: v.numpy() for k, v in synced.state_dict().items()}
        offloaded = _train(FSDP(_net(), cpu_offload=CPUOffload(offload_params=True)), [XS[r]])
        return first.numpy(), state, {k: v.numpy() for k, v in offloaded.state_dict().items()}
    got = world.simulate(2, f)
    assert not np.array_equal(got[0][0], got[1][0])   # (the ranks' own initializations differed)
    for _, state, trained in got:
        np.testing.assert_array_equal(state["0.weight"], got[0][0])
        np.testing.assert_array_equal(state["1.running_mean"], np.ones(4, np.float32))
        for k in want:
            np.testing.assert_allclose(trained[k], want[k], rtol=1e-5, atol=1e-6)


def test_mixed_precision_casts_parameters_inputs_and_buffers():
    def f(r):
        m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
        seen = []
        for sub in (m[0], m[2]):
            sub.register_forward_hook(lambda mod, i, o: seen.append((i[0].dtype, mod.weight.dtype, o.dtype)))
        mp = MixedPrecision(param_dtype=flow.bfloat16, buffer_dtype=flow.bfloat16)
        w = FSDP(m, mixed_precision=mp, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
        w(flow.ones(3, 4)).float().sum().backward()
        buffers = (m[1].running_mean.dtype, w.state_dict()["1.running_mean"].dtype)
        grads = {p.grad.dtype for p in w.parameters()} | {p.dtype for p in w.parameters()}
        return seen, buffers, grads
    for seen, buffers, grads in world.simulate(2, f):
        assert seen == [(flow.bfloat16, flow.bfloat16, flow.bfloat16)] * 2   # (the root casts the inputs)
        assert buffers == (flow.bfloat16, flow.float32)   # the state dict keeps the buffers' own dtype
        assert grads == {flow.float32}


def test_custom_policy_arguments_per_module_and_ignored_modules():
    def f(r):
        m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3), nn.Linear(3, 3))
        policy = CustomPolicy(lambda mod: {"sharding_strategy": ShardingStrategy.NO_SHARD}
                              if mod is m[2] else isinstance(mod, nn.Linear))
        w = FSDP(m, auto_wrap_policy=policy, ignored_modules=[m[3]])
        kinds = [type(x).__name__ for x in w.module]
        return kinds, [x.sharding_strategy for x in w.module[:3:2]], m[3].weight.is_global, \
            m[0].weight.placements, m[2].weight.placements
    for kinds, strategies, ignored_global, first, third in world.simulate(2, f):
        assert kinds == ["FullyShardedDataParallel", "Tanh", "FullyShardedDataParallel", "Linear"]
        assert strategies == [ShardingStrategy.FULL_SHARD, ShardingStrategy.NO_SHARD]
        assert not ignored_global and first == (Shard(0),) and third == (Replicate(), Shard(0))


def test_summon_full_params_rank0_only_and_nested_recurse_false():
    def f(r):
        w = FSDP(_net(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
        with FSDP.summon_full_params(w, writeback=False, rank0_only=True):
            mine = w.module[0].weight.is_global, tuple(w.module[0].weight.shape)
        with FSDP.summon_full_params(w.module[0], recurse=False):
            only = w.module[0].weight.is_global, w.module[2].weight.is_global
        return mine, only, w.module[0].weight.is_global
    got = world.simulate(2, f)
    assert got[0][0] == (False, (8, 6)) and got[1][0] == (True, (8, 6))   # rank 1 keeps its shards
    assert all(g[1] == (False, True) and g[2] for g in got)


def test_distributed_checkpoint_state_dicts_use_torchs_names():
    """torch.distributed.checkpoint's get_/set_ functions on an FSDP1 model: FQNs without the
    wrapper segments, DTensors unless full; a full state dict loads into another layout."""
    from holoflow.dtensor.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                        get_optimizer_state_dict, set_model_state_dict)

    def f(r):
        w = FSDP(_net(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
        opt = flow.optim.SGD(w.parameters(), lr=0.1, momentum=0.9)
        (w(flow.tensor(XS[r])) ** 2).mean().backward()
        opt.step()
        sharded = get_model_state_dict(w)
        full = get_model_state_dict(w, options=StateDictOptions(full_state_dict=True))
        osd = get_optimizer_state_dict(w, opt)
        other = FSDP(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)),
                     sharding_strategy=ShardingStrategy.NO_SHARD)
        set_model_state_dict(other, full, options=StateDictOptions(full_state_dict=True))
        with FSDP.state_dict_type(w, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig()):
            own = w.state_dict()
        return ({k: v.placements for k, v in sharded.items()}, {k: v.numpy() for k, v in full.items()},
                sorted(osd["state"]), {k: v.numpy() for k, v in other.state_dict().items()},
                {k: v.placements for k, v in own.items()})
    for sharded, full, osd_names, other, own in world.simulate(2, f):
        assert sharded == own == {k: (Shard(0),) for k in W}
        assert osd_names == sorted(W) and set(full) == set(W)
        for k in W:
            np.testing.assert_array_equal(other[k], full[k])


def test_sharded_state_dict_is_a_copy_and_full_rank0_only():
    def f(r):
        w = FSDP(_net())
        with FSDP.state_dict_type(w, StateDictType.SHARDED_STATE_DICT):
            snap = w.state_dict()["0.bias"]
        with flow.no_grad():
            w.module[0].bias.add_(1.0)
        with FSDP.state_dict_type(w, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
            keys = sorted(w.state_dict())
        return snap.full_tensor().numpy(), keys, FSDP.get_state_dict_type(w).state_dict_type
    got = world.simulate(2, f)
    for snap, _, kind in got:
        np.testing.assert_array_equal(snap, W["0.bias"])
        assert kind == StateDictType.FULL_STATE_DICT   # (restored after the block)
    assert got[0][1] == sorted(W) and got[1][1] == []


def test_refusals_name_the_option_and_what_to_do():
    def f(r):
        w = FSDP(_net())
        with pytest.raises(NotImplementedError, match="LOCAL_STATE_DICT is not supported .* use SHARDED_STATE_DICT"):
            FSDP.set_state_dict_type(w, StateDictType.LOCAL_STATE_DICT)
        with pytest.raises(TypeError, match="SHARDED_STATE_DICT takes a ShardedStateDictConfig, got "
                                            "FullStateDictConfig"):
            FSDP.set_state_dict_type(w, StateDictType.SHARDED_STATE_DICT, FullStateDictConfig())
        with pytest.raises(ValueError, match="Linear holds no FullyShardedDataParallel module"):
            FSDP.set_state_dict_type(nn.Linear(2, 2), StateDictType.FULL_STATE_DICT)
        with pytest.raises(ValueError, match="writeback=True and rank0_only=True is not supported"):
            with FSDP.summon_full_params(w, rank0_only=True):
                pass
        with pytest.raises(NotImplementedError, match="keep_low_precision_grads=True is not supported"):
            FSDP(_net(), mixed_precision=MixedPrecision(keep_low_precision_grads=True))
        with pytest.raises(NotImplementedError, match="pass device_mesh=init_device_mesh"):
            FSDP(_net(), process_group=((0, 1), (0, 1)))
        with pytest.raises(ValueError, match="pass process_group or device_mesh, not both"):
            FSDP(_net(), process_group=[0, 1], device_mesh=DeviceMesh("cpu", [0, 1]))
        with pytest.raises(ValueError, match="HYBRID_SHARD takes a 2-D device_mesh .* got a 1-D one"):
            FSDP(_net(), sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_mesh=DeviceMesh("cpu", [0, 1]))
        with pytest.raises(TypeError, match="sharding_strategy must be a ShardingStrategy, got 'FULL_SHARD'"):
            FSDP(_net(), sharding_strategy="FULL_SHARD")
        with pytest.raises(TypeError, match="wraps an nn.Module, got int"):
            FSDP(3)
        with pytest.raises(TypeError, match="auto_wrap_policy must be callable"):
            FSDP(_net(), auto_wrap_policy={nn.Linear})
        with pytest.raises(NotImplementedError, match="communication hooks are not supported"):
            w.register_comm_hook(None, None)
        with pytest.raises(NotImplementedError, match="use FullyShardedDataParallel.optim_state_dict"):
            FSDP.full_optim_state_dict(w, None)

        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.m = w

            def build(self, x):
                return self.m(x)
        with pytest.raises(RuntimeError, match="UnsupportedError: holoflow FullyShardedDataParallel: .* leave "
                                               "FullyShardedDataParallel out: .*enable_zero"):
            G()(flow.ones(2, 6))
        return True
    assert world.simulate(2, f) == [True, True]


def test_process_group_subsets_shard_over_their_members():
    """Ranks 0-1 and 2-3 each shard over their own process group: each pair trains as data
    parallel over its two batches."""
    def f(r):
        w = FSDP(_net(), process_group=[[0, 1], [2, 3]][r // 2])   # (a group is its ranks)
        _train(w, [XS[r]])
        return w.module[0].weight.device_mesh.flat_ranks, {k: v.numpy() for k, v in w.state_dict().items()}
    got = world.simulate(4, f)
    for r, (ranks, state) in enumerate(got):
        assert ranks == ((0, 1) if r < 2 else (2, 3))
        want = {k: v.numpy() for k, v in _train(_net(), XS[2 * (r // 2):2 * (r // 2) + 2]).state_dict().items()}
        for k in want:
            np.testing.assert_allclose(state[k], want[k], rtol=1e-5, atol=1e-6)


def test_mock_torch_resolves_fsdp1():
    from holoflow.dtensor import fsdp
    with mock_torch.enable():
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy as S
        from torch.distributed.fsdp.api import MixedPrecision as MP
        from torch.distributed.fsdp.fully_sharded_data_parallel import StateDictType as T
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        import torch
        assert FullyShardedDataParallel is fsdp.FullyShardedDataParallel and S is ShardingStrategy
        assert MP is MixedPrecision and T is StateDictType
        assert transformer_auto_wrap_policy is fsdp.wrap.transformer_auto_wrap_policy
        assert torch.device("meta").__enter__ is not None


@pytest.mark.parametrize("reshard", [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP])
def test_activation_checkpointing_applied_after_wrapping(reshard):
    """The llama-recipe order: FSDP1 with blocks wrapped, then apply_activation_checkpointing
    on the blocks inside the wrappers; the recomputation reads the gathered parameters again,
    and the state dict keeps the plain names."""
    from holoflow.dtensor.checkpoint_wrapper import apply_activation_checkpointing

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            return x + self.fc(x).tanh()

    flow.manual_seed(4)
    weights = nn.Sequential(Block(), Block(), nn.Linear(6, 3)).state_dict()

    def net():   # (weights loaded, not drawn: the simulated ranks share one generator)
        m = nn.Sequential(Block(), Block(), nn.Linear(6, 3))
        m.load_state_dict(weights)
        return m

    want = {k: v.numpy() for k, v in _train(net(), XS[:2]).state_dict().items()}

    def f(r):
        w = FSDP(net(), sharding_strategy=reshard, auto_wrap_policy=ModuleWrapPolicy({Block}))
        apply_activation_checkpointing(w, check_fn=lambda m: isinstance(m, Block))
        kinds = [type(w.module[0].module).__name__, type(w.module[0].module._checkpoint_wrapped_module).__name__]
        _train(w, [XS[r]])
        return kinds, {k: v.numpy() for k, v in w.state_dict().items()}
    for kinds, got in world.simulate(2, f):
        assert kinds == ["CheckpointWrapper", "Block"] and set(got) == set(want)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("wrap", ["fsdp1", "fully_shard"])
def test_grad_scaler_skips_a_step_on_every_rank_when_one_shard_overflows(wrap):
    """GradScaler (and ShardedGradScaler) on sharded gradients: the inf/nan counts of each
    placement's shards are summed over its ranks, so all ranks skip (and back off) together;
    a local parameter beside them (ignored by FSDP) is checked as before."""
    from holoflow.dtensor.fsdp import ShardedGradScaler, fully_shard

    def f(r, poison):
        flow.manual_seed(0)
        m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        extra = nn.Parameter(flow.ones(3))
        if wrap == "fsdp1":
            m = FSDP(m)
        else:
            fully_shard(m, mesh=DeviceMesh("cpu", [0, 1]))
        opt = flow.optim.SGD([*m.parameters(), extra], lr=0.1)
        scaler = (ShardedGradScaler if wrap == "fsdp1" else flow.amp.GradScaler)("cpu", init_scale=64.0)
        scaler.scale((m(flow.tensor(XS[r])) + extra).pow(2).mean()).backward()
        first = next(iter(m.parameters()))
        if poison and r == 1:
            first.grad._data.view(-1)[0] = float("inf")   # rank 1's shard only
        before = first.full_tensor().clone()
        scaler.step(opt)
        scaler.update()
        return scaler.get_scale(), bool((first.full_tensor() != before).any()), extra.tolist()
    assert world.simulate(2, lambda r: f(r, True)) == [(32.0, False, [1.0] * 3)] * 2
    clean = world.simulate(2, lambda r: f(r, False))
    assert [c[:2] for c in clean] == [(64.0, True)] * 2 and clean[0][2] != [1.0] * 3
