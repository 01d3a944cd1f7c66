"""All-reduce, all-gather and reduce-scatter through shared memory between ranks of one host
(what NCCL and DeepSpeed's CPU backend do for ranks on one node).

Gloo reduces between two processes of one host over TCP loopback, which costs both ranks CPU
(bench/dp_overlap.py's 3.3 MB gradient bucket: 2-6 ms on 2 ranks of a 2-core host, against
0.4-0.8 ms here). When every rank of a group can map the same shared segment, ``comm.all_reduce``
on a CPU float tensor runs here instead:

* each rank copies its tensor into its own slot of the segment and raises its flag;
* groups of up to ``READ_ALL_MAX`` ranks: once every flag is up, each rank reduces every slot (in
  rank order, float32 accumulation for 16-bit types) straight into its result, and raises its flag
  again (its peers may then overwrite their slots). One synchronisation: the last rank to arrive
  goes on at once instead of waiting for a sleeping peer to wake up and reduce its part (a wake-up
  on a busy or virtual host costs up to a millisecond, more than reducing the whole tensor);
* larger groups: once every flag is up, rank ``i`` reduces part ``i`` of every slot (in rank order)
  into part ``i`` of its own slot (a reduce-scatter) and raises its flag again; once every flag
  is up again, each rank copies every part from its owner's slot (an all-gather).

Either way each element is reduced in rank order: every rank gets the same bits.

An all-gather (``comm.all_gather_rows``: equal parts) copies each rank's part into its slot, then
every slot out to its place in the result; a reduce-scatter (``comm.reduce_scatter_rows``: equal
blocks) copies each rank's whole input in, then sums its own block of every slot in rank order
(the all-reduce's bits). Both go through the slot in chunks like the all-reduce.

Tensors larger than a slot (``HOLOFLOW_SHM_SLOT_MB``, default 8 MB per rank) go through it in
chunks. Every rank gets the same bits. The work runs on one thread per group, in issue order, so
an asynchronous all-reduce progresses while the caller computes, as Gloo's does.

The decision is made once per group, at its first eligible collective (which every member makes
at the same point of the program), through the c10d store: the group's first rank creates the
segment with a random token, the others open it and check the token (same host *and* same shared
memory), every rank posts its verdict, and the transport is used only if every verdict is yes; so
ranks always agree. The segment file is unlinked as soon as every rank has mapped it: nothing is
left in ``/dev/shm`` whatever happens to the processes later (a rank killed during the few
milliseconds of the handshake is the only window; the creator unlinks on every other exit).

Waits have the collective timeout; a rank that does not arrive is named, and a peer process that
is gone is reported within a second. ``HOLOFLOW_SHM_ALLREDUCE=0`` turns the transport off (every
rank still takes part in the handshake, so a mixed setting falls back to Gloo everywhere). The
flags rely on x86's store ordering; other machines use Gloo.
"""
from __future__ import annotations

import atexit
import collections
import datetime
import mmap
import os
import platform
import secrets
import select
import socket
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..core.errors import HoloflowError
from . import env

#: dtypes reduced here (others go to Gloo)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_OPS = ("sum", "avg", "max", "min", "prod")
_LINE = 64            # one flag per cache line
#: groups up to this size reduce every slot on every rank (one synchronisation); larger ones
#: reduce-scatter and all-gather through the slots (less memory traffic per rank)
READ_ALL_MAX = 4
#: all-reduces up to this size are started and finished by their caller when nothing else is in
#: flight (no hand-off to the group's thread)
INLINE_BYTES = 64 << 10
_DIR = "/dev/shm"
_PREFIX = "holoflow-shm-"


def enabled_here() -> str:
    """'' when this process may use the transport, else why not."""
    if os.environ.get("HOLOFLOW_SHM_ALLREDUCE", "1") == "0":
        return "HOLOFLOW_SHM_ALLREDUCE=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"{platform.machine()} (the flags need x86 store ordering)"
    if not os.path.isdir(_DIR):
        return f"no {_DIR}"
    return ""


def slot_bytes() -> int:
    """Bytes of one rank's slot (HOLOFLOW_SHM_SLOT_MB, default 8), a multiple of 64."""
    mb = float(os.environ.get("HOLOFLOW_SHM_SLOT_MB", "8"))
    return max(_LINE, int(mb * 2 ** 20) // _LINE * _LINE)


class ShmError(HoloflowError):
    """A shared-memory all-reduce that timed out or lost a peer (comm_track turns it into a CommError)."""


# -- the handshake ------------------------------------------------------------------------------

_TRANSPORTS: dict[tuple[int, ...], tuple[Any, "Shm | None"]] = {}   # group -> (default pg, transport or None)
_HANDSHAKES: collections.Counter = collections.Counter()
_CREATED: set[str] = set()   # segment files this process created and has not unlinked yet


def transport(key: tuple[int, ...], t: torch.Tensor) -> "Shm | None":
    """The group's shared-memory transport for ``t``, or None (Gloo). The first eligible call on a
    group decides for the group (a handshake every member makes at the same call)."""
    if len(key) < 2 or t.device.type != "cpu" or t.dtype not in DTYPES:
        return None
    pg = dist.distributed_c10d._get_default_group()
    got = _TRANSPORTS.get(key)
    if got is None or got[0] is not pg:
        if got is not None and got[1] is not None:   # a new world (made without env.shutdown): let the old go
            got[1].close()
        got = _TRANSPORTS[key] = (pg, _handshake(key))
    return got[1]


def _wait_keys(store, keys: list[str], ranks: list[int], what: str) -> None:
    try:
        store.wait(keys, env.comm_timeout())
    except Exception as e:  # noqa: BLE001 - name who is missing
        missing = [r for r, k in zip(ranks, keys) if not store.check([k])]
        raise ShmError(f"holoflow.comm: the shared-memory handshake of group {list(ranks)} timed out after "
                       f"{env.get_comm_timeout():g}s waiting for {what} of ranks {missing} (every member's first "
                       f"all_reduce on the group makes it). Cause: {str(e).strip().splitlines()[0] if str(e) else e!r}"
                       ) from e


def _handshake(key: tuple[int, ...]) -> "Shm | None":
    store = env.store()
    me = env.get_rank()
    _HANDSHAKES[key] += 1
    p = f"holoflow/shm/{'-'.join(map(str, key))}/{_HANDSHAKES[key]}"
    n, slot = len(key), slot_bytes()
    header = (_LINE * (n + 1) + 4095) // 4096 * 4096
    size = header + n * slot
    why = enabled_here()
    path = None
    mm = None
    try:
        if me == key[0]:
            if not why:
                try:
                    path, mm, token = _create(size)
                except OSError as e:
                    why = f"could not create a segment in {_DIR}: {e}"
            store.set(f"{p}/seg", f"{path} {token.hex()}" if path else "-")
        _wait_keys(store, [f"{p}/seg"], [key[0]], "the segment's name")
        seg = store.get(f"{p}/seg").decode()
        if me != key[0] and not why:
            if seg == "-":
                why = f"rank {key[0]} did not create a segment"
            else:
                path, tok = seg.split()
                try:
                    mm = _open(path, size, bytes.fromhex(tok))
                except OSError as e:
                    why = f"could not map {path}: {e}"
                if mm is None and not why:
                    why = f"{path} is not rank {key[0]}'s memory (another host or container)"
        sock = _bind(mm, key.index(me)) if mm is not None and not why else None
        store.set(f"{p}/v/{me}", f"{os.getpid()} {socket.gethostname()} {why}".strip())
        _wait_keys(store, [f"{p}/v/{r}" for r in key], list(key), "the verdicts")
        verdicts = [store.get(f"{p}/v/{r}").decode().split(" ", 2) for r in key]
    finally:
        if path is not None and me == key[0]:   # every rank has mapped it (or given up): no file is left
            _unlink(path)
    if any(len(v) > 2 for v in verdicts) or mm is None:
        if sock is not None:
            sock.close()
        return None
    return Shm(key, me, mm, header, slot, pids=[int(v[0]) for v in verdicts], sock=sock)


def _address(mm: mmap.mmap, i: int) -> bytes:
    """Rank ``i``'s wake-up socket: a Linux abstract name (no file) made of the segment's token."""
    return b"\0" + _PREFIX.encode() + bytes(mm[:16]).hex().encode() + f"-{i}".encode()


def _bind(mm: mmap.mmap, i: int) -> socket.socket | None:
    """A datagram socket peers poke after raising a flag, so a waiting rank sleeps in the kernel (no
    polling thread taking the GIL and a core from the computing one). None if it cannot be bound:
    the waits then poll every millisecond."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(_address(mm, i))
    except OSError:
        return None
    return sock


def _create(size: int) -> tuple[str, mmap.mmap, bytes]:
    path = os.path.join(_DIR, f"{_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    _CREATED.add(path)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
    except BaseException:
        _unlink(path)
        raise
    finally:
        os.close(fd)
    token = secrets.token_bytes(16)
    mm[:16] = token
    return path, mm, token


def _open(path: str, size: int, token: bytes) -> mmap.mmap | None:
    fd = os.open(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size != size:
            return None
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    if mm[:16] != token:
        mm.close()
        return None
    return mm


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    _CREATED.discard(path)


def unlink_created() -> None:
    """Removes segment files this process created whose handshake never finished (at exit)."""
    for path in list(_CREATED):
        _unlink(path)


def close_all() -> None:
    """Stops every group's thread and unmaps its segment (the world is being destroyed)."""
    for _, tr in list(_TRANSPORTS.values()):
        if tr is not None:
            tr.close()
    _TRANSPORTS.clear()
    unlink_created()


# -- the transport ------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        return True


_QUEUED, _POSTED = 0, 1   # an op's state: waiting to start; its tensor in the segment, not yet reduced


class _Op:
    """One collective: its kind, the flat inputs (read in order as one concatenation), the flat
    output it writes (the input itself for an all-reduce in place) and the reduction.

    It runs in chunks of ``units`` (an all-reduce: its elements; an all-gather: the elements of
    each rank's part; a reduce-scatter: the elements of its result, each rank copying in the
    matching elements of every rank's block), each filling ``n * per`` elements of a slot."""
    __slots__ = ("kind", "parts", "out", "op", "done", "error", "event", "state", "chunk", "units", "per")

    def __init__(self, parts: list[torch.Tensor], out: torch.Tensor, op: str, kind: str = "all_reduce",
                 n: int = 1) -> None:
        self.kind, self.parts, self.out, self.op = kind, parts, out, op
        self.units = out.numel() // n if kind == "all_gather" else out.numel()
        self.per = n if kind == "reduce_scatter" else 1   # slot elements per unit
        self.done = False
        self.error: BaseException | None = None
        self.event = threading.Event()
        self.state = _QUEUED
        self.chunk = -1   # the chunk number of an op started by its caller


class Work:
    """A shared-memory all-reduce in flight, with torch Work's ``wait(timeout)`` / ``is_completed()``."""

    def __init__(self, shm: "Shm", op: _Op) -> None:
        self.shm, self._op = shm, op

    def is_completed(self) -> bool:
        if not self._op.done:   # one its caller started: finished here if every peer's part is in
            self.shm._finish_here(self._op, 0.0)
        return self._op.done

    def done_within(self, seconds: float) -> bool:
        """Whether it completes within ``seconds`` (failed counts as completed: ``wait`` raises)."""
        if self.shm._finish_here(self._op, seconds) is False:
            return False
        return self._op.event.wait(seconds)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        op = self._op
        limit = timeout.total_seconds() if timeout is not None else None
        self.shm._finish_here(op)
        # the group's thread times out by itself (naming the ranks); this only guards against it being stuck
        if not op.event.wait(None if limit is None else limit + 5.0):
            raise ShmError(f"shared-memory {op.kind} timed out after {limit:g}s: still queued behind earlier "
                           f"collectives of group {list(self.shm.ranks)}")
        if op.error is not None:
            raise op.error
        return True


class Shm:
    """One group's segment: a header of flags (one cache line per rank) and one slot per rank.

    Ops run one at a time, in issue order, on the group's thread, except a small one issued
    while nothing else is in flight: its caller copies it in and raises its flag at once, and
    reduces it when it waits (``Work.wait``), on its own thread; the group's thread finishes it
    first only if another op is issued before that wait. A small all-reduce then costs no thread
    hand-off at all (on a busy core each one costs a wake-up and a turn of the GIL).
    """

    def __init__(self, ranks: tuple[int, ...], me: int, mm: mmap.mmap, header: int, slot: int,
                 pids: list[int], sock: socket.socket | None = None) -> None:
        self.ranks, self.n, self.index = ranks, len(ranks), ranks.index(me)
        self.mm, self.header, self.slot = mm, header, slot
        self.raw = torch.frombuffer(mm, dtype=torch.uint8)
        self.flags = np.frombuffer(mm, dtype=np.int64, count=header // 8)
        self._flag = [(_LINE * (i + 1)) // 8 for i in range(self.n)]
        self.flags[self._flag[self.index]] = 0
        self.peers = [i for i in range(self.n) if i != self.index]
        self.pids = pids
        self.sock = sock
        self._addrs = [_address(mm, i) for i in self.peers]
        if sock is not None:
            sock.setblocking(False)
        # a peer's liveness can be read here only if its pid is visible (same pid namespace)
        self._watch = [i for i in self.peers if _alive(pids[i])]
        self.step = 0              # chunks started by this rank
        self.broken: BaseException | None = None
        self._queue: collections.deque[_Op] = collections.deque()   # ops not finished, in issue order
        self._busy = False         # a thread is running the head op (the group's or a caller's)
        self.inline = 0            # ops started by their caller (tests read it)
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"holoflow-shm-{'-'.join(map(str, ranks))}",
                                        daemon=True)
        self._thread.start()

    # -- the caller's side
    def all_reduce(self, buf: torch.Tensor, op: str) -> Work:
        """Queues reducing ``buf`` (contiguous, handed over) in place; ``op`` in sum/avg/max/min/prod
        (avg reduces as a sum: the caller divides)."""
        flat = buf.view(-1)
        return self._queue_op(_Op([flat], flat, op))

    def all_reduce_parts(self, parts: list[torch.Tensor], out: torch.Tensor) -> Work:
        """Queues summing the concatenation of the flat tensors ``parts`` into the flat ``out``
        (contiguous, of their total size): each part is copied into the segment as it is, with no
        concatenated copy first. The parts must not change until the work completes."""
        return self._queue_op(_Op(list(parts), out.view(-1), "sum"))

    def all_gather(self, t: torch.Tensor, out: torch.Tensor) -> Work:
        """Queues gathering every rank's contiguous ``t`` (the same size on each) into the
        contiguous ``out`` of ``n`` times its size, in rank order. ``t`` must not change until the
        work completes."""
        return self._queue_op(_Op([t.view(-1)], out.view(-1), "sum", "all_gather", self.n))

    def reduce_scatter(self, t: torch.Tensor, out: torch.Tensor) -> Work:
        """Queues summing block ``index`` (of ``n`` equal blocks of the contiguous ``t``) over the
        ranks into the contiguous ``out`` (in rank order, as the all-reduce sums: the same bits).
        ``t`` must not change until the work completes."""
        if self.n * t.element_size() > self.slot:   # a chunk holds at least one element of each block
            raise ShmError(f"shared-memory reduce_scatter on group {list(self.ranks)}: a slot of {self.slot} bytes "
                           f"cannot hold one {t.dtype} element per rank; raise HOLOFLOW_SHM_SLOT_MB")
        return self._queue_op(_Op([t.view(-1)], out.view(-1), "sum", "reduce_scatter", self.n))

    def _queue_op(self, o: _Op) -> Work:
        with self._cv:
            if self._closed:
                raise ShmError(f"the shared-memory transport of group {list(self.ranks)} is closed")
            # (one chunk, as the group's thread would make: every rank counts chunks alike)
            here = not self._queue and not self._busy and self.broken is None \
                and 0 < o.out.numel() * o.out.element_size() <= INLINE_BYTES \
                and o.units * o.per * o.out.element_size() <= self.slot and self._ready(3 * self.step)
            self._queue.append(o)
            if here:
                self._busy = True
            else:
                self._cv.notify()
        if here:   # nothing in flight and the slot free: start it now, without blocking
            self.inline += 1
            try:
                o.chunk = self.step
                self._begin(_chunk_in(o, 0, o.units), o.units * o.per, o.out.dtype)
                o.state = _POSTED
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                self._fail(o, e)
            with self._cv:
                self._busy = False
                self._cv.notify()   # an op queued meanwhile finishes this one first
        return Work(self, o)

    def _finish_here(self, o: _Op, within: float | None = None) -> bool | None:
        """Finishes ``o`` on this thread if it is the head op its caller started and nobody is
        running; with ``within``, gives up (False, ``o`` left as it was) when its peers are still
        missing after that many seconds. None when another thread has it or it is done."""
        with self._cv:
            if o.done or o.state != _POSTED or not self._queue or self._queue[0] is not o or self._busy:
                return None
            self._busy = True
        try:
            if within is not None:
                try:
                    ready = self._wait(3 * o.chunk + 1, "write its tensor", time.monotonic() + within)
                except BaseException as e:  # noqa: BLE001 - a peer is gone: the op fails, its waiter raises
                    self._fail(o, e)
                    ready = True
                if not ready:
                    with self._cv:
                        self._busy = False
                        self._cv.notify()
                    return False
            self._execute(o)
        finally:
            with self._cv:
                if self._busy and self._queue and self._queue[0] is o and not o.done:
                    self._busy = False   # an error before _execute took over
        return True

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self.sock is not None:
            self.sock.close()
        self.raw = self.flags = None   # drop the views, then the mapping
        try:
            self.mm.close()
        except BufferError:   # a view still held elsewhere: the mapping goes with it
            pass

    # -- the group's thread
    def _runnable(self) -> bool:
        """The head op waits for the group's thread: queued, or started by its caller with more
        ops behind it (it must finish before they start)."""
        q = self._queue
        return bool(q) and not self._busy and (q[0].state == _QUEUED or len(q) > 1)

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._runnable():
                    self._cv.wait()
                if not self._runnable():
                    return
                o = self._queue[0]
                self._busy = True
            self._execute(o)

    def _execute(self, o: _Op) -> None:
        """Runs the head op ``o`` to its end (the caller holds ``_busy``), then hands it over."""
        try:
            if o.error is None:
                if self.broken is not None:
                    raise self.broken
                if o.state == _POSTED:
                    self._finish_chunk(o, 0, o.units, o.chunk)
                else:
                    self._run(o)
        except BaseException as e:  # noqa: BLE001 - handed to the waiter
            self._fail(o, e)
        with self._cv:
            self._queue.popleft()
            self._busy = False
            self._cv.notify()
        o.done = True
        o.event.set()

    def _fail(self, o: _Op, e: BaseException) -> None:
        o.error = e if isinstance(e, ShmError) else ShmError(f"shared-memory {o.kind} failed: {e!r}")
        self.broken = self.broken or o.error

    def _run(self, o: _Op) -> None:
        cap = max(1, self.slot // (o.out.element_size() * o.per))
        for start in range(0, o.units, cap):
            end = min(start + cap, o.units)
            k = self.step
            self._begin(_chunk_in(o, start, end), (end - start) * o.per, o.out.dtype)
            self._finish_chunk(o, start, end, k)

    def _finish_chunk(self, o: _Op, start: int, end: int, k: int) -> None:
        """Finishes chunk ``k`` of ``o``, its units ``[start, end)``."""
        if o.kind == "all_reduce":
            self._end(o.out[start:end], o.op, k)
            return
        c, n, dt = end - start, self.n, o.out.dtype
        self._wait(3 * k + 1, "write its tensor")
        if o.kind == "all_gather":   # every rank's part of the chunk, to its place in the result
            whole = o.units
            for i in range(n):
                o.out[i * whole + start:i * whole + end].copy_(self._slot(i, dt, c))
        else:                         # this rank's block of the chunk, summed over the slots in rank order
            me = self.index
            _reduce_into([self._slot(i, dt, n * c)[me * c:(me + 1) * c] for i in range(n)], o.op,
                         o.out[start:end])
        self._post(3 * k + 3)

    def _slot(self, i: int, dtype: torch.dtype, m: int) -> torch.Tensor:
        off = self.header + i * self.slot
        return self.raw[off:off + m * dtype.itemsize].view(dtype)

    def _begin(self, pieces: list[torch.Tensor], m: int, dt: torch.dtype) -> None:
        """Starts chunk ``self.step`` (then counts it): the concatenation of ``pieces`` (``m``
        elements of ``dt``) copied into this rank's slot, its flag raised."""
        k = self.step
        self.step += 1
        self._wait(3 * k, "finish the previous collective")     # peers have read my slot
        mine = self._slot(self.index, dt, m)
        if len(pieces) == 1:
            mine.copy_(pieces[0])
        elif pieces:   # one call (no Python per piece, the GIL released throughout)
            torch.cat(pieces, out=mine)
        self._post(3 * k + 1)

    def _end(self, part: torch.Tensor, op: str, k: int) -> None:
        """Finishes chunk ``k``: every rank's slot reduced into ``part`` (which may be the memory
        it was copied from)."""
        m, n, me, dt = part.numel(), self.n, self.index, part.dtype
        slots = [self._slot(i, dt, m) for i in range(n)]
        self._wait(3 * k + 1, "write its tensor")
        if n <= READ_ALL_MAX:
            _reduce_into(slots, op, part)
            self._post(3 * k + 3)
            return
        bounds = [m * i // n for i in range(n + 1)]
        a, b = bounds[me], bounds[me + 1]
        if b > a:
            parts = [s[a:b] for s in slots]
            _reduce(parts, op, me)
            part[a:b].copy_(parts[me])
        self._post(3 * k + 2)
        self._wait(3 * k + 2, "reduce its part")
        for i in self.peers:
            if bounds[i + 1] > bounds[i]:
                part[bounds[i]:bounds[i + 1]].copy_(slots[i][bounds[i]:bounds[i + 1]])
        self._post(3 * k + 3)

    def _post(self, v: int) -> None:
        flags, at = self.flags, self._flag
        flags[at[self.index]] = v
        if self.sock is None:
            return
        _fence()
        for i, a in zip(self.peers, self._addrs):
            # wake a peer that says it sleeps in _wait (or is about to: it re-reads the flags after
            # saying so, and the fences order both sides' store before their load, so one of the two
            # sees the other's); a full queue already holds a wake-up
            if flags[at[i] + 1]:
                try:
                    self.sock.sendto(b"!", a)
                except OSError:
                    pass

    def _ready(self, target: int) -> bool:
        flags, at = self.flags, self._flag
        return all(flags[at[i]] >= target for i in self.peers)

    def _wait(self, target: int, what: str, deadline: float | None = None) -> bool:
        """Waits until every peer's flag reaches ``target`` (True); with ``deadline`` (monotonic
        seconds) returns False once it passes, else raises after the collective timeout."""
        flags, at = self.flags, self._flag
        if all(flags[at[i]] >= target for i in self.peers):
            return True
        start = time.monotonic()
        timeout = env.get_comm_timeout()
        check = start + 0.5
        sock = self.sock
        while True:
            behind = [i for i in self.peers if flags[at[i]] < target]
            if not behind:
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            # sleep until a peer pokes (flags are re-read after every wake-up: a poke may be stale,
            # and one sent before this rank slept is still queued, so none is lost); every 50 ms
            # anyway (liveness, timeout), every 1 ms without a socket
            if sock is None:
                time.sleep(1e-3)
            else:
                sleeping = at[self.index] + 1
                flags[sleeping] = 1     # peers poke only a rank that says so (_post)
                _fence()
                if any(flags[at[i]] < target for i in behind) and select.select(
                        [sock], [], [], 0.05 if deadline is None else
                        max(0.0, min(0.05, deadline - time.monotonic())))[0]:
                    try:
                        while sock.recv(64):
                            pass
                    except OSError:
                        pass
                flags[sleeping] = 0
            now = time.monotonic()
            if now > check:
                check = now + 0.5
                gone = [i for i in behind if i in self._watch and not _alive(self.pids[i])]
                if gone:
                    raise ShmError(f"shared-memory collective on group {list(self.ranks)}: peer ranks "
                                   f"{[self.ranks[i] for i in gone]} are gone (pids "
                                   f"{[self.pids[i] for i in gone]}) before they could {what}")
            if now - start > timeout:
                raise ShmError(f"shared-memory collective on group {list(self.ranks)} timed out after {timeout:g}s: "
                               f"ranks {[self.ranks[i] for i in behind]} did not arrive (waiting for them to {what})")


_FENCE = threading.Lock()


def _fence() -> None:
    """A full memory barrier: the lock's atomic read-modify-write orders this thread's earlier
    stores before its later loads (x86 may otherwise let a load pass a store)."""
    _FENCE.acquire()
    _FENCE.release()


def _chunk_in(o: _Op, start: int, end: int) -> list[torch.Tensor]:
    """What this rank copies into its slot for units ``[start, end)`` of ``o``."""
    if o.kind != "reduce_scatter":
        return _pieces(o.parts, start, end)
    (t,) = o.parts   # the units' elements of each rank's block, block after block
    block = o.units
    return [t[j * block + start:j * block + end] for j in range(o.per)]


def _pieces(parts: list[torch.Tensor], start: int, end: int) -> list[torch.Tensor]:
    """The slices of the flat ``parts`` that make up elements ``[start, end)`` of their concatenation."""
    out, at = [], 0
    for p in parts:
        lo, hi = max(start, at), min(end, at + p.numel())
        if lo < hi:
            out.append(p[lo - at:hi - at])
        at += p.numel()
        if at >= end:
            break
    return out


_FNS = {"sum": torch.add, "avg": torch.add, "max": torch.maximum, "min": torch.minimum, "prod": torch.mul}


def _reduce_into(parts: list[torch.Tensor], op: str, out: torch.Tensor) -> None:
    """Writes ``op`` over ``parts`` (in rank order) into ``out``, as :func:`_reduce` computes it."""
    if op in ("sum", "avg") and out.dtype in (torch.float16, torch.bfloat16):
        acc = parts[0].float()
        for p in parts[1:]:
            acc.add_(p)
        out.copy_(acc)
        return
    fn = _FNS[op]
    fn(parts[0], parts[1], out=out)
    for p in parts[2:]:
        fn(out, p, out=out)


def _reduce(parts: list[torch.Tensor], op: str, me: int) -> None:
    """Writes ``op`` over ``parts`` (in rank order) into ``parts[me]``; 16-bit floats are summed in
    float32 and rounded once."""
    if op in ("sum", "avg") and parts[0].dtype in (torch.float16, torch.bfloat16):
        acc = parts[0].float()
        for p in parts[1:]:
            acc.add_(p)
        parts[me].copy_(acc)
        return
    fn = _FNS[op]
    # parts[me] is read first (elementwise, so writing it while reading is safe) unless it comes later
    out = parts[me] if me < 2 else torch.empty_like(parts[me])
    fn(parts[0], parts[1], out=out)
    for p in parts[2:]:
        fn(out, p, out=out)
    if out is not parts[me]:
        parts[me].copy_(out)


atexit.register(unlink_created)   # a handshake cut short by an exception or exit


__all__ = ["transport", "enabled_here", "slot_bytes", "close_all", "unlink_created", "Shm", "Work", "ShmError",
           "DTYPES"]
