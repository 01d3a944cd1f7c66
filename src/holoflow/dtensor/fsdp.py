"""``holoflow.dtensor.fsdp``: torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) on holoflow's
global tensors.

``fully_shard(module)`` replaces each parameter of ``module`` (those not already taken by a
``fully_shard`` of a submodule) by a DTensor leaf ``Shard(0)`` on the mesh (``(Replicate(),
Shard(0))`` on a 2-D mesh: HSDP): that is what the optimizer steps, what ``state_dict`` holds and
what ``p.grad`` is. A forward pre-hook all-gathers them (a ``redistribute`` to ``Replicate``) and
registers the unsharded local tensors in their place for the forward, which then runs on plain
local tensors, each rank on its own batch; the forward hook puts the shards back. In backward each
rank's gradient of an unsharded parameter is a partial sum of the data-parallel gradient: the
boxing to the leaf's ``Shard(0)`` reduce-scatters it, and a hook divides it by the number of
data-parallel ranks (torch's default: the average). Memory behaves as if ``reshard_after_forward``
were False (autograd keeps the gathered tensors until backward); the values are FSDP's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ..core.dtype import dtype as DType
from ..core.tensor import Tensor
from ..distributed import env
from ..distributed.device_mesh import DeviceMesh, current_mesh, init_device_mesh
from ..distributed.dtensor import distribute_tensor
from ..distributed.placement_types import Partial, Replicate, Shard
from ..nn.module import Module
from ..nn.parameter import Parameter

__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy",
           "UnshardHandle", "register_fsdp_forward_method"]


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """``param_dtype``: the unsharded parameters' dtype in forward/backward (the shards and the
    optimizer stay in theirs); ``output_dtype``: the module outputs' floating dtype;
    ``cast_forward_inputs``: floating inputs cast to ``param_dtype``. ``reduce_dtype`` is accepted:
    gradients are reduced in the shards' dtype."""

    param_dtype: DType | None = None
    reduce_dtype: DType | None = None
    output_dtype: DType | None = None
    cast_forward_inputs: bool = True


@dataclass
class OffloadPolicy:
    """No offloading (torch's default policy)."""


@dataclass
class CPUOffloadPolicy(OffloadPolicy):
    pin_memory: bool = True


class UnshardHandle:
    """What ``unshard(async_op=True)`` returns: holoflow gathers in the forward pre-hook."""

    def wait(self) -> None:
        return None


class FSDPModule:
    """The class ``fully_shard`` mixes into a module's own (``isinstance(m, FSDPModule)``)."""

    def __new__(cls, *args, **kwargs):
        raise TypeError("holoflow: FSDPModule is mixed in by fully_shard(module); it is not constructed")

    def reshard(self) -> None:
        """The shards are registered outside forward already."""

    def unshard(self, async_op: bool = False) -> UnshardHandle | None:
        return UnshardHandle() if async_op else None

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        if not requires_gradient_sync:
            raise NotImplementedError("holoflow fully_shard: gradients are reduce-scattered in every backward; "
                                      "set_requires_gradient_sync(False) (local accumulation) is not supported")

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        self._fsdp_state.reshard_after_forward = reshard_after_forward

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse: bool = True) -> None:
        """Shards are what the module holds after backward."""

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        """Every backward reduces its gradients."""

    def set_modules_to_forward_prefetch(self, modules: list) -> None:
        """Gathers are not prefetched: each module gathers in its forward pre-hook."""

    def set_modules_to_backward_prefetch(self, modules: list) -> None:
        """Gathers are not prefetched (autograd keeps the gathered parameters)."""

    def set_gradient_divide_factor(self, factor: float) -> None:
        self._fsdp_state.divide = float(factor)


class _State:
    """One ``fully_shard`` call: its mesh, the parameters it took (module, name) and how it runs."""

    def __init__(self, mesh: DeviceMesh, params: list, mp: MixedPrecisionPolicy, reshard_after_forward) -> None:
        self.mesh = mesh
        self.params = params
        self.mp = mp
        self.reshard_after_forward = reshard_after_forward
        self.divide = float(mesh.size())
        self.gathered = False

    def gather(self) -> None:
        """Each taken parameter's unsharded local tensor registered in its place (one gather for a
        parameter tied between modules)."""
        whole = [Replicate()] * self.mesh.ndim
        partial = [Partial()] * self.mesh.ndim
        gathered: dict = {}
        for mod, name, shard in self.params:
            if id(shard) in gathered:
                mod._parameters[name] = gathered[id(shard)]
                continue
            full = shard.redistribute(placements=whole).to_local(grad_placements=partial)
            if full.requires_grad:   # (the average over data-parallel ranks, in the shards' dtype)
                full.register_hook(lambda g, k=self.divide: g / k)
            if self.mp.param_dtype is not None and full.dtype.is_floating_point:
                full = full.to(self.mp.param_dtype)
            mod._parameters[name] = gathered[id(shard)] = full
        self.gathered = True

    def reshard(self) -> None:
        for mod, name, shard in self.params:
            mod._parameters[name] = shard
        self.gathered = False


def _cast(x: Any, dtype: DType | None):
    if dtype is None:
        return x
    if isinstance(x, Tensor):
        return x.to(dtype) if x.dtype.is_floating_point and x.dtype != dtype else x
    if isinstance(x, (tuple, list)):
        return type(x)(_cast(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    return x


def fully_shard(module: Module | list, *, mesh: DeviceMesh | None = None, reshard_after_forward: bool | None = None,
                shard_placement_fn=None, mp_policy: MixedPrecisionPolicy = MixedPrecisionPolicy(),
                offload_policy: OffloadPolicy = OffloadPolicy(), ignored_params: Iterable[Parameter] | None = None,
                **kwargs) -> Module:
    """torch's FSDP2 on ``module`` (in place; returns it). Call it bottom-up, each block then the
    root, as torch's: each call takes the parameters no earlier call on a submodule took."""
    if isinstance(module, list):
        raise NotImplementedError("holoflow fully_shard: a list of modules (one group) is not supported; call it "
                                  "on each module")
    if type(offload_policy) is not OffloadPolicy:
        raise NotImplementedError("holoflow fully_shard: offload_policy (CPU offloading) is not supported")
    if shard_placement_fn is not None:
        raise NotImplementedError("holoflow fully_shard: shard_placement_fn is not supported; parameters are "
                                  "sharded on dim 0")
    if kwargs:
        raise TypeError(f"holoflow fully_shard: unexpected keyword argument(s) {sorted(kwargs)}")
    mesh = DeviceMesh.from_placement(mesh if mesh is not None else (current_mesh() or _default_mesh(module)))
    if mesh.ndim not in (1, 2):
        raise ValueError(f"holoflow fully_shard: takes a 1-D mesh (FSDP) or a 2-D one (HSDP: replicate, shard), "
                         f"got {mesh.ndim}-D")
    if isinstance(module, FSDPModule):
        raise RuntimeError("holoflow fully_shard: this module is already sharded by fully_shard")
    placements = [Replicate()] * (mesh.ndim - 1) + [Shard(0)]
    ignored = {id(p) for p in ignored_params or ()}
    taken, shards = [], {}   # (a parameter tied between modules stays one: one shard)
    for mod in module.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or p._global is not None or id(p) in ignored:
                continue   # (global: taken by a fully_shard of a submodule, or laid out by the user)
            if id(p) not in shards:
                shards[id(p)] = Parameter(distribute_tensor(p.detach(), mesh, placements),
                                          requires_grad=p.requires_grad)
            mod._parameters[name] = shards[id(p)]
            taken.append((mod, name, shards[id(p)]))
    state = _State(mesh, taken, mp_policy, reshard_after_forward)
    module.__dict__["_fsdp_state"] = state

    def pre(mod, args, kwargs):
        state.gather()
        if mp_policy.cast_forward_inputs and mp_policy.param_dtype is not None:
            args, kwargs = _cast(args, mp_policy.param_dtype), _cast(kwargs, mp_policy.param_dtype)
        return args, kwargs

    def post(mod, args, output):
        state.reshard()
        return _cast(output, mp_policy.output_dtype)
    module.register_forward_pre_hook(pre, with_kwargs=True)
    module.register_forward_hook(post)
    cls = type(module)
    module.__class__ = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    return module


def _default_mesh(module: Module) -> DeviceMesh:
    """Every rank of the world, on the device type of the module's parameters."""
    env.ensure_initialized()
    first = next(iter(module.parameters()), None)
    kind = first.device.type if first is not None else "cpu"
    return init_device_mesh(kind, (env.get_world_size(),))


def register_fsdp_forward_method(module: Module, method_name: str) -> None:
    """Another method of ``module`` (``generate``) runs with the parameters gathered too."""
    if not isinstance(module, FSDPModule):
        return
    state = module._fsdp_state
    method = getattr(module, method_name)

    def gathered(*args, **kwargs):
        if state.gathered:
            return method(*args, **kwargs)
        state.gather()
        try:
            return method(*args, **kwargs)
        finally:
            state.reshard()
    setattr(module, method_name, gathered)
