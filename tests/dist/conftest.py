"""Session-wide worlds of rank processes (see pool.py): fixtures ``world2`` and ``world4``."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from pool import World  # noqa: E402

_WORLDS: dict[int, World] = {}


def _world(n: int) -> World:
    w = _WORLDS.get(n)
    if w is None:
        w = _WORLDS[n] = World(n)
    return w  # started lazily by the first run()


@pytest.fixture(scope="session")
def world2() -> World:
    """Two Gloo ranks on localhost, shared by every test of the session."""
    return _world(2)


@pytest.fixture(scope="session")
def world4() -> World:
    """Four Gloo ranks on localhost, shared by every test of the session."""
    return _world(4)


def pytest_sessionfinish(session, exitstatus):
    for w in _WORLDS.values():
        w.close()
