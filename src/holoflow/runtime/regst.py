"""Regsts: a producer's slots (`Regst`) and a consumer's view of them (`Inbox`).

Pieces of a regst (one per iteration) are numbered in order; piece ``p`` lives in slot
``p % register_num``. Every consumer reads and returns pieces in order, so counters are enough:
a slot is free again when the slowest consumer has returned the piece in it.

A runtime `Regst` bundles the plan regsts of one producer that have the same consumers (and are all
loop-carried or all not): their counters would move in step, so one piece per act — the tuple of
their values, ``names`` in order (of one plan regst: its value) — is announced and returned once
per consumer instead of once per value (a lowered task makes ~30 values; a message each cost more than the act itself).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .actor import Actor


class Regst:
    """The producer side: ``register_num`` slots, the consumers to notify, return counters."""

    __slots__ = ("names", "name", "register_num", "consumers", "targets", "produced", "returned", "least", "keep",
                 "last")

    def __init__(self, names: tuple[str, ...], register_num: int, keep: bool = False) -> None:
        self.names = names                              # the plan regsts a piece holds, in order
        self.name = names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1} bundled)"
        self.register_num = register_num
        self.consumers: list[tuple[Actor, int]] = []    # (consumer actor, index of its inbox)
        self.targets: list[tuple] = []                  # (consumer.on_ready, inbox index, its worker)
        self.produced = 0                               # pieces written, the initial one included
        self.returned: list[int] = []                   # per consumer: pieces it has returned
        self.least = 0                                  # min(returned): pieces returned by all
        self.keep = keep                                # loop-carried: remember the newest piece
        self.last: Any = None                           # the newest piece, if ``keep`` (read as state)

    def free(self) -> int:
        """Slots not holding a piece some consumer still reads."""
        least = self.least if self.returned else self.produced
        return self.register_num - (self.produced - least)

    def add_consumer(self, actor: Actor, inbox: int, skip_first: bool) -> int:
        """Registers a consumer; ``skip_first`` marks piece 0 as already returned by it (the sink
        reads a loop-carried regst from piece 1: the value produced in iteration 0)."""
        self.consumers.append((actor, inbox))
        self.targets.append((actor.on_ready, inbox, actor.worker))
        self.returned.append(int(skip_first))
        self.least = min(self.returned)
        return len(self.returned) - 1

    def give_back(self, consumer: int) -> bool:
        """Consumer number ``consumer`` returned its oldest piece; whether that freed a slot of a
        regst that had none (its producer may be waiting for it)."""
        old = self.returned[consumer]
        self.returned[consumer] = old + 1
        if old != self.least:
            return False
        full = self.produced - old >= self.register_num
        self.least = min(self.returned)
        return full and self.least > old


class Inbox:
    """The consumer side: pieces announced and not yet read, and where to return them."""

    __slots__ = ("pieces", "producer", "regst", "consumer", "bundled", "ret", "ret_worker", "slots", "wake")

    def __init__(self, producer: Actor | None, regst: int, consumer: int) -> None:
        self.pieces: deque = deque()
        self.producer = producer          # the actor owning the regst (None: the caller's feeds)
        self.regst = regst                # index of the regst in the producer's regsts
        self.consumer = consumer          # this reader's number in that regst's consumer list
        self.bundled = producer is not None and len(producer.regsts[regst].names) > 1   # pieces are tuples
        # the message returning a piece, and the worker to send it to (None: the caller's feeds)
        self.ret = (producer.on_free, regst, consumer) if producer is not None else None
        self.ret_worker = producer.worker if producer is not None else None
        # a consumer on the producer's worker returns a piece by counting it itself, and wakes the
        # producer only when that freed the slot it lacked (half the messages of a chain)
        self.slots = producer.regsts[regst] if producer is not None else None
        self.wake = (producer.on_wake, None, None) if producer is not None else None
