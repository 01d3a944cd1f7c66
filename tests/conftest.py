import os
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "dist"))

from pool import World  # noqa: E402  (tests/dist/pool.py: rank processes started once per session)

_WORLDS: dict = {}


def _world(n: int) -> World:
    w = _WORLDS.get(n)
    if w is None:
        w = _WORLDS[n] = World(n)
    return w  # started lazily by its first run()


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
