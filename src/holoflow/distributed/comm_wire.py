"""The side channel that carries collective fingerprints: direct TCP connections between ranks.

A fingerprint (:mod:`.comm_check`) is a few hundred bytes that every member of a group must see
before the payload collective starts. Sent as a Gloo all-gather it cost 0.2-0.4 ms on two local
ranks of an idle machine, ~1-3 ms on a loaded one: every Gloo collective hands off to the process
group's worker thread and to the transport's I/O thread on each side, and each hand-off is a
wake-up. Written to a socket from the calling thread and read back by the calling thread it is a
~10 us exchange (bench/README-boxing.md has the figures).

Each rank listens on one port, published in the c10d store under ``holoflow/fpwire/<rank>`` with a
nonce of this world; for each peer it opens one outbound connection (it only sends on it) and
accepts one inbound connection (it only reads from it), both on first use. A message carries a
group id; the messages of one peer on one group form a FIFO, so the k-th message of a peer on a
group is its k-th call there (as Gloo's tagged messages are). No background thread: whichever
waiting thread gets there first reads, files what it read under its group, and wakes the others.
Every wait has a deadline; a closed connection (a dead peer) and a timeout raise at once.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import secrets
import socket
import struct
import threading
import time
from collections import deque

import torch.distributed as dist

# a waiting reader polls this long (yielding the CPU) before it sleeps: on a loaded machine the
# sleep and wake-up cost ~0.3-1 ms, polling 0.2 ms of it saves most (bench/README-boxing.md)
SPIN_S = 200e-6
_MAGIC = b"HFW1"
_HELLO = struct.Struct("<4sIQ")  # magic, sender rank, the receiver's nonce
_HDR = struct.Struct("<4sIQ")  # magic, payload bytes, group id


class WireError(ConnectionError):
    """A fingerprint connection that closed or carried garbage."""


def group_id(ranks: tuple[int, ...], _cache: dict = {}) -> int:  # noqa: B006 - a deliberate cache
    """A 64-bit id of the group ``ranks`` (its sorted key), the same on every rank."""
    gid = _cache.get(ranks)
    if gid is None:
        digest = hashlib.blake2b("-".join(map(str, ranks)).encode(), digest_size=8).digest()
        gid = _cache[ranks] = int.from_bytes(digest, "little")
    return gid


def _host() -> str:
    """This host's address on the route to MASTER_ADDR (the store's host): reachable by peers."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.connect((socket.gethostbyname(master), 9))
            return u.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class _Peer:
    __slots__ = ("out", "inb", "buf", "queues", "reading", "send_lock")

    def __init__(self) -> None:
        self.out: socket.socket | None = None
        self.inb: socket.socket | None = None
        self.buf = bytearray()
        self.queues: dict[int, deque] = {}
        self.reading = False
        self.send_lock = threading.Lock()


def _left(deadline: float, what: str) -> float:
    rem = deadline - time.monotonic()
    if rem <= 0:
        raise TimeoutError(f"timed out waiting for {what}")
    return rem


class Wire:
    """This rank's fingerprint connections in one world (see the module docstring)."""

    def __init__(self, rank: int, store) -> None:
        self.rank, self.store = rank, store
        self.nonce = secrets.randbits(63)
        host = _host()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind((host, 0))
        self.listener.listen(256)
        store.set(f"holoflow/fpwire/{rank}", f"{host} {self.listener.getsockname()[1]} {self.nonce}")
        self.peers: dict[int, _Peer] = {}
        self.cond = threading.Condition()
        self.accept_lock = threading.Lock()

    def close(self) -> None:
        for s in [self.listener] + [x for p in self.peers.values() for x in (p.out, p.inb) if x is not None]:
            try:
                s.close()
            except OSError:
                pass

    def _peer(self, p: int) -> _Peer:
        peer = self.peers.get(p)
        if peer is None:
            with self.cond:
                peer = self.peers.setdefault(p, _Peer())
        return peer

    # -- sending ----------------------------------------------------------------------------

    def send(self, p: int, gid: int, payload: bytes, connect_deadline: float, deadline: float) -> None:
        """Sends ``payload`` to rank ``p`` under the group ``gid``. Connecting (first use) waits at
        most until ``connect_deadline``; the write itself until ``deadline``."""
        peer = self._peer(p)
        with peer.send_lock:
            if peer.out is None:
                peer.out = self._connect(p, connect_deadline)
            peer.out.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                peer.out.sendall(_HDR.pack(_MAGIC, len(payload), gid) + payload)
            except OSError as e:
                raise WireError(f"the fingerprint connection to rank {p} was closed ({e})") from e

    def _connect(self, p: int, deadline: float) -> socket.socket:
        key = f"holoflow/fpwire/{p}"
        what = f"rank {p} to open its fingerprint channel"
        while True:
            rem = _left(deadline, what)
            try:
                self.store.wait([key], datetime.timedelta(seconds=rem))
                host, port, nonce = self.store.get(key).decode().split()
            except (RuntimeError, dist.DistError) as e:  # the store's timeout
                raise TimeoutError(f"timed out waiting for {what}") from e
            try:
                s = socket.create_connection((host, int(port)), timeout=max(rem, 0.001))
            except OSError:  # not listening yet under a stale address: the peer will publish its own
                time.sleep(0.01)
                continue
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(_HELLO.pack(_MAGIC, self.rank, int(nonce)))
            return s

    # -- receiving --------------------------------------------------------------------------

    def recv(self, p: int, gid: int, deadline: float) -> bytes:
        """The next message of rank ``p`` under the group ``gid``, waiting until ``deadline``."""
        peer = self._peer(p)
        what = f"rank {p}'s fingerprint"
        while True:
            with self.cond:
                while True:
                    q = peer.queues.get(gid)
                    if q:
                        return q.popleft()
                    if not peer.reading:
                        peer.reading = True
                        break
                    self.cond.wait(_left(deadline, what))
            got = None
            try:
                got = self._read_one(peer, p, deadline)
            finally:
                with self.cond:
                    peer.reading = False
                    if got is not None:
                        peer.queues.setdefault(got[0], deque()).append(got[1])
                    self.cond.notify_all()

    def _read_one(self, peer: _Peer, p: int, deadline: float) -> tuple[int, bytes]:
        if peer.inb is None:
            self._accept(p, deadline)
        s, buf = peer.inb, peer.buf
        while True:
            if len(buf) >= _HDR.size:
                magic, n, gid = _HDR.unpack_from(buf)
                if magic != _MAGIC:
                    raise WireError(f"a corrupt message on the fingerprint connection from rank {p}")
                if len(buf) >= _HDR.size + n:
                    payload = bytes(buf[_HDR.size:_HDR.size + n])
                    del buf[:_HDR.size + n]
                    return gid, payload
            chunk = self._poll(s) if SPIN_S > 0 else None
            if chunk is None:
                s.settimeout(_left(deadline, f"rank {p}'s fingerprint"))
            try:
                chunk = chunk if chunk is not None else s.recv(1 << 16)
            except socket.timeout as e:
                raise TimeoutError(f"timed out waiting for rank {p}'s fingerprint") from e
            except OSError as e:
                raise WireError(f"the fingerprint connection from rank {p} was closed ({e})") from e
            if not chunk:
                raise WireError(f"the fingerprint connection from rank {p} was closed (its process may have exited)")
            buf += chunk

    @staticmethod
    def _poll(s: socket.socket) -> bytes | None:
        """Up to SPIN_S of non-blocking reads (yielding the CPU between them): a peer that arrives
        within it costs no sleep and wake-up. None when nothing came."""
        s.setblocking(False)
        end = time.perf_counter() + SPIN_S
        try:
            while True:
                try:
                    return s.recv(1 << 16)
                except BlockingIOError:
                    if time.perf_counter() > end:
                        return None
                    os.sched_yield()
        finally:
            s.setblocking(True)

    def _accept(self, p: int, deadline: float) -> None:
        """Accepts inbound connections (from any peer) until ``p``'s is there."""
        what = f"rank {p} to connect its fingerprint channel"
        if not self.accept_lock.acquire(timeout=_left(deadline, what)):
            raise TimeoutError(f"timed out waiting for {what}")
        try:
            while self._peer(p).inb is None:
                self.listener.settimeout(_left(deadline, what))
                try:
                    conn, _ = self.listener.accept()
                except socket.timeout as e:
                    raise TimeoutError(f"timed out waiting for {what}") from e
                r = self._hello(conn, deadline)
                if r is not None:
                    peer = self._peer(r)
                    peer.inb, peer.buf = conn, bytearray()
        finally:
            self.accept_lock.release()

    def _hello(self, conn: socket.socket, deadline: float) -> int | None:
        """The sender's rank, or None (and the connection closed) for anything not of this world."""
        data = b""
        try:
            while len(data) < _HELLO.size:
                conn.settimeout(_left(deadline, "a peer's hello"))
                chunk = conn.recv(_HELLO.size - len(data))
                if not chunk:
                    break
                data += chunk
        except (OSError, TimeoutError):
            pass
        if len(data) == _HELLO.size:
            magic, r, nonce = _HELLO.unpack(data)
            if magic == _MAGIC and nonce == self.nonce:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return r
        conn.close()
        return None


_WIRE: list = [None, None]  # [the default process group it belongs to, Wire]
_WIRE_LOCK = threading.Lock()


def get(rank: int, store) -> Wire:
    """This process's wire for the current world (a new one after the world was set up again)."""
    pg = dist.distributed_c10d._get_default_group()
    if _WIRE[0] is pg:
        return _WIRE[1]
    with _WIRE_LOCK:
        if _WIRE[0] is not pg:
            if _WIRE[1] is not None:
                _WIRE[1].close()
            _WIRE[1] = Wire(rank, store)
            _WIRE[0] = pg
        return _WIRE[1]


def close() -> None:
    """Closes this process's wire (the world it belonged to is being destroyed)."""
    with _WIRE_LOCK:
        if _WIRE[1] is not None:
            _WIRE[1].close()
        _WIRE[0] = _WIRE[1] = None


__all__ = ["Wire", "WireError", "group_id", "get", "close"]
