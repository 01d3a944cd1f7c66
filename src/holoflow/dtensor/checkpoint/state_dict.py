"""torch's ``torch.distributed.checkpoint.state_dict``: a model's and its optimizers' state dicts
keyed by parameter names (FQNs), sharded (DTensors as they are) or full (whole local tensors;
with ``cpu_offload`` only rank 0 gets them, as torch), and loaded back into any layout."""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

from ...core.grad_mode import no_grad
from ...core.tensor import Tensor
from ...distributed import world
from ...distributed.dtensor import distribute_tensor
from ...distributed.global_tensor import world_ranks
from ...nn.module import Module
from ...ops.creation import zeros

__all__ = ["StateDictOptions", "get_model_state_dict", "get_optimizer_state_dict", "get_state_dict",
           "set_model_state_dict", "set_optimizer_state_dict", "set_state_dict"]


@dataclass
class StateDictOptions:
    """torch's options: ``full_state_dict`` (whole tensors instead of DTensors), ``cpu_offload``
    (on the CPU; with ``full_state_dict`` only rank 0 keeps them), ``ignore_frozen_params``,
    ``strict`` (loading), ``broadcast_from_rank0`` (loading a full state dict only rank 0 has)."""

    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False


# wrappers whose names torch's FQNs leave out: FSDP1's and the activation checkpoint's
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
_VIEW = threading.local()


@contextlib.contextmanager
def sharded_view() -> Iterator[None]:
    """``state_dict()`` of FSDP1 models inside it holds their DTensors as they are, whatever
    state-dict type they were set to (these functions convert them themselves)."""
    before = getattr(_VIEW, "on", False)
    _VIEW.on = True
    try:
        yield
    finally:
        _VIEW.on = before


def in_sharded_view() -> bool:
    return getattr(_VIEW, "on", False)


def fqn(name: str) -> str:
    """A parameter's name without the wrappers' segments (torch's FQN)."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


class IncompatibleKeys(NamedTuple):
    missing_keys: list
    unexpected_keys: list


def _opts(options: StateDictOptions | None) -> StateDictOptions:
    return options if options is not None else StateDictOptions()


def _export(v: Any, o: StateDictOptions) -> Any:
    if not isinstance(v, Tensor):
        return v
    if o.full_state_dict and v._global is not None:
        v = v.full_tensor()
    if o.cpu_offload:
        v = v.cpu()
    return v.detach()


def _keep(o: StateDictOptions) -> bool:
    """Whether this rank returns the full state dict (torch: rank 0 only with cpu_offload)."""
    return not (o.full_state_dict and o.cpu_offload) or world.rank() == 0


def _optimizers(optimizers) -> list:
    return list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]


def get_model_state_dict(model: Module, *, submodules=None, options: StateDictOptions | None = None) -> dict:
    o = _opts(options)
    frozen = {fqn(n) for n, p in model.named_parameters() if not p.requires_grad} if o.ignore_frozen_params else set()
    with sharded_view():
        own = model.state_dict()
    out = {k: _export(v, o) for k, v in own.items() if k not in frozen}
    return out if _keep(o) else {}


def _init_optim_state(opt) -> None:
    """An optimizer's state made by a step of zero gradients at learning rate 0 (as torch does,
    so a fresh optimizer's state dict has every entry to load into)."""
    if opt.state:
        return
    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    if any(p.grad is not None for p in params):
        raise RuntimeError("holoflow get_optimizer_state_dict: the optimizer has no state yet but its parameters "
                           "have gradients; call it before backward or after a step")
    lrs = []
    for g in opt.param_groups:
        lrs.append(g.get("lr"))
        if "lr" in g:
            g["lr"] = 0.0
    with no_grad():
        for p in params:
            p.grad = zeros(p.shape, dtype=p.dtype) if p._global is None else \
                zeros(p.shape, dtype=p.dtype, placement=p._global.placement, sbp=p._global.sbp)
    opt.step()
    for g, lr in zip(opt.param_groups, lrs):
        if lr is not None:
            g["lr"] = lr
    opt.zero_grad(set_to_none=True)


def _names(model: Module) -> dict:
    """Each parameter's name (a tied one's first)."""
    names: dict = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), fqn(n))
    return names


def get_optimizer_state_dict(model: Module, optimizers, *, submodules=None,
                             options: StateDictOptions | None = None) -> dict:
    """The optimizers' state dicts merged, keyed by parameter names."""
    o = _opts(options)
    names = _names(model)
    state: dict = {}
    groups: list = []
    for opt in _optimizers(optimizers):
        _init_optim_state(opt)
        osd = opt.state_dict()
        order = [p for g in opt.param_groups for p in g["params"]]
        for i, s in osd["state"].items():
            state[names[id(order[i])]] = {k: _export(v, o) for k, v in s.items()}
        for g in osd["param_groups"]:
            groups.append({**g, "params": [names[id(order[i])] for i in g["params"]]})
    return {"state": state, "param_groups": groups} if _keep(o) else {}


def get_state_dict(model: Module, optimizers, *, submodules=None, options: StateDictOptions | None = None) -> tuple:
    return (get_model_state_dict(model, options=options),
            get_optimizer_state_dict(model, optimizers, options=options))


def _place_like(target: Tensor, value: Tensor | None, o: StateDictOptions) -> Tensor:
    """A whole ``value`` laid out as ``target`` (from rank 0's with ``broadcast_from_rank0``)."""
    if target._global is None:
        if not o.broadcast_from_rank0:
            return value
        mine = (value if world.rank() == 0 else target).detach().to(target.dtype)._data.contiguous()
        return Tensor._make(world.comm().broadcast(mine, 0, world_ranks()))   # (simulated worlds too)
    if value is None or (o.broadcast_from_rank0 and world.rank() != 0):
        value = zeros(target.shape, dtype=target.dtype)   # (what rank 0 broadcasts replaces it)
    return distribute_tensor(value.to(target.dtype), target.device_mesh, target.placements,
                             src_data_rank=0 if o.broadcast_from_rank0 else None)


def set_model_state_dict(model: Module, model_state_dict: dict, *,
                         options: StateDictOptions | None = None) -> IncompatibleKeys:
    """Loads ``model_state_dict`` (sharded, or full with ``full_state_dict``: each tensor laid out
    as the model's)."""
    o = _opts(options)
    if not o.full_state_dict:
        got = model.load_state_dict(model_state_dict, strict=o.strict)
        return IncompatibleKeys(list(got.missing_keys), list(got.unexpected_keys))
    with sharded_view():
        own = model.state_dict()
    have = model_state_dict if not o.broadcast_from_rank0 or world.rank() == 0 else {}
    missing = [k for k in own if k not in have] if have or world.rank() == 0 else []
    unexpected = [k for k in have if k not in own]
    if o.strict and (missing or unexpected):
        raise RuntimeError(f"holoflow set_model_state_dict: missing keys {missing}, unexpected keys {unexpected}")
    with no_grad():
        for k, target in own.items():
            v = have.get(k)
            if v is None and not o.broadcast_from_rank0:
                continue
            new = _place_like(target, v, o)
            target._data.copy_(new._data if isinstance(new, Tensor) else new)
    return IncompatibleKeys(missing, unexpected)


def set_optimizer_state_dict(model: Module, optimizers, optim_state_dict: dict, *,
                             options: StateDictOptions | None = None) -> None:
    """Loads a state dict keyed by parameter names into the optimizers (full tensors laid out as
    their parameters)."""
    o = _opts(options)
    for opt in _optimizers(optimizers):
        opt.load_state_dict(optimizer_state_to_load(model, opt, optim_state_dict, o))


def optimizer_state_to_load(model: Module, opt, optim_state_dict: dict, o: StateDictOptions) -> dict:
    """``optim_state_dict`` (keyed by parameter names) as ``opt.load_state_dict`` takes it: keyed
    by ``opt``'s parameter indices, full tensors laid out as the parameters' states."""
    names = _names(model)
    _init_optim_state(opt)
    order = [p for g in opt.param_groups for p in g["params"]]
    index = {names[id(p)]: i for i, p in enumerate(order)}
    own = opt.state_dict()
    state = {}
    for i, s in own["state"].items():
        name = names[id(order[i])]
        src = optim_state_dict.get("state", {}).get(name)
        if src is None and not o.broadcast_from_rank0:
            raise RuntimeError(f"holoflow set_optimizer_state_dict: no state for parameter {name!r}")
        state[i] = {k: (_place_like(v, (src or {}).get(k), o) if isinstance(v, Tensor) and o.full_state_dict
                        else (src or {}).get(k, v)) for k, v in s.items()}
    groups = []
    mine = [g for g in optim_state_dict.get("param_groups", []) if all(n in index for n in g["params"])]
    for g_own, g in zip(own["param_groups"], mine or own["param_groups"]):
        groups.append({**g, "params": g_own["params"]})
    return {"state": state, "param_groups": groups}


def set_state_dict(model: Module, optimizers, *, model_state_dict: dict, optim_state_dict: dict,
                   options: StateDictOptions | None = None) -> IncompatibleKeys:
    keys = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return keys
