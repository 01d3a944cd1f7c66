"""The fingerprint side channel (distributed/comm_wire.py) in one process: two wires on a dict
store. Messages of one peer on one group arrive in order, groups never mix, readers on several
threads each get their own group's message, and timeouts and closed peers raise at once."""
import threading
import time

import pytest

from holoflow.distributed import comm_wire


class _Store:
    def __init__(self):
        self.d, self.cv = {}, threading.Condition()

    def set(self, k, v):
        with self.cv:
            self.d[k] = v.encode() if isinstance(v, str) else v
            self.cv.notify_all()

    def get(self, k):
        return self.d[k]

    def wait(self, keys, timeout):
        with self.cv:
            if not self.cv.wait_for(lambda: all(k in self.d for k in keys), timeout.total_seconds()):
                raise RuntimeError("store wait timed out")


@pytest.fixture
def wires():
    store = _Store()
    a, b = comm_wire.Wire(0, store), comm_wire.Wire(1, store)
    yield a, b
    a.close()
    b.close()


def _dl(s=5.0):
    return time.monotonic() + s


def test_fifo_per_group_and_groups_do_not_mix(wires):
    a, b = wires
    g1, g2 = comm_wire.group_id((0, 1)), comm_wire.group_id((0, 1, 2))
    assert g1 != g2 and g1 == comm_wire.group_id((0, 1))
    for i in range(3):
        a.send(1, g1, b"one%d" % i, _dl(), _dl())
        a.send(1, g2, b"two%d" % i, _dl(), _dl())
    assert [b.recv(0, g2, _dl()) for _ in range(3)] == [b"two0", b"two1", b"two2"]
    assert [b.recv(0, g1, _dl()) for _ in range(3)] == [b"one0", b"one1", b"one2"]
    b.send(0, g1, b"back", _dl(), _dl())
    assert a.recv(1, g1, _dl()) == b"back"


def test_readers_on_several_threads_each_get_their_group(wires):
    a, b = wires
    gids = [comm_wire.group_id((0, 1, k)) for k in range(2, 10)]
    got = {}

    def read(g):
        got[g] = [b.recv(0, g, _dl()) for _ in range(20)]
    threads = [threading.Thread(target=read, args=(g,)) for g in gids]
    for t in threads:
        t.start()
    for i in range(20):
        for g in reversed(gids):
            a.send(1, g, b"%d:%d" % (g % 1000, i), _dl(), _dl())
    for t in threads:
        t.join(10)
    assert got == {g: [b"%d:%d" % (g % 1000, i) for i in range(20)] for g in gids}


def test_timeout_and_closed_peer(wires):
    a, b = wires
    g = comm_wire.group_id((0, 1))
    a.send(1, g, b"x", _dl(), _dl())
    assert b.recv(0, g, _dl()) == b"x"
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="rank 0's fingerprint"):
        b.recv(0, g, _dl(0.2))
    assert time.monotonic() - t0 < 2
    a.close()
    with pytest.raises(comm_wire.WireError, match="closed"):
        b.recv(0, g, _dl())


def test_a_peer_that_never_publishes_times_out():
    w = comm_wire.Wire(0, _Store())
    try:
        with pytest.raises(TimeoutError, match="rank 3 to open its fingerprint channel"):
            w.send(3, 1, b"x", _dl(0.2), _dl())
        with pytest.raises(TimeoutError, match="rank 3"):
            w.recv(3, 1, _dl(0.2))
    finally:
        w.close()
