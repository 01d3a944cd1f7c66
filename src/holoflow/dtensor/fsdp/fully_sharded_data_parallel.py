"""FSDP1: torch's ``FullyShardedDataParallel`` wrapper, on the machinery of ``fully_shard``.

``FullyShardedDataParallel(module, auto_wrap_policy=...)`` wraps the submodules the policy picks
(bottom-up, each in its own wrapper) and then ``module``; each wrapper shards the parameters of
its subtree that no inner wrapper took, as ``fully_shard`` does: the parameters become DTensors
(``Shard(0)`` on the data-parallel mesh; ``(Replicate(), Shard(0))`` on a 2-D one for
HYBRID_SHARD, ``(Replicate(), Shard(0))`` on a ``(world, 1)`` mesh for NO_SHARD), gathered for
each forward and again for backward, their gradients reduce-scattered and averaged.

Where it differs from torch's: torch flattens each wrapper's parameters into one ``FlatParameter``
and, with ``use_orig_params=True``, shows each rank a 1-D slice of it; here ``parameters()`` are
the original parameters as DTensors of their whole shape, whatever ``use_orig_params`` says (an
optimizer, per-parameter groups, weight decay and ``clip_grad_norm_`` work on them as on torch's).
SHARDED state dicts hold DTensors (torch's ``ShardedTensor``); LOCAL ones are refused.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterable, Iterator

import torch

from ...core import device as _device
from ...core.grad_mode import no_grad
from ...core.tensor import Tensor
from ...distributed import world
from ...distributed.device_mesh import DeviceMesh
from ...distributed.dtensor import distribute_tensor
from ...distributed.global_tensor import world_ranks
from ...distributed.process_group import get_process_group_ranks
from ...nn.module import Module
from ...nn.parameter import Parameter
from ...nn.utils.clip_grad import get_total_norm
from ..checkpoint.state_dict import (StateDictOptions, fqn, get_optimizer_state_dict, in_sharded_view,
                                     optimizer_state_to_load)
from ._fully_shard import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, _cast, _fsdp_states, shard
from .api import (BackwardPrefetch, CPUOffload, FullOptimStateDictConfig, FullStateDictConfig, MixedPrecision,
                  OptimStateDictConfig, ShardedOptimStateDictConfig, ShardedStateDictConfig, ShardingStrategy,
                  StateDictConfig, StateDictSettings, StateDictType)
from .wrap import CustomPolicy, _recursive_wrap

__all__ = ["FullyShardedDataParallel"]

_WRAPPED = "_fsdp_wrapped_module"
_PREFIX = _WRAPPED + "."
_WHO = "FullyShardedDataParallel"
# reshard after forward per strategy (None: every wrapper but the root, as torch's FULL_SHARD)
_RESHARD = {ShardingStrategy.FULL_SHARD: None, ShardingStrategy.SHARD_GRAD_OP: False,
            ShardingStrategy.NO_SHARD: False, ShardingStrategy.HYBRID_SHARD: None,
            ShardingStrategy._HYBRID_SHARD_ZERO2: False}
_HYBRID = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
_DEFAULT_CONFIGS = {StateDictType.FULL_STATE_DICT: (FullStateDictConfig, FullOptimStateDictConfig),
                    StateDictType.SHARDED_STATE_DICT: (ShardedStateDictConfig, ShardedOptimStateDictConfig)}


def _torch_device(device_id: Any) -> torch.device:
    """torch's reading of ``device_id``: an int is a CUDA device's index."""
    return torch.device("cuda", device_id) if isinstance(device_id, int) else _device.to_torch(device_id)


def _device_type(module: Module, device_id: Any) -> str:
    if device_id is not None:
        return _torch_device(device_id).type
    first = next(iter(module.parameters()), None)
    return first.device.type if first is not None and not first.is_meta else "cpu"


def _mesh(module: Module, process_group: Any, device_mesh: Any, strategy: ShardingStrategy,
          device_id: Any) -> DeviceMesh:
    """The mesh the parameters are laid out on: ``(shards,)``, ``(replicas, shards)`` for the
    hybrid strategies, ``(world, 1)`` for NO_SHARD."""
    hybrid = strategy in _HYBRID
    if device_mesh is not None:
        if process_group is not None:
            raise ValueError(f"holoflow {_WHO}: pass process_group or device_mesh, not both")
        mesh = DeviceMesh.from_placement(device_mesh)
        if mesh.ndim != (2 if hybrid else 1):
            raise ValueError(f"holoflow {_WHO}: sharding_strategy {strategy.name} takes a "
                             f"{'2-D device_mesh (replicate, shard)' if hybrid else '1-D device_mesh'}, got a "
                             f"{mesh.ndim}-D one")
        kind, ranks = mesh.device_type, [int(r) for r in mesh.ranks.reshape(-1).tolist()]
    else:
        if isinstance(process_group, tuple):
            raise NotImplementedError(f"holoflow {_WHO}: a (intra-node, inter-node) pair of process groups is not "
                                      f"supported; pass device_mesh=init_device_mesh(device_type, (replicas, shards))")
        kind = _device_type(module, device_id)
        ranks = list(world_ranks()) if process_group is None else get_process_group_ranks(process_group)
        if hybrid:   # shard within a node, replicate across nodes
            from ...distributed import env
            per_node = env.get_local_world_size() if world.simulated_rank() is None else len(ranks)
            if len(ranks) % per_node:
                raise ValueError(f"holoflow {_WHO}: {len(ranks)} ranks do not divide into nodes of {per_node}; "
                                 f"pass device_mesh")
            return DeviceMesh(kind, [ranks[i:i + per_node] for i in range(0, len(ranks), per_node)])
        mesh = DeviceMesh(kind, ranks)
    if strategy is ShardingStrategy.NO_SHARD:
        return DeviceMesh(kind, [[r] for r in ranks])
    return mesh


def _materialize(module: Module, param_init_fn: Callable | None, device_type: str, ignored: set) -> None:
    """A module built on the meta device gets memory: ``param_init_fn(submodule)`` for each
    submodule, or ``to_empty`` + ``reset_parameters()`` of those holding tensors (torch's)."""
    def modules() -> list:
        out, todo = [], [module]
        while todo:   # (not into wrappers made already, nor ignored modules)
            m = todo.pop(0)
            out.append(m)
            todo.extend(c for c in m.children() if not isinstance(c, FullyShardedDataParallel) and id(c) not in ignored)
        return out
    own = [t for m in modules() for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]]
    if not any(t.is_meta for t in own):
        return
    if param_init_fn is not None:
        for m in modules():
            param_init_fn(m)
        return
    device = "cpu" if device_type == "cpu" else f"{device_type}:{torch.cuda.current_device()}"
    with no_grad():
        for m in modules():
            if next(iter([*m.parameters(recurse=False), *m.buffers(recurse=False)]), None) is None:
                continue
            m.to_empty(device=device, recurse=False)
            reset = getattr(m, "reset_parameters", None)
            if reset is None:
                raise ValueError(f"holoflow {_WHO}: {type(m).__name__} has meta-device tensors but no "
                                 f"reset_parameters(); pass param_init_fn to initialize it")
            reset()


class FullyShardedDataParallel(Module):
    """torch's FSDP1 wrapper (``torch.distributed.fsdp.FullyShardedDataParallel`` under
    mock_torch): ``module`` with its parameters sharded over the data-parallel ranks. See the
    module's doc for how its parameters look."""

    def __init__(self, module: Module, process_group: Any = None,
                 sharding_strategy: ShardingStrategy | None = None, cpu_offload: CPUOffload | None = None,
                 auto_wrap_policy: Callable | None = None,
                 backward_prefetch: BackwardPrefetch | None = BackwardPrefetch.BACKWARD_PRE,
                 mixed_precision: MixedPrecision | None = None, ignored_modules: Iterable[Module] | None = None,
                 param_init_fn: Callable[[Module], None] | None = None, device_id: Any = None,
                 sync_module_states: bool = False, forward_prefetch: bool = False, limit_all_gathers: bool = True,
                 use_orig_params: bool = False, ignored_states: Iterable[Any] | None = None,
                 device_mesh: DeviceMesh | None = None) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"holoflow {_WHO}: wraps an nn.Module, got {type(module).__name__}")
        strategy = ShardingStrategy.FULL_SHARD if sharding_strategy is None else sharding_strategy
        if not isinstance(strategy, ShardingStrategy):
            raise TypeError(f"holoflow {_WHO}: sharding_strategy must be a ShardingStrategy, got {strategy!r}")
        if mixed_precision is not None and mixed_precision.keep_low_precision_grads:
            raise NotImplementedError(f"holoflow {_WHO}: keep_low_precision_grads=True is not supported: gradients "
                                      f"are reduced and kept in the parameters' dtype")
        if ignored_modules is not None and ignored_states is not None:
            raise ValueError(f"holoflow {_WHO}: pass ignored_modules or ignored_states, not both")
        ignored_mods, ignored_params = set(), set()
        for item in list(ignored_modules or ()) + list(ignored_states or ()):
            if isinstance(item, Module):
                ignored_mods.update(id(m) for m in item.modules())
                ignored_params.update(id(p) for p in item.parameters())
            elif isinstance(item, Tensor):
                ignored_params.add(id(item))
            else:
                raise TypeError(f"holoflow {_WHO}: ignored_states takes modules and parameters, got "
                                f"{type(item).__name__}")
        kind = _device_type(module, device_id)
        _materialize(module, param_init_fn, kind, ignored_mods)
        if device_id is not None:
            module.to(_torch_device(device_id))
        self.sharding_strategy = strategy
        self.mixed_precision = mixed_precision
        self.cpu_offload = cpu_offload or CPUOffload()
        self.backward_prefetch = backward_prefetch
        self.forward_prefetch = forward_prefetch
        self.limit_all_gathers = limit_all_gathers
        self.use_orig_params = use_orig_params
        if auto_wrap_policy is not None:
            kwargs = dict(process_group=process_group, sharding_strategy=sharding_strategy, cpu_offload=cpu_offload,
                          backward_prefetch=backward_prefetch, mixed_precision=mixed_precision,
                          ignored_states=[p for p in module.parameters() if id(p) in ignored_params] or None,
                          param_init_fn=param_init_fn, device_id=device_id, sync_module_states=sync_module_states,
                          forward_prefetch=forward_prefetch, limit_all_gathers=limit_all_gathers,
                          use_orig_params=use_orig_params, device_mesh=device_mesh)
            policy = _policy_of(auto_wrap_policy)

            def unwrapped(module: Module, recurse: bool, nonwrapped_numel: int) -> bool:
                return not isinstance(module, FullyShardedDataParallel) and policy(
                    module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel)
            _recursive_wrap(module, unwrapped,
                            lambda m: FullyShardedDataParallel(m, **_overrides(auto_wrap_policy, m, kwargs)),
                            only_children=True, ignored=frozenset(ignored_mods))
        self._fsdp_wrapped_module = module
        mesh = _mesh(module, process_group, device_mesh, strategy, device_id)
        if sync_module_states:   # (parameters are laid out from rank 0's values anyway)
            self._broadcast_buffers(mesh, ignored_mods)
        self._orig_buffer_dtypes = self._cast_buffers(mixed_precision, ignored_mods)
        mp = MixedPrecisionPolicy() if mixed_precision is None else MixedPrecisionPolicy(
            param_dtype=mixed_precision.param_dtype, reduce_dtype=mixed_precision.reduce_dtype,
            cast_forward_inputs=False)
        offload = CPUOffloadPolicy() if self.cpu_offload.offload_params else OffloadPolicy()
        ignored = [p for p in module.parameters() if id(p) in ignored_params]
        state = shard([self], mesh, _RESHARD[strategy], None, mp, offload, ignored, who=_WHO)
        state.post_hooks = False   # (torch's FSDP1 runs no hook of its original parameters)
        if backward_prefetch is None:   # (no refill issued ahead in backward; forward's always are)
            state.backward_prefetch = []
        for inner in self.modules():
            if isinstance(inner, FullyShardedDataParallel) and inner is not self:
                inner.__dict__["_is_root"] = False
        self.__dict__["_state_dict_settings"] = StateDictSettings(
            StateDictType.FULL_STATE_DICT, FullStateDictConfig(), FullOptimStateDictConfig())
        self.__dict__["_summoned"] = False
        self.register_state_dict_hook(FullyShardedDataParallel._post_state_dict)
        self.register_load_state_dict_pre_hook(FullyShardedDataParallel._pre_load_state_dict)
        self.register_load_state_dict_post_hook(FullyShardedDataParallel._post_load_state_dict)

    # -- the wrapped module ---------------------------------------------------------------------
    @property
    def module(self) -> Module:
        """The wrapped module."""
        return self._modules[_WRAPPED]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get(_WRAPPED)
            if inner is None:
                raise
            return getattr(inner, name)

    def __getitem__(self, key: int) -> Any:
        return self._modules[_WRAPPED].__getitem__(key)

    def check_is_root(self) -> bool:
        return self.__dict__.get("_is_root", True)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mp = self.mixed_precision
        if mp is not None and mp.param_dtype is not None and (
                mp.cast_forward_inputs or (mp.cast_root_forward_inputs and self.check_is_root())):
            args, kwargs = _cast(args, mp.param_dtype), _cast(kwargs, mp.param_dtype)
        return self._modules[_WRAPPED](*args, **kwargs)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator:
        """As nn.Module's; inside :meth:`summon_full_params` the names are the wrapped modules'."""
        for name, p in super().named_parameters(*args, **kwargs):
            yield (name.replace(_PREFIX, "") if self.__dict__.get("_summoned") else name), p

    def named_buffers(self, *args: Any, **kwargs: Any) -> Iterator:
        for name, b in super().named_buffers(*args, **kwargs):
            yield (name.replace(_PREFIX, "") if self.__dict__.get("_summoned") else name), b

    def _broadcast_buffers(self, mesh: DeviceMesh, ignored: set) -> None:
        """``sync_module_states``: every rank's buffers are the first rank's."""
        ranks = tuple(int(r) for r in mesh.ranks.reshape(-1).tolist())
        for m in self._modules[_WRAPPED].modules():
            if id(m) in ignored:
                continue
            for b in m._buffers.values():
                if b is not None and b._global is None:
                    with no_grad():
                        got = world.comm().broadcast(b._data.contiguous(), ranks[0], ranks)
                        b._data.copy_(got)

    def _cast_buffers(self, mp: MixedPrecision | None, ignored: set) -> dict:
        """Buffers cast to ``mp.buffer_dtype`` in place; their dtypes before, by state-dict key."""
        if mp is None or mp.buffer_dtype is None:
            return {}
        before = {}
        for mname, m in self._modules[_WRAPPED].named_modules():
            if id(m) in ignored or isinstance(m, FullyShardedDataParallel):
                continue
            for name, b in m._buffers.items():
                if b is not None and b.dtype.is_floating_point and b.dtype != mp.buffer_dtype:
                    before[fqn(f"{mname}.{name}" if mname else name)] = b.dtype
                    m._buffers[name] = b.to(mp.buffer_dtype)
        return before

    # -- gradients ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate each rank's gradients without communication; the
        first backward after it reduces them with its own (call it on the root)."""
        states = _fsdp_states(self, True)
        before = [s.sync for s in states]
        for s in states:
            s.sync = False
        try:
            yield
        finally:
            for s, was in zip(states, before):
                s.sync = was

    @no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Scales every gradient so that their total norm over all ranks is at most ``max_norm``;
        returns that total norm before clipping (a whole tensor on every rank)."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if not grads:
            return Tensor._make(torch.tensor(0.0))
        norm_type = float(norm_type)
        parts = []
        for group in ([g for g in grads if g._global is not None], [g for g in grads if g._global is None]):
            if group:
                n = get_total_norm(group, norm_type)
                parts.append(n.full_tensor() if n._global is not None else n)
        if len(parts) == 1:
            total = parts[0]
        elif norm_type == float("inf"):
            total = parts[0].maximum(parts[1])
        else:
            total = (parts[0] ** norm_type + parts[1] ** norm_type) ** (1.0 / norm_type)
        coef = min(float(max_norm) / (total.item() + 1e-6), 1.0)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
        return total

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        raise NotImplementedError(f"holoflow {_WHO}: communication hooks are not supported; gradients are "
                                  f"reduce-scattered in the parameters' dtype and averaged")

    # -- whole parameters -----------------------------------------------------------------------
    @staticmethod
    def fsdp_modules(module: Module, root_only: bool = False) -> list:
        """The FSDP1 wrappers in ``module`` (itself included), or only the outermost ones."""
        found = [m for m in module.modules() if isinstance(m, FullyShardedDataParallel)]
        if not root_only:
            return found
        inner = {id(sub) for m in found for sub in m.modules() if sub is not m}
        return [m for m in found if id(m) not in inner]

    @staticmethod
    @contextlib.contextmanager
    def summon_full_params(module: Module, recurse: bool = True, writeback: bool = True, rank0_only: bool = False,
                           offload_to_cpu: bool = False, with_grads: bool = False) -> Iterator[None]:
        """Inside, each wrapper's parameters are whole local Parameters (in their own dtype, with
        their whole gradients with ``with_grads``); with ``writeback`` what they hold on exit is
        sharded back. Every rank must enter it (it all-gathers)."""
        if writeback and rank0_only:
            raise ValueError(f"holoflow {_WHO}.summon_full_params: writeback=True and rank0_only=True is not "
                             f"supported: the other ranks hold no whole parameters to write back")
        if recurse:
            wrappers = FullyShardedDataParallel.fsdp_modules(module)
        elif isinstance(module, FullyShardedDataParallel):
            wrappers = [module]
        else:
            wrappers = FullyShardedDataParallel.fsdp_modules(module, root_only=True)
        mine = not rank0_only or world.rank() == 0
        summoned = []   # (wrapper, [(module, name, shard)])
        try:
            with no_grad():
                for w in wrappers:
                    state = w._fsdp_state
                    if state.gathered:   # (inside forward, or summoned already)
                        continue
                    whole: dict = {}
                    for mod, name, shard_ in state.params:
                        if id(shard_) not in whole:
                            value = shard_.full_tensor()
                            full = Parameter(value.cpu() if offload_to_cpu else value,
                                             requires_grad=shard_.requires_grad)
                            if with_grads and shard_.grad is not None:
                                full.grad = shard_.grad.full_tensor()
                            whole[id(shard_)] = full
                        if mine:
                            mod._parameters[name] = whole[id(shard_)]
                    if mine:
                        state.gathered = True
                        summoned.append((w, state.params))
                        w.__dict__["_summoned"] = True
            yield
        finally:
            with no_grad():
                for w, params in summoned:
                    state = w._fsdp_state
                    if writeback:
                        done = set()
                        for mod, name, shard_ in params:
                            if id(shard_) in done:
                                continue
                            done.add(id(shard_))
                            now = mod._parameters[name]
                            back = distribute_tensor(now.detach().to(shard_.dtype).to(shard_.device),
                                                     shard_.device_mesh, shard_.placements, src_data_rank=None)
                            shard_._data.copy_(back._data)
                    state.reshard()
                    w.__dict__["_summoned"] = False

    def apply(self, fn: Callable[[Module], None]) -> "FullyShardedDataParallel":
        """``fn`` on every submodule, with whole parameters written back (initialization)."""
        with FullyShardedDataParallel.summon_full_params(self, recurse=False, writeback=True):
            return super().apply(fn)

    # -- state dicts ----------------------------------------------------------------------------
    @staticmethod
    def set_state_dict_type(module: Module, state_dict_type: StateDictType,
                            state_dict_config: StateDictConfig | None = None,
                            optim_state_dict_config: OptimStateDictConfig | None = None) -> StateDictSettings:
        """Sets what ``state_dict()`` and :meth:`optim_state_dict` of every wrapper in ``module``
        return; returns the previous settings."""
        if state_dict_type not in _DEFAULT_CONFIGS:
            raise NotImplementedError(f"holoflow {_WHO}: {state_dict_type} is not supported (each rank's flat "
                                      f"pieces); use SHARDED_STATE_DICT (DTensors) or FULL_STATE_DICT")
        model_cfg, optim_cfg = _DEFAULT_CONFIGS[state_dict_type]
        settings = StateDictSettings(state_dict_type, state_dict_config or model_cfg(),
                                     optim_state_dict_config or optim_cfg())
        for given, want in ((settings.state_dict_config, model_cfg), (settings.optim_state_dict_config, optim_cfg)):
            if not isinstance(given, want):
                raise TypeError(f"holoflow {_WHO}: {state_dict_type.name} takes a {want.__name__}, got "
                                f"{type(given).__name__}")
        wrappers = FullyShardedDataParallel.fsdp_modules(module)
        if not wrappers:
            raise ValueError(f"holoflow {_WHO}.set_state_dict_type: {type(module).__name__} holds no "
                             f"FullyShardedDataParallel module")
        previous = wrappers[0]._state_dict_settings
        for w in wrappers:
            w.__dict__["_state_dict_settings"] = settings
        return previous

    @staticmethod
    def get_state_dict_type(module: Module) -> StateDictSettings:
        wrappers = FullyShardedDataParallel.fsdp_modules(module)
        if not wrappers:
            raise ValueError(f"holoflow {_WHO}.get_state_dict_type: {type(module).__name__} holds no "
                             f"FullyShardedDataParallel module")
        return wrappers[0]._state_dict_settings

    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(module: Module, state_dict_type: StateDictType,
                        state_dict_config: StateDictConfig | None = None,
                        optim_state_dict_config: OptimStateDictConfig | None = None) -> Iterator[None]:
        """:meth:`set_state_dict_type` for the block, the previous settings restored after."""
        previous = FullyShardedDataParallel.set_state_dict_type(module, state_dict_type, state_dict_config,
                                                                optim_state_dict_config)
        try:
            yield
        finally:
            FullyShardedDataParallel.set_state_dict_type(module, *previous)

    def _export(self, key: str, value: Any) -> Any:
        """A state-dict entry as the state-dict type says: a whole tensor (FULL) or a copy of the
        DTensor (SHARDED: what training does next does not change it, as torch's)."""
        settings = self._state_dict_settings
        if not isinstance(value, Tensor):
            return value
        if settings.state_dict_type is StateDictType.SHARDED_STATE_DICT:   # (a copy, as torch's)
            return value.clone() if value._global is not None else value
        if value._global is not None:
            value = value.full_tensor()
        dtype = self._orig_buffer_dtypes.get(fqn(key))
        if dtype is not None:
            value = value.to(dtype)
        return value.cpu() if settings.state_dict_config.offload_to_cpu else value

    @staticmethod
    def _post_state_dict(module: "FullyShardedDataParallel", destination: dict, prefix: str, *_: Any) -> None:
        """The wrapped module's entries under the wrapper's own prefix (torch's FQNs), whole tensors
        for FULL_STATE_DICT (only on rank 0 with ``rank0_only``)."""
        inside, raw = prefix + _PREFIX, in_sharded_view()
        settings = module._state_dict_settings
        drop = not raw and settings.state_dict_type is StateDictType.FULL_STATE_DICT and \
            settings.state_dict_config.rank0_only and world.rank() != 0
        items = list(destination.items())
        destination.clear()   # (rebuilt in order)
        for key, value in items:
            if key.startswith(inside):
                key = prefix + key[len(inside):]
                if not raw:   # (a collective: the ranks whose entries are dropped take part)
                    value = module._export(key[len(prefix):], value)
                if drop:
                    continue
            destination[key] = value

    @staticmethod
    def _pre_load_state_dict(module: Module, state_dict: dict, prefix: str, *_: Any) -> None:
        """Entries named as the wrapped module's go to it (any layout loads: whole tensors are
        sliced, DTensors redistributed)."""
        inside = prefix + _PREFIX
        for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inside)]:
            state_dict[inside + key[len(prefix):]] = state_dict.pop(key)

    @staticmethod
    def _post_load_state_dict(module: Module, incompatible: Any) -> None:
        for keys in (incompatible.missing_keys, incompatible.unexpected_keys):
            keys[:] = [k.replace(_PREFIX, "") for k in keys]

    @staticmethod
    def optim_state_dict(model: Module, optim: Any, optim_state_dict: dict | None = None,
                         group: Any = None) -> dict:
        """``optim``'s state keyed by parameter names (torch's FQNs): whole tensors under
        FULL_STATE_DICT (only on rank 0 with ``rank0_only``), DTensors under SHARDED."""
        settings = FullyShardedDataParallel.get_state_dict_type(model)
        full = settings.state_dict_type is StateDictType.FULL_STATE_DICT
        out = get_optimizer_state_dict(model, optim, options=StateDictOptions(full_state_dict=full))
        if full and settings.optim_state_dict_config.rank0_only and world.rank() != 0:
            return {}
        if settings.optim_state_dict_config.offload_to_cpu:
            out["state"] = {k: {n: (v.cpu() if isinstance(v, Tensor) and v._global is None else v)
                                for n, v in s.items()} for k, s in out["state"].items()}
        return out

    @staticmethod
    def optim_state_dict_to_load(model: Module, optim: Any, optim_state_dict: dict, is_named_optimizer: bool = False,
                                 load_directly: bool = False, group: Any = None) -> dict:
        """What :meth:`optim_state_dict` returned, made ``optim.load_state_dict``'s input (loaded
        with ``load_directly``)."""
        settings = FullyShardedDataParallel.get_state_dict_type(model)
        full = settings.state_dict_type is StateDictType.FULL_STATE_DICT
        rank0 = full and getattr(settings.optim_state_dict_config, "rank0_only", False)
        out = optimizer_state_to_load(model, optim, optim_state_dict,
                                      StateDictOptions(full_state_dict=full, broadcast_from_rank0=rank0))
        if load_directly:
            optim.load_state_dict(out)
        return out

    @staticmethod
    def full_optim_state_dict(*args: Any, **kwargs: Any) -> dict:
        raise NotImplementedError(f"holoflow {_WHO}.full_optim_state_dict (deprecated in torch) is not supported; "
                                  f"use {_WHO}.optim_state_dict under state_dict_type FULL_STATE_DICT")

    sharded_optim_state_dict = scatter_full_optim_state_dict = shard_full_optim_state_dict = full_optim_state_dict
    rekey_optim_state_dict = full_optim_state_dict


def _policy_of(policy: Any) -> Callable:
    if not callable(policy):
        raise TypeError(f"holoflow {_WHO}: auto_wrap_policy must be callable (a function of (module, recurse, "
                        f"nonwrapped_numel) or a policy of torch.distributed.fsdp.wrap), got {type(policy).__name__}")
    return policy


def _overrides(policy: Any, module: Module, kwargs: dict) -> dict:
    """The wrapper arguments for ``module``: a CustomPolicy's dict for it overrides them."""
    if isinstance(policy, CustomPolicy):
        got = policy._lambda_fn(module)
        if isinstance(got, dict):
            return {**kwargs, **copy.copy(got)}
    return kwargs

