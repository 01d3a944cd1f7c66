"""Bookkeeping around every collective: counting, sequence tracking, fingerprints, timeouts, clear errors.

Each collective goes through :func:`run` (or :func:`begin` + :func:`launch_checked`): it records
the call in every active :func:`count` context, writes ``"<seq> <kind>"`` under
``holoflow/seq/<group>/<rank>`` in the c10d store (one ``store.set``, a few microseconds; off with
``HOLOFLOW_COMM_TRACK=0``), verifies the call's fingerprint with its peers (always on, see
:mod:`.comm_check`: a mismatch raises :class:`CommError` on every rank before any payload moves;
an asynchronous collective sends its fingerprint when issued and compares its peers' when waited
for, before its result is handed out, so issuing one never waits for the peers to arrive),
launches the torch collective asynchronously and waits with the configured timeout. On timeout or
a peer's failure it reads the peers' keys and raises :class:`CommError` naming the collective, the
group, the ranks that did not arrive, and peers whose processes are gone.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import datetime
import os
import socket
import struct
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from ..core.errors import HoloflowError
from . import comm_check, comm_wire, env, shm_comm


class CommError(HoloflowError):
    """A collective that timed out or whose peers failed; the message names the laggards."""


# -- counting --------------------------------------------------------------------------------

@dataclass(eq=False)   # identity: count() removes its own counter, never an equal one of another rank
class CommCount:
    """What :func:`count` saw: ``counts[kind]``, ``bytes[kind]``, ``calls`` and ``total``."""

    counts: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)
    calls: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, bytes, group size)
    sim_rank: int | None = None   # opened by this simulated rank (world.simulate): counts its calls

    @property
    def total(self) -> int:
        """The number of collectives recorded (all kinds)."""
        return sum(self.counts.values())

    def add(self, kind: str, nbytes: int, size: int) -> None:
        self.counts[kind] += 1
        self.bytes[kind] += nbytes
        self.calls.append((kind, nbytes, size))


_COUNTERS: list[CommCount] = []
FAILURES = 0  # collectives that failed in this process (after one, a group may be out of step)


@contextlib.contextmanager
def count() -> Iterator[CommCount]:
    """Records every collective this rank takes part in, by kind, with bytes and group size.

    >>> with flow.comm.count() as c:
    ...     y = x.to_global(sbp=flow.sbp.broadcast)   # from partial_sum
    >>> c.counts["all_reduce"], c.total
    (1, 1)

    ``bytes`` is this rank's input payload. Shape exchanges needed by uneven collectives whose
    sizes were not given are recorded under the kind ``"meta"``. Inside a simulated rank
    (``world.simulate``) it records that rank's simulated collectives.
    """
    from . import world
    c = CommCount(sim_rank=world.simulated_rank())
    _COUNTERS.append(c)
    try:
        yield c
    finally:
        _COUNTERS.remove(c)


def count_simulated(kind: str, nbytes: int, size: int, rank: int) -> None:
    """Records a simulated collective of ``rank`` in the counters that rank opened."""
    for c in tuple(_COUNTERS):   # a snapshot: other simulated ranks open and close theirs meanwhile
        if c.sim_rank == rank:
            c.add(kind, nbytes, size)


# -- sequence tracking -----------------------------------------------------------------------

TRACK = os.environ.get("HOLOFLOW_COMM_TRACK", "1") != "0"
FINGERPRINTS = True  # always on; bench/boxing.py turns it off only to measure what it costs
_SEQ: Counter = Counter()
_VERIFIED: dict[tuple[int, ...], tuple[int, str]] = {}  # group -> (seq, kind) every member entered
_GRACE_S = 0.05  # a fingerprint exchange done within this needs no arrival record in the store


_PLANNED: contextvars.ContextVar[bool] = contextvars.ContextVar("holoflow_planned_collectives", default=False)


@contextlib.contextmanager
def planned() -> Iterator[None]:
    """Collectives of a compiled global graph's plan: their fingerprints are not exchanged per
    call. The ranks compared the whole program's fingerprint before it ran
    (graph/global_graph.check_same_program) and the plan issues its collectives in program order
    (one thread issues them all: graph/ir.stream_of), so a per-call exchange would only repeat that
    check, at the price of one more synchronisation of the ranks per collective (bench/dp_overlap.py:
    ~20 ms of a 250 ms step on the loaded 2-core box). Counting and sequence tracking stay; the
    arrival record is written only when the rank has to wait for the collective (Handle.wait)."""
    tok = _PLANNED.set(True)
    try:
        yield
    finally:
        _PLANNED.reset(tok)


def set_tracking(on: bool) -> None:
    """Turns sequence tracking in the store on or off (HOLOFLOW_COMM_TRACK=0 starts it off)."""
    global TRACK
    TRACK = bool(on)


@dataclass
class CallInfo:
    kind: str
    ranks: tuple[int, ...]  # sorted group key
    seq: int
    start: float
    site: str = ""
    recorded: bool = True   # this rank's arrival is in the store (a plan's is written only if it waits)
    check: Any = None       # a fingerprint comparison deferred to the wait (an asynchronous collective)


def _key(ranks: tuple[int, ...]) -> str:
    return "-".join(map(str, ranks))


# torch >= 2.13 renamed the flat all-gather
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def begin(kind: str, ranks: tuple[int, ...], nbytes: int, tensor: torch.Tensor | None = None, *,
          detail: str = "", splits: tuple | None = None, peer: int | None = None,
          defer: bool = False) -> CallInfo:
    """Counts the call, records this rank's arrival in the store, and verifies the call's
    fingerprint with the peers (raising :class:`CommError` on every rank on a mismatch). With
    ``defer`` (an asynchronous collective) the fingerprint is only sent: the :class:`Handle`'s
    ``wait()`` compares the peers' (and writes the arrival record if it has to wait for them).

    ``tensor`` is the payload this rank sends (its dtype and shape must match the peers');
    ``detail`` distinguishes variants that must agree too (the reduce op, the broadcast source);
    ``splits`` are all_to_all's (send, receive) element counts per rank in group order, checked
    against the peers' instead of the shape; ``peer`` makes it a point-to-point call with that rank.
    """
    for c in tuple(_COUNTERS):   # a snapshot: simulated ranks open and close theirs meanwhile
        if c.sim_rank is None:
            c.add(kind, nbytes, len(ranks))
    _SEQ[ranks] += 1
    seq = _SEQ[ranks]
    site = comm_check.user_site()
    info = CallInfo(kind, ranks, seq, time.monotonic(), site)
    check = None
    if FINGERPRINTS and len(ranks) > 1 and not _PLANNED.get():
        check = _launch_fingerprint(info, tensor, f"{kind}[{detail}]" if detail else kind, splits, peer)
    # the arrival record (read by peers that time out) is written only when the peers are not all
    # here within a short grace: a completed fingerprint exchange already proves everyone arrived.
    # A plan's collective writes it only if it has to wait (Handle.wait): one that is already
    # complete when waited for proves it too, and an issue then costs no store round trip
    if _PLANNED.get():
        info.recorded = False
    elif check is not None and defer:
        check.send()
        info.check, info.recorded = check, False
        return info
    elif TRACK and len(ranks) > 1 and (check is None or not check.arrived(_GRACE_S)):
        _record(info)
    if check is not None:
        check()
        _VERIFIED[ranks] = (seq, kind)
    return info


def _record(info: CallInfo) -> None:
    env.store().set(f"holoflow/seq/{_key(info.ranks)}/{env.get_rank()}", f"{info.seq} {info.kind}")
    info.recorded = True


WIRE_MAX_GROUP = 64  # larger groups all-gather their fingerprints over Gloo (n - 1 sockets per rank here)


@dataclass
class _Route:
    """Where a group's (or a point-to-point pair's) fingerprints go, cached per world."""

    pg: Any  # the default process group this was made for (a new world makes a new route)
    me: int
    peers: list[int]
    order: list[int]  # the group's ranks in row order (sorted)
    group: Any  # the torch group (collectives)
    wire: Any  # comm_wire.Wire, or None (a group over WIRE_MAX_GROUP ranks: Gloo carries them)
    gid: int


_ROUTES: dict[tuple, _Route] = {}
# per fingerprint group id: the reads of this rank's calls whose peers' fingerprints are not read
# yet, in issue order (a deferred comparison reads at its wait; a later call reads those first)
_UNREAD: dict[int, collections.deque] = {}


def _route(ranks: tuple[int, ...], peer: int | None) -> _Route:
    if not dist.is_initialized():  # the first collective of a script sets the world up
        env.ensure_initialized()
    pg = dist.distributed_c10d._get_default_group()
    r = _ROUTES.get((ranks, peer))
    if r is None or r.pg is not pg:
        from .groups import group_for
        me = env.get_rank()
        # the group is created first: a peer that never comes fails its creation, named
        g = group_for(ranks) if peer is None else None
        wire = comm_wire.get(me, env.store()) if peer is not None or len(ranks) <= WIRE_MAX_GROUP else None
        peers = [peer] if peer is not None else [x for x in ranks if x != me]
        r = _ROUTES[(ranks, peer)] = _Route(pg, me, peers, sorted((me, *peers)), g, wire,
                                            comm_wire.group_id(ranks))
    return r


def forget_world() -> None:
    """Drops every route (and so every reference to the world's process groups) and closes the
    fingerprint wire: called when the world is destroyed, so the groups are freed (their Gloo
    threads joined) then, not during interpreter finalization."""
    _ROUTES.clear()
    _UNREAD.clear()
    _PENDING.clear()
    comm_wire.close()
    shm_comm.close_all()


def _launch_fingerprint(info: CallInfo, t: torch.Tensor | None, kind: str, splits,
                        peer: int | None) -> Callable[[], None]:
    """Sends this rank's fingerprint to the peers (the same size on every rank: the exchange can
    never mismatch); returns the function that waits for theirs and raises on a mismatch.
    ``check.arrived(grace_s)`` waits at most ``grace_s`` and says whether every peer's is here."""
    route = _route(info.ranks, peer)
    me, peers, wire, gid, order = route.me, route.peers, route.wire, route.gid, route.order
    words = comm_check.fingerprint(info.seq, kind, t, info.site, len(info.ranks), splits)
    if wire is None:
        return _gloo_fingerprint(info, words, route.group, me)
    payload = struct.pack(f"<{len(words)}q", *words)
    timeout = env.get_comm_timeout()
    got: dict[int, bytes] = {}
    unsent, todo = list(peers), list(peers)

    def send(deadline: float) -> None:
        while unsent:  # connecting waits until the deadline, the write itself until the timeout
            wire.send(unsent[0], gid, payload, deadline, time.monotonic() + timeout)
            unsent.pop(0)

    def read(deadline: float) -> None:
        while todo:
            got[todo[0]] = wire.recv(todo[0], gid, deadline)
            todo.pop(0)

    def step(deadline: float) -> None:
        """Sends what is unsent and reads what is missing, until ``deadline`` (TimeoutError).
        The peers' fingerprints of this group come in issue order: those of earlier calls whose
        comparison waits for their ``wait()`` are read first."""
        send(deadline)
        unread = _UNREAD[gid]
        while todo:   # (none left: a later call read them)
            unread[0](deadline)
            unread.popleft()
    _UNREAD.setdefault(gid, collections.deque()).append(read)

    def arrived(grace_s: float) -> bool:
        try:
            step(time.monotonic() + grace_s)
        except TimeoutError:
            return False
        except comm_wire.WireError as e:
            raise failure(info, e) from e
        return True

    def check() -> None:
        try:
            step(info.start + timeout)
        except (TimeoutError, comm_wire.WireError) as e:
            raise failure(info, e) from e
        rows = [words if r == me else _words(got[r]) for r in order]
        _raise_on_mismatch(info, rows, me, peer is not None)
    check.arrived = arrived
    check.send = lambda: send(info.start + timeout)
    return check


def _words(b: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(b) // 8}q", b)) if len(b) % 8 == 0 and b else [0]


def _gloo_fingerprint(info: CallInfo, words: list[int], g, me: int) -> Callable[[], None]:
    """The fingerprint exchange of a large group: one Gloo all-gather."""
    fp = torch.tensor(words, dtype=torch.int64)
    n = len(info.ranks)
    out = fp.new_empty(n * fp.numel())
    work = launch_checked(info, lambda: ALL_GATHER(out, fp, group=g, async_op=True))

    def arrived(grace_s: float) -> bool:
        deadline = time.monotonic() + grace_s
        while not work.is_completed():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0001)
        return True

    def check() -> None:
        Handle(work, info).wait()
        _raise_on_mismatch(info, out.view(n, -1).tolist(), me, False)
    check.arrived = arrived
    check.send = lambda: None   # (launched: the all-gather carries it)
    return check


def _raise_on_mismatch(info: CallInfo, rows: list, me: int, p2p: bool) -> None:
    reason = comm_check.mismatch(rows, info.ranks, me, p2p=p2p)
    if reason is not None:
        count_failure()
        raise comm_check.mismatch_error(reason, rows, info.ranks, me, info.seq)


def run(kind: str, ranks: tuple[int, ...], nbytes: int, launch: Callable[[], Any],
        tensor: torch.Tensor | None = None, **check: Any) -> None:
    """Begins (see :func:`begin` for ``tensor`` and ``check``), launches (``launch()`` returns a
    torch Work) and waits with the timeout."""
    info = begin(kind, ranks, nbytes, tensor, **check)
    Handle(launch_checked(info, launch), info).wait()


def launch_checked(info: CallInfo, launch: Callable[[], Any]):
    try:
        return launch()
    except Exception as e:  # noqa: BLE001 - every backend error becomes a CommError
        raise failure(info, e) from e


_PENDING: "weakref.WeakSet[Handle]" = weakref.WeakSet()  # launched, not yet waited (drained at exit)


def drain(timeout_s: float) -> list[str]:
    """Waits (at most ``timeout_s`` in all) for collectives launched but never waited; returns the
    ones that did not finish. Called at exit, before the process groups are destroyed."""
    deadline = time.monotonic() + timeout_s
    stuck = []
    for h in list(_PENDING):
        w = h.work
        try:
            left = max(0.1, deadline - time.monotonic())
            if w is not None and not w.is_completed():
                w.wait(timeout=datetime.timedelta(seconds=left))
        except Exception:  # noqa: BLE001 - a peer is gone or late: report it, destroy nothing it uses
            stuck.append(f"{h.info.kind} #{h.info.seq} on {list(h.info.ranks)}" if h.info else "a collective")
    _PENDING.clear()
    return stuck


def _done_within(work, seconds: float) -> bool:
    """Whether ``work`` completes within ``seconds``, for works that can wait that briefly without
    failing (holoflow's shared-memory ones; a torch Work's timed-out wait aborts it)."""
    wait = getattr(work, "done_within", None)
    return wait is not None and wait(seconds)


class Handle:
    """An asynchronous collective: ``wait()`` blocks with the timeout, then runs ``finish``."""

    def __init__(self, work, info: CallInfo | None, finish: Callable[[], Any] | None = None) -> None:
        self.work, self.info, self.finish = work, info, finish
        self._done = False
        self._result = None
        if work is not None:
            _PENDING.add(self)

    def is_completed(self) -> bool:
        return self._done or self.work is None or self.work.is_completed()

    def wait(self) -> Any:
        if self._done:
            return self._result
        info = self.info
        if info is not None and info.check is not None:   # the peers' fingerprints, compared first
            check, info.check = info.check, None
            if TRACK and not check.arrived(_GRACE_S):
                _record(info)
            check()
            _VERIFIED[info.ranks] = (info.seq, info.kind)
        if self.work is not None:
            if info is not None and not info.recorded and TRACK and len(info.ranks) > 1 \
                    and not self.work.is_completed() and not _done_within(self.work, _GRACE_S):
                _record(info)   # about to wait long: peers that time out must see this rank arrived
            try:
                self.work.wait(timeout=env.comm_timeout())
            except Exception as e:  # noqa: BLE001
                raise failure(self.info, e) from e
            finally:
                _PENDING.discard(self)
            if info is not None:   # complete: every member entered it
                _VERIFIED[info.ranks] = max(_VERIFIED.get(info.ranks, (0, "")), (info.seq, info.kind))
        self._done = True
        self._result = self.finish() if self.finish is not None else None
        return self._result

    def then(self, fn: Callable[[Any], Any]) -> "Handle":
        """This handle with ``wait()`` returning ``fn`` of what it returned (unpadding, say)."""
        inner = self.finish
        self.finish = (lambda: fn(inner())) if inner is not None else (lambda: fn(None))
        return self


# -- failure reports -------------------------------------------------------------------------

def _read(store, key: str) -> str | None:
    if not store.check([key]):
        return None
    return store.get(key).decode()


def _gone(store, rank: int) -> str | None:
    """``"pid N on host"`` if rank's process ran on this host and is no longer alive."""
    v = _read(store, f"holoflow/proc/{rank}")
    if v is None:
        return None
    host, pid = v.split()
    if host != socket.gethostname():
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        alive = state not in ("Z", "X")  # a zombie has exited; its parent just hasn't reaped it
    except FileNotFoundError:
        alive = False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(int(pid), 0)
            alive = True
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
    return None if alive else f"pid {pid} on {host}"


def laggards(info: CallInfo, peer_lost: bool = False) -> str:
    """Reads the peers' sequence keys: who did not arrive, who called something else, who died.
    ``peer_lost``: a connection closed, so give a dying peer a moment to disappear."""
    text = _laggards(info)
    deadline = time.monotonic() + (2.0 if peer_lost else 0.0)
    while "process is gone" not in text and time.monotonic() < deadline:
        time.sleep(0.1)
        text = _laggards(info)
    return text


def _laggards(info: CallInfo) -> str:
    me = env.get_rank()
    behind, other, dead = [], [], []
    try:
        store = env.store()
        for r in info.ranks:
            if r == me:
                continue
            v = _read(store, f"holoflow/seq/{_key(info.ranks)}/{r}") if TRACK else None
            seq, kind = (int(v.split()[0]), v.split()[1]) if v else (0, "nothing")
            seq, kind = max((seq, kind), _VERIFIED.get(info.ranks, (0, "nothing")))  # entered by all
            if TRACK and seq < info.seq:
                behind.append(f"{r} (last entered call #{seq}: {kind})" if seq else f"{r} (never entered one)")
            elif TRACK and seq == info.seq and kind != info.kind:
                other.append(f"{r} (called {kind} instead)")
            g = _gone(store, r)
            if g:
                dead.append(f"{r} ({g})")
    except Exception as e:  # noqa: BLE001 - the store itself may be gone with rank 0
        return f" Could not read the peers' state from the store ({type(e).__name__}: {e}); the rank " \
               f"hosting it (rank 0) may have died."
    parts = []
    if dead:
        parts.append(f"ranks whose process is gone: {', '.join(dead)}")
    if behind:
        parts.append(f"ranks that did not arrive: {', '.join(behind)}")
    if other:
        parts.append(f"ranks in a different collective at this point: {', '.join(other)}")
    if not TRACK:
        parts.append("(sequence tracking is off: HOLOFLOW_COMM_TRACK=0)")
    text = "; ".join(parts)
    return f" {text[0].upper()}{text[1:]}." if parts else " Every peer entered this collective."


def count_failure() -> None:
    """Notes that a collective failed here (the process's groups may now be out of step)."""
    global FAILURES
    FAILURES += 1


def failure(info: CallInfo | None, cause: BaseException) -> CommError:
    """A CommError for ``cause`` naming the collective, its group and the laggards."""
    count_failure()
    if info is None:
        return CommError(f"holoflow.comm: collective failed: {cause}")
    waited = time.monotonic() - info.start
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    lost = "closed" in text.lower() or "reset by peer" in text.lower()
    what = "timed out" if "timed out" in text.lower() or "timeout" in text.lower() else "failed"
    return CommError(
        f"holoflow.comm.{info.kind} (call #{info.seq} on group {list(info.ranks)}, seen from rank "
        f"{env.get_rank()}) {what} after {waited:.1f}s (timeout {env.get_comm_timeout():g}s).{laggards(info, lost)} "
        f"Cause: {text}")
