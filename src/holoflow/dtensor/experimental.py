"""``holoflow.dtensor.experimental``: torch's ``torch.distributed.tensor.experimental`` names
holoflow has (``implicit_replication``, ``local_map``)."""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from ..core.tensor import Tensor
from ..distributed.device_mesh import DeviceMesh
from ..distributed.dtensor import DTensor, implicit_replication
from ..distributed.placement_types import Placement
from ..graph.pytree import flatten, unflatten

__all__ = ["implicit_replication", "local_map"]

Placements = Sequence[Placement] | None


def local_map(func: Callable | None = None, out_placements: Placements | tuple = None,
              in_placements: tuple | None = None, in_grad_placements: tuple | None = None,
              device_mesh: DeviceMesh | None = None, *, redistribute_inputs: bool = False) -> Callable:
    """``func``, written for local tensors, applied to DTensors: each DTensor argument (of the
    flattened positional arguments) becomes its local shard (checked against, or with
    ``redistribute_inputs`` laid out as, ``in_placements``; its gradient laid out as
    ``in_grad_placements`` says, else like the DTensor), and each tensor of ``func``'s flattened
    output becomes a DTensor with its entry of ``out_placements`` (``from_local`` without check).
    Called without any DTensor argument, ``func`` runs as it is. As torch's (its exception classes
    too: AssertionError for a malformed placements list, ValueError for a layout that differs
    without ``redistribute_inputs``); usable as a decorator (``func`` omitted)."""
    if func is None:
        return functools.partial(local_map, out_placements=out_placements, in_placements=in_placements,
                                 in_grad_placements=in_grad_placements, device_mesh=device_mesh,
                                 redistribute_inputs=redistribute_inputs)

    @functools.wraps(func)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        return _local_map_call(func, out_placements, in_placements, in_grad_placements, device_mesh,
                               redistribute_inputs, args, kwargs)
    return mapped


def _name(func: Callable) -> str:
    return getattr(func, "__name__", type(func).__name__)


def _local_map_call(func, out_placements, in_placements, in_grad_placements, mesh, redistribute, args, kwargs):
    flat, spec = flatten(args)
    where = f"holoflow.local_map({_name(func)})"
    for what, given in (("in_placements", in_placements), ("in_grad_placements", in_grad_placements)):
        if given is not None and len(given) != len(flat):
            raise AssertionError(f"{where}: {what} has {len(given)} entries for {len(flat)} flattened positional "
                                 f"arguments; give one per argument (None for a non-tensor)")
    local, seen = [], False
    for i, arg in enumerate(flat):
        if not isinstance(arg, DTensor):
            if in_placements is not None and in_placements[i] is not None and not isinstance(arg, Tensor):
                raise AssertionError(f"{where}: argument {i} is a {type(arg).__name__}, not a tensor, but "
                                     f"in_placements gives it {in_placements[i]}; give None")
            local.append(arg)
            continue
        seen = True
        mesh = mesh if mesh is not None else arg.device_mesh
        if in_placements is not None:
            want = in_placements[i]
            if want is None:
                raise AssertionError(f"{where}: argument {i} is a DTensor ({arg.placements}) but in_placements "
                                     f"gives it None; give the placements the function takes")
            if tuple(arg.placements) != tuple(want):
                if not redistribute:
                    raise ValueError(f"{where}: argument {i} is laid out as {tuple(arg.placements)}, the "
                                     f"function takes {tuple(want)}; redistribute it first or pass "
                                     f"redistribute_inputs=True")
                arg = arg.redistribute(placements=want)
        grad = in_grad_placements[i] if in_grad_placements is not None else None
        if in_grad_placements is not None and grad is None:
            raise AssertionError(f"{where}: argument {i} is a DTensor but in_grad_placements gives it None")
        local.append(arg.to_local(grad_placements=grad))
    out = func(*unflatten(local, spec), **kwargs)
    if not seen:
        return out
    flat_out, out_spec = flatten(out)
    specs = out_placements if isinstance(out_placements, tuple) else (out_placements,)
    if len(specs) != len(flat_out):
        raise AssertionError(f"{where}: out_placements has {len(specs)} entries, the function returned "
                             f"{len(flat_out)} values; give one per flattened output (None for a non-tensor)")
    wrapped = []
    for j, (value, placements) in enumerate(zip(flat_out, specs)):
        if isinstance(value, DTensor):
            raise AssertionError(f"{where}: output {j} is a DTensor; the function must return local tensors")
        if isinstance(value, Tensor):   # (placements None: replicated, as from_local's default)
            value = DTensor.from_local(value, mesh, placements, run_check=False)
        elif placements is not None:
            raise AssertionError(f"{where}: output {j} is a {type(value).__name__}, not a tensor, but "
                                 f"out_placements gives it {placements}; give None")
        wrapped.append(value)
    return unflatten(wrapped, out_spec)
