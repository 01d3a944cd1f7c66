"""``Optimizer``: param groups, per-parameter state, ``state_dict`` in torch's format, ``step``.

An algorithm subclasses :class:`Optimizer` and writes two methods:

- ``_init_state(p, group) -> dict``: the fresh state of one parameter (``step`` is a float32
  scalar tensor, as torch stores it);
- ``_update(V, group, params, grads, states)``: its update rule, written ONCE in the list
  operations of a lowering ``V`` (optim/lowering.py): ``V.of(tensors)`` gives the elements to
  work on, ``V.lerp_(ms, gs, 1 - b1)`` ... update them in place, following torch's formulas, so
  results equal torch's on the same gradients (``Parameter`` identity holds).

``step()`` runs the rule with :data:`~.lowering.FOREACH` (one ``torch._foreach_*`` call per
operation, on local tensors in eager mode; ``_step_foreach``) or :data:`~.lowering.OPS` (holoflow
ops per element, for global tensors and ``foreach=False``; ``_step_ops``). A class may declare
``fused_update``, one torch kernel for the whole rule, which graph mode selects as a lowering
(graph/passes/fuse_update.py). A subclass may still override ``_step_foreach``/``_step_ops``.
"""
from __future__ import annotations

import copy
import functools
import operator
from collections import OrderedDict, defaultdict
from itertools import chain
from typing import Any, Callable, Iterable

import torch

from ..core import grad_mode
from ..core.interpret import is_lazy
from ..core.errors import UnsupportedError
from ..core.sbp import P
from ..core.tensor import Tensor, clear_grads
from ..distributed.global_tensor import make_global
from ..nn.hooks import RemovableHandle
from .lowering import FOREACH, OPS
from .state_dict_hooks import StateDictHooks

__all__ = ["Optimizer", "register_optimizer_step_pre_hook", "register_optimizer_step_post_hook"]

_UNSUPPORTED_FLAGS = ("capturable", "differentiable")


class _Required:
    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


def _check_state_is_whole(opt, params: list, states: list) -> None:
    """An eager step of a global parameter needs its whole (global) state: state that nn.Graph's
    ZeRO sharded (this rank's rows, local tensors) can only be stepped by that graph."""
    for p, st in zip(params, states):
        if p._global is None:
            continue
        for k, v in st.items():
            if isinstance(v, Tensor) and v._global is None and v.dim() > 0:
                raise UnsupportedError(
                    f"holoflow.optim.{type(opt).__name__}.step: the state {k!r} of a global parameter of "
                    f"shape {tuple(p.shape)} is this rank's rows (shape {tuple(v.shape)}), sharded by an "
                    f"nn.Graph with config.enable_zero; an eager step cannot use it: keep stepping this "
                    f"optimizer in that graph, or train eagerly with an optimizer of its own")


def _real_view(t: Tensor) -> Tensor:
    return Tensor._make(torch.view_as_real(t._data))


def _complex_as_real(params: list, grads: list, states: list) -> tuple:
    """torch steps a complex parameter as its real view (``view_as_real`` of the parameter, its
    gradient and its complex state), so every rule treats real and imaginary parts as separate
    elements; this does the same for local complex parameters."""
    if is_lazy() or not any(p._global is None and p._data.is_complex() for p in params):
        return params, grads, states, []
    rp, rg, rs, back = [], [], [], []
    for p, g, st in zip(params, grads, states):
        if p._global is not None or not p._data.is_complex():
            rp.append(p)
            rg.append(g)
            rs.append(st)
            continue
        views = {k: _real_view(v) if isinstance(v, Tensor) and v._global is None and v._data.is_complex()
                 else v for k, v in st.items()}
        rp.append(_real_view(p))
        rg.append(_real_view(g) if g._data.is_complex() else g)
        rs.append(views)
        back.append((p, st, dict(views), views))
    return rp, rg, rs, back


def _write_back_complex(back: list) -> None:
    """Stores state a rule created or replaced on a real view back as complex tensors."""
    for p, st, before, views in back:
        for k, v in views.items():
            if before.get(k) is v and k in st:
                continue
            if isinstance(v, Tensor) and v._global is None and tuple(v.shape) == tuple(p.shape) + (2,):
                v = Tensor._make(torch.view_as_complex(v._data.contiguous()))
            st[k] = v


# every optimizer's step hooks (torch.optim.optimizer.register_optimizer_step_pre_hook/post_hook)
_GLOBAL_PRE_HOOKS: OrderedDict[int, Callable] = OrderedDict()
_GLOBAL_POST_HOOKS: OrderedDict[int, Callable] = OrderedDict()


def register_optimizer_step_pre_hook(hook: Callable) -> RemovableHandle:
    """``hook(optimizer, args, kwargs)`` before every optimizer's ``step``; it may return new
    ``(args, kwargs)``."""
    handle = RemovableHandle(_GLOBAL_PRE_HOOKS)
    _GLOBAL_PRE_HOOKS[handle.id] = hook
    return handle


def register_optimizer_step_post_hook(hook: Callable) -> RemovableHandle:
    """``hook(optimizer, args, kwargs)`` after every optimizer's ``step``."""
    handle = RemovableHandle(_GLOBAL_POST_HOOKS)
    _GLOBAL_POST_HOOKS[handle.id] = hook
    return handle


def has_step_hooks(optimizer: Any) -> bool:
    """Whether a step of ``optimizer`` runs any step hook (its own or every optimizer's)."""
    return bool(_GLOBAL_PRE_HOOKS or _GLOBAL_POST_HOOKS or getattr(optimizer, "_optimizer_step_pre_hooks", None)
                or getattr(optimizer, "_optimizer_step_post_hooks", None))


def run_step_pre_hooks(optimizer: Any, args: tuple, kwargs: dict, what: Any = "step") -> tuple[tuple, dict]:
    """Runs the global and ``optimizer``'s pre-step hooks (``hook(optimizer, args, kwargs)``, in
    torch's order); returns the ``(args, kwargs)`` the step then takes (a hook may replace them).
    ``what`` names the step in the error a malformed result raises."""
    for pre_hook in chain(_GLOBAL_PRE_HOOKS.values(), getattr(optimizer, "_optimizer_step_pre_hooks", {}).values()):
        result = pre_hook(optimizer, args, kwargs)
        if result is not None:
            if not (isinstance(result, tuple) and len(result) == 2):
                raise RuntimeError(f"{what} must return None or a tuple of (new_args, new_kwargs), but got "
                                   f"{result}.")
            args, kwargs = result
    return args, kwargs


def run_step_post_hooks(optimizer: Any, args: tuple, kwargs: dict) -> None:
    """Runs ``optimizer``'s and then the global post-step hooks (``hook(optimizer, args, kwargs)``)."""
    for post_hook in chain(getattr(optimizer, "_optimizer_step_post_hooks", {}).values(), _GLOBAL_POST_HOOKS.values()):
        post_hook(optimizer, args, kwargs)


def _hooked_step(step: Callable) -> Callable:
    """``step`` running the global and the optimizer's step hooks around it, as torch's
    ``Optimizer.profile_hook_step`` (``args`` starts with the optimizer)."""
    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        self = args[0]
        args, kwargs = run_step_pre_hooks(self, args, kwargs, step)
        out = step(*args, **kwargs)
        run_step_post_hooks(self, args, kwargs)
        return out
    wrapper.hooked = True  # type: ignore[attr-defined]
    return wrapper


class Optimizer(StateDictHooks):
    """Base class of holoflow's optimizers, API-compatible with ``torch.optim.Optimizer``.

    >>> opt = flow.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    #: ``(group, params, grads, states) -> None``: the update as one fused torch kernel, a
    #: lowering graph mode may choose (graph/passes/fuse_update.py); None where torch has none
    fused_update: Callable | None = None

    def __init__(self, params: Iterable, defaults: dict[str, Any]) -> None:
        for flag in _UNSUPPORTED_FLAGS:
            if defaults.get(flag):
                raise UnsupportedError(f"holoflow.optim.{type(self).__name__}: {flag}=True is not "
                                       f"supported; leave it False")
        if defaults.get("fused") and defaults.get("foreach"):
            raise RuntimeError(f"holoflow.optim.{type(self).__name__}: `fused` and `foreach` cannot be "
                               f"`True` together (as in torch)")
        self.defaults = defaults
        self._optimizer_step_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict[int, Callable] = OrderedDict()
        if not getattr(type(self).step, "hooked", False):   # once per class, as torch patches it
            type(self).step = _hooked_step(type(self).step)
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, Tensor):
            raise TypeError("holoflow.optim: params should be an iterable of Tensors or dicts, "
                            "got a Tensor; pass [tensor] or model.parameters()")
        groups = list(params)
        if not groups:
            raise ValueError("holoflow.optim: optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)
        self._step_count = 0

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(g.items()) if k not in ("params", "param_names")]
        return "\n".join(lines + [")"])

    def __getstate__(self) -> dict:
        return self.__dict__

    # -- groups ----------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Adds a group of parameters with its own hyper-parameters (missing ones from defaults)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"holoflow.optim: a param group must be a dict, got {type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("holoflow.optim: params must be an ordered collection, not a set")
        params = list(params)
        if params and isinstance(params[0], tuple):
            group["param_names"] = [name for name, _ in params]
            params = [p for _, p in params]
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"holoflow.optim: can only optimize holoflow Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("holoflow.optim: can't optimize a non-leaf Tensor")
        group["params"] = params
        for k, v in self.defaults.items():
            if v is required and k not in group:
                raise ValueError(f"holoflow.optim: parameter group didn't specify a value of required "
                                 f"optimization parameter {k}")
            group.setdefault(k, v)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params) or len({id(p) for p in params}) != len(params):
            raise ValueError("holoflow.optim: some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def register_step_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(optimizer, args, kwargs)`` before this optimizer's ``step``; it may return new
        ``(args, kwargs)``."""
        handle = RemovableHandle(self._optimizer_step_pre_hooks)
        self._optimizer_step_pre_hooks[handle.id] = hook
        return handle

    def register_step_post_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(optimizer, args, kwargs)`` after this optimizer's ``step``."""
        handle = RemovableHandle(self._optimizer_step_post_hooks)
        self._optimizer_step_post_hooks[handle.id] = hook
        return handle

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Resets the gradients of all optimized tensors (to ``None`` by default, as torch)."""
        clear_grads((p for g in self.param_groups for p in g["params"]), set_to_none)

    # -- step ------------------------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Performs one update; ``closure`` (re-evaluating the loss) runs first with grad enabled."""
        loss = None
        if closure is not None:
            with grad_mode.enable_grad():
                loss = closure()
        prev, grad_mode.STATE.enabled = grad_mode.STATE.enabled, False
        try:
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                if not params:
                    continue
                grads = [p.grad for p in params]
                states = [self._state_of(p, group) for p in params]
                if not is_lazy():
                    _check_state_is_whole(self, params, states)
                fused = self._use_fused(group, params, grads)
                foreach = not fused and self._use_foreach(group, params, grads)
                on_shards = not fused and not foreach and self._on_shards(group, params, grads, states)
                params, grads, states, back = _complex_as_real(params, grads, states)
                if fused:
                    self._step_fused(group, params, grads, states)
                elif foreach:
                    self._step_foreach(group, params, grads, states)
                elif on_shards:
                    self._step_foreach(group, params, grads, states)
                    _lay_out_new_state(params, states)
                else:
                    self._step_ops(group, params, grads, states)
                _write_back_complex(back)
        finally:
            grad_mode.STATE.enabled = prev
        self._step_count += 1
        self._opt_called = True
        return loss

    def _state_of(self, p: Tensor, group: dict) -> dict:
        st = self.state[p]
        if not st:
            st.update(self._init_state(p, group))
        return st

    @staticmethod
    def _use_foreach(group: dict, params: list, grads: list) -> bool:
        """The torch fast path runs on local eager tensors; global tensors (FSDP's, DTensors) and
        traces take ops, ``foreach=True`` too (torch accepts it for DTensors: a speed hint, the
        same numbers)."""
        if group.get("foreach") is False:
            return False
        return not is_lazy() and all(p._global is None for p in params) and all(g._global is None for g in grads)

    def _on_shards(self, group: dict, params: list, grads: list, states: list) -> bool:
        """Whether eager global parameters step by the foreach lowering on each rank's pieces:
        the rule is elementwise (the class keeps the shared ``_step_foreach``), and every
        gradient and state tensor is laid out as its parameter (FSDP's shards, replicas; no
        partial sums), so a piece's update is that piece of the update (torch steps DTensors by
        foreach ops too)."""
        if group.get("foreach") is False or is_lazy() or type(self)._step_foreach is not Optimizer._step_foreach:
            return False
        for p, g, st in zip(params, grads, states):
            layout = _layout(p)   # (a partial-sum piece is no piece of the value: Adam squares it)
            if layout is None or P in layout[1] or p.is_complex() or _layout(g) != layout:
                return False
            if any(_layout(v) != layout for v in st.values() if isinstance(v, Tensor) and v.dim()):
                return False
        return True

    def _use_fused(self, group: dict, params: list, grads: list) -> bool:
        """``fused=True`` (torch's flag) runs the declared ``fused_update`` on local eager tensors,
        giving torch's fused numbers; the default (None) keeps torch's default (foreach) numbers."""
        if not group.get("fused"):
            return False
        if group.get("foreach"):
            raise RuntimeError(f"holoflow.optim.{type(self).__name__}: fused=True and foreach=True "
                               f"can't both be set (as in torch)")
        if self.fused_update is None:
            raise UnsupportedError(f"holoflow.optim.{type(self).__name__}: fused=True is not supported "
                                   f"(no fused kernel); leave fused=None")
        if is_lazy():   # nn.Graph chooses the fused lowering itself (graph/passes/fuse_update.py)
            return False
        if any(p._global is not None for p in params) or any(g._global is not None for g in grads):
            _check_aligned(type(self).__name__, params, grads, [self._state_of(p, group) for p in params])
        if not all(p._data.is_floating_point() for p in params):
            raise RuntimeError(f"holoflow.optim.{type(self).__name__}: fused=True requires floating "
                               f"point parameters (as torch)")
        return True

    def _step_fused(self, group: dict, params: list, grads: list, states: list) -> None:
        """One fused kernel call per (device, dtype) of the parameters, as torch groups them."""
        by_kind: dict = {}
        for p, g, st in zip(params, grads, states):
            ps, gs, sts = by_kind.setdefault((p._data.device, p._data.dtype), ([], [], []))
            ps.append(p)
            gs.append(g)
            sts.append(st)
        for ps, gs, sts in by_kind.values():
            type(self).fused_update(group, ps, gs, sts)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        return {}

    def _update(self, V, group: dict, params: list, grads: list, states: list) -> None:
        """The update rule, in the list operations of lowering ``V`` (see the module doc)."""
        raise NotImplementedError(f"holoflow.optim.{type(self).__name__}: no update rule (_update)")

    def _step_foreach(self, group: dict, params: list, grads: list, states: list) -> None:
        self._update(FOREACH, group, params, grads, states)

    def _step_ops(self, group: dict, params: list, grads: list, states: list) -> None:
        self._update(OPS, group, params, grads, states)

    # -- state dict ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{'state': {idx: {...}}, 'param_groups': [{..., 'params': [idx, ...]}]}``, as torch
        (through the state-dict hooks, optim/state_dict_hooks.py)."""
        self._run_hooks("state_dict_pre")
        index: dict[int, int] = {}
        groups = []
        for g in self.param_groups:
            for p in g["params"]:
                index.setdefault(id(p), len(index))
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = [index[id(p)] for p in g["params"]]
            groups.append(packed)
        state = {index[id(p)]: s for p, s in self.state.items() if id(p) in index}
        return self._run_hooks("state_dict_post", {"state": state, "param_groups": groups})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state written by :meth:`state_dict` (holoflow's or torch's: torch tensors are
        converted). State tensors are copied and cast to their parameter's dtype/device, except
        ``step``."""
        state_dict = self._run_hooks("load_state_dict_pre", state_dict.copy())   # (shallow, as torch)
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"holoflow.optim: loaded state dict has {len(saved_groups)} parameter "
                             f"groups, this optimizer has {len(self.param_groups)}")
        for i, (g, s) in enumerate(zip(self.param_groups, saved_groups)):
            if len(g["params"]) != len(s["params"]):
                raise ValueError(f"holoflow.optim: loaded state dict's group {i} has {len(s['params'])} "
                                 f"parameters, this optimizer's has {len(g['params'])}")
        id_map = {old: p for g, s in zip(self.param_groups, saved_groups)
                  for old, p in zip(s["params"], g["params"])}
        self.state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                p = id_map[k]
                self.state[p] = {name: _cast_state(name, val, p) for name, val in v.items()}
        new_groups = []
        for g, s in zip(self.param_groups, saved_groups):
            ng = {k: copy.deepcopy(v) for k, v in s.items() if k != "params"}
            ng["params"] = g["params"]
            if "param_names" in g and "param_names" not in ng:
                ng["param_names"] = g["param_names"]
            new_groups.append(ng)
        self.param_groups = new_groups
        self._run_hooks("load_state_dict_post")


def _cast_state(name: str, value: Any, p: Tensor) -> Any:
    if isinstance(value, torch.Tensor):
        value = Tensor._make(value.detach())
    if not isinstance(value, Tensor):
        return copy.deepcopy(value)
    if name == "step":
        return value.clone()
    dtype = p.dtype if p.is_floating_point() else None
    return value.to(dtype=dtype, device=p.device).clone() if dtype is not None else \
        value.to(device=p.device).clone()


def storages(tensors: list[Tensor]) -> list[torch.Tensor]:
    """The torch storages of local tensors, for the ``torch._foreach_*`` fast path."""
    return [t._data for t in tensors]


def scalar_dtype(fused: bool = False) -> torch.dtype:
    """The dtype of an optimizer's scalar state (``step``, NAdam's ``mu_product``, ASGD's ``eta``
    and ``mu``), as torch's ``_get_scalar_dtype``: float64 under a float64 default dtype, else
    float32; always float32 for a fused kernel's counters."""
    return torch.float64 if not fused and torch.get_default_dtype() == torch.float64 else torch.float32


def _layout(t: Tensor) -> tuple | None:
    g = t._global
    return None if g is None else (g.placement, tuple(g.sbp), tuple(t.shape))


def _lay_out_new_state(params: list, states: list) -> None:
    """State tensors the rule made on a step of pieces (SGD's first momentum buffer, a piece of
    the gradient) become global tensors laid out as their parameter."""
    for p, st in zip(params, states):
        for k, v in st.items():
            if isinstance(v, Tensor) and v.dim() and v._global is None:
                st[k] = make_global(v, p._global.placement, tuple(p._global.sbp), tuple(p.shape))


def _check_aligned(name: str, params: list, grads: list, states: list) -> None:
    """A fused kernel on global tensors runs on each rank's shards (torch's fused kernels on
    DTensors): elementwise, so every gradient and state tensor must be laid out as its
    parameter (FSDP's are)."""
    for i, (p, g, st) in enumerate(zip(params, grads, states)):
        want = None if p._global is None else (p._global.placement, tuple(p._global.sbp))
        if want is not None and P in want[1]:
            raise UnsupportedError(f"holoflow.optim.{name}: fused=True runs on each rank's shards, and parameter "
                                   f"{i} is laid out as a partial sum ({want[1]}), whose pieces are no pieces of "
                                   f"its value; leave fused=None")
        for what, t in [("gradient", g), *((k, v) for k, v in st.items() if isinstance(v, Tensor) and v.dim())]:
            got = None if t._global is None else (t._global.placement, tuple(t._global.sbp))
            if got != want:
                raise UnsupportedError(f"holoflow.optim.{name}: fused=True runs on each rank's shards, so the "
                                       f"{what} of parameter {i} must be laid out as the parameter "
                                       f"({'local' if want is None else want[1]}), got "
                                       f"{'local' if got is None else got[1]}; leave fused=None")


def new_step(fused: bool = False) -> Tensor:
    """A fresh ``step`` counter: a scalar tensor of :func:`scalar_dtype`, as torch keeps it."""
    return Tensor._make(torch.zeros((), dtype=scalar_dtype(fused)))


def advance_steps(states: list[dict], device: torch.device | None = None) -> list[torch.Tensor]:
    """Adds one to the ``step`` counter of each state, as torch's ``_foreach_add_(steps, 1)``, and
    returns the counters' storages (moved to ``device`` first if given: fused kernels want them
    on the parameters' device). A group's counters are packed, at their first step, into one
    buffer each of them views, so the increment is one kernel instead of one per parameter (a
    foreach over 0-d CPU tensors is a loop of ~1.5 us calls: 40 us per step on GPT-mini). A
    counter replaced since (``load_state_dict``, a user's assignment) re-packs the group; counters
    that cannot share a buffer (global, of mixed dtypes, shapes or devices) take the foreach."""
    counters = [st["step"] for st in states]
    datas = [c._data for c in counters]
    if not datas:
        return datas
    pack = counters[0].__dict__.get("_step_pack")   # (the buffer, every counter's view of it)
    if pack is None or len(pack[1]) != len(datas) or not all(map(operator.is_, pack[1], datas)) or \
            (device is not None and pack[0].device != device):
        pack = _pack(counters, datas, device)
        if pack is None:
            if device is not None:
                for c in counters:
                    if c._data.device != device:
                        c._data = c._data.to(device)
                datas = [c._data for c in counters]
            torch._foreach_add_(datas, 1)
            return datas
    pack[0].add_(1)
    return list(pack[1])


def _pack(counters: list[Tensor], datas: list[torch.Tensor], device) -> tuple | None:
    first = datas[0]
    device = first.device if device is None else device
    if any(c._global is not None for c in counters) or \
            any(d.dim() or d.dtype != first.dtype or d.device != first.device for d in datas):
        return None
    buffer = torch.stack(datas).to(device)
    views = tuple(buffer.unbind())
    for c, v in zip(counters, views):
        c._data = v
    pack = counters[0].__dict__["_step_pack"] = (buffer, views)
    return pack


def step_values(states: list[dict]) -> list[float]:
    """Increments the states' step counters in place and returns them as Python floats (as torch
    does)."""
    steps = advance_steps(states)
    pack = states[0]["step"].__dict__.get("_step_pack") if steps else None
    if pack is not None and pack[1][0] is steps[0] and len(pack[1]) == len(steps):
        return pack[0].tolist()
    return [s.item() for s in steps]
