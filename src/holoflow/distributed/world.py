"""Who am I and how do I talk: this rank and the communicator boxing uses.

Normally the rank comes from ``holoflow.env`` and collectives from ``holoflow.distributed.comm``
(torch.distributed). ``simulate(world_size)`` runs a function once per rank in threads of one
process, with an in-memory communicator: the whole global view can be exercised without
processes (tests, the explain tools); real multi-process tests check the same code on Gloo.
A simulated rank answers as its process would: ``env.get_rank()``/``get_world_size()`` (and
torch.distributed's under mock_torch) give its rank and world, and its random ops draw from
default generators of its own (core/generators.py), so a program runs as on real ranks.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from ..core import generators
from ..core.errors import HoloflowError
from . import comm_track


class _Local(threading.local):
    rank: int | None = None
    comm: Any = None


_LOCAL = _Local()


def rank() -> int:
    if _LOCAL.rank is not None:
        return _LOCAL.rank
    from . import env
    return env.get_rank()


def simulated_rank() -> int | None:
    """The rank this thread acts as in a simulated world (``simulate``, ``acting_as`` with a
    simulated communicator), else None."""
    return _LOCAL.rank if isinstance(_LOCAL.comm, SimComm) else None


def simulated_world_size() -> int | None:
    """The number of ranks of the simulated world this thread acts in, else None."""
    c = _LOCAL.comm
    return c.world_size if isinstance(c, SimComm) else None


def comm():
    if _LOCAL.comm is not None:
        return _LOCAL.comm
    return _torch_comm()


_TORCH_COMM = []


def _torch_comm():
    if not _TORCH_COMM:
        from .torch_comm import TorchComm
        _TORCH_COMM.append(TorchComm())
    return _TORCH_COMM[0]


def _padded_bytes(t: torch.Tensor, dim: int, rows: int, pieces: int) -> int:
    """Bytes of ``pieces`` pieces of ``t`` with ``rows`` along ``dim`` (a padded collective buffer)."""
    rest = t.numel() // t.shape[dim] if t.dim() and t.shape[dim] else 0
    return pieces * rows * rest * t.element_size() if t.dim() else t.numel() * t.element_size()


class PeerFailed(RuntimeError):
    """A simulated collective's peer raised before arriving: this rank cannot go on either."""


class SimComm:
    """Collectives among threads of one process: each call deposits this rank's tensor, waits
    for the group, and computes the result from everyone's deposits. Point-to-point messages
    pair as Gloo's do (:meth:`send`, :meth:`isend`); every wait times out naming the ranks. It also
    holds each rank's default generators (core/generators.py): a process's own, as every real
    rank has."""

    def __init__(self, world_size: int, timeout: float = 60.0) -> None:
        self.world_size, self.timeout = world_size, timeout
        fork = generators.Fork()
        self.generators = [generators.RankGenerators(fork) for _ in range(world_size)]
        self._cv = threading.Condition()
        self._slots: dict = {}
        self._seq: dict = {}
        self._prints: dict = {}       # (group, seq) -> rank -> (kind, signature): checked like real ranks'
        self._failed: dict = {}       # rank -> its error, once its program raised (simulate)
        self._mail: dict = {}         # (src, dst, k) -> the k-th isend from src to dst, in flight
        self._posted: dict = {}       # (src, dst, "send" | "recv") -> how many were posted
        self.calls: list[tuple[str, tuple, int]] = []

    def fail(self, r: int, err: BaseException) -> None:
        """Rank ``r``'s program raised: its peers waiting on it raise now instead of timing out."""
        with self._cv:
            self._failed[r] = f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
            self._cv.notify_all()

    def _exchange(self, kind: str, group: tuple, value, nbytes: int | None = None) -> dict:
        """``nbytes``: what the call hands to the wire when it differs from the deposit's bytes
        (Gloo's collectives pad uneven shards to the largest; the log counts as they do)."""
        return self._collect(self._deposit(kind, group, value, nbytes))

    def _deposit(self, kind: str, group: tuple, value, nbytes: int | None = None) -> tuple:
        """Takes this rank's part of a call (its place in the group's sequence is fixed here): a
        copy, as a wire takes one: the rank may write into its tensor as soon as its own call
        returns, while slower peers still read the deposit."""
        r = rank()
        bad = [q for q in group if not 0 <= q < self.world_size]
        if bad:   # as groups.normalize says on real ranks, at once instead of a timeout
            raise HoloflowError(f"holoflow (simulated): {kind} over ranks {list(group)}: ranks {bad} are outside "
                                f"the world of {self.world_size} process(es) (ranks 0..{self.world_size - 1}); "
                                f"a placement may only name ranks of the world")
        value = _copied(value)
        with self._cv:
            seq = self._seq.get((group, r), 0)
            self._seq[(group, r)] = seq + 1
            key = (group, seq)
            box = self._slots.setdefault(key, {})
            box[r] = value
            self._prints.setdefault(key, {})[r] = (kind, _signature(kind, value))
            if nbytes is None:
                nbytes = sum(v.numel() * v.element_size() for v in _tensors(value))
            if r == group[0]:
                self.calls.append((kind, group, nbytes))
            self._cv.notify_all()
        comm_track.count_simulated(kind, nbytes, len(group), r)   # flow.comm.count() in this rank
        return kind, group, key, box

    def _collect(self, deposit: tuple) -> dict:
        """Waits for the group's parts of a deposited call; every rank's, checked alike."""
        kind, group, key, box = deposit
        failed = self._failed
        with self._cv:
            if not self._cv.wait_for(lambda: len(box) == len(group) or
                                     any(q in failed and q not in box for q in group), self.timeout):
                missing = sorted(set(group) - set(box))
                raise RuntimeError(f"holoflow (simulated): {kind} over ranks {group} timed out; "
                                   f"ranks {missing} did not arrive")
            if len(box) != len(group):
                gone = [q for q in group if q in failed and q not in box]
                raise PeerFailed(f"holoflow (simulated): {kind} over ranks {list(group)}: rank(s) {gone} "
                                 f"failed before arriving ({failed[gone[0]]})")
            prints = self._prints[key]
        p2p = {k for k, _ in prints.values()} <= {"send", "recv"}
        if (len({k for k, _ in prints.values()}) != 2 or len({sig for _, sig in prints.values()}) > 1) if p2p \
                else len(set(prints.values())) > 1:
            from .comm_track import CommError
            calls = "; ".join(f"rank {q}: {k}{' ' + sig if sig else ''}" for q, (k, sig) in sorted(prints.items()))
            rule = ("a send must meet a recv of the same dtype and size, as the k-th message between two ranks"
                    if p2p else "every rank must issue the same collectives in the same order")
            raise CommError(f"holoflow (simulated): {'call' if p2p else 'collective'} #{key[1]} over ranks "
                            f"{list(group)} does not match across ranks ({calls}); {rule}")
        return dict(box)

    # -- point to point ----------------------------------------------------------------------------
    def send(self, t: torch.Tensor, dst: int) -> None:
        """holoflow.comm's send, as on Gloo: the k-th call between two ranks (their collectives
        over the pair counted too) must be a send meeting the peer's recv of the same dtype and
        size; it returns once the peer's recv arrived, else times out naming it."""
        self._exchange("send", self._pair("send", dst), t)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        """holoflow.comm's recv into ``t`` (see :meth:`send`); returns ``t``."""
        got = self._exchange("recv", self._pair("recv", src), torch.empty(t.shape, dtype=t.dtype, device="meta"))
        return t.copy_(got[src].view(t.shape))

    def _pair(self, kind: str, peer: int) -> tuple[int, int]:
        me = rank()
        if peer == me:
            raise HoloflowError(f"holoflow.comm.{kind}: rank {me} cannot {kind} {'to' if kind == 'send' else 'from'} "
                                f"itself")
        return (min(me, peer), max(me, peer))

    def isend(self, t: torch.Tensor, dst: int) -> "_P2P":
        """torch.distributed's isend: hands a copy of ``t`` to rank ``dst`` now; ``wait()`` returns
        once ``dst`` posted the matching irecv (its k-th from this rank, as Gloo pairs them)."""
        return self._post("send", rank(), dst, t)

    def irecv(self, t: torch.Tensor, src: int) -> "_P2P":
        """torch.distributed's irecv into ``t``: ``wait()`` returns once rank ``src``'s matching
        isend arrived (checked for ``t``'s dtype and size) and was copied in."""
        return self._post("recv", src, rank(), t)

    def _post(self, kind: str, src: int, dst: int, t: torch.Tensor) -> "_P2P":
        peer = dst if kind == "send" else src
        if not 0 <= peer < self.world_size or peer == rank():
            raise HoloflowError(f"holoflow.distributed.i{kind} on simulated rank {rank()}: peer {peer} is not another "
                                f"rank of the world of {self.world_size} (ranks 0..{self.world_size - 1})")
        with self._cv:
            k = self._posted.get((src, dst, kind), 0)
            self._posted[(src, dst, kind)] = k + 1
            slot = self._mail.setdefault((src, dst, k), {})
            slot[kind] = t.detach().clone() if kind == "send" else t
            if len(slot) == 2:   # both sides posted: each holds the slot
                del self._mail[(src, dst, k)]
            self._cv.notify_all()
        comm_track.count_simulated(kind, t.numel() * t.element_size(), 2, rank())
        return _P2P(self, kind, (src, dst, k), slot)

    def _finish(self, kind: str, key: tuple, slot: dict, timeout: float | None) -> None:
        """Waits for the other side of message ``key`` (src, dst, k); a receiver copies it in."""
        src, dst, k = key
        peer, other = (dst, "recv") if kind == "send" else (src, "send")
        limit = self.timeout if timeout is None else timeout
        with self._cv:
            if not self._cv.wait_for(lambda: other in slot or peer in self._failed, limit):
                raise RuntimeError(f"holoflow (simulated): i{kind} #{k} from rank {src} to rank {dst} timed out after "
                                   f"{limit:g}s: rank {peer} did not post the matching i{other}")
            if other not in slot:
                raise PeerFailed(f"holoflow (simulated): i{kind} #{k} from rank {src} to rank {dst}: rank {peer} "
                                 f"failed before posting the matching i{other} ({self._failed[peer]})")
            sent, into = slot["send"], slot["recv"]
        if sent.dtype != into.dtype or sent.numel() != into.numel():
            from .comm_track import CommError
            raise CommError(f"holoflow (simulated): message #{k} from rank {src} to rank {dst} does not match: rank "
                            f"{src} sent {_describe(sent)}, rank {dst} receives into {_describe(into)}; an isend must "
                            f"meet an irecv of the same dtype and size")
        if kind == "recv":
            into.copy_(sent.view(into.shape))

    def all_reduce_async(self, t, group) -> "_Later":
        """Deposits ``t`` now (the caller hands it over); ``wait()`` returns the sum."""
        d = self._deposit("all_reduce", group, t)
        return _Later(lambda: _sum(self._collect(d), group))

    def all_reduce_many_async(self, ts, group) -> "_Later":
        """The concatenation of ``ts`` (flattened) deposited now; ``wait()`` returns its sum."""
        return self.all_reduce_async(torch.cat([t.reshape(-1) for t in ts]), group)

    def reduce_scatter_async(self, t, group, dim, sizes) -> "_Later":
        d = self._deposit("reduce_scatter", group, t, _padded_bytes(t, dim, max(sizes), len(group)))
        i = group.index(rank())
        return _Later(lambda: _sum(self._collect(d), group).narrow(dim, sum(sizes[:i]), sizes[i]).contiguous())

    def all_gather_async(self, t, group, dim, sizes) -> "_Later":
        """Deposits ``t`` now (the caller hands it over); ``wait()`` returns the gathered tensor."""
        d = self._deposit("all_gather", group, t, _padded_bytes(t, dim, max(sizes), 1))
        return _Later(lambda: torch.cat([self._collect(d)[g] for g in group], dim=dim))

    def all_gather(self, t, group, dim, sizes):
        got = self._exchange("all_gather", group, t, _padded_bytes(t, dim, max(sizes), 1))
        return torch.cat([got[g] for g in group], dim=dim)

    def all_reduce(self, t, group):
        return _sum(self._exchange("all_reduce", group, t), group)

    def reduce_scatter(self, t, group, dim, sizes):
        got = self._exchange("reduce_scatter", group, t, _padded_bytes(t, dim, max(sizes), len(group)))
        total = sum((got[g] for g in group[1:]), got[group[0]].clone())
        i = group.index(rank())
        return total.narrow(dim, sum(sizes[:i]), sizes[i]).contiguous()

    def all_to_all(self, chunks, group, out_shapes=None):
        got = self._exchange("all_to_all", group, list(chunks))
        i = group.index(rank())
        return [got[g][i] for g in group]

    def broadcast(self, t, src, group):
        got = self._exchange("broadcast", group, t)
        return got[src].clone()

    def all_gather_shapes(self, shape: tuple, group) -> list[tuple]:
        got = self._exchange("meta", group, shape)
        return [got[g] for g in group]


def _copied(v):
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
        return type(v)(x.clone() if isinstance(x, torch.Tensor) else x for x in v)
    return v


def _sum(got: dict, group: tuple) -> torch.Tensor:
    return sum((got[g] for g in group[1:]), got[group[0]].clone())


class _Later:
    """A simulated collective in flight: ``wait()`` collects it (once)."""

    def __init__(self, collect: Callable[[], Any]) -> None:
        self._collect, self._done = collect, None

    def wait(self) -> Any:
        if self._collect is not None:
            self._done, self._collect = self._collect(), None
        return self._done


class _P2P:
    """A simulated isend or irecv in flight (torch's Work): ``wait()`` finishes it (once)."""

    def __init__(self, sim: SimComm, kind: str, key: tuple, slot: dict) -> None:
        self.sim, self.kind, self.key, self.slot, self._done = sim, kind, key, slot, False

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            secs = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
            self.sim._finish(self.kind, self.key, self.slot, secs)
            self._done = True
        return True

    def is_completed(self) -> bool:
        """Whether the other side posted (then the transfer is finished here, as a wait would)."""
        if not self._done and len(self.slot) == 2:
            self.wait()
        return self._done


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def _signature(kind: str, value) -> str:
    """What every rank's call must agree on: dtype and shape where the collective needs equal
    shapes (all_gather and all_to_all take uneven pieces, the shape exchange differs by design)."""
    if kind in ("all_reduce", "reduce_scatter", "broadcast") and isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    if kind == "all_gather" and isinstance(value, torch.Tensor):
        return str(value.dtype).replace("torch.", "")
    if kind in ("send", "recv"):   # (the payload, or the receiving buffer's meta)
        return f"{str(value.dtype).replace('torch.', '')}[{value.numel()} elements]"
    return ""


def _tensors(v):
    return [v] if isinstance(v, torch.Tensor) else [x for x in v if isinstance(x, torch.Tensor)] \
        if isinstance(v, (list, tuple)) else []


def simulate(world_size: int, fn: Callable[[int], Any], timeout: float = 60.0) -> list:
    """Runs ``fn(rank)`` for every rank in threads sharing a :class:`SimComm`; returns results."""
    comm_ = SimComm(world_size, timeout)
    results: list = [None] * world_size
    errors: list = [None] * world_size

    def run(r: int) -> None:
        _LOCAL.rank, _LOCAL.comm = r, comm_
        generators.install(comm_.generators[r])
        try:
            results[r] = fn(r)
        except BaseException as e:  # reported to the caller below
            errors[r] = e
            comm_.fail(r, e)
        finally:
            _LOCAL.rank = _LOCAL.comm = None
            generators.install(None)
    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    # the first rank whose own program failed (its peers' errors only say it did)
    for r, e in sorted(enumerate(errors), key=lambda re: isinstance(re[1], PeerFailed)):
        if e is not None:
            raise RuntimeError(f"simulated rank {r} failed: {e}") from e
    simulate.last_comm = comm_
    return results


class acting_as:
    """Runs a block as ``rank`` talking through ``comm`` (a plan's kernels on a runtime thread
    of a simulated rank: collectives there must know whose deposit they make)."""

    def __init__(self, rank_: int, comm_: Any) -> None:
        self.rank, self.comm = rank_, comm_

    def __enter__(self) -> None:
        # a simulated rank's generators, or (a real rank's comm) torch's
        gens = self.comm.generators[self.rank] if isinstance(self.comm, SimComm) else None
        self.prev = _LOCAL.rank, _LOCAL.comm, generators.install(gens)
        _LOCAL.rank, _LOCAL.comm = self.rank, self.comm

    def __exit__(self, *exc) -> None:
        _LOCAL.rank, _LOCAL.comm, gens = self.prev
        generators.install(gens)
