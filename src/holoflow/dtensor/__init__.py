"""``holoflow.dtensor``: torch's ``torch.distributed.tensor`` on holoflow's global tensors (what
mock_torch gives for it; ``.parallel`` is ``torch.distributed.tensor.parallel``).

DTensors are global tensors on a DeviceMesh (``holoflow.distributed.dtensor``,
``holoflow.distributed.device_mesh``); this module adds what works on modules,
:func:`distribute_module`.
"""
from __future__ import annotations

import inspect
from typing import Callable

from ..distributed.device_mesh import DeviceMesh, _check_mesh, init_device_mesh
from ..distributed.dtensor import (DTensor, distribute_tensor, empty, full, install, ones, rand, randn,
                                   zeros)
from ..distributed.placement_types import Partial, Placement, Replicate, Shard
from ..nn.module import Module
from ..nn.parameter import Parameter

__all__ = ["DTensor", "DeviceMesh", "distribute_tensor", "distribute_module", "Shard", "Replicate", "Partial",
           "Placement", "init_device_mesh", "ones", "empty", "full", "rand", "randn", "zeros"]
# (``install``: the facade puts the DTensor methods on Tensor once, at import)


def distribute_parameter(p: Parameter, mesh: DeviceMesh, placements, src_data_rank: int | None = 0) -> Parameter:
    """``p`` itself made a DTensor laid out as ``placements`` (its gradient dropped). torch
    registers a new Parameter instead, so an optimizer built before still holds the old tensors
    and silently trains nothing; here the parameter objects stay, and so do ties between modules."""
    moved = distribute_tensor(p.detach(), mesh, placements, src_data_rank=src_data_rank)
    rg = p.requires_grad
    p.grad = None
    p._data, p._global = moved._data, moved._global
    if p.requires_grad != rg:
        p.requires_grad_(rg)
    return p


def _replicate_params_and_buffers(module: Module, mesh: DeviceMesh) -> None:
    """Every parameter and buffer of ``module`` itself that is not a DTensor yet, replicated."""
    full_replicate = [Replicate()] * mesh.ndim
    for p in module._parameters.values():
        if p is not None and p._global is None:
            distribute_parameter(p, mesh, full_replicate)
    for key, b in list(module._buffers.items()):
        if b is not None and b._global is None:
            module._buffers[key] = distribute_tensor(b, mesh, full_replicate)


def _arity(fn: Callable) -> int:
    return len(inspect.signature(fn).parameters)


def distribute_module(module: Module, device_mesh: DeviceMesh | None = None,
                      partition_fn: Callable | None = None, input_fn: Callable | None = None,
                      output_fn: Callable | None = None) -> Module:
    """torch's ``distribute_module``: ``partition_fn(name, submodule, mesh)`` lays out each
    submodule's parameters (the rest are replicated); ``input_fn(module, inputs, mesh)`` and
    ``output_fn(module, outputs, mesh)`` become a forward pre-hook and a forward hook."""
    mesh = _check_mesh(device_mesh, "distribute_module")
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError("holoflow.distribute_module should only be called once on a module, but it has already "
                           "been called on this module")
    for name, submod in module.named_modules():
        if partition_fn is not None:
            partition_fn(name, submod, mesh)
        _replicate_params_and_buffers(submod, mesh)
    if input_fn is not None:
        if _arity(input_fn) == 3:
            module.register_forward_pre_hook(lambda _, inputs: input_fn(module, inputs, mesh))
        elif _arity(input_fn) == 2:   # (inputs, mesh): torch's deprecated form
            module.register_forward_pre_hook(lambda _, inputs: input_fn(inputs, mesh))
        else:
            raise ValueError(f"holoflow.distribute_module: input_fn should take (module, inputs, device_mesh), got "
                             f"{_arity(input_fn)} parameter(s)")
    if output_fn is not None:
        if _arity(output_fn) == 3:
            module.register_forward_hook(lambda mod, inputs, outputs: output_fn(mod, outputs, mesh))
        elif _arity(output_fn) == 2:
            module.register_forward_hook(lambda mod, inputs, outputs: output_fn(outputs, mesh))
        else:
            raise ValueError(f"holoflow.distribute_module: output_fn should take (module, outputs, device_mesh), "
                             f"got {_arity(output_fn)} parameter(s)")
    module._distribute_module_applied = True
    return module
