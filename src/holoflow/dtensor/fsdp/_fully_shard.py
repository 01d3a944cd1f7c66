"""``holoflow.dtensor.fsdp``: torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) on holoflow's
global tensors.

``fully_shard(module)`` replaces each parameter of ``module`` (those not already taken by a
``fully_shard`` of a submodule) by a DTensor leaf ``Shard(0)`` on the mesh (or the dim
``shard_placement_fn`` gives; ``(Replicate(), Shard(0))`` on a 2-D mesh: HSDP): that is what the
optimizer steps, what ``state_dict`` holds and what ``p.grad`` is. A forward pre-hook all-gathers
them (all of the call's in one collective per dtype on a 1-D mesh) and registers the unsharded
local tensors in their place for the forward, which then runs on plain local tensors, each rank
on its own batch; the forward hook puts the shards back. In backward each rank's gradient of an
unsharded parameter is a partial sum of the data-parallel gradient, divided by a hook by the
number of data-parallel ranks (torch's default: the average); the call's gradients are
reduce-scattered together once the module's backward is done and added to ``shard.grad``.

Resharding after forward (torch's default for every module but the root) frees the unsharded
tensors' storage when the forward returns, as torch's does: what autograd saved keeps its tensor
objects (and version counters), a hook on the module's outputs all-gathers into the same storage
when backward reaches the module, and each tensor's storage is freed again once its gradient is
complete (or at the end of backward). ``set_requires_gradient_sync(False)`` accumulates the
unsharded gradients on each rank without communication; the next synchronized backward
reduce-scatters them with its own.

Communication runs while the ranks compute, as torch's FSDP2 overlaps it on its own streams: in
forward a group's pre-hook issues the all-gather of the group that ran next in the last forward
pass (or those ``set_modules_to_forward_prefetch`` names), in backward a call's pre-backward hook
issues the refill of the call whose forward ended before its own (or the modules
``set_modules_to_backward_prefetch`` names), and a group's reduce-scatter runs while the next
group's backward computes (at most one in flight; backward ends with none). A gather issued ahead
is used only if no shard was written since (an optimizer step between issue and use: gathered
anew).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from ...autograd.function import Function
from ...core import dtype as _dtype
from ...core import grad_mode, interpret
from ...core.autograd import current_graph_task, queue_callback, run_post_accumulate_hooks
from ...core.dtype import dtype as DType
from ...core.errors import UnsupportedError
from ...core.grad_mode import no_grad
from ...core.sbp import B, P, S
from ...core.tensor import Tensor
from ...distributed import env, world
from ...distributed.global_tensor import _from_local, make_global
from ...distributed.sharding import local_shape, piece
from ...distributed.device_mesh import DeviceMesh, current_mesh, init_device_mesh
from .. import distribute_parameter
from ...distributed.placement_types import Replicate, Shard
from ...nn.module import Module
from ...nn.parameter import Parameter

__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy",
           "UnshardHandle", "register_fsdp_forward_method"]


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """``param_dtype``: the unsharded parameters' dtype in forward/backward (the shards and the
    optimizer stay in theirs); ``output_dtype``: the module outputs' floating dtype;
    ``cast_forward_inputs``: floating inputs cast to ``param_dtype``; ``reduce_dtype``: the dtype
    gradients are summed in across ranks (and accumulated in without sync), ``param_dtype`` if
    None, as torch's. The shards are gathered in ``param_dtype`` (cast before the all-gather:
    half the bytes for bf16) and their gradients land in the shards' dtype."""

    param_dtype: DType | None = None
    reduce_dtype: DType | None = None
    output_dtype: DType | None = None
    cast_forward_inputs: bool = True


@dataclass
class OffloadPolicy:
    """No offloading (torch's default policy)."""


@dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """Shards, gradients and the optimizer step on the CPU: what a cpu mesh does anyway (a device
    mesh's is refused)."""

    pin_memory: bool = True


class UnshardHandle:
    """What ``unshard(async_op=True)`` returns: ``wait()`` waits for the all-gather and registers
    the unsharded parameters (the module's forward does it too if nobody waited)."""

    def __init__(self, state: _State | None = None) -> None:
        self._state = state

    def wait(self) -> None:
        state, self._state = self._state, None
        if state is not None and not state.gathered:
            state.gather(None)


def _fsdp_states(module: Module, recurse: bool) -> list:
    """The sharding states of ``module`` (and below): ``fully_shard``'s and FSDP1 wrappers'."""
    mods = module.modules() if recurse else (module,)
    return [m.__dict__["_fsdp_state"] for m in mods if "_fsdp_state" in m.__dict__]


class FSDPModule:
    """The class ``fully_shard`` mixes into a module's own (``isinstance(m, FSDPModule)``)."""

    def __new__(cls, *args, **kwargs):
        raise TypeError("holoflow: FSDPModule is mixed in by fully_shard(module); it is not constructed")

    def reshard(self) -> None:
        """Registers the shards again after :meth:`unshard` (forward reshards by itself)."""
        self._fsdp_state.reshard()

    def unshard(self, async_op: bool = False) -> UnshardHandle | None:
        """Registers the unsharded parameters until :meth:`reshard` (forward then uses them);
        with ``async_op`` the all-gather is only issued, and the handle's ``wait()`` (or the
        module's forward) registers them."""
        state = self._fsdp_state
        if async_op:
            state.prefetch()
            return UnshardHandle(state)
        if not state.gathered:
            state.gather(None)
        return None

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """False: each rank accumulates its unsharded gradients without communication (``p.grad``
        stays as it was); the next backward with True reduce-scatters them with its own."""
        for state in _fsdp_states(self, recurse):
            state.sync = bool(requires_gradient_sync)

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(f"holoflow fully_shard: reshard_after_forward should be a bool, got "
                             f"{type(reshard_after_forward).__name__}")
        for state in _fsdp_states(self, recurse):
            state.reshard_after_forward = reshard_after_forward

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse: bool = True) -> None:
        """False: the unsharded parameters' storage stays after backward (freed by the next
        forward's gather replacing them)."""
        for state in _fsdp_states(self, recurse):
            state.reshard_after_backward = bool(reshard_after_backward)

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        """Every synchronized backward reduces its gradients."""

    def set_modules_to_forward_prefetch(self, modules: list) -> None:
        """This module's forward pre-hook issues the all-gathers of ``modules`` (instead of the
        group that ran next in the last forward pass)."""
        self._fsdp_state.forward_prefetch = _states_of(modules, "set_modules_to_forward_prefetch")

    def set_modules_to_backward_prefetch(self, modules: list) -> None:
        """This module's pre-backward issues the all-gathers of ``modules``' latest forward calls
        (instead of the call whose forward ended before its own)."""
        self._fsdp_state.backward_prefetch = _states_of(modules, "set_modules_to_backward_prefetch")

    def set_gradient_divide_factor(self, factor: float) -> None:
        self._fsdp_state.divide = float(factor)


def _states_of(modules: list, who: str) -> list:
    if not all(isinstance(m, FSDPModule) for m in modules):
        bad = [type(m).__name__ for m in modules if not isinstance(m, FSDPModule)]
        raise ValueError(f"holoflow FSDPModule.{who}: takes modules sharded by fully_shard, got {bad}")
    return [m._fsdp_state for m in modules]


class _Ahead:
    """An all-gather of ``shards`` issued ahead of its use. ``take()`` waits for it and returns the
    whole values, or None if a shard was written since the issue (an optimizer step): the
    caller gathers anew."""

    def __init__(self, shards: list, wait) -> None:
        self.shards = shards
        self.versions = [s._data._version for s in shards]
        self._wait = wait

    def take(self, shards: list) -> list | None:
        values = self._wait()
        fresh = len(shards) == len(self.shards) and all(
            a is b and a._data._version == v for a, b, v in zip(shards, self.shards, self.versions))
        return values if fresh else None


class _Order:
    """What one tree of ``fully_shard`` groups (its states share it) knows of its passes, for
    communicating ahead: the groups in the order their forwards began (this pass and the last),
    the calls in the order their forwards ended (backward runs them in reverse), and the one
    reduce-scatter in flight."""

    def __init__(self) -> None:
        self.forward: list = []
        self.last_forward: list = []
        self.calls: list = []
        self.reducing = None   # () -> None: waits for the reduce-scatter and adds the gradients

    def begin_pass(self) -> None:
        """A new forward pass of the tree: an earlier pass's calls that backward has not reached
        are forgotten (their backward gathers when it comes, without prefetching)."""
        if self.forward:
            self.last_forward, self.forward = self.forward, []
        self.calls = [c for c in self.calls if c.reached]

    def next_forward(self, state: _State) -> list:
        """The group that began its forward after ``state``'s in the last pass."""
        order = self.last_forward
        for i, s in enumerate(order[:-1]):
            if s is state:
                return [order[i + 1]]
        return []

    def previous_calls(self, call: _Unsharded) -> list:
        """The call whose forward ended just before ``call``'s (its backward comes next)."""
        for i, c in enumerate(self.calls):
            if c is call:
                return [self.calls[i - 1]] if i else []
        return []

    def latest_calls(self, states: list) -> list:
        """Each state's latest call of this pass."""
        found = []
        for state in states:
            c = next((c for c in reversed(self.calls) if c.state is state), None)
            if c is not None:
                found.append(c)
        return found

    def finish_reduce(self) -> None:
        done, self.reducing = self.reducing, None
        if done is not None:
            done()


def _owned(t: Tensor, shard: Parameter) -> Tensor:
    """``t``, or a copy of it that owns its storage alone, so that freeing the storage frees
    nothing else (a gather over one rank aliases the shard; one may hand out a view of a buffer)."""
    d = t._data
    st = d.untyped_storage()
    if st.resizable() and d.storage_offset() == 0 and st.nbytes() == d.numel() * d.element_size() \
            and st.data_ptr() != shard._data.untyped_storage().data_ptr():
        return t
    return t.clone()


def _free(t: Tensor) -> None:
    t._data.untyped_storage().resize_(0)


class _Unsharded:
    """The unsharded tensors one forward call of a module registered (under grad mode): ``tensors``
    ``(shard, tensor)`` once each, ``registered`` ``(module, name, tensor)`` per registration.
    Their storage is freed after the forward when the module reshards; when backward reaches the
    module they are gathered into again and registered again (a recomputing activation
    checkpoint reads them), and at the end of backward the shards are registered back; each
    storage is freed once its gradient is complete (or at the end of backward), as torch's
    reshard after backward."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.tensors: list = []
        self.nbytes: list = []
        self.registered: list = []
        self.reached = False
        self.ahead: _Ahead | None = None

    def free(self) -> None:
        for _, t in self.tensors:
            _free(t)

    def _freed(self) -> list:
        return [(shard, t, n) for (shard, t), n in zip(self.tensors, self.nbytes)
                if t._data.untyped_storage().nbytes() != n]

    def prefetch(self) -> None:
        """Issues the all-gather :meth:`refill` will wait for (inside a backward pass: at its end
        one that no gradient came to use is waited for and dropped)."""
        if self.ahead is None and not self.reached:
            shards = [shard for shard, _, _ in self._freed()]
            if shards:
                self.ahead = _Ahead(shards, self.state.issue_values(shards, cast=True))
                if current_graph_task() is not None:
                    queue_callback(self.drop_ahead)

    def drop_ahead(self) -> None:
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            ahead.take([])

    def refill(self) -> None:
        """Gathers each freed tensor's value into its own storage (its version counter kept:
        autograd's saved-tensor checks see the tensor it saved): one all-gather for all of them
        (the one issued ahead, if any)."""
        freed = self._freed()
        shards = [shard for shard, _, _ in freed]
        ahead, self.ahead = self.ahead, None
        values = ahead.take(shards) if ahead is not None else None
        if values is None and shards:
            values = self.state.whole_values(shards, cast=True)
        for (_, t, n), value in zip(freed, values or ()):
            d = t._data
            d.untyped_storage().resize_(n)
            with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(d):
                d.copy_(value)

    def before_backward(self, grad):
        """A hook on the forward's outputs: the module's backward reads its unsharded parameters."""
        if self.reached:   # (another output of the same call)
            return None
        self.refill()
        for mod, name, t in self.registered:
            mod._parameters[name] = t
        if current_graph_task() is not None:
            self.reached = True
            queue_callback(self.after_backward)
            order = self.state.order
            if order is not None:   # the next call's gather runs while this one's backward computes
                targets = self.state.backward_prefetch
                for call in (order.previous_calls(self) if targets is None else order.latest_calls(targets)):
                    call.prefetch()
        return None

    def after_backward(self) -> None:
        self.reached = False
        order = self.state.order
        if order is not None and self in order.calls:
            order.calls.remove(self)
        self.state.reshard()
        if self.state.reshard_after_backward:
            self.free()


class _State:
    """One ``fully_shard`` call: its mesh, the parameters it took (module, name) and how it runs."""

    def __init__(self, mesh: DeviceMesh, params: list, mp: MixedPrecisionPolicy, reshard_after_forward,
                 tensor_parallel: dict | None = None) -> None:
        self.mesh = mesh
        self.params = params
        self.tensor_parallel = tensor_parallel or {}   # id(shard) -> (mesh, SBP) forward runs it on
        self.mp = mp
        self.reshard_after_forward = reshard_after_forward   # None: True unless this is the root
        self.reshard_after_backward = True
        self.is_root: bool | None = None                     # the first of the tree to run forward
        self.divide = float(mesh.size())
        self.sync = True
        self.accumulated: dict = {}   # id(shard) -> unsharded gradient summed without sync
        self.pending: dict = {}       # id(shard) -> (shard, its whole gradient in this backward)
        self.expected: set = set()    # the shards whose gradients a reduce waits for
        self.flush_queued = False     # (an end-of-backward reduce of what is left is queued)
        self.gathered = False
        self.finish_pass = lambda: None   # ends an open forward pass of the group (fully_shard)
        self.post_hooks = True            # a shard's post-accumulate-grad hooks run (FSDP2's, not FSDP1's)
        self.order: _Order | None = None  # the tree's, from its root's first forward
        self.ahead: _Ahead | None = None  # an all-gather of the parameters issued ahead of the forward
        self.forward_prefetch: list | None = None    # None: the group that ran next in the last pass
        self.backward_prefetch: list | None = None   # None: the call whose forward ended before

    def reshards(self) -> bool:
        flag = self.reshard_after_forward
        return (not self.is_root) if flag is None else bool(flag)   # (an int: resharded fully)

    def unsharded_value(self, shard: Parameter, cast: bool = True) -> Tensor:
        """``shard``'s whole value on this rank (no autograd), in the forward's dtype (``cast``)."""
        return Tensor._make(self.whole_values([shard], cast)[0])

    def whole_values(self, shards: list, cast: bool) -> list:
        """Each shard's whole value on this rank (torch tensors, no autograd), in the forward's
        dtype with ``cast`` (the shards cast before they are gathered, as torch's): on a 1-D mesh
        one all-gather per dtype for all of them (each rank's shards flattened end to end), as
        torch's FSDP2 gathers a module's parameters together; on an HSDP mesh one redistribute
        each."""
        return self.issue_values(shards, cast)()

    def issue_values(self, shards: list, cast: bool):
        """:meth:`whole_values` issued: returns the wait that gives them (on an HSDP mesh the
        redistributes run at once)."""
        want = self.mp.param_dtype if cast else None
        if self.mesh.ndim != 1 or len(shards) <= 1:
            with no_grad():   # (FSDP's is the last mesh dimension; a tensor-parallel layout before it stays)
                values = [_cast(s, want).redistribute(placements=s.placements[:-1] + (Replicate(),)).to_local()._data
                          for s in shards]
            return lambda: values
        return _gather_flat_async(shards, self.mesh, None if want is None else _dtype.to_torch(want))

    def _unique(self) -> list:
        return list({id(shard): shard for _, _, shard in self.params}.values())

    def prefetch(self) -> None:
        """Issues the all-gather of the parameters for a forward (theirs or an ``unshard()``)."""
        if not self.gathered and self.ahead is None:
            unique = self._unique()
            self.ahead = _Ahead(unique, self.issue_values(unique, cast=True))

    def drop_ahead(self) -> None:
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            ahead.take([])

    def _in_reduce_dtype(self, g: torch.Tensor) -> torch.Tensor:
        dtype = self.mp.reduce_dtype or self.mp.param_dtype
        return g.to(_dtype.to_torch(dtype)) if dtype is not None and g.is_floating_point() else g

    def gather(self, call: _Unsharded | None) -> None:
        """Each taken parameter's unsharded local tensor registered in its place (one gather for a
        parameter tied between modules). Synchronized, its gradient reaches the shard through a
        reduce-scatter (averaged); unsynchronized, it is a leaf whose gradient is kept here. Under
        grad mode the tensors go to ``call`` (None: an explicit ``unshard()``), each freed once
        its gradient is complete: no reader of it is left."""
        track = call is not None and grad_mode.STATE.enabled
        unique = self._unique()
        ahead, self.ahead = self.ahead, None
        got = ahead.take(unique) if ahead is not None else None
        values = dict(zip(map(id, unique), got if got is not None else self.whole_values(unique, cast=True)))
        gathered: dict = {}
        for mod, name, shard in self.params:
            key = id(shard)
            if key in gathered:
                mod._parameters[name] = gathered[key]
                if track:
                    call.registered.append((mod, name, gathered[key]))
                continue
            value = Tensor._make(values[key])
            if not shard.requires_grad or not grad_mode.STATE.enabled:
                full = value
            elif not self.sync:
                full = value.requires_grad_()
                full.register_post_accumulate_grad_hook(lambda t, k=key: self._accumulate(k, t))
            else:
                # (the shard goes in by reference, not as an autograd input: as in torch's FSDP2 no
                # gradient edge reaches it, so backward runs no hook of it; the state calls its
                # post-accumulate hooks once the reduced gradient lands)
                full = _Unshard.apply(self, _Ref(shard), value.requires_grad_())
                self.expected.add(key)
            used = _owned(full, shard) if track else full
            runs = self._as_run(shard, used)
            if track:
                call.tensors.append((shard, used))
                call.nbytes.append(used._data.untyped_storage().nbytes())
                if full.requires_grad and self.reshard_after_backward:
                    done = full.register_post_accumulate_grad_hook if full.grad_fn is None else full.register_hook
                    done(lambda _, t=used: _free(t))
                call.registered.append((mod, name, runs))
            mod._parameters[name] = gathered[key] = runs
        self.gathered = True

    def _as_run(self, shard: Parameter, unsharded: Tensor) -> Tensor:
        """The unsharded local tensor as forward runs it: itself, or under tensor parallelism
        this rank's piece of a DTensor on the tensor-parallel mesh (sharing its storage; its
        gradient comes back laid out as the piece, as torch's FSDP redistributes it there)."""
        layout = self.tensor_parallel.get(id(shard))
        if layout is None:
            return unsharded
        return _from_local(unsharded, layout[0], layout[1], False, None, broadcast=False, shape=tuple(shard.shape))

    def arrive(self, shard: Parameter, grad: Tensor) -> None:
        """A shard's whole gradient from backward (with what it accumulated unsynced), in the
        reduce dtype, reduced with the others once every expected one came (the module's backward
        is done), else at the end of backward."""
        key = id(shard)
        grad = self._in_reduce_dtype(grad._data)
        for held in (self.accumulated.pop(key, None), self.pending.get(key, (None, None))[1]):
            if held is not None:
                grad = grad + held
        self.pending[key] = (shard, grad)
        if not self.flush_queued and current_graph_task() is not None:
            self.flush_queued = True
            queue_callback(self._end_of_backward)
        if self.expected and self.expected <= self.pending.keys():
            self.flush()

    def _end_of_backward(self) -> None:
        self.flush_queued = False
        self.flush()
        if self.order is not None:
            self.order.finish_reduce()

    def flush(self) -> None:
        """The pending gradients averaged over the ranks in the reduce dtype (one reduce-scatter
        per dtype on a 1-D mesh; per shard on an HSDP mesh) and added to ``shard.grad`` in the
        shard's dtype. Inside a backward pass the reduce-scatter is left running while backward
        goes on: it completes when the next group's starts (gradients land in order) or when
        backward ends."""
        items = list(self.pending.values())
        self.pending.clear()
        self.expected = set()
        if not items:
            return
        shards = [shard for shard, _ in items]
        with no_grad():
            if self.mesh.ndim == 1:   # (the whole gradients are dropped once copied into the collective's buffer)
                wait = _reduce_scatter_flat_async(items, self.mesh, self.divide)
            else:
                locals_ = [_as_global(g / self.divide, shard, _partial_over(shard, self.mesh.ndim))
                           .redistribute(placements=shard.placements).to_local()._data for shard, g in items]
                wait = lambda: locals_   # noqa: E731
        del items
        order = self.order
        if order is None or not self.flush_queued:   # (the end of backward, or no backward running)
            self._land(shards, wait())
            return
        order.finish_reduce()
        order.reducing = lambda: self._land(shards, wait())

    def _land(self, shards: list, locals_: list) -> None:
        """The reduced pieces of ``shards``' gradients added to their ``.grad``."""
        with no_grad():
            for shard, local in zip(shards, locals_):
                g = _as_global(local.to(shard._data.dtype).contiguous(), shard, tuple(shard._global.sbp))
                if shard.grad is None:
                    shard.grad = g
                else:
                    shard.grad.add_(g)
                if self.post_hooks:   # (FSDP2's: optimizer-in-backward steps a shard here)
                    run_post_accumulate_hooks(shard, g)

    def _accumulate(self, key: int, leaf: Tensor) -> None:
        grad = self._in_reduce_dtype(leaf.grad._data)
        held = self.accumulated.get(key)
        self.accumulated[key] = grad if held is None else held + grad
        leaf.grad = None

    def reshard(self) -> None:
        for mod, name, shard in self.params:
            mod._parameters[name] = shard
        self.gathered = False

    def mark_root(self, module: Module) -> None:
        """The first module of a tree to run forward is its root (torch's lazy init)."""
        if self.is_root is not None:
            return
        self.is_root = True
        self.order = _Order()
        for state in _fsdp_states(module, True):
            if state.is_root is None:
                state.is_root = False
                state.order = self.order


class _Ref:
    """A tensor handed to a Function's forward without making it an input of the graph."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor


class _Unshard(Function):
    """A shard's whole value (gathered by the caller, with its peers'; a fresh leaf) as a local
    tensor. Its gradient, each rank's partial sum, goes to the state, not through autograd to the
    shard (no input of the node):
    the state reduce-scatters its shards' gradients together and adds them to ``shard.grad``, as
    torch's FSDP2 does after a module's backward."""

    @staticmethod
    def forward(ctx, state, shard, whole):
        ctx.state, ctx.shard = state, shard.tensor
        return whole.detach()

    @staticmethod
    def backward(ctx, grad):
        ctx.state.arrive(ctx.shard, grad)
        return None, None, None


def _as_global(local: torch.Tensor, shard: Parameter, nd: tuple) -> Tensor:
    """``local`` as this rank's piece, laid out as ``nd``, of a tensor of ``shard``'s placement
    and shape (no communication: every rank's piece is known to fit)."""
    return make_global(Tensor._make(local), shard._global.placement, nd, tuple(shard.shape))


def _reduce_scatter_flat_async(items: list, mesh: DeviceMesh, divide: float = 1.0):
    """Issues the sum of each ``(shard, whole gradient)`` over the ranks of the 1-D ``mesh``,
    divided by ``divide``; returns the wait giving this rank's pieces, laid out as its shards:
    per dtype, every rank's pieces end to end in an even-padded block of its own, one
    reduce-scatter (the gradients are read only while the block is filled)."""
    ranks = tuple(mesh.flat_ranks)
    n, me = len(ranks), ranks.index(world.rank())
    out: list = [None] * len(items)
    by_dtype: dict = {}
    for i, (_, g) in enumerate(items):
        by_dtype.setdefault(g.dtype, []).append(i)
    issued = []
    for idx in by_dtype.values():
        pieces: list = [[] for _ in range(n)]
        for i in idx:
            shard, g = items[i]
            dim = shard.placements[-1].dim
            for r in range(n):
                start, size = piece(g.shape[dim], mesh, 0, r)
                pieces[r].append(g.narrow(dim, start, size))
        block = max(sum(p.numel() for p in rank_pieces) for rank_pieces in pieces)
        flat = items[idx[0]][1].new_zeros(n * block)
        for r, rank_pieces in enumerate(pieces):
            off = r * block
            for p in rank_pieces:
                flat[off:off + p.numel()] = p.reshape(-1)
                off += p.numel()
        if divide != 1.0:
            flat.div_(divide)
        mine = [tuple(p.shape) for p in pieces[me]]
        issued.append((idx, mine, world.comm().reduce_scatter_async(flat, ranks, 0, [block] * n)))

    def wait() -> list:
        for idx, mine, handle in issued:
            got, off = handle.wait(), 0
            for i, shape in zip(idx, mine):
                k = math.prod(shape)
                out[i] = got[off:off + k].view(shape)
                off += k
        return out
    return wait


def _gather_flat_async(shards: list, mesh: DeviceMesh, dtype: torch.dtype | None = None):
    """Issues the gather of the whole values of ``shards`` (each ``Shard(d)`` on the 1-D
    ``mesh``; floating ones cast to ``dtype`` first); returns the wait that gives them: per dtype,
    every rank's shards flattened end to end, one all-gather, and each value put back together."""
    ranks = tuple(mesh.flat_ranks)
    n = len(ranks)
    out: list = [None] * len(shards)
    datas = [s._data.to(dtype) if dtype is not None and s._data.is_floating_point() else s._data for s in shards]
    by_dtype: dict = {}
    for i, d in enumerate(datas):
        by_dtype.setdefault(d.dtype, []).append(i)
    issued = []
    for idx in by_dtype.values():
        layouts = []   # per shard: (dim, [each rank's local shape])
        for i in idx:
            shape, dim = _unsharded_shape(shards[i]), shards[i].placements[-1].dim
            locals_ = [shape[:dim] + (piece(shape[dim], mesh, 0, r)[1],) + shape[dim + 1:] for r in range(n)]
            layouts.append((dim, locals_))
        sizes = [sum(math.prod(loc[r]) for _, loc in layouts) for r in range(n)]
        with no_grad():
            flat = torch.cat([datas[i].reshape(-1) for i in idx])
        issued.append((idx, layouts, sizes, world.comm().all_gather_async(flat, ranks, 0, sizes)))  # (simulated too)

    def wait() -> list:
        for idx, layouts, sizes, handle in issued:
            got = handle.wait().split(sizes)
            offsets = [0] * n
            for i, (dim, locals_) in zip(idx, layouts):
                pieces = []
                for r in range(n):
                    k = math.prod(locals_[r])
                    pieces.append(got[r][offsets[r]:offsets[r] + k].view(locals_[r]))
                    offsets[r] += k
                out[i] = torch.cat(pieces, dim)
        return out
    return wait


def _partial_over(shard: Parameter, axes: int) -> tuple:
    """``shard``'s layout with its last ``axes`` mesh dimensions (FSDP's) partial sums: how each
    rank's unsharded gradient lies (a tensor-parallel placement before them stays)."""
    sbp = tuple(shard._global.sbp)
    return sbp[:len(sbp) - axes] + (P,) * axes


def _unsharded_shape(shard: Parameter) -> tuple:
    """The shape FSDP's (last) mesh dimension splits: the logical one, or under tensor
    parallelism this rank's tensor-parallel piece's."""
    g = shard._global
    return local_shape(tuple(g.shape), tuple(g.sbp[:-1]) + (B,), g.placement, world.rank())


def _grad_outputs(x: Any) -> list:
    if isinstance(x, Tensor):
        return [x] if x.requires_grad else []
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _grad_outputs(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _grad_outputs(v)]
    return []


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
                **kwargs) -> Module | list:
    """torch's FSDP2 on ``module`` (in place; returns it). Call it bottom-up, each block then the
    root, as torch's: each call takes the parameters no earlier call on a submodule took. A list
    of modules is one group: its parameters are gathered when the first of them runs forward and
    resharded when all of them have (or when the root's forward returns)."""
    group = list(module) if isinstance(module, (list, tuple)) else [module]
    if not group or not all(isinstance(m, Module) for m in group):
        raise TypeError(f"holoflow fully_shard: takes a Module or a non-empty list of Modules, got {module!r}")
    if kwargs:
        raise TypeError(f"holoflow fully_shard: unexpected keyword argument(s) {sorted(kwargs)}")
    if any(isinstance(m, FSDPModule) for m in group):
        raise RuntimeError("holoflow fully_shard: this module is already sharded by fully_shard")
    shard(group, mesh, reshard_after_forward, shard_placement_fn, mp_policy, offload_policy, ignored_params)
    for m in group:
        cls = type(m)
        m.__class__ = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    return module


def shard(group: list, mesh: DeviceMesh | None, reshard_after_forward: bool | None, shard_placement_fn,
          mp_policy: MixedPrecisionPolicy, offload_policy: OffloadPolicy, ignored_params,
          who: str = "fully_shard") -> _State:
    """What ``fully_shard`` does but mixing its class in (FSDP1's wrapper uses it too): the
    group's parameters sharded, its forward hooks registered, its state at ``m._fsdp_state``."""
    mesh = DeviceMesh.from_placement(mesh if mesh is not None else (current_mesh() or _default_mesh(group[0])))
    if mesh.ndim not in (1, 2):
        raise ValueError(f"holoflow {who}: takes a 1-D mesh (FSDP) or a 2-D one (HSDP: replicate, shard), "
                         f"got {mesh.ndim}-D")
    if isinstance(offload_policy, CPUOffloadPolicy) and mesh.device_type != "cpu":
        raise NotImplementedError(f"holoflow {who}: CPUOffloadPolicy on a {mesh.device_type} mesh (shards "
                                  f"kept on the CPU, gathered to the device) is not supported; on a cpu mesh the "
                                  f"shards are on the CPU already")
    if type(offload_policy) not in (OffloadPolicy, CPUOffloadPolicy):
        raise TypeError(f"holoflow {who}: offload_policy must be an OffloadPolicy or a CPUOffloadPolicy, got "
                        f"{type(offload_policy).__name__}")
    ignored = {id(p) for p in ignored_params or ()}
    ignored |= {id(p) for m in group for st in _fsdp_states(m, True) for _, _, p in st.params}   # (a submodule's)
    taken = []   # (module, name, parameter): a parameter tied between modules is sharded once
    tensor_parallel: dict = {}   # id(parameter) -> (its tensor-parallel mesh, SBP): what forward runs on
    for mod in (sub for m in group for sub in m.modules()):
        for name, p in list(mod._parameters.items()):
            if p is None or id(p) in ignored:
                continue
            if any(q is p for _, _, q in taken):
                pass
            elif p._global is None:
                layout = [Replicate()] * (mesh.ndim - 1) + [_shard_of(p, shard_placement_fn, who, name)]
                distribute_parameter(p, mesh, layout)
            else:
                tensor_parallel[id(p)] = _shard_tensor_parallel(p, mesh, _shard_of(p, shard_placement_fn, who, name),
                                                                who, name)
            taken.append((mod, name, p))
    state = _State(mesh, taken, mp_policy, reshard_after_forward, tensor_parallel)
    members = {id(m) for m in group}
    # one forward pass of the group: its gather, the forwards running, the members that ran
    running: dict = {"call": None, "depth": 0, "ran": set()}

    def finish() -> None:
        call, running["call"] = running["call"], None
        if call is None:
            return
        state.reshard()
        if call.tensors and state.reshards():
            call.free()
        if call.tensors and state.order is not None and current_graph_task() is None:
            state.order.calls.append(call)   # (not a checkpoint's recomputation inside backward)
    state.finish_pass = finish

    def pre(mod, args, kwargs):
        if interpret.is_lazy():
            raise UnsupportedError(
                f"holoflow {who}: {type(mod).__name__} runs on each rank's own batch with local "
                f"tensors, eagerly; inside nn.Graph's build() the program is one logical one. For a graph, "
                f"leave {who} out: lay the model out with model.to_global(placement, flow.sbp.broadcast), "
                f"feed batches split(0), and shard parameters, gradients and optimizer state with "
                f"self.config.enable_zero(True, stage=3)")
        state.mark_root(mod)
        order = state.order
        if running["call"] is None:   # the group's first forward of this pass
            if state.is_root:
                order.begin_pass()
            running["call"], running["ran"] = _Unsharded(state), set()
            if not state.gathered:   # (after unshard(), its parameters stay)
                state.gather(running["call"])
            if order is not None and current_graph_task() is None:   # (not recomputing in backward)
                order.forward.append(state)
                ahead = order.next_forward(state) if state.forward_prefetch is None else state.forward_prefetch
                for target in ahead:   # its all-gather runs while this group computes
                    target.prefetch()
        running["depth"] += 1
        if mp_policy.cast_forward_inputs and mp_policy.param_dtype is not None:
            args, kwargs = _cast(args, mp_policy.param_dtype), _cast(kwargs, mp_policy.param_dtype)
        return args, kwargs

    def post(mod, args, output):
        call = running["call"]
        running["depth"] -= 1
        running["ran"].add(id(mod))
        if call is not None and call.tensors:
            for t in _grad_outputs(output):
                t.register_hook(call.before_backward)
        if running["depth"] == 0 and running["ran"] >= members:
            finish()
        if state.is_root:   # a group some of whose modules did not run this pass ends with the root's
            for sub in _fsdp_states(mod, True):
                sub.finish_pass()
                sub.drop_ahead()   # (a prefetched group that did not run)
        return _cast(output, mp_policy.output_dtype)
    for m in group:
        m.__dict__["_fsdp_state"] = state
        m.register_forward_pre_hook(pre, with_kwargs=True)
        m.register_forward_hook(post)
    return state


def _shard_tensor_parallel(p: Parameter, mesh: DeviceMesh, fsdp: Shard, who: str, name: str) -> tuple:
    """``p``, a DTensor of a 1-D tensor-parallel mesh sliced from the root mesh FSDP's ``mesh``
    was sliced from, sharded once more on FSDP's dimension (torch's FSDP + TP): each rank keeps
    its FSDP piece of its tensor-parallel piece, as torch's ``(_StridedShard, tp placement)`` on
    the ``(dp, tp)`` mesh. holoflow splits along a mesh's dimensions in order, so the parameter
    lies on the mesh ``(tp, dp)``: tensor-parallel placement first, FSDP's ``Shard`` last (HSDP:
    ``(tp, replicate, shard)``, replicated between). Returns what forward runs on: the
    tensor-parallel mesh and SBP."""
    g = p._global
    tp = g.placement
    ok = isinstance(tp, DeviceMesh) and tp.ndim == 1 and tp.mesh_dim_names and mesh.mesh_dim_names and \
        tp.root_mesh() == mesh.root_mesh() and not set(tp.mesh_dim_names) & set(mesh.mesh_dim_names)
    if not ok:
        raise NotImplementedError(
            f"holoflow {who}: parameter {name!r} is a DTensor already ({tuple(p.placements)} on {tp!r}); "
            f"fully_shard composes with a layout on a 1-D mesh sliced by name from the same mesh as its own "
            f"(FSDP + TP: parallelize_module(m, mesh['tp'], ...), then fully_shard(m, mesh=mesh['dp'])), got "
            f"FSDP's mesh {mesh!r}")
    if g.sbp[0] == P:
        raise NotImplementedError(f"holoflow {who}: parameter {name!r} is Partial on {tp!r}; a parameter "
                                  f"sharded by fully_shard is Shard or Replicate there")
    every = mesh.root_mesh()[tp.mesh_dim_names + mesh.mesh_dim_names]
    at, n = piece(p._data.shape[fsdp.dim], every, every.ndim - 1, every.get_coordinate()[-1])
    nd = (g.sbp[0],) + (B,) * (mesh.ndim - 1) + (S(fsdp.dim),)
    moved = make_global(Tensor._make(p._data.narrow(fsdp.dim, at, n).clone()), every, nd, tuple(p.shape))
    p.grad = None
    p._data, p._global = moved._data, moved._global
    return tp, g.sbp


def _shard_of(p: Parameter, fn, who: str, name: str) -> Shard:
    """The dim ``p`` is sharded on: ``fn(p)``'s ``Shard`` (None: dim 0), as torch's
    ``shard_placement_fn``."""
    got = fn(p) if fn is not None else None
    if got is None:
        return Shard(0)
    if not isinstance(got, Shard):
        raise NotImplementedError(f"holoflow {who}: shard_placement_fn returned {got!r} for {name!r}; it "
                                  f"may return a Shard(dim) or None (a ShardPlacementResult with its own mesh is "
                                  f"not supported)")
    dim = got.dim + p.dim() if got.dim < 0 else got.dim
    if not 0 <= dim < max(p.dim(), 1):
        raise ValueError(f"holoflow {who}: shard_placement_fn gave Shard({got.dim}) for {name!r} of shape "
                         f"{tuple(p.shape)}; the dim must be in [{-p.dim()}, {p.dim() - 1}]")
    return Shard(dim)


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
        state.gather(None)
        try:
            return method(*args, **kwargs)
        finally:
            state.reshard()
    setattr(module, method_name, gathered)
