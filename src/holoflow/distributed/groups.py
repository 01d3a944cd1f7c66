"""Process groups named by their global ranks, created once and cached.

A group is identified by a sorted tuple of global ranks (``(0, 1)``, ``(1, 3)``...). Groups are
created with *local synchronization*: only the member ranks take part in creating a group, so a
rank never has to call :func:`group_for` for a group it does not belong to.

Contract (what every rank must keep):

* the ranks of one group must create it in the same relative order with respect to the other
  groups they share — which holds automatically when groups are created on first use by a
  program whose collectives are themselves issued in the same order on every rank (any program
  that does not deadlock);
* :func:`groups_for_mesh` creates, on every rank, the groups of every mesh axis that contain
  the rank, in a fixed order (axis by axis, fixed coordinates in row-major order); calling it when
  a placement is first used keeps creation in lock-step across ranks.

The full world maps to torch's default group; a one-rank group needs no process group at all.

At interpreter exit (:func:`shutdown_at_exit`, registered when this module is imported, so it runs
after atexit handlers registered later, e.g. the user's) the collectives still in flight are
waited for and every process group is destroyed while the interpreter is still whole
(:func:`destroy_world`, also what ``env.shutdown()`` does), and every reference holoflow keeps to
a group is dropped, so the groups are freed and their Gloo threads joined then. A group still
alive at finalization kept threads that release finished work, whose tensors need the GIL: some
runs aborted with "terminate called without an active exception" (``env.init`` also keeps torch
from pinning the default group, see ``env._import_group_pinning_modules``).
"""
from __future__ import annotations

import atexit
import gc
import itertools
import logging
from typing import Any, Iterable

import numpy as np
import torch.distributed as dist

from ..core.errors import HoloflowError
from . import env

_GROUPS: dict[tuple[tuple[int, ...], str | None], Any] = {}


def normalize(ranks: Iterable[int]) -> tuple[int, ...]:
    """A group's key: its global ranks, sorted, without duplicates."""
    key = tuple(sorted({int(r) for r in ranks}))
    if not key:
        raise HoloflowError("holoflow.distributed: a process group needs at least one rank")
    ws = env.get_world_size()
    bad = [r for r in key if not 0 <= r < ws]
    if bad:
        raise HoloflowError(f"holoflow.distributed: ranks {bad} are outside the world of {ws} "
                            f"process(es) (ranks 0..{ws - 1})")
    return key


def group_for(ranks: Iterable[int], backend: str | None = None):
    """The torch process group over ``ranks`` (global ranks), created on first use.

    Only members may call it. Returns ``None`` for a one-rank group (nothing to communicate) and
    torch's default group for the whole world. ``backend=None`` uses the world's backend.
    """
    key = normalize(ranks)
    if len(key) == 1:
        return None
    me = env.get_rank()
    if me not in key:
        raise HoloflowError(f"holoflow.distributed: rank {me} asked for the group {key} it is not a member of")
    env.ensure_initialized()
    if backend is None and len(key) == env.get_world_size():
        return dist.group.WORLD
    cached = _GROUPS.get((key, backend))
    if cached is None:
        cached = _GROUPS[(key, backend)] = _new_group(key, backend)
    return cached


def _new_group(key: tuple[int, ...], backend: str | None):
    """``dist.new_group`` with local synchronization and a name that is the same on every member.

    torch names a locally synchronized group by a hash of its ranks *and the number of groups
    this process already has*, which differs between ranks that created different groups before;
    members would then rendezvous under different store keys and hang. We name it by its ranks
    and backend instead (patching torch's private namer for the duration of the call).
    """
    c10d = dist.distributed_c10d
    name = f"holoflow:{backend or 'default'}:{'_'.join(map(str, key))}"
    namer = c10d._process_group_name
    c10d._process_group_name = lambda ranks, use_hashed_name: name
    try:
        return dist.new_group(list(key), timeout=env.comm_timeout(), backend=backend,
                              use_local_synchronization=True)
    except Exception as e:  # noqa: BLE001 - a rendezvous timeout, a dead peer...
        from .comm_track import CommError, count_failure
        count_failure()
        raise CommError(f"holoflow.comm: creating the process group {list(key)} failed on rank {env.get_rank()} "
                        f"(timeout {env.get_comm_timeout():g}s): every member must reach its first collective on "
                        f"this group. Cause: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
                        ) from e
    finally:
        c10d._process_group_name = namer


def mesh_subgroups(ranks_nd) -> dict[tuple[int, tuple[int, ...]], tuple[int, ...]]:
    """The sub-groups of a rank mesh: ``(axis, fixed coords) -> ranks`` varying along ``axis``.

    ``fixed coords`` are the mesh coordinates of the other axes, in axis order. For the mesh
    ``[[0, 1], [2, 3]]``: ``(0, (0,)) -> (0, 2)``, ``(0, (1,)) -> (1, 3)``, ``(1, (0,)) -> (0, 1)``...
    """
    arr = np.asarray(ranks_nd, dtype=np.int64)
    out: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = {}
    for axis in range(arr.ndim):
        moved = np.moveaxis(arr, axis, -1)
        for fixed in itertools.product(*(range(n) for n in moved.shape[:-1])):
            out[(axis, tuple(fixed))] = tuple(int(r) for r in moved[fixed])
    return out


def groups_for_mesh(ranks_nd, backend: str | None = None) -> dict[tuple[int, tuple[int, ...]], tuple[int, ...]]:
    """Creates every sub-group of the mesh this rank belongs to, in a fixed order, and returns
    :func:`mesh_subgroups` (group keys are rank tuples, which every comm function accepts).

    Call it on every rank of the mesh when a placement is first used.
    """
    subs = mesh_subgroups(ranks_nd)
    if env.get_world_size() > 1:
        me = env.get_rank()
        for ranks in subs.values():
            if me in ranks:
                group_for(ranks, backend)
    return subs


def clear() -> None:
    """Forgets cached groups (after the default group is destroyed)."""
    _GROUPS.clear()


_EXIT_DRAIN_S = 10.0


def destroy_world(drain_s: float) -> None:
    """Waits for collectives launched but never waited (at most ``drain_s``), then destroys the
    sub-groups and the default group, in that order, and forgets every cached group and
    fingerprint route, so the groups are freed (their Gloo threads joined) now. If something is
    still in flight (a peer is gone), the groups are left alone: destroying them would block on
    that work."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    from . import comm_track
    stuck = comm_track.drain(drain_s)
    if stuck:
        logging.getLogger("holoflow").warning(
            f"holoflow: rank {env.get_rank()} still had collectives in flight ({', '.join(stuck)}); "
            f"not destroying its process groups")
        return
    try:
        for pg in list(_GROUPS.values()):
            dist.destroy_process_group(pg)
        clear()
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - exiting anyway; say why the teardown was incomplete
        logging.getLogger("holoflow").warning(f"holoflow: destroying the process groups failed: {e}")
    comm_track.forget_world()
    gc.collect()   # a group held only by a reference cycle is freed here, not during finalization


def shutdown_at_exit() -> None:
    """:func:`destroy_world` at interpreter exit (collectives in flight get at most 10 s)."""
    destroy_world(min(_EXIT_DRAIN_S, env.get_comm_timeout()))


atexit.register(shutdown_at_exit)


__all__ = ["group_for", "groups_for_mesh", "mesh_subgroups", "normalize", "clear", "destroy_world", "shutdown_at_exit"]
