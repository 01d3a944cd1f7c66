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


# Tests that run several rank processes: the Gloo worlds above, tests/dist's launched programs, the
# launcher's own tests. Under pytest-xdist (`-n 2 --dist loadgroup`, the README's command) they all
# run on one worker, one at a time, as they would alone: ranks of two worlds never share the cores.
_RANK_FIXTURES = {"world2", "world4"}
_RANK_FILES = {os.path.join(HERE, "checkpoint", "test_launch_resume.py")}


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    dist = os.path.join(HERE, "dist") + os.sep
    for item in items:
        path = str(item.path)
        if _RANK_FIXTURES.intersection(item.fixturenames) or path.startswith(dist) or path in _RANK_FILES:
            item.add_marker(pytest.mark.xdist_group("ranks"))


def pytest_sessionfinish(session, exitstatus):
    for w in _WORLDS.values():
        w.close()
